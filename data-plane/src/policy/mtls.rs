//! `AUTH_MTLS` routes (issue 27): the caller is the client certificate it
//! presented on the HTTPS listener, verified there against `--tls-client-ca`
//! during the handshake ([`gateway_transport::tls`]).
//!
//! The identity forwarded is the certificate's subject: its Common Name,
//! else its first DNS, URI or e-mail subject alternative name, behind the
//! prefix `mtls:` ([`MTLS_SUBJECT_PREFIX`]) as `X-User-Id`, with
//! `X-User-Role: mtls`. A request that came over cleartext, or over TLS
//! without a certificate, is refused (401); with the route's `mtls_allow`
//! ([`MtlsAllow`]), so is a certificate none of whose names is listed (403).

use std::collections::HashSet;

use gateway_proto::validate::{MtlsNameKind, parse_mtls_allow_entry};
use gateway_transport::tls::ClientCertificate;
use http::HeaderValue;
use http::request::Parts;
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer as _, X509Certificate};

use crate::policy::hooks::Identity;

/// The role forwarded for a caller authenticated by its certificate.
pub const MTLS_ROLE: &str = "mtls";

/// What the forwarded `X-User-Id` of a certificate starts with, so that a
/// Common Name never equals a JWT `sub` or an API key's subject (issue 41,
/// item 15): rate limits by user, sticky balancing and upstreams tell them
/// apart. Tokens and API keys may not use it.
pub use gateway_proto::validate::MTLS_SUBJECT_PREFIX;

/// Why an `AUTH_MTLS` route refused a caller (401, or 403 for [`MtlsError::NotAllowed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MtlsError {
    /// No verified client certificate: a cleartext request, or none presented.
    #[error("a client certificate is required")]
    Missing,
    /// The certificate names no subject that can be a header value.
    #[error("the client certificate names no usable subject")]
    NoSubject,
    /// A verified certificate, but none of its names is on the route's `mtls_allow`.
    #[error("the client certificate is not one this route admits")]
    NotAllowed,
}

/// A route's `mtls_allow`, compiled once per snapshot: the names admitted,
/// by the kind of certificate name each may match. DNS names and e-mail
/// addresses are held in lower case and compared so.
#[derive(Debug, Default)]
pub struct MtlsAllow {
    cn: HashSet<Box<str>>,
    dns: HashSet<Box<str>>,
    uri: HashSet<Box<str>>,
    email: HashSet<Box<str>>,
}

impl MtlsAllow {
    /// The allow list of `entries` (validated: see
    /// [`parse_mtls_allow_entry`]); `None` when empty, which admits any
    /// verified certificate.
    pub fn compile(entries: &[String]) -> Option<Self> {
        if entries.is_empty() {
            return None;
        }
        let mut allow = Self::default();
        for (kind, name) in entries
            .iter()
            .filter_map(|e| parse_mtls_allow_entry(e).ok())
        {
            let lower = || name.to_ascii_lowercase().into_boxed_str();
            match kind {
                MtlsNameKind::Cn => _ = allow.cn.insert(name.into()),
                MtlsNameKind::Dns => _ = allow.dns.insert(lower()),
                MtlsNameKind::Uri => _ = allow.uri.insert(name.into()),
                MtlsNameKind::Email => _ = allow.email.insert(lower()),
                MtlsNameKind::Any => {
                    allow.cn.insert(name.into());
                    allow.uri.insert(name.into());
                    allow.dns.insert(lower());
                    allow.email.insert(lower());
                }
            }
        }
        Some(allow)
    }

