//! Certificates and keys are made on the fly: rcgen for ECDSA and Ed25519,
//! the `openssl` command for RSA (ring cannot generate RSA keys) and for the
//! SEC1 and PKCS#1 encodings. No fixed PEM file that could expire.

use super::*;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair,
    PKCS_ECDSA_P256_SHA256, PKCS_ECDSA_P384_SHA384, PKCS_ED25519, SignatureAlgorithm,
};
use std::path::Path;
use std::process::Command;

/// A self-signed certificate for `names` and its PKCS#8 key, both PEM.
fn self_signed(alg: &'static SignatureAlgorithm, names: &[&str]) -> (String, String) {
    let key = KeyPair::generate_for(alg).unwrap();
    let params =
        CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).unwrap();
    (params.self_signed(&key).unwrap().pem(), key.serialize_pem())
}

fn cert(name: &str, hosts: &[&str], chain: &str, key: &str) -> Certificate {
    Certificate {
        name: name.into(),
        sni_hosts: hosts.iter().map(|h| h.to_string()).collect(),
        cert_chain_pem: chain.into(),
        private_key_pem: key.into(),
        ..Default::default()
    }
}

/// A valid P-256 certificate named `name` for `host`.
fn p256(name: &str, host: &str) -> Certificate {
    let (chain, key) = self_signed(&PKCS_ECDSA_P256_SHA256, &[host]);
    cert(name, &[host], &chain, &key)
}

fn problems(certs: &[Certificate]) -> String {
    validate_certificates(certs).unwrap_err().to_string()
}

#[track_caller]
fn refused_with(c: Certificate, needle: &str) {
    let text = problems(std::slice::from_ref(&c));
    assert!(text.contains(needle), "{needle:?} not in: {text}");
    if !c.private_key_pem.is_empty() {
        assert!(
            !text.contains(c.private_key_pem.trim()),
            "the key leaked: {text}"
        );
    }
}

/// Runs `openssl` in `dir`; the tests need the real command (Debian: openssl).
fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| {
            panic!("these tests need the openssl command ({e}): apt-get install openssl")
        });
    assert!(out.status.success(), "openssl {args:?}: {out:?}");
}

/// An RSA key of `bits` and a self-signed certificate for `host`: (chain, PKCS#8 key, PKCS#1 key).
fn rsa(bits: u32, host: &str) -> (String, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    openssl(
        d,
        &[
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            &format!("rsa_keygen_bits:{bits}"),
            "-out",
            "k.pem",
        ],
    );
    openssl(
        d,
        &[
            "req",
            "-x509",
            "-new",
            "-key",
            "k.pem",
            "-subj",
            &format!("/CN={host}"),
            "-addext",
            &format!("subjectAltName=DNS:{host}"),
            "-days",
            "2",
            "-out",
            "c.pem",
        ],
    );
    openssl(
        d,
        &["rsa", "-in", "k.pem", "-traditional", "-out", "k1.pem"],
    );
    let read = |f: &str| std::fs::read_to_string(d.join(f)).unwrap();
    (read("c.pem"), read("k.pem"), read("k1.pem"))
}

#[test]
fn a_p256_certificate_comes_back_typed() {
    let c = p256("edge", "api.example.com");
    let specs = validate_certificates(std::slice::from_ref(&c)).unwrap();
    let s = &specs[0];
    assert_eq!(s.proto.name, "edge");
    assert_eq!(s.key_type, KeyType::EcdsaP256);
    assert_eq!(s.subject_alt_names, ["api.example.com"]);
    // rcgen's defaults: from 1975 to 4096.
    assert_eq!(
        s.not_before,
        rcgen::date_time_ymd(1975, 1, 1).unix_timestamp()
    );
    assert_eq!(
        s.not_after,
        rcgen::date_time_ymd(4096, 1, 1).unix_timestamp()
    );
    let leaf = CertificateDer::from_pem_slice(c.cert_chain_pem.as_bytes()).unwrap();
    let digest = ring::digest::digest(&ring::digest::SHA256, leaf.as_ref());
    assert_eq!(s.sha256_fingerprint, gateway_hex::encode(digest.as_ref()));
    assert_eq!(s.sha256_fingerprint.len(), 64);
    assert_eq!(s.certified_key.cert.len(), 1);
    assert_eq!(s.uncovered_sni_hosts().count(), 0);
    let debug = format!("{s:?} {c:?}");
    assert!(!debug.contains("PRIVATE KEY"), "{debug}");
    assert!(debug.contains("<redacted>"), "{debug}");
}

