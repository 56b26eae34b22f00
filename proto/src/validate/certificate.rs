//! Validation of TLS certificates (`Certificate`): names and SNI hosts, the
//! PEM chain (X.509, leaf first), the leaf's key algorithm, and the private
//! key, which must parse and match the leaf's public key.
//!
//! Returns each certificate typed ([`CertificateSpec`]): the chain and key
//! ready for a rustls server (`CertifiedKey`, checked with its own
//! `keys_match`), the validity period, the leaf's fingerprint and names.
//! Expiry is not a refusal: whoever has a clock (the control plane) decides
//! what to warn about. No message ever quotes key material.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use rustls::crypto::ring::sign::any_supported_type;
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::{PemObject as _, SectionKind};
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use x509_parser::certificate::X509Certificate;
use x509_parser::extensions::GeneralName;
use x509_parser::oid_registry::{
    OID_EC_P256, OID_KEY_TYPE_EC_PUBLIC_KEY, OID_NIST_EC_P384, OID_PKCS1_RSAENCRYPTION,
    OID_SIG_ED25519,
};
use x509_parser::prelude::FromDer as _;
use x509_parser::public_key::PublicKey;

use super::{MAX_NAME_LEN, ValidationError, Validator, is_valid_hostname, is_valid_name};
use crate::v1::Certificate;

/// Longest accepted `cert_chain_pem`, in bytes.
pub const MAX_CERT_CHAIN_PEM_LEN: usize = 65_536;
/// Longest accepted `private_key_pem`, in bytes.
pub const MAX_PRIVATE_KEY_PEM_LEN: usize = 16_384;
/// Most `sni_hosts` entries of one certificate.
pub const MAX_SNI_HOSTS: usize = 100;
/// Smallest accepted RSA modulus, in bits.
pub const MIN_RSA_BITS: usize = 2048;
/// Largest accepted RSA modulus, in bits (ring signs with 2048 to 8192).
pub const MAX_RSA_BITS: usize = 8192;

/// The key algorithms accepted, as the refusals name them.
const SUPPORTED: &str = "ECDSA P-256 or P-384, Ed25519, or RSA of 2048 to 8192 bits";

/// The algorithm of a certificate's key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyType {
    /// ECDSA on NIST P-256.
    EcdsaP256,
    /// ECDSA on NIST P-384.
    EcdsaP384,
    /// Ed25519.
    Ed25519,
    /// RSA with a modulus of this many bits.
    Rsa(usize),
}

impl fmt::Display for KeyType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyType::EcdsaP256 => f.write_str("ECDSA P-256"),
            KeyType::EcdsaP384 => f.write_str("ECDSA P-384"),
            KeyType::Ed25519 => f.write_str("Ed25519"),
            KeyType::Rsa(bits) => write!(f, "RSA {bits}"),
        }
    }
}

/// A validated certificate, typed.
#[derive(Clone)]
pub struct CertificateSpec<'a> {
    /// The message, for the fields that need no parsing (name, SNI hosts).
    pub proto: &'a Certificate,
    /// The chain (leaf first) and the signing key, checked to match: what a
    /// rustls server offers for this certificate.
    pub certified_key: Arc<CertifiedKey>,
    /// The leaf's key algorithm.
    pub key_type: KeyType,
    /// The leaf's notBefore, Unix seconds.
    pub not_before: i64,
    /// The leaf's notAfter, Unix seconds.
    pub not_after: i64,
    /// Lowercase hex SHA-256 of the leaf's DER bytes.
    pub sha256_fingerprint: String,
    /// The leaf's subject alternative names: DNS names as written, IP addresses as text.
    pub subject_alt_names: Vec<String>,
}

impl fmt::Debug for CertificateSpec<'_> {
    /// Names, dates and the fingerprint; never the key.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertificateSpec")
            .field("name", &self.proto.name)
            .field("key_type", &self.key_type)
            .field("not_before", &self.not_before)
            .field("not_after", &self.not_after)
            .field("sha256_fingerprint", &self.sha256_fingerprint)
            .field("subject_alt_names", &self.subject_alt_names)
            .finish_non_exhaustive()
    }
}

