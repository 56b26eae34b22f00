//! Refresh tokens: opaque, 256-bit random, rotated on every use, grouped in families.
//!
//! Redis layout (only SHA-256 hashes of tokens are stored, never the tokens):
//! * `auth:{<tag>}:fam:<family>` — hash `{current, sub, role, expires_at, revoked}`; expires
//!   with the family.
//! * `auth:{<tag>}:rt:<sha256 hex>` — the family of every token ever issued in it, so a
//!   replayed (already consumed) token can still be traced to its family and burn it.
//!
//! `<tag>` is the family id's first 8 hex digits, and every token of the family starts with
//! those 4 bytes (then 28 random ones: still 32 bytes, 43 base64url characters). So a token
//! names its family's hash tag: on Redis Cluster a family and all its tokens share one slot,
//! and each script below touches one slot only. Families created before this layout
//! (`auth:fam:<family>`, `auth:rt:<hash>`, found when the tagged lookup misses) keep working
//! on one Redis until they expire (7 days); they rotate within the old layout.
//!
//! A family lives at most [`REFRESH_TOKEN_TTL_SECS`] from login; rotation never extends it.
//! Consumption is one Lua script (`lua/rotate.lua`), so two concurrent refreshes of one token
//! cannot both win.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use gateway_redis::RedisConnection;
use redis::Script;
use sha2::{Digest as _, Sha256};

/// Absolute lifetime of a refresh-token family: 7 days from login.
pub const REFRESH_TOKEN_TTL_SECS: u64 = 7 * 24 * 3600;

const PREFIX: &str = "auth:";

/// The user a family belongs to and when it ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    /// Family id (random, 128 bits, hex).
    pub family: String,
    /// Token subject.
    pub sub: String,
    /// Role at login.
    pub role: String,
    /// Absolute expiry (Unix seconds).
    pub expires_at: u64,
}

/// A freshly issued refresh token.
#[derive(Debug, Clone)]
pub struct IssuedRefresh {
    /// The opaque token handed to the client.
    pub token: String,
    /// Its family.
    pub session: Session,
}

/// Why a refresh was refused (all of them are a 401 to the client).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rejection {
    /// Never issued, malformed, or its family expired and was purged.
    Unknown,
    /// An already consumed token: the family has now been revoked.
    Reused {
        /// The burnt family.
        family: String,
    },
    /// The family was revoked earlier (logout or reuse).
    Revoked {
        /// The family.
        family: String,
    },
    /// The family's absolute lifetime is over.
    Expired {
        /// The family.
        family: String,
    },
}

/// Result of presenting a refresh token.
#[derive(Debug, Clone)]
pub enum RotateOutcome {
    /// The token was consumed and a successor issued in the same family.
    Rotated(IssuedRefresh),
    /// The token was refused.
    Rejected(Rejection),
}

/// Redis failed or answered something unexpected.
#[derive(Debug, thiserror::Error)]
pub enum RefreshError {
    /// Redis command failed (down, timeout, ...).
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// A script returned a shape this code does not know.
    #[error("unexpected reply from refresh script: {0:?}")]
    UnexpectedReply(Vec<String>),
}

/// Refresh-token families in Redis.
#[derive(Clone)]
pub struct RefreshStore {
    conn: RedisConnection,
    create: Script,
    rotate: Script,
    revoke: Script,
}

impl std::fmt::Debug for RefreshStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RefreshStore").finish_non_exhaustive()
    }
}

/// Hex SHA-256 of a token: what Redis stores instead of the token.
pub fn token_hash(token: &str) -> String {
    gateway_hex::encode(Sha256::digest(token.as_bytes()))
}

/// Bytes of a token (and of its family id) that name the family's hash tag.
const TAG_BYTES: usize = 4;

/// A new token of the family whose id starts with `tag`: the tag's bytes, then random ones.
fn new_token(tag: [u8; TAG_BYTES]) -> (String, String) {
    let mut bytes: [u8; 32] = rand::random();
    bytes[..TAG_BYTES].copy_from_slice(&tag);
    let token = URL_SAFE_NO_PAD.encode(bytes);
    let hash = token_hash(&token);
    (token, hash)
}

/// The 32 bytes of `token` if it has the shape of one we issue (43 base64url characters).
fn decode(token: &str) -> Option<[u8; 32]> {
    if token.len() != 43 {
        return None;
    }
    URL_SAFE_NO_PAD.decode(token).ok()?.try_into().ok()
}

/// Where a family's keys live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    /// `auth:{<tag>}:…`: one slot per family.
    Tagged,
    /// `auth:fam:…`, `auth:rt:…`: families created before the tags.
    Legacy,
}