#[test]
fn p384_and_ed25519_are_accepted() {
    for (alg, want) in [
        (&PKCS_ECDSA_P384_SHA384, KeyType::EcdsaP384),
        (&PKCS_ED25519, KeyType::Ed25519),
    ] {
        let (chain, key) = self_signed(alg, &["a.example.com"]);
        let c = [cert("a", &["a.example.com"], &chain, &key)];
        let specs = validate_certificates(&c).unwrap();
        assert_eq!(specs[0].key_type, want);
    }
}

#[test]
fn rsa_2048_in_pkcs8_and_pkcs1_is_accepted_and_1024_is_refused() {
    let (chain, pkcs8, pkcs1) = rsa(2048, "rsa.example.com");
    assert!(
        pkcs1.starts_with("-----BEGIN RSA PRIVATE KEY-----"),
        "{}",
        &pkcs1[..40]
    );
    for key in [&pkcs8, &pkcs1] {
        let c = [cert("rsa", &["rsa.example.com"], &chain, key)];
        let specs = validate_certificates(&c).unwrap();
        assert_eq!(specs[0].key_type, KeyType::Rsa(2048));
    }
    let (chain, pkcs8, _) = rsa(1024, "weak.example.com");
    refused_with(
        cert("weak", &[], &chain, &pkcs8),
        "certificate \"weak\": cert_chain_pem: the leaf's key is RSA of 1024 bits; at least 2048 bits are required",
    );
}

#[test]
fn a_sec1_ec_key_is_accepted() {
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
    let chain = CertificateParams::new(vec!["ec.example.com".to_owned()])
        .unwrap()
        .self_signed(&key)
        .unwrap()
        .pem();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("k8.pem"), key.serialize_pem()).unwrap();
    openssl(dir.path(), &["ec", "-in", "k8.pem", "-out", "k1.pem"]);
    let sec1 = std::fs::read_to_string(dir.path().join("k1.pem")).unwrap();
    assert!(sec1.starts_with("-----BEGIN EC PRIVATE KEY-----"));
    let c = [cert("ec", &[], &chain, &sec1)];
    let specs = validate_certificates(&c).unwrap();
    assert_eq!(specs[0].key_type, KeyType::EcdsaP256);
}

/// A CA and a leaf it signed: (leaf PEM, CA PEM, leaf key PEM).
fn ca_and_leaf(host: &str) -> (String, String, String) {
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "Test CA");
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let leaf_key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(vec![host.to_owned()]).unwrap();
    params.distinguished_name.push(DnType::CommonName, host);
    let leaf = params.signed_by(&leaf_key, &ca).unwrap();
    (leaf.pem(), ca.pem(), leaf_key.serialize_pem())
}

#[test]
fn a_chain_is_leaf_first_then_each_issuer() {
    let (leaf, ca, key) = ca_and_leaf("www.example.com");
    let c = [cert(
        "www",
        &["www.example.com"],
        &format!("{leaf}{ca}"),
        &key,
    )];
    let specs = validate_certificates(&c).unwrap();
    assert_eq!(specs[0].certified_key.cert.len(), 2);
    refused_with(
        cert("www", &[], &format!("{ca}{leaf}"), &key),
        "certificate \"www\": cert_chain_pem: certificate 2 (subject \"CN=www.example.com\") did not issue certificate 1",
    );
    // The CA alone: a chain that parses, whose leaf is not the key's.
    refused_with(
        cert("www", &[], &ca, &key),
        "private_key_pem does not match the public key",
    );
}