impl CertificateSpec<'_> {
    /// The `sni_hosts` entries none of the leaf's DNS names covers: clients
    /// asking for them would refuse the certificate.
    pub fn uncovered_sni_hosts(&self) -> impl Iterator<Item = &str> {
        self.proto
            .sni_hosts
            .iter()
            .map(String::as_str)
            .filter(|h| !self.subject_alt_names.iter().any(|san| covers(san, h)))
    }
}

/// Whether the certificate name `san` is valid for the server name `host`
/// (RFC 6125: a wildcard stands for exactly one whole leftmost label). A
/// wildcard `host` is covered only by the same wildcard.
fn covers(san: &str, host: &str) -> bool {
    if san.eq_ignore_ascii_case(host) {
        return true;
    }
    match (san.strip_prefix("*."), host.split_once('.')) {
        (Some(suffix), Some((label, rest))) => {
            label != "*" && !label.is_empty() && suffix.eq_ignore_ascii_case(rest)
        }
        _ => false,
    }
}

/// Lower-cases the `sni_hosts` of a certificate (the control plane does so on
/// every write, before validation, which refuses upper case).
pub fn normalize_sni_hosts(c: &mut Certificate) {
    for h in &mut c.sni_hosts {
        h.make_ascii_lowercase();
    }
}

/// The DER SubjectPublicKeyInfo of the leaf (first certificate) of a PEM
/// chain, or `None` when the chain does not parse. Two chains with the same
/// leaf public key take the same private key.
pub fn leaf_public_key(cert_chain_pem: &str) -> Option<Vec<u8>> {
    let der = CertificateDer::pem_slice_iter(cert_chain_pem.as_bytes())
        .next()?
        .ok()?;
    let (_, leaf) = X509Certificate::from_der(der.as_ref()).ok()?;
    Some(leaf.public_key().raw.to_vec())
}

/// Validates every certificate of a configuration: each one's fields, unique
/// names, and no SNI host claimed by two certificates. Returns them typed, in
/// the order given.
pub fn validate_certificates(
    certificates: &[Certificate],
) -> Result<Vec<CertificateSpec<'_>>, ValidationError> {
    let mut v = Validator::default();
    let mut names = HashSet::new();
    let mut claimed: HashMap<&str, &str> = HashMap::new();
    let mut specs = Vec::with_capacity(certificates.len());
    for c in certificates {
        let who = format!("certificate \"{}\"", c.name);
        if !names.insert(c.name.as_str()) {
            v.push(format!("{who}: duplicate name"));
        }
        for h in &c.sni_hosts {
            match claimed.get(h.as_str()) {
                Some(other) if *other != c.name => v.push(format!(
                    "{who}: sni_hosts: \"{h}\" is already claimed by certificate \"{other}\" (each server name may have one certificate)"
                )),
                Some(_) => {}
                None => {
                    claimed.insert(h.as_str(), c.name.as_str());
                }
            }
        }
        if let Some(spec) = v.certificate(&who, c) {
            specs.push(spec);
        }
    }
    v.finish()?;
    Ok(specs)
}