/// The hash tag of a family: its id's first [`TAG_BYTES`] bytes, in hex.
fn tag_of(family: &str) -> &str {
    family.get(..2 * TAG_BYTES).unwrap_or(family)
}

fn family_key(layout: Layout, family: &str) -> String {
    match layout {
        Layout::Tagged => format!("{PREFIX}{{{}}}:fam:{family}", tag_of(family)),
        Layout::Legacy => format!("{PREFIX}fam:{family}"),
    }
}

fn token_key(layout: Layout, tag: &str, hash: &str) -> String {
    match layout {
        Layout::Tagged => format!("{PREFIX}{{{tag}}}:rt:{hash}"),
        Layout::Legacy => format!("{PREFIX}rt:{hash}"),
    }
}

/// The tag bytes of a family id (random ones for a legacy id that is not hex).
fn tag_bytes(family: &str) -> [u8; TAG_BYTES] {
    let mut tag = [0; TAG_BYTES];
    if gateway_hex::decode_to_slice(tag_of(family), &mut tag).is_err() {
        tag = rand::random();
    }
    tag
}

impl RefreshStore {
    /// Wraps the process's one Redis connection.
    pub fn new(conn: RedisConnection) -> Self {
        Self {
            conn,
            create: Script::new(include_str!("lua/create_family.lua")),
            rotate: Script::new(include_str!("lua/rotate.lua")),
            revoke: Script::new(include_str!("lua/revoke_family.lua")),
        }
    }

    /// Starts a new family at login and returns its first token.
    pub async fn create(
        &self,
        sub: &str,
        role: &str,
        now: u64,
    ) -> Result<IssuedRefresh, RefreshError> {
        let family = gateway_hex::encode(rand::random::<[u8; 16]>());
        let (token, hash) = new_token(tag_bytes(&family));
        let expires_at = now + REFRESH_TOKEN_TTL_SECS;
        let _: i64 = self
            .create
            .key(family_key(Layout::Tagged, &family))
            .key(token_key(Layout::Tagged, tag_of(&family), &hash))
            .arg(&hash)
            .arg(sub)
            .arg(role)
            .arg(expires_at)
            .arg(&family)
            .arg(REFRESH_TOKEN_TTL_SECS)
            .invoke_async(&mut self.conn.clone())
            .await?;
        Ok(IssuedRefresh {
            token,
            session: Session {
                family,
                sub: sub.to_owned(),
                role: role.to_owned(),
                expires_at,
            },
        })
    }

    /// The family of `token` and where its keys live, if it was ever issued.
    async fn family_of(&self, token: &str) -> Result<Option<(String, Layout)>, RefreshError> {
        let Some(bytes) = decode(token) else {
            return Ok(None);
        };
        let hash = token_hash(token);
        let tag = gateway_hex::encode(&bytes[..TAG_BYTES]);
        for layout in [Layout::Tagged, Layout::Legacy] {
            let family: Option<String> = redis::cmd("GET")
                .arg(token_key(layout, &tag, &hash))
                .query_async(&mut self.conn.clone())
                .await?;
            if let Some(family) = family {
                return Ok(Some((family, layout)));
            }
        }
        Ok(None)
    }

    /// Consumes `token` and issues its successor, or says why not. A consumed token presented
    /// again revokes its whole family.
    pub async fn rotate(&self, token: &str, now: u64) -> Result<RotateOutcome, RefreshError> {
        // The token -> family mapping never changes once written, so reading it outside the
        // script is safe; the decision itself happens atomically inside the script.
        let Some((family, layout)) = self.family_of(token).await? else {
            return Ok(RotateOutcome::Rejected(Rejection::Unknown));
        };
        let (new_token, new_hash) = new_token(tag_bytes(&family));
        let reply: Vec<String> = self
            .rotate
            .key(family_key(layout, &family))
            .key(token_key(layout, tag_of(&family), &new_hash))
            .arg(token_hash(token))
            .arg(&new_hash)
            .arg(now)
            .arg(&family)
            .invoke_async(&mut self.conn.clone())
            .await?;
        let rejected = |r| Ok(RotateOutcome::Rejected(r));
        match reply.first().map(String::as_str) {
            Some("rotated") if reply.len() == 4 => {
                let expires_at = reply[3]
                    .parse()
                    .map_err(|_| RefreshError::UnexpectedReply(reply.clone()))?;
                Ok(RotateOutcome::Rotated(IssuedRefresh {
                    token: new_token,
                    session: Session {
                        family,
                        sub: reply[1].clone(),
                        role: reply[2].clone(),
                        expires_at,
                    },
                }))
            }
            Some("unknown") => rejected(Rejection::Unknown),
            Some("revoked") => rejected(Rejection::Revoked { family }),
            Some("expired") => rejected(Rejection::Expired { family }),
            Some("reused") => rejected(Rejection::Reused { family }),
            _ => Err(RefreshError::UnexpectedReply(reply)),
        }
    }

