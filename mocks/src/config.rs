//! Which service a mock plays and its fault settings.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::hooks::MAX_DELAY_MS;
use crate::identity::IdentityVerifier;

/// The demo service a mock instance plays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Service {
    /// `GET /users/{id}`.
    Users,
    /// `GET /orders/{id}`.
    Orders,
}

impl Service {
    /// The service name, which is also its path's first segment.
    pub fn name(self) -> &'static str {
        match self {
            Service::Users => "users",
            Service::Orders => "orders",
        }
    }
}

impl fmt::Display for Service {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Service {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "users" => Ok(Service::Users),
            "orders" => Ok(Service::Orders),
            other => Err(ConfigError::UnknownService(other.to_owned())),
        }
    }
}

/// Invalid mock settings.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ConfigError {
    /// `--service` names neither `users` nor `orders`.
    #[error("unknown service {0:?}: expected \"users\" or \"orders\"")]
    UnknownService(String),
    /// `FAIL_RATE` is not a number in 0.0..=1.0.
    #[error("FAIL_RATE must be a number from 0.0 to 1.0, got {0:?}")]
    BadFailRate(String),
    /// `FAIL_STATUS` is not an integer from 500 to 599.
    #[error("FAIL_STATUS must be an integer from 500 to 599, got {0:?}")]
    BadFailStatus(String),
    /// `DELAY_MS` or `DRAIN_DELAY_MS` is not an integer from 0 to [`MAX_DELAY_MS`].
    #[error("{0} must be an integer from 0 to 600000, got {1:?}")]
    BadDelay(&'static str, String),
    /// `--instance-id` is empty or not a valid header value.
    #[error("instance id must be non-empty visible ASCII, got {0:?}")]
    BadInstanceId(String),
    /// `--identity-secret` is not 32 to 256 visible ASCII characters (never echoed).
    #[error("identity secret must be 32 to 256 visible ASCII characters (got {0})")]
    BadIdentitySecret(usize),
    /// `--identity-audience` is empty.
    #[error(
        "identity audience must be the name of the upstream this mock is behind (got an empty name)"
    )]
    EmptyIdentityAudience,
}

/// How signatures are verified besides the secret (see [`crate::identity`]).
#[derive(Debug, Clone, Default)]
pub struct IdentityOptions {
    /// The upstream's name v3 signatures must bind (`None`: the service's name).
    pub audience: Option<String>,
    /// Accept mirror copies: the mock is a shadow upstream.
    pub shadow: bool,
    /// Accept v2 signatures too (while gateways are upgraded).
    pub accept_v2: bool,
}

/// Everything a mock instance needs to answer requests.
#[derive(Debug, Clone)]
pub struct MockConfig {
    /// The service it plays.
    pub service: Service,
    /// Its instance id, sent as `X-Instance-Id` and `"instance"`.
    pub instance_id: String,
    /// Fraction of requests (0.0–1.0) that answer `fail_status`, from `FAIL_RATE`.
    pub fail_rate: f64,
    /// The status of a `FAIL_RATE` failure, from `FAIL_STATUS` (default 500).
    pub fail_status: http::StatusCode,
    /// Wait before answering every request but `/health`, from `DELAY_MS`
    /// (a slow instance; `?delay_ms=` adds to it).
    pub delay: Duration,
    /// Set once shutdown has begun: `/health` answers 503 while every other
    /// request is still served (see `DRAIN_DELAY_MS` in the README).
    pub draining: Arc<AtomicBool>,
    /// When set, requests must carry a valid `X-Gateway-Signature` (`--identity-secret`).
    pub identity: Option<Arc<IdentityVerifier>>,
}