impl Validator {
    /// One certificate's own rules; its spec when they all hold.
    fn certificate<'a>(&mut self, who: &str, c: &'a Certificate) -> Option<CertificateSpec<'a>> {
        let before = self.problems.len();
        if !is_valid_name(&c.name) {
            self.push(format!(
                "{who}: name must match [a-z0-9][a-z0-9-]* and be at most {MAX_NAME_LEN} characters"
            ));
        }
        self.sni_hosts(who, &c.sni_hosts);
        let chain = self.chain(who, &c.cert_chain_pem);
        let facts = chain.as_deref().and_then(|chain| self.leaf(who, chain));
        let key = self.private_key(who, &c.private_key_pem);
        let (chain, facts, key) = (chain?, facts?, key?);
        let signing_key = match any_supported_type(&key) {
            Ok(k) => k,
            Err(_) => {
                self.push(format!(
                    "{who}: private_key_pem is not a usable {SUPPORTED} private key"
                ));
                return None;
            }
        };
        let certified_key = CertifiedKey::new(chain, signing_key);
        match certified_key.keys_match() {
            Ok(()) => {}
            Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch)) => {
                self.push(format!(
                    "{who}: private_key_pem does not match the public key of the certificate (the leaf, first in cert_chain_pem)"
                ));
                return None;
            }
            // webpki reads only X.509 v3 (an `openssl x509 -req` without extensions makes v1).
            Err(e) => {
                self.push(format!(
                    "{who}: cert_chain_pem: the leaf is not a certificate TLS can use (X.509 v3 is required): {e}"
                ));
                return None;
            }
        }
        (self.problems.len() == before).then(|| CertificateSpec {
            proto: c,
            certified_key: Arc::new(certified_key),
            key_type: facts.key_type,
            not_before: facts.not_before,
            not_after: facts.not_after,
            sha256_fingerprint: facts.sha256_fingerprint,
            subject_alt_names: facts.subject_alt_names,
        })
    }

    fn sni_hosts(&mut self, who: &str, hosts: &[String]) {
        if hosts.len() > MAX_SNI_HOSTS {
            self.push(format!(
                "{who}: sni_hosts must list at most {MAX_SNI_HOSTS} names (got {})",
                hosts.len()
            ));
        }
        let mut seen = HashSet::new();
        for h in hosts {
            let bare = h.strip_prefix("*.").unwrap_or(h);
            if bare.parse::<Ipv4Addr>().is_ok() {
                self.push(format!(
                    "{who}: sni_hosts: \"{h}\" is an IP address; TLS clients send host names only in SNI"
                ));
            } else if !is_valid_hostname(bare) {
                self.push(format!(
                    "{who}: sni_hosts: \"{h}\" is not a lower-case host name, or \"*.\" and one (a wildcard only as the whole leftmost label)"
                ));
            }
            if !seen.insert(h.as_str()) {
                self.push(format!("{who}: sni_hosts: \"{h}\" is listed twice"));
            }
        }
    }

    /// The chain's certificates, leaf first, when it is PEM of X.509
    /// certificates and nothing else.
    fn chain(&mut self, who: &str, pem: &str) -> Option<Vec<CertificateDer<'static>>> {
        if pem.trim().is_empty() {
            self.push(format!("{who}: cert_chain_pem is required"));
            return None;
        }
        if pem.len() > MAX_CERT_CHAIN_PEM_LEN {
            self.push(format!(
                "{who}: cert_chain_pem must be at most {MAX_CERT_CHAIN_PEM_LEN} bytes (got {})",
                pem.len()
            ));
            return None;
        }
        // Every viewer reads the chain back: a key pasted into it would leak.
        if pem.contains("PRIVATE KEY-----") {
            self.push(format!(
                "{who}: cert_chain_pem holds a private key; put the key in private_key_pem (the chain is shown to every reader)"
            ));
            return None;
        }
        let mut chain = Vec::new();
        for section in <(SectionKind, Vec<u8>)>::pem_slice_iter(pem.as_bytes()) {
            match section {
                Ok((SectionKind::Certificate, der)) => chain.push(CertificateDer::from(der)),
                Ok((kind, _)) => {
                    self.push(format!(
                        "{who}: cert_chain_pem must hold only CERTIFICATE blocks (found {})",
                        label(kind)
                    ));
                    return None;
                }
                Err(e) => {
                    self.push(format!("{who}: cert_chain_pem is not valid PEM: {e}"));
                    return None;
                }
            }
        }
        if chain.is_empty() {
            self.push(format!(
                "{who}: cert_chain_pem holds no PEM CERTIFICATE block (-----BEGIN CERTIFICATE-----)"
            ));
            return None;
        }
        let mut parsed = Vec::with_capacity(chain.len());
        for (i, der) in chain.iter().enumerate() {
            match X509Certificate::from_der(der.as_ref()) {
                Ok(([], cert)) => parsed.push(cert),
                Ok(_) => {
                    self.push(format!(
                        "{who}: cert_chain_pem: certificate {} has bytes after its end",
                        i + 1
                    ));
                    return None;
                }
                Err(e) => {
                    self.push(format!(
                        "{who}: cert_chain_pem: certificate {} is not an X.509 certificate: {e}",
                        i + 1
                    ));
                    return None;
                }
            }
        }
        for (i, pair) in parsed.windows(2).enumerate() {
            if pair[0].issuer().as_raw() != pair[1].subject().as_raw() {
                self.push(format!(
                    "{who}: cert_chain_pem: certificate {} (subject \"{}\") did not issue certificate {} (issuer \"{}\"); the chain must be the leaf first, then each issuer in turn",
                    i + 2,
                    pair[1].subject(),
                    i + 1,
                    pair[0].issuer()
                ));
                return None;
            }
        }
        Some(chain)
    }

    /// The private key, when the field holds exactly one unencrypted key.
    fn private_key(&mut self, who: &str, pem: &str) -> Option<PrivateKeyDer<'static>> {
        if pem.trim().is_empty() {
            self.push(format!(
                "{who}: private_key_pem is required (the private key of the leaf certificate)"
            ));
            return None;
        }
        if pem.len() > MAX_PRIVATE_KEY_PEM_LEN {
            self.push(format!(
                "{who}: private_key_pem must be at most {MAX_PRIVATE_KEY_PEM_LEN} bytes (got {})",
                pem.len()
            ));
            return None;
        }
        if pem.contains("-----BEGIN ENCRYPTED PRIVATE KEY-----") {
            self.push(format!(
                "{who}: private_key_pem is encrypted (ENCRYPTED PRIVATE KEY); give it unencrypted, e.g. `openssl pkey -in key.pem`"
            ));
            return None;
        }
        let mut keys = Vec::new();
        for section in <(SectionKind, Vec<u8>)>::pem_slice_iter(pem.as_bytes()) {
            // The parser's errors may quote a line of the input: not repeated here.
            let Ok((kind, der)) = section else {
                self.push(format!("{who}: private_key_pem is not valid PEM"));
                return None;
            };
            let key = match kind {
                SectionKind::PrivateKey => PrivateKeyDer::Pkcs8(der.into()),
                SectionKind::EcPrivateKey => PrivateKeyDer::Sec1(der.into()),
                SectionKind::RsaPrivateKey => PrivateKeyDer::Pkcs1(der.into()),
                other => {
                    self.push(format!(
                        "{who}: private_key_pem must hold only the private key (found {}; certificates go in cert_chain_pem)",
                        label(other)
                    ));
                    return None;
                }
            };
            keys.push(key);
        }
        match keys.len() {
            0 => {
                self.push(format!(
                    "{who}: private_key_pem holds no PEM PRIVATE KEY, EC PRIVATE KEY or RSA PRIVATE KEY block"
                ));
                None
            }
            1 => keys.pop(),
            n => {
                self.push(format!(
                    "{who}: private_key_pem must hold one private key (found {n})"
                ));
                None
            }
        }
    }

    /// What the leaf (first certificate) tells, when its key algorithm is supported.
    fn leaf(&mut self, who: &str, chain: &[CertificateDer<'_>]) -> Option<LeafFacts> {
        let der = chain.first()?;
        let (_, leaf) = X509Certificate::from_der(der.as_ref()).ok()?;
        let key_type = match key_type(&leaf) {
            Ok(t) => t,
            Err(why) => {
                self.push(format!("{who}: cert_chain_pem: the leaf's key {why}"));
                return None;
            }
        };
        let subject_alt_names = match leaf.subject_alternative_name() {
            Ok(san) => san
                .map(|ext| {
                    ext.value
                        .general_names
                        .iter()
                        .filter_map(general_name_text)
                        .collect()
                })
                .unwrap_or_default(),
            Err(e) => {
                self.push(format!(
                    "{who}: cert_chain_pem: the leaf's subjectAltName extension is malformed: {e}"
                ));
                return None;
            }
        };
        let digest = ring::digest::digest(&ring::digest::SHA256, der.as_ref());
        Some(LeafFacts {
            key_type,
            not_before: leaf.validity().not_before.timestamp(),
            not_after: leaf.validity().not_after.timestamp(),
            sha256_fingerprint: gateway_hex::encode(digest.as_ref()),
            subject_alt_names,
        })
    }
}