    /// Revokes the family of `token` (logout). Returns the family if the token was known.
    pub async fn revoke(&self, token: &str) -> Result<Option<String>, RefreshError> {
        let Some((family, layout)) = self.family_of(token).await? else {
            return Ok(None);
        };
        self.revoke_in(layout, &family).await?;
        Ok(Some(family))
    }

    /// Revokes a family by id.
    pub async fn revoke_family(&self, family: &str) -> Result<bool, RefreshError> {
        if self.revoke_in(Layout::Tagged, family).await? {
            return Ok(true);
        }
        self.revoke_in(Layout::Legacy, family).await
    }

    async fn revoke_in(&self, layout: Layout, family: &str) -> Result<bool, RefreshError> {
        let existed: i64 = self
            .revoke
            .key(family_key(layout, family))
            .invoke_async(&mut self.conn.clone())
            .await?;
        Ok(existed == 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{RedisServer, connection_manager, start_redis};

    async fn store() -> (RedisServer, RefreshStore) {
        let redis = start_redis().await;
        let conn = connection_manager(&redis);
        (redis, RefreshStore::new(conn))
    }

    fn rotated(o: RotateOutcome) -> IssuedRefresh {
        match o {
            RotateOutcome::Rotated(i) => i,
            RotateOutcome::Rejected(r) => panic!("expected rotation, got {r:?}"),
        }
    }

    fn rejected(o: RotateOutcome) -> Rejection {
        match o {
            RotateOutcome::Rejected(r) => r,
            RotateOutcome::Rotated(i) => {
                panic!("expected rejection, got rotation in {}", i.session.family)
            }
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn rotation_keeps_the_family_and_its_expiry() {
        let (_r, s) = store().await;
        let now = 1_700_000_000;
        let first = s.create("alice", "user", now).await.unwrap();
        assert_eq!(first.token.len(), 43);
        let second = rotated(s.rotate(&first.token, now + 10).await.unwrap());
        assert_eq!(
            second.session, first.session,
            "same family, sub, role and absolute expiry"
        );
        assert_ne!(second.token, first.token);
        let third = rotated(s.rotate(&second.token, now + 20).await.unwrap());
        assert_eq!(third.session.expires_at, now + REFRESH_TOKEN_TTL_SECS);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn redis_stores_only_hashes() {
        let (r, s) = store().await;
        let issued = s.create("alice", "user", 1_700_000_000).await.unwrap();
        let mut conn = connection_manager(&r);
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg("*")
            .query_async(&mut conn)
            .await
            .unwrap();
        let mut everything = keys.join(" ");
        for k in &keys {
            let t: String = redis::cmd("TYPE")
                .arg(k)
                .query_async(&mut conn)
                .await
                .unwrap();
            if t == "hash" {
                let v: Vec<String> = redis::cmd("HGETALL")
                    .arg(k)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                everything.push_str(&v.join(" "));
            } else {
                let v: String = redis::cmd("GET")
                    .arg(k)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                everything.push_str(&v);
            }
        }
        assert!(
            !everything.contains(&issued.token),
            "plaintext token in redis"
        );
        assert!(everything.contains(&token_hash(&issued.token)));
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_family_and_all_its_tokens_share_one_cluster_slot() {
        use redis::cluster_routing::Slot;
        let (r, s) = store().await;
        let now = 1_700_000_000;
        let mut slots = Vec::new();
        for _ in 0..3 {
            let first = s.create("alice", "user", now).await.unwrap();
            let family = first.session.family.clone();
            let second = rotated(s.rotate(&first.token, now).await.unwrap());
            rotated(s.rotate(&second.token, now).await.unwrap());
            let mut conn = connection_manager(&r);
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg(format!("auth:{{{}}}:*", &family[..8]))
                .query_async(&mut conn)
                .await
                .unwrap();
            // The family's hash and its three tokens' mappings.
            assert_eq!(keys.len(), 4, "{keys:?}");
            let slot = Slot::for_key(&keys[0]);
            assert!(keys.iter().all(|k| Slot::for_key(k) == slot), "{keys:?}");
            assert!(keys.contains(&family_key(Layout::Tagged, &family)));
            slots.push(slot);
        }
        // Families are spread over slots (their tags are random).
        assert!(slots[0] != slots[1] || slots[1] != slots[2], "{slots:?}");
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn families_of_the_untagged_layout_still_rotate_and_revoke() {
        let (r, s) = store().await;
        let now = 1_700_000_000;
        // A family as the previous release wrote it.
        let family = "00112233445566778899aabbccddeeff";
        let token = URL_SAFE_NO_PAD.encode([7u8; 32]);
        let mut conn = connection_manager(&r);
        let _: () = redis::cmd("HSET")
            .arg(format!("auth:fam:{family}"))
            .arg(
                &[
                    "current",
                    &token_hash(&token),
                    "sub",
                    "alice",
                    "role",
                    "user",
                ][..],
            )
            .arg(&["expires_at", &(now + 100).to_string(), "revoked", "0"][..])
            .query_async(&mut conn)
            .await
            .unwrap();
        let _: () = redis::cmd("SET")
            .arg(format!("auth:rt:{}", token_hash(&token)))
            .arg(family)
            .query_async(&mut conn)
            .await
            .unwrap();
        let next = rotated(s.rotate(&token, now).await.unwrap());
        assert_eq!(next.session.family, family);
        assert_eq!(next.session.expires_at, now + 100);
        assert_eq!(
            rejected(s.rotate(&token, now).await.unwrap()),
            Rejection::Reused {
                family: family.into()
            }
        );
        let fresh = s.create("alice", "user", now).await.unwrap();
        assert_eq!(
            s.revoke(&fresh.token).await.unwrap(),
            Some(fresh.session.family)
        );
        assert!(s.revoke_family(family).await.unwrap());
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn reuse_revokes_the_whole_family() {
        let (_r, s) = store().await;
        let now = 1_700_000_000;
        let first = s.create("alice", "user", now).await.unwrap();
        let second = rotated(s.rotate(&first.token, now).await.unwrap());
        // Replaying the consumed token burns the family...
        let family = first.session.family.clone();
        assert_eq!(
            rejected(s.rotate(&first.token, now).await.unwrap()),
            Rejection::Reused {
                family: family.clone()
            }
        );
        // ...so the legitimate newest token is refused too.
        assert_eq!(
            rejected(s.rotate(&second.token, now).await.unwrap()),
            Rejection::Revoked { family }
        );
        // Another login is unaffected.
        let other = s.create("alice", "user", now).await.unwrap();
        rotated(s.rotate(&other.token, now).await.unwrap());
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn concurrent_refreshes_of_one_token_have_exactly_one_winner() {
        let (_r, s) = store().await;
        let now = 1_700_000_000;
        for _ in 0..10 {
            let t = s.create("alice", "user", now).await.unwrap().token;
            let attempts = (0..8).map(|_| {
                let (s, t) = (s.clone(), t.clone());
                tokio::spawn(async move { s.rotate(&t, now).await.unwrap() })
            });
            let mut wins = 0;
            for a in attempts {
                if matches!(a.await.unwrap(), RotateOutcome::Rotated(_)) {
                    wins += 1;
                }
            }
            assert_eq!(wins, 1);
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn family_expiry_is_absolute() {
        let (_r, s) = store().await;
        let now = 1_700_000_000;
        let first = s.create("alice", "user", now).await.unwrap();
        let late = now + REFRESH_TOKEN_TTL_SECS - 1;
        let second = rotated(s.rotate(&first.token, late).await.unwrap());
        assert_eq!(
            rejected(
                s.rotate(&second.token, now + REFRESH_TOKEN_TTL_SECS)
                    .await
                    .unwrap()
            ),
            Rejection::Expired {
                family: first.session.family
            }
        );
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn logout_revokes_and_unknown_tokens_are_rejected() {
        let (_r, s) = store().await;
        let now = 1_700_000_000;
        let first = s.create("alice", "user", now).await.unwrap();
        let second = rotated(s.rotate(&first.token, now).await.unwrap());
        assert_eq!(
            s.revoke(&first.token).await.unwrap(),
            Some(first.session.family.clone())
        );
        assert!(matches!(
            rejected(s.rotate(&second.token, now).await.unwrap()),
            Rejection::Revoked { .. }
        ));

        for bad in [
            "",
            "short",
            &"A".repeat(43),
            &"!".repeat(43),
            &format!("{}x", second.token),
        ] {
            assert_eq!(
                rejected(s.rotate(bad, now).await.unwrap()),
                Rejection::Unknown,
                "{bad:?}"
            );
            assert_eq!(s.revoke(bad).await.unwrap(), None);
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn redis_down_is_an_error_not_a_rejection() {
        let (mut r, s) = store().await;
        r.kill().await;
        let err = s.create("alice", "user", 1).await.unwrap_err();
        assert!(matches!(err, RefreshError::Redis(_)), "{err}");
    }
}
