//! Cross-site request forgery: every state-changing form carries a token
//! that a forged request from another site cannot know.
//!
//! * Signed in: the session's own token (made with the session, kept with it,
//!   [`crate::console::session`]), in a hidden `csrf` field of every form.
//! * The sign-in form has no session yet: it carries the value of a
//!   short-lived [`SIGNIN_COOKIE`] set when the form was shown (double
//!   submit), so another site cannot sign a browser in with its own token.
//!
//! A POST whose token is missing or differs is refused with 403, before anything
//! else is looked at. Tokens are compared in constant time.

use sha2::{Digest, Sha256};

/// The form field every state-changing form carries.
pub const FIELD: &str = "csrf";
/// The cookie that pairs a sign-in form with the browser that was shown it.
pub const SIGNIN_COOKIE: &str = "console_signin";
/// How long a sign-in form stays usable (seconds).
pub const SIGNIN_MAX_AGE: u64 = 10 * 60;

/// A fresh random token (32 bytes, hex).
pub fn new_token() -> String {
    gateway_hex::encode(rand::random::<[u8; 32]>())
}

/// Whether `presented` is `expected`; empty never matches. Compares the
/// SHA-256 of both, so the time taken says nothing about where they differ
/// (nor about the length).
pub fn matches(expected: &str, presented: Option<&str>) -> bool {
    let Some(presented) = presented.filter(|p| !p.is_empty()) else {
        return false;
    };
    if expected.is_empty() {
        return false;
    }
    let a: [u8; 32] = Sha256::digest(expected.as_bytes()).into();
    let b: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
    a.iter().zip(&b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The `Set-Cookie` value of a new sign-in form's token.
pub fn signin_cookie(token: &str, tls: bool) -> String {
    format!(
        "{SIGNIN_COOKIE}={token}; Path=/; Max-Age={SIGNIN_MAX_AGE}; HttpOnly; SameSite=Strict{}",
        if tls { "; Secure" } else { "" }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_same_non_empty_token_matches() {
        let t = new_token();
        assert_eq!(t.len(), 64);
        assert_ne!(t, new_token());
        assert!(matches(&t, Some(&t)));
        assert!(!matches(&t, Some(&t[1..])));
        assert!(!matches(&t, None));
        assert!(!matches(&t, Some("")));
        assert!(!matches("", Some("")));
    }

    #[test]
    fn the_signin_cookie_is_short_lived_and_strict() {
        let c = signin_cookie("tok", true);
        assert_eq!(
            c,
            "console_signin=tok; Path=/; Max-Age=600; HttpOnly; SameSite=Strict; Secure"
        );
    }
}