/// The PEM label of a section, as an operator wrote it.
fn label(kind: SectionKind) -> &'static str {
    match kind {
        SectionKind::Certificate => "CERTIFICATE",
        SectionKind::PublicKey => "PUBLIC KEY",
        SectionKind::RsaPrivateKey => "RSA PRIVATE KEY",
        SectionKind::PrivateKey => "PRIVATE KEY",
        SectionKind::EcPrivateKey => "EC PRIVATE KEY",
        SectionKind::Crl => "X509 CRL",
        SectionKind::Csr => "CERTIFICATE REQUEST",
        _ => "another kind of PEM block",
    }
}

/// The parts of [`CertificateSpec`] read from the leaf.
struct LeafFacts {
    key_type: KeyType,
    not_before: i64,
    not_after: i64,
    sha256_fingerprint: String,
    subject_alt_names: Vec<String>,
}

/// The leaf's key algorithm, or why it is refused ("… is not supported").
fn key_type(leaf: &X509Certificate<'_>) -> Result<KeyType, String> {
    let spki = leaf.public_key();
    let algorithm = &spki.algorithm.algorithm;
    if *algorithm == OID_PKCS1_RSAENCRYPTION {
        let bits = match spki.parsed() {
            Ok(PublicKey::RSA(rsa)) => rsa.key_size(),
            _ => return Err("is a malformed RSA public key".into()),
        };
        if bits < MIN_RSA_BITS {
            return Err(format!(
                "is RSA of {bits} bits; at least {MIN_RSA_BITS} bits are required"
            ));
        }
        if bits > MAX_RSA_BITS {
            return Err(format!(
                "is RSA of {bits} bits; at most {MAX_RSA_BITS} bits are supported"
            ));
        }
        return Ok(KeyType::Rsa(bits));
    }
    if *algorithm == OID_KEY_TYPE_EC_PUBLIC_KEY {
        let curve = spki
            .algorithm
            .parameters
            .clone()
            .and_then(|p| x509_parser::der_parser::oid::Oid::try_from(p).ok());
        return match curve {
            Some(c) if c == OID_EC_P256 => Ok(KeyType::EcdsaP256),
            Some(c) if c == OID_NIST_EC_P384 => Ok(KeyType::EcdsaP384),
            Some(c) => Err(format!(
                "is ECDSA on curve {c}, which is not supported ({SUPPORTED})"
            )),
            None => Err("is ECDSA without a named curve, which is not supported".into()),
        };
    }
    if *algorithm == OID_SIG_ED25519 {
        return Ok(KeyType::Ed25519);
    }
    Err(format!(
        "has algorithm {algorithm}, which is not supported ({SUPPORTED})"
    ))
}

/// A DNS name or IP address of the subjectAltName extension, as text.
fn general_name_text(name: &GeneralName<'_>) -> Option<String> {
    match name {
        GeneralName::DNSName(dns) => Some((*dns).to_owned()),
        GeneralName::IPAddress(bytes) => match bytes.len() {
            4 => <[u8; 4]>::try_from(*bytes)
                .ok()
                .map(|b| Ipv4Addr::from(b).to_string()),
            16 => <[u8; 16]>::try_from(*bytes)
                .ok()
                .map(|b| Ipv6Addr::from(b).to_string()),
            _ => None,
        },
        _ => None,
    }
}

#[cfg(test)]
mod tests;