    /// Whether any Common Name or DNS, URI or e-mail SAN of `cert` is listed.
    fn admits(&self, cert: &X509Certificate<'_>) -> bool {
        if cert
            .subject()
            .iter_common_name()
            .filter_map(|cn| cn.as_str().ok())
            .any(|cn| self.cn.contains(cn))
        {
            return true;
        }
        let Ok(Some(san)) = cert.subject_alternative_name() else {
            return false;
        };
        san.value.general_names.iter().any(|name| match name {
            GeneralName::DNSName(n) => self.dns.contains(n.to_ascii_lowercase().as_str()),
            GeneralName::URI(n) => self.uri.contains(*n),
            GeneralName::RFC822Name(n) => self.email.contains(n.to_ascii_lowercase().as_str()),
            _ => false,
        })
    }
}

/// The identity of the client certificate of the request's connection,
/// if `allow` (the route's `mtls_allow`, `None`: any) admits it.
pub fn identity(parts: &Parts, allow: Option<&MtlsAllow>) -> Result<Identity, MtlsError> {
    let certificate = parts
        .extensions
        .get::<ClientCertificate>()
        .ok_or(MtlsError::Missing)?;
    // The handshake verified it, so it parses.
    let (_, cert) = X509Certificate::from_der(&certificate.0).map_err(|_| MtlsError::NoSubject)?;
    let subject = subject(&cert).ok_or(MtlsError::NoSubject)?;
    if allow.is_some_and(|allow| !allow.admits(&cert)) {
        return Err(MtlsError::NotAllowed);
    }
    let forwarded = format!("{MTLS_SUBJECT_PREFIX}{subject}");
    Ok(Identity {
        subject: HeaderValue::from_str(&forwarded).map_err(|_| MtlsError::NoSubject)?,
        role: HeaderValue::from_static(MTLS_ROLE),
        api_key: None,
    })
}

