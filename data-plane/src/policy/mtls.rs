//! `AUTH_MTLS` routes (issue 27): the caller is the client certificate it
//! presented on the HTTPS listener, verified there against `--tls-client-ca`
//! during the handshake ([`gateway_transport::tls`]).
//!
//! The identity forwarded is the certificate's subject: its Common Name,
//! else its first DNS, URI or e-mail subject alternative name, as
//! `X-User-Id`, with `X-User-Role: mtls`. A request that came over cleartext,
//! or over TLS without a certificate, is refused.

use gateway_transport::tls::ClientCertificate;
use http::HeaderValue;
use http::request::Parts;
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer as _, X509Certificate};

use crate::policy::hooks::Identity;

/// The role forwarded for a caller authenticated by its certificate.
pub const MTLS_ROLE: &str = "mtls";

/// Why an `AUTH_MTLS` route refused a caller (401).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MtlsError {
    /// No verified client certificate: a cleartext request, or none presented.
    #[error("a client certificate is required")]
    Missing,
    /// The certificate names no subject that can be a header value.
    #[error("the client certificate names no usable subject")]
    NoSubject,
}

/// The identity of the client certificate of the request's connection.
pub fn identity(parts: &Parts) -> Result<Identity, MtlsError> {
    let certificate = parts
        .extensions
        .get::<ClientCertificate>()
        .ok_or(MtlsError::Missing)?;
    let subject = subject(&certificate.0).ok_or(MtlsError::NoSubject)?;
    Ok(Identity {
        subject: HeaderValue::from_str(&subject).map_err(|_| MtlsError::NoSubject)?,
        role: HeaderValue::from_static(MTLS_ROLE),
        api_key: None,
    })
}

/// The Common Name of `der`'s subject, else its first DNS, URI or e-mail
/// SAN; `None` when it has none (or does not parse, which the handshake's
/// verification already ruled out).
fn subject(der: &[u8]) -> Option<String> {
    let (_, cert) = X509Certificate::from_der(der).ok()?;
    if let Some(cn) = cert
        .subject()
        .iter_common_name()
        .find_map(|cn| cn.as_str().ok())
        .filter(|cn| !cn.is_empty())
    {
        return Some(cn.to_owned());
    }
    let san = cert.subject_alternative_name().ok().flatten()?;
    san.value.general_names.iter().find_map(|name| match name {
        GeneralName::DNSName(n) | GeneralName::URI(n) | GeneralName::RFC822Name(n) => {
            Some((*n).to_owned())
        }
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

    #[test]
    fn the_common_name_else_the_first_san_is_the_subject() {
        let id = identity(&parts_with(Some(certificate(
            Some("billing-service"),
            vec!["billing.internal".into()],
        ))))
        .unwrap();
        assert_eq!(id.subject, "billing-service");
        assert_eq!(id.role, MTLS_ROLE);
        let id = identity(&parts_with(Some(certificate(
            None,
            vec!["reports.internal".into()],
        ))))
        .unwrap();
        assert_eq!(id.subject, "reports.internal");
    }

    #[test]
    fn no_certificate_or_no_subject_is_refused() {
        assert_eq!(identity(&parts_with(None)).err(), Some(MtlsError::Missing));
        assert_eq!(
            identity(&parts_with(Some(certificate(None, vec![])))).err(),
            Some(MtlsError::NoSubject)
        );
    }
}
