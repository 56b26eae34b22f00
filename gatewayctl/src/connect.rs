//! A client of the control plane's AdminService from the connection flags:
//! TLS and mTLS as grpcurl takes them (`--cacert`, `--cert`, `--key`), and
//! the bearer token from `GATEWAY_TOKEN` or `--token-file`.

use std::path::Path;
use std::time::Duration;

use gateway_proto::v1::admin_service_client::AdminServiceClient;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

use crate::args::Connection;
use crate::error::CtlError;

/// The AdminService client every command uses.
pub type Admin = AdminServiceClient<InterceptedService<Channel, Bearer>>;

/// Adds `authorization: Bearer TOKEN` to every call, when there is a token.
#[derive(Clone)]
pub struct Bearer(Option<MetadataValue<Ascii>>);

impl std::fmt::Debug for Bearer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Bearer(<redacted>)")
    }
}

impl Interceptor for Bearer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.0 {
            req.metadata_mut().insert("authorization", value.clone());
        }
        Ok(req)
    }
}

/// The token: `GATEWAY_TOKEN` when set and not empty, else the first line of
/// `--token-file`, else none (a control plane without a tokens file on
/// loopback takes unauthenticated calls).
pub fn token(
    env_token: Option<String>,
    token_file: Option<&Path>,
) -> Result<Option<String>, CtlError> {
    let token = match (env_token.filter(|t| !t.is_empty()), token_file) {
        (Some(t), _) => t,
        (None, Some(path)) => std::fs::read_to_string(path)
            .map_err(|e| CtlError::Read(path.display().to_string(), e))?
            .lines()
            .next()
            .unwrap_or_default()
            .trim()
            .to_owned(),
        (None, None) => return Ok(None),
    };
    if token.is_empty() {
        return Err(CtlError::Usage("the token is empty".into()));
    }
    Ok(Some(token))
}

/// Connects to `conn.server` (lazily: the first call connects, and a refused
/// connection is that call's error).
pub fn admin(conn: &Connection, token: Option<String>) -> Result<Admin, CtlError> {
    let https = conn.server.starts_with("https://");
    if !https && !conn.server.starts_with("http://") {
        return Err(CtlError::Usage(format!(
            "--server {}: give http://HOST:PORT or https://HOST:PORT",
            conn.server
        )));
    }
    let mut endpoint = Channel::from_shared(conn.server.clone())
        .map_err(|e| CtlError::Usage(format!("--server {}: {e}", conn.server)))?
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(60));
    match (&conn.cacert, https) {
        (Some(ca), true) => {
            let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read(ca)?));
            if let (Some(cert), Some(key)) = (&conn.cert, &conn.key) {
                tls = tls.identity(Identity::from_pem(read(cert)?, read(key)?));
            }
            endpoint = endpoint
                .tls_config(tls)
                .map_err(|e| CtlError::Usage(format!("TLS settings: {e}")))?;
        }
        (None, true) => {
            return Err(CtlError::Usage(
                "an https:// --server needs --cacert (the CA that signed the control plane's certificate)"
                    .into(),
            ));
        }
        (Some(_), false) => {
            return Err(CtlError::Usage(
                "--cacert is for an https:// --server; this one is http://".into(),
            ));
        }
        (None, false) if conn.cert.is_some() => {
            return Err(CtlError::Usage(
                "--cert and --key need an https:// --server and --cacert".into(),
            ));
        }
        (None, false) => {}
    }
    let bearer = match token {
        None => Bearer(None),
        Some(t) => {
            let mut value: MetadataValue<Ascii> = format!("Bearer {t}").parse().map_err(|_| {
                CtlError::Usage("the token holds characters a header cannot carry".into())
            })?;
            value.set_sensitive(true);
            Bearer(Some(value))
        }
    };
    Ok(AdminServiceClient::with_interceptor(
        endpoint.connect_lazy(),
        bearer,
    ))
}

fn read(path: &Path) -> Result<Vec<u8>, CtlError> {
    std::fs::read(path).map_err(|e| CtlError::Read(path.display().to_string(), e))
}
