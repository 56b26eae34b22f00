//! Validation of caller-identity settings: API keys (`ApiKey`,
//! `CreateApiKeyRequest`) and an upstream's `identity_signing_secret`.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};

use super::{MAX_NAME_LEN, ValidationError, Validator, is_valid_name};
use crate::v1::{ApiKey, Upstream};

/// Longest API key subject (forwarded as `X-User-Id`).
pub const MAX_API_KEY_SUBJECT_LEN: usize = 256;
/// Longest API key role (forwarded as `X-User-Role`).
pub const MAX_API_KEY_ROLE_LEN: usize = 64;
/// Shortest accepted `identity_signing_secret`: 32 characters, so a random
/// secret carries at least 128 bits even when written in hex.
pub const MIN_SIGNING_SECRET_LEN: usize = 32;
/// Longest accepted `identity_signing_secret`.
pub const MAX_SIGNING_SECRET_LEN: usize = 256;

/// True for 1 to `max` visible ASCII characters (no space): always a valid header value.
fn is_visible_ascii(s: &str, max: usize) -> bool {
    !s.is_empty() && s.len() <= max && s.bytes().all(|c| c.is_ascii_graphic())
}

/// True for 64 lowercase hex digits (a SHA-256).
pub fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'))
}

/// Checks the caller-given fields of an API key (`CreateApiKey`): name,
/// subject and role. Every problem names the field.
pub fn validate_api_key_fields(
    name: &str,
    subject: &str,
    role: &str,
) -> Result<(), ValidationError> {
    let mut v = Validator::default();
    v.api_key_fields(&format!("api key \"{name}\""), name, subject, role);
    v.finish()
}

/// Checks the API keys of a configuration: fields as in
/// [`validate_api_key_fields`], unique names, and a `key_sha256` on each.
pub fn validate_api_keys(keys: &[ApiKey]) -> Result<(), ValidationError> {
    let mut v = Validator::default();
    let mut names = HashSet::new();
    let mut hashes = HashSet::new();
    for k in keys {
        let who = format!("api key \"{}\"", k.name);
        v.api_key_fields(&who, &k.name, &k.subject, &k.role);
        if !names.insert(k.name.as_str()) {
            v.push(format!("{who}: duplicate name"));
        }
        if !is_sha256_hex(&k.key_sha256) {
            v.push(format!("{who}: key_sha256 must be 64 lowercase hex digits"));
        } else if !hashes.insert(k.key_sha256.as_str()) {
            v.push(format!("{who}: key_sha256 is the same as another key's"));
        }
    }
    v.finish()
}

impl Validator {
    fn api_key_fields(&mut self, who: &str, name: &str, subject: &str, role: &str) {
        if !is_valid_name(name) {
            self.push(format!(
                "{who}: name must match [a-z0-9][a-z0-9-]* and be at most {MAX_NAME_LEN} characters"
            ));
        }
        if !is_visible_ascii(subject, MAX_API_KEY_SUBJECT_LEN) {
            self.push(format!(
                "{who}: subject must be 1 to {MAX_API_KEY_SUBJECT_LEN} visible ASCII characters (no spaces)"
            ));
        }
        if subject.starts_with(super::MTLS_SUBJECT_PREFIX) {
            self.push(format!(
                "{who}: subject must not start with \"{}\", which names client-certificate callers",
                super::MTLS_SUBJECT_PREFIX
            ));
        }
        if !is_visible_ascii(role, MAX_API_KEY_ROLE_LEN) {
            self.push(format!(
                "{who}: role must be 1 to {MAX_API_KEY_ROLE_LEN} visible ASCII characters (no spaces)"
            ));
        }
    }

    /// The identity-signing fields of upstream `u`. The secret itself never
    /// appears in a message.
    pub(super) fn identity_signing(&mut self, who: &str, u: &Upstream) {
        let secret = &u.identity_signing_secret;
        let valid = secret.len() >= MIN_SIGNING_SECRET_LEN
            && is_visible_ascii(secret, MAX_SIGNING_SECRET_LEN);
        if !secret.is_empty() && !valid {
            self.push(format!(
                "{who}: identity_signing_secret must be {MIN_SIGNING_SECRET_LEN} to {MAX_SIGNING_SECRET_LEN} visible ASCII characters (got {} characters)",
                secret.chars().count()
            ));
        }
        if !secret.is_empty() && u.clear_identity_signing_secret {
            self.push(format!(
                "{who}: identity_signing_secret and clear_identity_signing_secret cannot both be set"
            ));
        }
    }

