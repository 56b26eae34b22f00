//! Signed-in console sessions: a random id in a cookie, the caller and the
//! session's CSRF token kept here (in memory: a restart signs everyone out).
//!
//! The cookie is `HttpOnly` (no script may read it; the console has none
//! anyway), `SameSite=Strict` (no other site's page sends it), `Path=/`, and
//! `Secure` when the console is served over TLS. A session ends after
//! [`IDLE_TIMEOUT`] without a request, [`MAX_AGE`] after sign-in, or at sign-out.
//! Only the id's SHA-256 is kept, so the map holds nothing a browser could present.

use parking_lot::Mutex;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::time::Duration;
use tokio::time::Instant;

use crate::auth::Caller;
use crate::console::csrf;

/// The session cookie's name.
pub const COOKIE: &str = "console_session";
/// A session unused this long is over.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// A session is over this long after its sign-in, used or not.
pub const MAX_AGE: Duration = Duration::from_secs(8 * 60 * 60);
/// At most this many live sessions; the oldest goes first beyond it.
const MAX_SESSIONS: usize = 10_000;

/// What a request's session says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Session {
    /// Who signed in.
    pub caller: Caller,
    /// The token every state-changing form of this session carries.
    pub csrf: String,
}

#[derive(Debug)]
struct Entry {
    session: Session,
    created: Instant,
    last_used: Instant,
}

impl Entry {
    fn live(&self, now: Instant) -> bool {
        now.duration_since(self.created) < MAX_AGE
            && now.duration_since(self.last_used) < IDLE_TIMEOUT
    }
}

/// The live sessions, by the SHA-256 of their id.
#[derive(Debug, Default)]
pub struct Sessions {
    entries: Mutex<HashMap<[u8; 32], Entry>>,
}

fn digest(id: &str) -> [u8; 32] {
    Sha256::digest(id.as_bytes()).into()
}

impl Sessions {
    /// Starts a session for `caller`; returns the cookie value (the id) and the session.
    pub fn create(&self, caller: Caller) -> (String, Session) {
        let id = gateway_hex::encode(rand::random::<[u8; 32]>());
        let session = Session {
            caller,
            csrf: csrf::new_token(),
        };
        let now = Instant::now();
        let mut entries = self.entries.lock();
        entries.retain(|_, e| e.live(now));
        if entries.len() >= MAX_SESSIONS
            && let Some(oldest) = entries
                .iter()
                .min_by_key(|(_, e)| e.created)
                .map(|(k, _)| *k)
        {
            entries.remove(&oldest);
        }
        entries.insert(
            digest(&id),
            Entry {
                session: session.clone(),
                created: now,
                last_used: now,
            },
        );
        (id, session)
    }

    /// The live session with cookie value `id`, which counts as used now.
    pub fn get(&self, id: &str) -> Option<Session> {
        let now = Instant::now();
        let key = digest(id);
        let mut entries = self.entries.lock();
        let entry = entries.get_mut(&key)?;
        if !entry.live(now) {
            entries.remove(&key);
            return None;
        }
        entry.last_used = now;
        Some(entry.session.clone())
    }

    /// Ends the session with cookie value `id` (sign-out).
    pub fn remove(&self, id: &str) {
        self.entries.lock().remove(&digest(id));
    }
}

/// The `Set-Cookie` value that starts a session.
pub fn set_cookie(id: &str, tls: bool) -> String {
    format!(
        "{COOKIE}={id}; Path=/; Max-Age={}; HttpOnly; SameSite=Strict{}",
        MAX_AGE.as_secs(),
        if tls { "; Secure" } else { "" }
    )
}

/// The `Set-Cookie` value that removes a cookie named `name`.
pub fn clear_cookie(name: &str, tls: bool) -> String {
    format!(
        "{name}=; Path=/; Max-Age=0; HttpOnly; SameSite=Strict{}",
        if tls { "; Secure" } else { "" }
    )
}

/// The value of cookie `name` in the request's `Cookie` headers.
pub fn cookie<'h>(headers: &'h http::HeaderMap, name: &str) -> Option<&'h str> {
    headers
        .get_all(http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(n, _)| *n == name)
        .map(|(_, v)| v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::Role;

    fn alice() -> Caller {
        Caller {
            name: "alice".into(),
            role: Role::Viewer,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn sessions_expire_when_idle_and_at_their_max_age() {
        let sessions = Sessions::default();
        let (id, s) = sessions.create(alice());
        assert_eq!(id.len(), 64);
        assert_eq!(sessions.get(&id), Some(s.clone()));
        assert_eq!(sessions.get("other"), None);
        // Used every 20 minutes: alive until the 8 hours are over.
        for _ in 0..23 {
            tokio::time::advance(Duration::from_secs(20 * 60)).await;
            assert!(sessions.get(&id).is_some());
        }
        tokio::time::advance(Duration::from_secs(20 * 60)).await;
        assert_eq!(sessions.get(&id), None);

        let (idle, _) = sessions.create(alice());
        tokio::time::advance(IDLE_TIMEOUT).await;
        assert_eq!(sessions.get(&idle), None);

        let (gone, _) = sessions.create(alice());
        sessions.remove(&gone);
        assert_eq!(sessions.get(&gone), None);
    }

    #[test]
    fn cookies_have_the_attributes_and_are_found_among_others() {
        assert_eq!(
            set_cookie("abc", false),
            "console_session=abc; Path=/; Max-Age=28800; HttpOnly; SameSite=Strict"
        );
        assert!(set_cookie("abc", true).ends_with("; SameSite=Strict; Secure"));
        assert!(clear_cookie(COOKIE, false).starts_with("console_session=; Path=/; Max-Age=0"));
        let mut h = http::HeaderMap::new();
        h.append(
            http::header::COOKIE,
            "a=1; console_session=xyz".parse().unwrap(),
        );
        assert_eq!(cookie(&h, COOKIE), Some("xyz"));
        assert_eq!(cookie(&h, "b"), None);
    }
}