#[test]
fn a_key_of_another_certificate_is_refused() {
    let (chain, _) = self_signed(&PKCS_ECDSA_P256_SHA256, &["a.example.com"]);
    let (_, other_key) = self_signed(&PKCS_ECDSA_P256_SHA256, &["a.example.com"]);
    refused_with(
        cert("a", &[], &chain, &other_key),
        "certificate \"a\": private_key_pem does not match the public key of the certificate (the leaf, first in cert_chain_pem)",
    );
    // Another algorithm altogether.
    let (_, ed_key) = self_signed(&PKCS_ED25519, &["a.example.com"]);
    refused_with(
        cert("a", &[], &chain, &ed_key),
        "private_key_pem does not match",
    );
}

#[test]
fn bad_pem_and_misplaced_blocks_are_refused_with_their_reason() {
    let good = p256("a", "a.example.com");
    let with_chain = |chain: &str| cert("a", &[], chain, &good.private_key_pem);
    let with_key = |key: &str| cert("a", &[], &good.cert_chain_pem, key);
    refused_with(
        with_chain(""),
        "certificate \"a\": cert_chain_pem is required",
    );
    refused_with(
        with_chain("hello"),
        "cert_chain_pem holds no PEM CERTIFICATE block",
    );
    refused_with(
        with_chain("-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n"),
        "cert_chain_pem is not valid PEM",
    );
    refused_with(
        with_chain("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"),
        "cert_chain_pem: certificate 1 is not an X.509 certificate",
    );
    refused_with(
        with_chain("-----BEGIN CERTIFICATE-----\nMIIB\n"),
        "cert_chain_pem is not valid PEM",
    );
    refused_with(
        with_chain(&format!("{}{}", good.cert_chain_pem, good.private_key_pem)),
        "cert_chain_pem holds a private key; put the key in private_key_pem",
    );
    refused_with(
        with_key(""),
        "certificate \"a\": private_key_pem is required",
    );
    refused_with(
        with_key("not a key"),
        "private_key_pem holds no PEM PRIVATE KEY",
    );
    refused_with(
        with_key(
            "-----BEGIN ENCRYPTED PRIVATE KEY-----\nAAAA\n-----END ENCRYPTED PRIVATE KEY-----\n",
        ),
        "private_key_pem is encrypted",
    );
    refused_with(
        with_key(&format!("{}{}", good.private_key_pem, good.cert_chain_pem)),
        "private_key_pem must hold only the private key (found CERTIFICATE",
    );
    refused_with(
        with_key(&format!("{}{}", good.private_key_pem, good.private_key_pem)),
        "private_key_pem must hold one private key (found 2)",
    );
    refused_with(
        with_key("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"),
        "private_key_pem is not a usable ECDSA P-256 or P-384, Ed25519, or RSA of 2048 to 8192 bits private key",
    );
    refused_with(
        with_chain(&"x".repeat(MAX_CERT_CHAIN_PEM_LEN + 1)),
        "cert_chain_pem must be at most 65536 bytes",
    );
    // Both fields wrong: both reported.
    let text = problems(&[cert("a", &[], "hello", "")]);
    assert!(
        text.contains("cert_chain_pem holds no") && text.contains("private_key_pem is required"),
        "{text}"
    );
}

#[test]
fn sni_hosts_are_host_names_or_leftmost_wildcards() {
    let base = p256("a", "example.com");
    let with_hosts = |hosts: &[&str]| {
        let mut c = base.clone();
        c.sni_hosts = hosts.iter().map(|h| h.to_string()).collect();
        c
    };
    assert!(
        validate_certificates(&[with_hosts(&[
            "example.com",
            "*.example.com",
            "a-b.c.example.com"
        ])])
        .is_ok()
    );
    assert!(validate_certificates(&[with_hosts(&[])]).is_ok());
    for bad in [
        "a.*.example.com",
        "*example.com",
        "*",
        "*.",
        "Example.com",
        "ex ample.com",
        "-a.example.com",
        "example.com.",
    ] {
        refused_with(
            with_hosts(&[bad]),
            &format!("sni_hosts: \"{bad}\" is not a lower-case host name"),
        );
    }
    refused_with(
        with_hosts(&["10.0.0.1"]),
        "sni_hosts: \"10.0.0.1\" is an IP address",
    );
    refused_with(
        with_hosts(&["a.example.com", "a.example.com"]),
        "sni_hosts: \"a.example.com\" is listed twice",
    );
    let many: Vec<String> = (0..=MAX_SNI_HOSTS)
        .map(|i| format!("h{i}.example.com"))
        .collect();
    let refs: Vec<&str> = many.iter().map(String::as_str).collect();
    refused_with(
        with_hosts(&refs),
        "sni_hosts must list at most 100 names (got 101)",
    );
    let mut upper = with_hosts(&["API.Example.COM", "*.Example.com"]);
    normalize_sni_hosts(&mut upper);
    assert_eq!(upper.sni_hosts, ["api.example.com", "*.example.com"]);
}