/// The Common Name of `cert`'s subject, else its first DNS, URI or e-mail
/// SAN; `None` when it has none.
fn subject<'a>(cert: &'a X509Certificate<'_>) -> Option<&'a str> {
    if let Some(cn) = cert
        .subject()
        .iter_common_name()
        .find_map(|cn| cn.as_str().ok())
        .filter(|cn| !cn.is_empty())
    {
        return Some(cn);
    }
    let san = cert.subject_alternative_name().ok().flatten()?;
    san.value.general_names.iter().find_map(|name| match name {
        GeneralName::DNSName(n) | GeneralName::URI(n) | GeneralName::RFC822Name(n) => Some(*n),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn parts_with(der: Option<Vec<u8>>) -> Parts {
        let mut req = http::Request::new(());
        if let Some(der) = der {
            req.extensions_mut()
                .insert(ClientCertificate(Arc::new(der.into())));
        }
        req.into_parts().0
    }

    fn certificate(cn: Option<&str>, sans: Vec<String>) -> Vec<u8> {
        let mut params = rcgen::CertificateParams::new(sans).unwrap();
        params.distinguished_name = rcgen::DistinguishedName::new();
        if let Some(cn) = cn {
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, cn);
        }
        let key = rcgen::KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().to_vec()
    }

    fn allow(entries: &[&str]) -> MtlsAllow {
        MtlsAllow::compile(&entries.iter().map(|e| (*e).to_owned()).collect::<Vec<_>>()).unwrap()
    }

    #[test]
    fn the_common_name_else_the_first_san_is_the_subject_behind_the_prefix() {
        let id = identity(
            &parts_with(Some(certificate(
                Some("billing-service"),
                vec!["billing.internal".into()],
            ))),
            None,
        )
        .unwrap();
        assert_eq!(id.subject, "mtls:billing-service");
        assert_eq!(id.role, MTLS_ROLE);
        let id = identity(
            &parts_with(Some(certificate(None, vec!["reports.internal".into()]))),
            None,
        )
        .unwrap();
        assert_eq!(id.subject, "mtls:reports.internal");
    }

    #[test]
    fn tokens_may_not_take_the_certificate_prefix() {
        assert_eq!(gateway_jwt::RESERVED_SUB_PREFIX, MTLS_SUBJECT_PREFIX);
    }

    #[test]
    fn no_certificate_or_no_subject_is_refused() {
        assert_eq!(
            identity(&parts_with(None), None).err(),
            Some(MtlsError::Missing)
        );
        assert_eq!(
            identity(&parts_with(Some(certificate(None, vec![]))), None).err(),
            Some(MtlsError::NoSubject)
        );
    }

    #[test]
    fn the_allow_list_admits_a_certificate_by_its_common_name() {
        let billing = parts_with(Some(certificate(
            Some("billing-service"),
            vec!["billing.internal".into()],
        )));
        for entries in [
            &["billing-service"][..],
            &["cn:billing-service"],
            &["reports", "cn:billing-service"],
        ] {
            let id = identity(&billing, Some(&allow(entries))).unwrap();
            assert_eq!(id.subject, "mtls:billing-service", "{entries:?}");
        }
        // Common Names compare exactly, and a cn: entry matches no SAN.
        for entries in [&["cn:Billing-Service"][..], &["cn:billing.internal"]] {
            assert_eq!(
                identity(&billing, Some(&allow(entries))).err(),
                Some(MtlsError::NotAllowed),
                "{entries:?}"
            );
        }
    }

    #[test]
    fn the_allow_list_admits_a_certificate_by_a_subject_alternative_name() {
        let billing = parts_with(Some(certificate(
            Some("billing-service"),
            vec!["billing.internal".into(), "Billing.Example.ORG".into()],
        )));
        // Any of the SANs, DNS names ignoring case; the identity is still the CN.
        for entries in [
            &["dns:billing.example.org"][..],
            &["DNS-NAME-ELSEWHERE", "billing.internal"],
            &["dns:BILLING.INTERNAL"],
        ] {
            let id = identity(&billing, Some(&allow(entries))).unwrap();
            assert_eq!(id.subject, "mtls:billing-service", "{entries:?}");
        }
        // A dns: entry matches no Common Name, a uri: entry no DNS name.
        for entries in [&["dns:billing-service"][..], &["uri:billing.internal"]] {
            assert_eq!(
                identity(&billing, Some(&allow(entries))).err(),
                Some(MtlsError::NotAllowed),
                "{entries:?}"
            );
        }
    }

    #[test]
    fn the_allow_list_admits_uri_and_email_names_each_compared_its_way() {
        use rcgen::SanType;
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.subject_alt_names = vec![
            SanType::URI(
                "spiffe://example.org/ns/prod/sa/billing"
                    .try_into()
                    .unwrap(),
            ),
            SanType::Rfc822Name("Ops@Example.ORG".try_into().unwrap()),
        ];
        let key = rcgen::KeyPair::generate().unwrap();
        let parts = parts_with(Some(params.self_signed(&key).unwrap().der().to_vec()));
        for entries in [
            &["uri:spiffe://example.org/ns/prod/sa/billing"][..],
            &["email:ops@example.org"],
            &["OPS@example.org"],
        ] {
            let id = identity(&parts, Some(&allow(entries))).unwrap();
            assert_eq!(
                id.subject, "mtls:spiffe://example.org/ns/prod/sa/billing",
                "{entries:?}"
            );
        }
        // URIs compare exactly.
        assert_eq!(
            identity(
                &parts,
                Some(&allow(&["uri:SPIFFE://example.org/ns/prod/sa/billing"]))
            )
            .err(),
            Some(MtlsError::NotAllowed)
        );
    }

    #[test]
    fn a_certificate_not_on_the_list_is_refused() {
        let reports = parts_with(Some(certificate(
            Some("reports"),
            vec!["reports.internal".into()],
        )));
        assert_eq!(
            identity(
                &reports,
                Some(&allow(&["billing-service", "dns:billing.internal"]))
            )
            .err(),
            Some(MtlsError::NotAllowed)
        );
        // Without a list, any verified certificate is the caller.
        assert!(MtlsAllow::compile(&[]).is_none());
        assert!(identity(&reports, None).is_ok());
    }
}