    /// One `identity_signing_secret` per upstream: with a secret shared, a
    /// backend of one upstream (a shadow that gets mirror copies, say) could
    /// sign requests the other accepts. v3 signatures bind the upstream's
    /// name, so they cannot be replayed across upstreams; a shared secret
    /// would still let one upstream's backends forge the other's. Compared
    /// after the control plane has put kept secrets back (an empty secret in
    /// an input keeps the stored one), so it sees the secrets in force; the
    /// secret itself never appears in the message.
    pub(super) fn distinct_signing_secrets(&mut self, upstreams: &[Upstream]) {
        let mut first: HashMap<&str, &str> = HashMap::new();
        for u in upstreams {
            let secret = u.identity_signing_secret.as_str();
            if secret.is_empty() {
                continue;
            }
            match first.entry(secret) {
                Entry::Vacant(e) => {
                    e.insert(u.name.as_str());
                }
                Entry::Occupied(e) => self.push(format!(
                    "upstream \"{}\": identity_signing_secret is the same as upstream \"{}\"'s: give each upstream its own secret",
                    u.name,
                    e.get()
                )),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1::Instance;

    fn key(name: &str, hash: &str) -> ApiKey {
        ApiKey {
            name: name.into(),
            subject: "svc-billing".into(),
            role: "service".into(),
            key_sha256: hash.into(),
            ..Default::default()
        }
    }

    #[test]
    fn api_key_fields_name_every_bad_field() {
        assert!(validate_api_key_fields("ci-bot", "user:42", "admin").is_ok());
        let e = validate_api_key_fields("Bad Name", "", "a b").unwrap_err();
        let text = e.to_string();
        assert_eq!(e.problems.len(), 3, "{text}");
        assert!(
            text.contains("api key \"Bad Name\": name must match"),
            "{text}"
        );
        assert!(text.contains("subject must be 1 to 256"), "{text}");
        assert!(text.contains("role must be 1 to 64"), "{text}");
        let long = "x".repeat(MAX_API_KEY_SUBJECT_LEN + 1);
        assert!(validate_api_key_fields("k", &long, "r").is_err());
        assert!(validate_api_key_fields("k", &"x".repeat(256), &"r".repeat(64)).is_ok());
        assert!(validate_api_key_fields("k", "s", &"r".repeat(65)).is_err());
        assert!(validate_api_key_fields("k", "caf\u{e9}", "r").is_err());
    }

    #[test]
    fn stored_keys_need_a_hash_and_unique_names_and_hashes() {
        let h1 = "a".repeat(64);
        let h2 = "b".repeat(64);
        assert!(validate_api_keys(&[key("a", &h1), key("b", &h2)]).is_ok());
        let e = validate_api_keys(&[key("a", &h1), key("a", &h2)]).unwrap_err();
        assert!(
            e.to_string().contains("api key \"a\": duplicate name"),
            "{e}"
        );
        let e = validate_api_keys(&[key("a", &h1), key("b", &h1)]).unwrap_err();
        assert!(e.to_string().contains("the same as another key's"), "{e}");
        for bad in [
            "",
            "A".repeat(64).as_str(),
            &"a".repeat(63),
            &"g".repeat(64),
        ] {
            let e = validate_api_keys(&[key("a", bad)]).unwrap_err();
            assert!(
                e.to_string()
                    .contains("key_sha256 must be 64 lowercase hex"),
                "{e}"
            );
        }
    }

    fn upstream(secret: &str, clear: bool) -> Upstream {
        Upstream {
            name: "u".into(),
            instances: vec![Instance {
                id: "i".into(),
                url: "http://127.0.0.1:1".into(),
                ..Default::default()
            }],
            identity_signing_secret: secret.into(),
            clear_identity_signing_secret: clear,
            ..Default::default()
        }
    }

    #[test]
    fn signing_secret_length_and_characters() {
        let ok = "s".repeat(MIN_SIGNING_SECRET_LEN);
        assert!(crate::validate_config(&[], &[upstream("", false)]).is_ok());
        assert!(crate::validate_config(&[], &[upstream(&ok, false)]).is_ok());
        assert!(crate::validate_config(&[], &[upstream(&"s".repeat(256), false)]).is_ok());
        for bad in [
            "s".repeat(31),
            "s".repeat(257),
            format!("{} x", "s".repeat(40)),
        ] {
            let e = crate::validate_config(&[], &[upstream(&bad, false)]).unwrap_err();
            let text = e.to_string();
            assert!(
                text.contains("upstream \"u\": identity_signing_secret must be 32 to 256"),
                "{text}"
            );
            // The message never repeats the secret.
            assert!(!text.contains(&bad), "{text}");
        }
        let e = crate::validate_config(&[], &[upstream(&ok, true)]).unwrap_err();
        assert!(e.to_string().contains("cannot both be set"), "{e}");
        assert!(crate::validate_config(&[], &[upstream("", true)]).is_ok());
    }

    #[test]
    fn one_secret_on_two_upstreams_is_refused_naming_both() {
        let named = |name: &str, secret: &str| Upstream {
            name: name.into(),
            ..upstream(secret, false)
        };
        let shared = "shared-0123456789abcdef0123456789abcdef";
        let own = "own-0123456789abcdef0123456789abcdef";
        // Each its own secret, or none: accepted.
        let fine = [
            named("users", shared),
            named("users-shadow", own),
            named("orders", ""),
            named("billing", ""),
        ];
        assert!(crate::validate_config(&[], &fine).is_ok());
        // The same secret on a primary and its shadow (and a third): each later one named with the first.
        let e = crate::validate_config(
            &[],
            &[
                named("users", shared),
                named("users-shadow", shared),
                named("zeta", shared),
            ],
        )
        .unwrap_err();
        let text = e.to_string();
        assert_eq!(e.problems.len(), 2, "{text}");
        assert!(
            text.contains(
                "upstream \"users-shadow\": identity_signing_secret is the same as upstream \"users\"'s: give each upstream its own secret"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "upstream \"zeta\": identity_signing_secret is the same as upstream \"users\"'s"
            ),
            "{text}"
        );
        // The message never repeats the secret.
        assert!(!text.contains(shared), "{text}");
    }
}