impl MockConfig {
    /// Validates the settings.
    pub fn new(
        service: Service,
        instance_id: impl Into<String>,
        fail_rate: f64,
    ) -> Result<Self, ConfigError> {
        let instance_id = instance_id.into();
        if instance_id.is_empty()
            || !instance_id.bytes().all(|b| b.is_ascii_graphic())
            || http::HeaderValue::from_str(&instance_id).is_err()
        {
            return Err(ConfigError::BadInstanceId(instance_id));
        }
        if !(0.0..=1.0).contains(&fail_rate) {
            return Err(ConfigError::BadFailRate(fail_rate.to_string()));
        }
        Ok(Self {
            service,
            instance_id,
            fail_rate,
            fail_status: http::StatusCode::INTERNAL_SERVER_ERROR,
            delay: Duration::ZERO,
            draining: Arc::new(AtomicBool::new(false)),
            identity: None,
        })
    }

    /// The same settings, requiring requests signed with `secret` (see
    /// [`crate::identity`]) for the audience and with the options of
    /// `options`. An empty secret turns verification off.
    pub fn with_identity_secret(
        mut self,
        secret: &str,
        options: &IdentityOptions,
    ) -> Result<Self, ConfigError> {
        if secret.is_empty() {
            self.identity = None;
            return Ok(self);
        }
        let audience = options.audience.as_deref().unwrap_or(self.service.name());
        if audience.is_empty() {
            return Err(ConfigError::EmptyIdentityAudience);
        }
        let verifier = IdentityVerifier::new(secret, audience)
            .ok_or(ConfigError::BadIdentitySecret(secret.chars().count()))?
            .shadow(options.shadow)
            .accept_v2(options.accept_v2);
        self.identity = Some(Arc::new(verifier));
        Ok(self)
    }

    /// Whether shutdown has begun (health checks are being told to stop sending).
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    /// Marks the start of shutdown: `/health` answers 503 from now on.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    /// The same settings with `FAIL_RATE` failures answered with `status`.
    pub fn with_fail_status(mut self, status: http::StatusCode) -> Self {
        self.fail_status = status;
        self
    }

    /// The same settings with every answer delayed by `delay`.
    pub fn with_delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }
}

/// Parses a milliseconds value of environment variable `name` (`DELAY_MS`,
/// `DRAIN_DELAY_MS`): absent or empty means zero.
pub fn parse_delay(name: &'static str, raw: Option<&str>) -> Result<Duration, ConfigError> {
    let Some(raw) = raw.map(str::trim).filter(|s| !s.is_empty()) else {
        return Ok(Duration::ZERO);
    };
    match raw.parse::<u64>() {
        Ok(ms) if ms <= MAX_DELAY_MS => Ok(Duration::from_millis(ms)),
        _ => Err(ConfigError::BadDelay(name, raw.to_owned())),
    }
}

/// Parses a `FAIL_STATUS` value (500–599): absent or empty means 500.
pub fn parse_fail_status(raw: Option<&str>) -> Result<http::StatusCode, ConfigError> {
    let Some(raw) = raw.map(str::trim).filter(|s| !s.is_empty()) else {
        return Ok(http::StatusCode::INTERNAL_SERVER_ERROR);
    };
    raw.parse::<u16>()
        .ok()
        .filter(|c| (500..=599).contains(c))
        .and_then(|c| http::StatusCode::from_u16(c).ok())
        .ok_or_else(|| ConfigError::BadFailStatus(raw.to_owned()))
}

