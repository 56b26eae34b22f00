//! The certificates of a snapshot as the HTTPS listener offers them (issue
//! 27): by SNI host, exact names first, then `*.example.com` wildcards (one
//! whole leftmost label), then the certificate named `default`; and the
//! resolver that the listener's handshake asks, which always reads the
//! current snapshot, so a pushed certificate applies to the next handshake.

use std::collections::HashMap;
use std::sync::Arc;

use gateway_proto::validate::CertificateSpec;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use super::ConfigStore;

/// The name of the certificate offered when the client sends no SNI, or one
/// no certificate's `sni_hosts` covers.
pub const DEFAULT_CERTIFICATE: &str = "default";

/// A certificate's dates, for `/metrics` and `/config`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertificateInfo {
    /// The certificate's name.
    pub name: String,
    /// The leaf's notAfter, Unix seconds.
    pub not_after: i64,
    /// The leaf's SHA-256 fingerprint (hex).
    pub sha256_fingerprint: String,
    /// The SNI hosts it is offered for.
    pub sni_hosts: Vec<String>,
}

/// The certificates of one snapshot, by the names clients ask for.
#[derive(Default)]
pub struct Certificates {
    /// Lowercase exact host names.
    exact: HashMap<Box<str>, Arc<CertifiedKey>>,
    /// `*.example.com` entries, by their lowercase `example.com` part.
    wildcard: HashMap<Box<str>, Arc<CertifiedKey>>,
    default: Option<Arc<CertifiedKey>>,
    info: Vec<CertificateInfo>,
}

impl std::fmt::Debug for Certificates {
    /// Names and dates; never key material.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Certificates")
            .field("info", &self.info)
            .finish_non_exhaustive()
    }
}

impl Certificates {
    /// The table of validated `specs` (validation has refused duplicate
    /// names and hosts claimed twice).
    pub fn new(specs: &[CertificateSpec<'_>]) -> Self {
        let mut table = Self::default();
        for spec in specs {
            let key = &spec.certified_key;
            for host in &spec.proto.sni_hosts {
                let host = host.to_ascii_lowercase();
                match host.strip_prefix("*.") {
                    Some(parent) => table.wildcard.insert(parent.into(), key.clone()),
                    None => table.exact.insert(host.into(), key.clone()),
                };
            }
            if spec.proto.name == DEFAULT_CERTIFICATE {
                table.default = Some(key.clone());
            }
            table.info.push(CertificateInfo {
                name: spec.proto.name.clone(),
                not_after: spec.not_after,
                sha256_fingerprint: spec.sha256_fingerprint.clone(),
                sni_hosts: spec.proto.sni_hosts.clone(),
            });
        }
        table.info.sort_by(|a, b| a.name.cmp(&b.name));
        table
    }

    /// The certificate for `server_name` (the ClientHello's SNI), else the default.
    pub fn resolve(&self, server_name: Option<&str>) -> Option<Arc<CertifiedKey>> {
        let found = server_name.and_then(|name| {
            // rustls hands the name over lowercased, without a trailing dot.
            let name = name.to_ascii_lowercase();
            self.exact.get(name.as_str()).cloned().or_else(|| {
                let (_, parent) = name.split_once('.')?;
                self.wildcard.get(parent).cloned()
            })
        });
        found.or_else(|| self.default.clone())
    }

    /// Each certificate's name and dates, by name.
    pub fn info(&self) -> &[CertificateInfo] {
        &self.info
    }

    /// Whether the snapshot has no certificate.
    pub fn is_empty(&self) -> bool {
        self.info.is_empty()
    }
}

/// What the HTTPS listener's handshake asks: the current snapshot's
/// certificate for the ClientHello's SNI.
#[derive(Debug)]
pub struct SniResolver(pub Arc<ConfigStore>);

impl ResolvesServerCert for SniResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.0.load().certificates.resolve(hello.server_name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gateway_proto::v1::Certificate;
    use gateway_proto::validate::validate_certificates;

    fn certificate(name: &str, hosts: &[&str]) -> Certificate {
        let sans: Vec<String> = if hosts.is_empty() {
            vec!["localhost".to_owned()]
        } else {
            hosts.iter().map(|h| (*h).to_owned()).collect()
        };
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(sans)
            .unwrap()
            .self_signed(&key)
            .unwrap();
        Certificate {
            name: name.to_owned(),
            sni_hosts: hosts.iter().map(|h| (*h).to_owned()).collect(),
            cert_chain_pem: cert.pem(),
            private_key_pem: key.serialize_pem(),
            ..Default::default()
        }
    }

    #[test]
    fn exact_names_then_wildcards_then_the_default() {
        let certs = [
            certificate("api", &["api.example.com"]),
            certificate("wild", &["*.example.com"]),
            certificate(DEFAULT_CERTIFICATE, &[]),
        ];
        let specs = validate_certificates(&certs).unwrap();
        let table = Certificates::new(&specs);
        let key_of = |name: &str| {
            specs
                .iter()
                .find(|s| s.proto.name == name)
                .unwrap()
                .certified_key
                .clone()
        };
        let is = |got: Option<Arc<CertifiedKey>>, name: &str| {
            Arc::ptr_eq(&got.expect("a certificate"), &key_of(name))
        };
        assert!(is(table.resolve(Some("api.example.com")), "api"));
        assert!(is(table.resolve(Some("API.Example.COM")), "api"));
        assert!(is(table.resolve(Some("www.example.com")), "wild"));
        // A wildcard stands for one label only.
        assert!(is(
            table.resolve(Some("a.b.example.com")),
            DEFAULT_CERTIFICATE
        ));
        assert!(is(table.resolve(Some("example.com")), DEFAULT_CERTIFICATE));
        assert!(is(table.resolve(None), DEFAULT_CERTIFICATE));
        assert_eq!(
            table
                .info()
                .iter()
                .map(|i| i.name.as_str())
                .collect::<Vec<_>>(),
            ["api", DEFAULT_CERTIFICATE, "wild"]
        );
    }

    #[test]
    fn without_a_default_an_unknown_name_gets_nothing() {
        let certs = [certificate("api", &["api.example.com"])];
        let specs = validate_certificates(&certs).unwrap();
        let table = Certificates::new(&specs);
        assert!(table.resolve(Some("api.example.com")).is_some());
        assert!(table.resolve(Some("other.example.com")).is_none());
        assert!(table.resolve(None).is_none());
        assert!(
            Certificates::default()
                .resolve(Some("api.example.com"))
                .is_none()
        );
    }
}
