//! TLS to upstream instances (`Upstream.tls`, https:// instance URLs;
//! issue 27): one scheme per upstream, `tls` only where the instances are
//! spoken to over TLS, the CA bundle parsed, the server name a host name or
//! an IP address, and the client certificate a `Certificate` of the same
//! configuration ([`validate_client_certificates`], which needs both lists).

use std::collections::HashSet;

use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::{PemObject as _, SectionKind};
use x509_parser::certificate::X509Certificate;
use x509_parser::prelude::FromDer as _;

use super::{ValidationError, Validator, is_valid_hostname, is_valid_name, parse_instance_url};
use crate::v1::{Certificate, Upstream};

/// Longest accepted `tls.ca_pem`, in bytes.
pub const MAX_CA_PEM_LEN: usize = 65_536;

/// The CA certificates of a `ca_pem`, parsed (DER), or why not.
pub fn parse_ca_pem(pem: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    if pem.len() > MAX_CA_PEM_LEN {
        return Err(format!(
            "must be at most {MAX_CA_PEM_LEN} bytes (got {})",
            pem.len()
        ));
    }
    let mut cas = Vec::new();
    for section in <(SectionKind, Vec<u8>)>::pem_slice_iter(pem.as_bytes()) {
        match section {
            Ok((SectionKind::Certificate, der)) => {
                if X509Certificate::from_der(&der).is_err() {
                    return Err(format!(
                        "certificate {} is not a valid X.509 certificate",
                        cas.len() + 1
                    ));
                }
                cas.push(CertificateDer::from(der));
            }
            Ok(_) => return Err("must hold only CERTIFICATE blocks".to_owned()),
            Err(_) => return Err("is not valid PEM".to_owned()),
        }
    }
    if cas.is_empty() {
        return Err("holds no PEM CERTIFICATE block".to_owned());
    }
    Ok(cas)
}

impl Validator {
    /// An upstream's scheme and `tls` rules.
    pub(super) fn upstream_tls(&mut self, who: &str, u: &Upstream) {
        let schemes: HashSet<bool> = u
            .instances
            .iter()
            .filter_map(|i| parse_instance_url(&i.url).ok().map(|p| p.tls))
            .collect();
        if schemes.len() > 1 {
            self.push(format!(
                "{who}: instances must all be http:// or all https:// (one upstream, one scheme)"
            ));
        }
        let Some(tls) = &u.tls else {
            return;
        };
        if u.discovery.is_none() && schemes.contains(&false) {
            self.push(format!(
                "{who}: tls is only for https:// instances (or discovery); make the instance URLs https://"
            ));
        }
        if !tls.ca_pem.is_empty()
            && let Err(why) = parse_ca_pem(&tls.ca_pem)
        {
            self.push(format!("{who}: tls.ca_pem {why}"));
        }
        if !tls.server_name.is_empty()
            && tls.server_name.parse::<std::net::IpAddr>().is_err()
            && !is_valid_hostname(&tls.server_name)
        {
            self.push(format!(
                "{who}: tls.server_name \"{}\" is not a host name or an IP address",
                tls.server_name
            ));
        }
        if !tls.client_certificate.is_empty() && !is_valid_name(&tls.client_certificate) {
            self.push(format!(
                "{who}: tls.client_certificate must be the name of a certificate ([a-z0-9][a-z0-9-]*)"
            ));
        }
    }
}

/// Every `tls.client_certificate` names a certificate of `certificates`.
pub fn validate_client_certificates(
    upstreams: &[Upstream],
    certificates: &[Certificate],
) -> Result<(), ValidationError> {
    let names: HashSet<&str> = certificates.iter().map(|c| c.name.as_str()).collect();
    let mut v = Validator::default();
    for u in upstreams {
        if let Some(tls) = &u.tls
            && !tls.client_certificate.is_empty()
            && !names.contains(tls.client_certificate.as_str())
        {
            v.push(format!(
                "upstream \"{}\": tls.client_certificate \"{}\" does not exist (add it with UpsertCertificate first; a certificate an upstream names cannot be deleted)",
                u.name, tls.client_certificate
            ));
        }
    }
    v.finish()
}