/// Parses a `FAIL_RATE` value: absent or empty means 0.
pub fn parse_fail_rate(raw: Option<&str>) -> Result<f64, ConfigError> {
    let Some(raw) = raw.map(str::trim).filter(|s| !s.is_empty()) else {
        return Ok(0.0);
    };
    match raw.parse::<f64>() {
        Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
        _ => Err(ConfigError::BadFailRate(raw.to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fail_status_parsing() {
        assert_eq!(
            parse_fail_status(None),
            Ok(http::StatusCode::INTERNAL_SERVER_ERROR)
        );
        assert_eq!(
            parse_fail_status(Some(" ")),
            Ok(http::StatusCode::INTERNAL_SERVER_ERROR)
        );
        assert_eq!(
            parse_fail_status(Some("503")),
            Ok(http::StatusCode::SERVICE_UNAVAILABLE)
        );
        for bad in ["200", "499", "600", "x"] {
            assert_eq!(
                parse_fail_status(Some(bad)),
                Err(ConfigError::BadFailStatus(bad.to_owned()))
            );
        }
    }

    #[test]
    fn service_names_round_trip() {
        assert_eq!("users".parse::<Service>(), Ok(Service::Users));
        assert_eq!("orders".parse::<Service>(), Ok(Service::Orders));
        assert!(matches!(
            "carts".parse::<Service>(),
            Err(ConfigError::UnknownService(_))
        ));
        assert_eq!(Service::Orders.to_string(), "orders");
    }

    #[test]
    fn fail_rate_parsing() {
        assert_eq!(parse_fail_rate(None), Ok(0.0));
        assert_eq!(parse_fail_rate(Some("")), Ok(0.0));
        assert_eq!(parse_fail_rate(Some("0.25")), Ok(0.25));
        assert_eq!(parse_fail_rate(Some("1")), Ok(1.0));
        assert!(parse_fail_rate(Some("1.5")).is_err());
        assert!(parse_fail_rate(Some("-0.1")).is_err());
        assert!(parse_fail_rate(Some("NaN")).is_err());
        assert!(parse_fail_rate(Some("lots")).is_err());
    }

    #[test]
    fn delay_parsing() {
        let parse = |raw| parse_delay("DELAY_MS", raw);
        assert_eq!(parse(None), Ok(Duration::ZERO));
        assert_eq!(parse(Some(" ")), Ok(Duration::ZERO));
        assert_eq!(parse(Some("250")), Ok(Duration::from_millis(250)));
        assert!(parse(Some("600001")).is_err());
        assert!(parse(Some("-1")).is_err());
        let e = parse_delay("DRAIN_DELAY_MS", Some("slow")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "DRAIN_DELAY_MS must be an integer from 0 to 600000, got \"slow\""
        );
    }

    #[test]
    fn instance_id_must_be_a_header_value() {
        assert!(MockConfig::new(Service::Users, "users-1", 0.0).is_ok());
        assert!(MockConfig::new(Service::Users, "", 0.0).is_err());
        assert!(MockConfig::new(Service::Users, "a b", 0.0).is_err());
        assert!(MockConfig::new(Service::Users, "x", 2.0).is_err());
    }

    #[test]
    fn identity_secret_is_checked_and_never_echoed() {
        let base = MockConfig::new(Service::Users, "users-1", 0.0).unwrap();
        let options = IdentityOptions::default();
        assert!(
            base.clone()
                .with_identity_secret("", &options)
                .unwrap()
                .identity
                .is_none()
        );
        let ok = "k".repeat(32);
        let verifier = base
            .clone()
            .with_identity_secret(&ok, &options)
            .unwrap()
            .identity
            .unwrap();
        // The audience defaults to the service's name.
        assert_eq!(verifier.audience(), "users");
        let named = IdentityOptions {
            audience: Some("users-shadow".into()),
            ..IdentityOptions::default()
        };
        let verifier = base
            .clone()
            .with_identity_secret(&ok, &named)
            .unwrap()
            .identity
            .unwrap();
        assert_eq!(verifier.audience(), "users-shadow");
        let empty = IdentityOptions {
            audience: Some(String::new()),
            ..IdentityOptions::default()
        };
        assert_eq!(
            base.clone().with_identity_secret(&ok, &empty).unwrap_err(),
            ConfigError::EmptyIdentityAudience
        );
        let e = base
            .with_identity_secret("short-secret", &options)
            .unwrap_err();
        assert_eq!(e, ConfigError::BadIdentitySecret(12));
        assert!(!e.to_string().contains("short-secret"));
    }
}
