//! TLS certificates in the configuration, as the control plane handles them
//! around the shared validation (`gateway_proto::validate::validate_certificates`):
//! what a write may leave out (the private key, kept by public key), the
//! output fields filled from the parsed leaf, the warnings a commit answers
//! with, and the redacted form every read returns.

use chrono::{DateTime, SecondsFormat, Utc};
use gateway_proto::spec::CertificateSpec;
use gateway_proto::v1::Certificate;
use gateway_proto::validate::{leaf_public_key, normalize_sni_hosts};

use crate::error::StoreError;

/// What validation learnt of one certificate's leaf: its output fields, and
/// what the commit's warnings are made of.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertificateNotes {
    /// The certificate's name.
    pub name: String,
    /// notBefore, Unix seconds.
    pub not_before: i64,
    /// notAfter, Unix seconds.
    pub not_after: i64,
    /// Lowercase hex SHA-256 of the leaf's DER.
    pub sha256_fingerprint: String,
    /// The leaf's DNS names and IP addresses.
    pub subject_alt_names: Vec<String>,
    /// `sni_hosts` entries none of those names covers.
    pub uncovered_sni_hosts: Vec<String>,
}

impl From<&CertificateSpec<'_>> for CertificateNotes {
    fn from(s: &CertificateSpec<'_>) -> Self {
        CertificateNotes {
            name: s.proto.name.clone(),
            not_before: s.not_before,
            not_after: s.not_after,
            sha256_fingerprint: s.sha256_fingerprint.clone(),
            subject_alt_names: s.subject_alt_names.clone(),
            uncovered_sni_hosts: s.uncovered_sni_hosts().map(str::to_owned).collect(),
        }
    }
}

impl CertificateNotes {
    /// Writes the output fields into the stored certificate.
    pub fn fill(&self, c: &mut Certificate) {
        c.not_before = unix_rfc3339(self.not_before);
        c.not_after = unix_rfc3339(self.not_after);
        c.sha256_fingerprint.clone_from(&self.sha256_fingerprint);
        c.subject_alt_names.clone_from(&self.subject_alt_names);
    }

    /// The warnings of a commit that adds or changes this certificate at `now`
    /// (Unix seconds): expired, not yet valid, SNI hosts its names do not cover.
    pub fn warnings(&self, now: i64) -> Vec<String> {
        let who = format!("certificate \"{}\"", self.name);
        let mut out = Vec::new();
        if self.not_after < now {
            out.push(format!(
                "{who}: expired at {} (not_after is in the past); accepted, but clients will refuse it until it is replaced",
                unix_rfc3339(self.not_after)
            ));
        } else if self.not_before > now {
            out.push(format!(
                "{who}: not valid before {} (not_before is in the future); accepted, but clients will refuse it until then",
                unix_rfc3339(self.not_before)
            ));
        }
        for host in &self.uncovered_sni_hosts {
            out.push(format!(
                "{who}: sni_hosts \"{host}\" is not among the certificate's names ({}); clients asking for it will refuse the certificate",
                if self.subject_alt_names.is_empty() {
                    "it has no subjectAltName".to_owned()
                } else {
                    self.subject_alt_names.join(", ")
                }
            ));
        }
        out
    }
}

/// RFC 3339 UTC with whole seconds (`2025-03-04T05:06:07Z`); empty for a
/// time chrono cannot represent (X.509 allows years up to 9999, chrono more).
pub fn unix_rfc3339(secs: i64) -> String {
    DateTime::<Utc>::from_timestamp(secs, 0)
        .map(|t| t.to_rfc3339_opts(SecondsFormat::Secs, true))
        .unwrap_or_default()
}

/// A certificate as a write gives it, made ready to validate: SNI hosts
/// lower-cased, output-only fields cleared (validation fills them again).
pub fn prepare(c: &mut Certificate) {
    normalize_sni_hosts(c);
    c.private_key_set = false;
    c.not_before.clear();
    c.not_after.clear();
    c.sha256_fingerprint.clear();
    c.subject_alt_names.clear();
}

/// Resolves the write-only private key of `new` against the certificate of
/// the same name in the current configuration: a given key is used as is;
/// an empty one keeps the current key when the new chain's leaf has the same
/// public key, and is refused when it has another (a new key pair needs its
/// private key). With no current certificate, or a chain that does not parse,
/// the key stays empty and validation says what is wrong.
pub fn carry_private_key(
    new: &mut Certificate,
    current: Option<&Certificate>,
) -> Result<(), StoreError> {
    if !new.private_key_pem.is_empty() {
        return Ok(());
    }
    let Some(current) = current.filter(|c| !c.private_key_pem.is_empty()) else {
        return Ok(());
    };
    let Some(new_key) = leaf_public_key(&new.cert_chain_pem) else {
        return Ok(());
    };
    if leaf_public_key(&current.cert_chain_pem).as_ref() == Some(&new_key) {
        new.private_key_pem.clone_from(&current.private_key_pem);
        Ok(())
    } else {
        Err(StoreError::Invalid(format!(
            "certificate \"{}\": private_key_pem is required: the certificate's public key is not the one of the stored certificate, so the stored private key does not fit it",
            new.name
        )))
    }
}