#[test]
fn two_certificates_may_not_claim_one_host_or_share_a_name() {
    let a = p256("a", "api.example.com");
    let mut b = p256("b", "api.example.com");
    let text = problems(&[a.clone(), b.clone()]);
    assert!(
        text.contains("certificate \"b\": sni_hosts: \"api.example.com\" is already claimed by certificate \"a\""),
        "{text}"
    );
    // An exact name beside a wildcard covering it is fine; the same wildcard twice is not.
    b.sni_hosts = vec!["*.example.com".into()];
    assert!(validate_certificates(&[a.clone(), b.clone()]).is_ok());
    let mut c = p256("c", "x.example.com");
    c.sni_hosts = vec!["*.example.com".into()];
    assert!(
        problems(&[a.clone(), b, c])
            .contains("\"*.example.com\" is already claimed by certificate \"b\"")
    );
    let text = problems(&[a.clone(), p256("a", "other.example.com")]);
    assert!(text.contains("certificate \"a\": duplicate name"), "{text}");
    refused_with(
        p256("Bad_Name", "x.example.com"),
        "certificate \"Bad_Name\": name must match",
    );
}

#[test]
fn expired_certificates_validate_and_say_when() {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(vec!["old.example.com".to_owned()]).unwrap();
    params.not_before = rcgen::date_time_ymd(2019, 1, 1);
    params.not_after = rcgen::date_time_ymd(2020, 1, 2);
    let chain = params.self_signed(&key).unwrap().pem();
    let c = [cert(
        "old",
        &["old.example.com"],
        &chain,
        &key.serialize_pem(),
    )];
    let specs = validate_certificates(&c).unwrap();
    assert_eq!(specs[0].not_before, 1_546_300_800);
    assert_eq!(specs[0].not_after, 1_577_923_200);
}

#[test]
fn uncovered_sni_hosts_are_those_no_name_of_the_leaf_matches() {
    let (chain, key) = self_signed(
        &PKCS_ECDSA_P256_SHA256,
        &["*.example.com", "example.org", "127.0.0.1"],
    );
    let c = cert(
        "w",
        &[
            "a.example.com",
            "example.org",
            "*.example.com",
            "example.com",
            "a.b.example.com",
            "x.example.org",
        ],
        &chain,
        &key,
    );
    let specs = validate_certificates(std::slice::from_ref(&c)).unwrap();
    assert_eq!(
        specs[0].subject_alt_names,
        ["*.example.com", "example.org", "127.0.0.1"]
    );
    let uncovered: Vec<&str> = specs[0].uncovered_sni_hosts().collect();
    assert_eq!(
        uncovered,
        ["example.com", "a.b.example.com", "x.example.org"]
    );
}

#[test]
fn the_leaf_public_key_identifies_a_key_pair_across_reissues() {
    let key = KeyPair::generate().unwrap();
    let first = CertificateParams::new(vec!["a.example.com".to_owned()])
        .unwrap()
        .self_signed(&key)
        .unwrap()
        .pem();
    let renewed = CertificateParams::new(vec!["b.example.com".to_owned()])
        .unwrap()
        .self_signed(&key)
        .unwrap()
        .pem();
    let (other, _) = self_signed(&PKCS_ECDSA_P256_SHA256, &["a.example.com"]);
    let spki = leaf_public_key(&first).unwrap();
    assert_eq!(Some(spki.clone()), leaf_public_key(&renewed));
    assert_ne!(Some(spki), leaf_public_key(&other));
    assert_eq!(leaf_public_key("garbage"), None);
}
