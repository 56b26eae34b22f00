//! The harness of the `jwt` fuzz target (`fuzz/`, run by `scripts/fuzz`) and
//! of its regression test in the data plane
//! (`data-plane/tests/fuzz_regressions.rs`). Not part of the crate's API.

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use http::HeaderMap;
use http::header::AUTHORIZATION;
use jsonwebtoken::{DecodingKey, EncodingKey};

use super::*;
use crate::{bearer_candidate, bearer_token, is_b64token};
use gateway_clock::ManualClock;

/// The verifier's clock (2027-01-15): seeds' tokens expire after it.
const NOW: u64 = 1_800_000_000;
/// The Ed25519 key pair of RFC 8032 §7.1, test 1: PKCS#8 of the private key,
/// and the public key as a JWK's `x`.
const PRIVATE_PKCS8: [u8; 48] = [
    0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20,
    0x9d, 0x61, 0xb1, 0x9d, 0xef, 0xfd, 0x5a, 0x60, 0xba, 0x84, 0x4a, 0xf4, 0x92, 0xec, 0x2c, 0xc4,
    0x44, 0x49, 0xc5, 0x69, 0x7b, 0x32, 0x69, 0x19, 0x70, 0x3b, 0xac, 0x03, 0x1c, 0xae, 0x7f, 0x60,
];
const PUBLIC_X: &str = "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo";

/// Reads `data` as an `Authorization` value's token and as a JWKS document;
/// then verifies a token: `data` itself, or, when it holds a NUL byte, the
/// JSON header before it and the JSON claims after it, signed with the key the
/// verifier knows under whatever `kid` the header names (so that the claims
/// checks are reached at all).
///
/// Holds: a bearer token is trimmed, non-empty and, from [`bearer_token`],
/// made of token characters; verification never waits on a JWKS fetch when
/// the `kid` is known; it accepts only a token whose header says `EdDSA`,
/// whose `iss`, `aud`, `sub`, `role`, `exp` and `nbf` hold at the clock's
/// time, and whose identity is its claims; and a second verification is a
/// cache hit with the same identity, as a refusal is never cached.
pub fn token(data: &[u8]) {
    bearer(data);
    let _ = crate::jwks::parse_jwks(data, AlgSet::of(&crate::SUPPORTED_ALGORITHMS));
    let token = match data.iter().position(|&b| b == 0) {
        Some(at) => signed(&data[..at], &data[at + 1..]),
        None => match std::str::from_utf8(data) {
            Ok(token) => token.to_owned(),
            Err(_) => return,
        },
    };
    verify(&token);
}

fn bearer(data: &[u8]) {
    let Ok(value) = http::HeaderValue::from_bytes(data) else {
        return;
    };
    let mut headers = HeaderMap::new();
    headers.insert(AUTHORIZATION, value.clone());
    if let Some(candidate) = bearer_candidate(&headers) {
        assert!(!candidate.is_empty());
        assert_eq!(candidate, candidate.trim_matches(' '), "trimmed");
        assert!(data[..7].eq_ignore_ascii_case(b"bearer "));
    }
    if let Some(token) = bearer_token(&headers) {
        assert!(is_b64token(token));
    }
    headers.append(AUTHORIZATION, value);
    assert_eq!(bearer_candidate(&headers), None, "two Authorization fields");
}

/// `header.claims.signature`, signed with [`PRIVATE_PKCS8`].
fn signed(header: &[u8], claims: &[u8]) -> String {
    let message = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(header),
        URL_SAFE_NO_PAD.encode(claims)
    );
    let key = EncodingKey::from_ed_der(&PRIVATE_PKCS8);
    let signature =
        jsonwebtoken::crypto::sign(message.as_bytes(), &key, Algorithm::EdDSA).expect("signs");
    format!("{message}.{signature}")
}

/// Verifies `token` and checks what is said on [`token`]; whether it was accepted.
fn verify(token: &str) -> bool {
    let config = JwtConfig {
        cache_capacity: 16,
        ..JwtConfig::default()
    };
    let leeway = config.leeway.as_secs();
    let clock = Arc::new(ManualClock::new(Duration::from_secs(NOW)));
    // Outside a runtime: no background refresh starts.
    let verifier = JwtVerifier::with_clock(config, clock).expect("the default settings");
    if let Ok((_, kid)) = check_header(token, AlgSet::of(&[Algorithm::EdDSA])) {
        let decoding = DecodingKey::from_ed_components(PUBLIC_X).expect("a public key");
        let key = Key {
            decoding,
            algs: AlgSet::of(&[Algorithm::EdDSA]),
        };
        let mut keys = KeySet::new();
        keys.insert(kid.unwrap_or_default().into(), Arc::new(key));
        *verifier.inner.keys.write() = Arc::new(keys);
    }
    let Ok(identity) = at_once(verifier.verify(token)) else {
        assert!(verifier.cached(token).is_none(), "a refusal is not cached");
        return false;
    };
    let mut parts = token.split('.');
    let mut json = || {
        let part = URL_SAFE_NO_PAD
            .decode(parts.next().expect("a part"))
            .expect("base64url");
        serde_json::from_slice::<serde_json::Value>(&part).expect("JSON")
    };
    let (header, claims) = (json(), json());
    assert_eq!(header["alg"], "EdDSA");
    assert_eq!(claims["iss"], "gateway-auth");
    let aud = &claims["aud"];
    assert!(
        aud == "gateway"
            || aud
                .as_array()
                .is_some_and(|a| a.iter().any(|x| x == "gateway")),
        "audience {aud}"
    );
    assert_eq!(claims["sub"], identity.sub.as_str());
    assert_eq!(claims["role"], identity.role.as_str());
    assert_eq!(claims["exp"].as_u64(), Some(identity.exp));
    assert!(NOW < identity.exp.saturating_add(leeway), "not expired");
    let nbf = claims["nbf"].as_u64().expect("a numeric nbf");
    assert!(nbf <= NOW + leeway, "already valid");
    let again = at_once(verifier.verify(token)).expect("verified twice");
    assert!(Arc::ptr_eq(&again, &identity), "the second is a cache hit");
    true
}

/// Polls `f` once: with the key known, verifying has nothing to wait for.
fn at_once<F: Future>(f: F) -> F::Output {
    match pin!(f).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("verification waited"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: &[u8] = br#"{"alg":"EdDSA","kid":"k1"}"#;
    const CLAIMS: &str = r#"{"sub":"alice","role":"user","iss":"gateway-auth","aud":"gateway","exp":EXP,"nbf":1700000000}"#;

    #[test]
    fn the_harness_signs_tokens_the_verifier_accepts_and_reaches_the_claims() {
        let claims = |exp: u64| CLAIMS.replace("EXP", &exp.to_string());
        assert!(verify(&signed(HEADER, claims(NOW + 60).as_bytes())));
        assert!(
            !verify(&signed(HEADER, claims(NOW - 60).as_bytes())),
            "expired"
        );
        let other_issuer = claims(NOW + 60).replace("gateway-auth", "elsewhere");
        assert!(!verify(&signed(HEADER, other_issuer.as_bytes())));
        let hs256 = br#"{"alg":"HS256","kid":"k1"}"#;
        assert!(!verify(&signed(hs256, claims(NOW + 60).as_bytes())));
    }
}