/// A certificate as operators see it: the key replaced by `private_key_set`.
pub fn redact_certificate(c: &Certificate) -> Certificate {
    let mut c = c.clone();
    c.private_key_set = !c.private_key_pem.is_empty();
    c.private_key_pem.clear();
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{CertificateParams, KeyPair};

    fn issue(key: &KeyPair, host: &str) -> String {
        CertificateParams::new(vec![host.to_owned()])
            .unwrap()
            .self_signed(key)
            .unwrap()
            .pem()
    }

    fn cert(chain: &str, key: &str) -> Certificate {
        Certificate {
            name: "edge".into(),
            cert_chain_pem: chain.into(),
            private_key_pem: key.into(),
            ..Default::default()
        }
    }

    #[test]
    fn an_empty_key_keeps_the_stored_one_only_for_the_same_public_key() {
        let key = KeyPair::generate().unwrap();
        let stored = cert(&issue(&key, "a.example.com"), &key.serialize_pem());

        // Renewed with the same key pair: the key is kept.
        let mut renewed = cert(&issue(&key, "b.example.com"), "");
        carry_private_key(&mut renewed, Some(&stored)).unwrap();
        assert_eq!(renewed.private_key_pem, stored.private_key_pem);

        // A new key pair without its key: refused, saying why.
        let other = KeyPair::generate().unwrap();
        let mut rekeyed = cert(&issue(&other, "a.example.com"), "");
        let e = carry_private_key(&mut rekeyed, Some(&stored)).unwrap_err();
        assert!(
            matches!(&e, StoreError::Invalid(m) if m.contains("certificate \"edge\": private_key_pem is required: the certificate's public key is not the one of the stored certificate")),
            "{e:?}"
        );
        assert!(!e.to_string().contains("PRIVATE KEY-----"));

        // A key given is used as is; nothing stored, or a chain that does not parse: left to validation.
        let mut given = cert(&issue(&other, "a.example.com"), &other.serialize_pem());
        carry_private_key(&mut given, Some(&stored)).unwrap();
        assert_eq!(given.private_key_pem, other.serialize_pem());
        let mut fresh = cert(&issue(&key, "a.example.com"), "");
        carry_private_key(&mut fresh, None).unwrap();
        assert_eq!(fresh.private_key_pem, "");
        let mut garbage = cert("garbage", "");
        carry_private_key(&mut garbage, Some(&stored)).unwrap();
        assert_eq!(garbage.private_key_pem, "");
    }

    #[test]
    fn redaction_and_preparation() {
        let mut c = cert("chain", "-----BEGIN PRIVATE KEY-----\nx\n");
        c.sni_hosts = vec!["API.Example.com".into()];
        let shown = redact_certificate(&c);
        assert_eq!(shown.private_key_pem, "");
        assert!(shown.private_key_set);
        assert_eq!(shown.cert_chain_pem, "chain");
        assert!(!redact_certificate(&cert("chain", "")).private_key_set);

        c.private_key_set = true;
        c.not_after = "2000-01-01T00:00:00Z".into();
        c.subject_alt_names = vec!["forged".into()];
        prepare(&mut c);
        assert_eq!(c.sni_hosts, ["api.example.com"]);
        assert!(!c.private_key_set);
        assert_eq!(c.not_after, "");
        assert!(c.subject_alt_names.is_empty());
        assert!(!c.private_key_pem.is_empty(), "the key itself stays");
    }

    #[test]
    fn warnings_name_expiry_and_uncovered_hosts() {
        let notes = CertificateNotes {
            name: "old".into(),
            not_before: 1_546_300_800,
            not_after: 1_577_923_200,
            sha256_fingerprint: "ab".repeat(32),
            subject_alt_names: vec!["old.example.com".into()],
            uncovered_sni_hosts: vec!["new.example.com".into()],
        };
        let w = notes.warnings(1_600_000_000);
        assert_eq!(w.len(), 2, "{w:?}");
        assert_eq!(
            w[0],
            "certificate \"old\": expired at 2020-01-02T00:00:00Z (not_after is in the past); accepted, but clients will refuse it until it is replaced"
        );
        assert!(w[1].contains("sni_hosts \"new.example.com\" is not among the certificate's names (old.example.com)"), "{}", w[1]);
        assert!(
            notes.warnings(1_550_000_000).len() == 1,
            "valid now: only the host"
        );
        assert!(notes.warnings(1_500_000_000)[0].contains("not valid before 2019-01-01T00:00:00Z"));
        let mut c = Certificate::default();
        notes.fill(&mut c);
        assert_eq!(
            (c.not_before.as_str(), c.not_after.as_str()),
            ("2019-01-01T00:00:00Z", "2020-01-02T00:00:00Z")
        );
        assert_eq!(c.subject_alt_names, ["old.example.com"]);
        assert_eq!(unix_rfc3339(i64::MAX), "");
    }
}
