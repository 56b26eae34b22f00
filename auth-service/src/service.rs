//! The auth flows (login, refresh, logout, JWKS) over users, keys and refresh families,
//! independent of HTTP.

use parking_lot::RwLock;
use std::net::IpAddr;
use std::sync::Arc;

use serde::Serialize;

use crate::keys::KeyRing;
use crate::problem::ApiError;
use crate::refresh::{RefreshStore, Rejection, RotateOutcome};
use crate::throttle::{Admission, LoginThrottle};
use crate::tokens::{ACCESS_TOKEN_TTL_SECS, TokenIssuer};
use crate::users::UserStore;
use gateway_clock::Clock;

/// Response body of login and refresh.
#[derive(Debug, Clone, Serialize)]
pub struct TokenPair {
    /// EdDSA JWT, valid for `expires_in` seconds.
    pub access_token: String,
    /// Opaque refresh token, single use.
    pub refresh_token: String,
    /// Always `Bearer`.
    pub token_type: &'static str,
    /// Access-token lifetime in seconds.
    pub expires_in: u64,
    /// Seconds until the refresh-token family ends (it is not extended by refreshing).
    pub refresh_expires_in: u64,
}

/// Everything the HTTP layer needs.
#[derive(Debug)]
pub struct AuthService {
    users: UserStore,
    keys: Arc<RwLock<KeyRing>>,
    issuer: TokenIssuer,
    refresh: RefreshStore,
    throttle: LoginThrottle,
    clock: Arc<dyn Clock>,
}

impl AuthService {
    /// Assembles the service.
    pub fn new(
        users: UserStore,
        keys: Arc<RwLock<KeyRing>>,
        issuer: TokenIssuer,
        refresh: RefreshStore,
        throttle: LoginThrottle,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Self {
            users,
            keys,
            issuer,
            refresh,
            throttle,
            clock,
        }
    }

    fn access_token(&self, sub: &str, role: &str, now: u64) -> Result<String, ApiError> {
        // Clone the Arc out so the lock is not held while signing.
        let key = self.keys.read().signing_key(now);
        Ok(self.issuer.issue(&key, sub, role, now)?)
    }

    /// Checks credentials (unless the failed-login throttle refuses the attempt first) and
    /// starts a refresh family. `client` is the address the attempt is counted against.
    pub async fn login(
        &self,
        username: &str,
        password: &str,
        client: IpAddr,
    ) -> Result<TokenPair, ApiError> {
        let attempt = match self.throttle.admit(username, client).await? {
            Admission::Admitted(attempt) => attempt,
            Admission::Refused { retry_after } => {
                tracing::debug!(%client, "login refused: failed-login limit");
                return Err(ApiError::TooManyFailedLogins { retry_after });
            }
        };
        let verified = self.users.verify(username, password).await;
        if !matches!(verified, Ok(None)) {
            // Right password, or the database failed: not a failed login. Only this attempt's
            // unit is given back, never the earlier failures.
            if let Err(error) = self.throttle.not_a_failure(attempt).await {
                tracing::warn!(%error, "login throttle: could not give back a successful attempt's unit");
            }
        }
        let user = verified?.ok_or(ApiError::InvalidCredentials)?;
        let now = self.clock.unix_secs();
        let access_token = self.access_token(&user.username, &user.role, now)?;
        let refresh = self.refresh.create(&user.username, &user.role, now).await?;
        Ok(TokenPair {
            access_token,
            refresh_token: refresh.token,
            token_type: "Bearer",
            expires_in: ACCESS_TOKEN_TTL_SECS,
            refresh_expires_in: refresh.session.expires_at.saturating_sub(now),
        })
    }

    /// Consumes a refresh token and issues a new pair in the same family.
    pub async fn refresh(&self, refresh_token: &str) -> Result<TokenPair, ApiError> {
        let now = self.clock.unix_secs();
        let issued = match self.refresh.rotate(refresh_token, now).await? {
            RotateOutcome::Rotated(issued) => issued,
            RotateOutcome::Rejected(rejection) => {
                match &rejection {
                    Rejection::Reused { family } => tracing::warn!(
                        %family,
                        "refresh token reuse detected: the token was already consumed; whole family revoked"
                    ),
                    other => tracing::debug!(?other, "refresh refused"),
                }
                return Err(ApiError::InvalidRefreshToken);
            }
        };
        let session = issued.session;
        // The role may have changed (or the user been removed) since login.
        let Some(user) = self.users.find(&session.sub).await? else {
            self.refresh.revoke_family(&session.family).await?;
            tracing::info!(family = %session.family, sub = %session.sub, "user no longer exists; family revoked");
            return Err(ApiError::InvalidRefreshToken);
        };
        let access_token = self.access_token(&user.username, &user.role, now)?;
        Ok(TokenPair {
            access_token,
            refresh_token: issued.token,
            token_type: "Bearer",
            expires_in: ACCESS_TOKEN_TTL_SECS,
            refresh_expires_in: session.expires_at.saturating_sub(now),
        })
    }

    /// Revokes the family of `refresh_token`. Unknown tokens are accepted silently (RFC 7009 §2.2).
    pub async fn logout(&self, refresh_token: &str) -> Result<(), ApiError> {
        if let Some(family) = self.refresh.revoke(refresh_token).await? {
            tracing::debug!(%family, "family revoked by logout");
        }
        Ok(())
    }

    /// The JWKS document and its `max-age`.
    pub fn jwks(&self) -> (String, u64) {
        let ring = self.keys.read();
        (
            ring.jwks_json(self.clock.unix_secs()),
            ring.policy().jwks_max_age(),
        )
    }
}
