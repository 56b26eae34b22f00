//! What devstack tells people once the stack is up: the one-line JSON of
//! `--json` (docs/devstack.md) and the paste-ready examples shown otherwise.

use std::collections::BTreeMap;

use serde::Serialize;

/// The `--json` line. Field names are the public contract; new fields may
/// be added, none renamed.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct StackInfo {
    /// Control-plane gRPC address, `"127.0.0.1:P"`.
    pub control_plane: String,
    /// The control plane's web console URL (extension).
    pub console: String,
    /// Proxy URL of each data plane.
    pub gateways: Vec<String>,
    /// Ops URL of each data plane.
    pub gateway_admins: Vec<String>,
    /// HTTPS URL of each data plane (`https://localhost:P`).
    pub gateways_tls: Vec<String>,
    /// The CA certificate file the HTTPS listeners' certificate chains to (`curl --cacert`).
    pub edge_ca: String,
    /// Auth service URL.
    pub auth: String,
    /// Redis URL.
    pub redis: String,
    /// Pid of every running process, by stack name.
    pub pids: BTreeMap<String, u32>,
    /// Directory of the process logs (extension).
    pub log_dir: String,
    /// The configuration version the data planes synced to (extension).
    pub config_version: u64,
    /// The control plane's admin token, for `grpcurl -H "authorization: Bearer …"`.
    pub admin_token: String,
    /// The control plane's viewer token (read-only), for the console (extension).
    pub viewer_token: String,
    /// With `--tls`: the CA certificate file (`grpcurl -cacert`); `client.pem`
    /// and `client-key.pem` next to it are a client certificate (`-cert`, `-key`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca: Option<String>,
}

impl StackInfo {
    /// The JSON document on one line.
    pub fn to_json_line(&self) -> String {
        serde_json::to_string(self).expect("plain strings and numbers always serialise")
    }

    /// The human summary with paste-ready curl and grpcurl commands.
    pub fn examples(&self) -> String {
        let gw = self
            .gateways
            .first()
            .map_or("http://127.0.0.1:8080", String::as_str);
        let ops = self
            .gateway_admins
            .first()
            .map_or("http://127.0.0.1:9901", String::as_str);
        let gw_tls = self
            .gateways_tls
            .first()
            .map_or("https://localhost:8443", String::as_str);
        let cp = &self.control_plane;
        // grpcurl's transport flags: plaintext, or the stack's CA and client certificate.
        let transport = match &self.ca {
            None => "-plaintext".to_owned(),
            Some(ca) => {
                let dir = std::path::Path::new(ca)
                    .parent()
                    .map(|d| d.display().to_string())
                    .unwrap_or_default();
                format!("-cacert {ca} -cert {dir}/client.pem -key {dir}/client-key.pem")
            }
        };
        let list = |v: &[String]| v.join("  ");
        let pid_list = self
            .pids
            .iter()
            .map(|(name, pid)| format!("{name}={pid}"))
            .collect::<Vec<_>>()
            .join(" ");
        format!(
            r#"devstack is up: configuration version {version} is live on every gateway.

  gateways        {gateways}
  gateways (TLS)  {gateways_tls}  (CA {edge_ca})
  gateway ops     {admins}
  control plane   {cp}  (gRPC with reflection)
  console         {console}  (sign in with $ADMIN_TOKEN, or the viewer token {viewer_token})
  auth service    {auth}
  redis           {redis}
  processes       {pid_list}
  logs            {logs}/<process>.log

Try it:

  # log in as alice through the gateway and keep the access token
  TOKEN=$(curl -s -X POST {gw}/auth/login -H 'content-type: application/json' \
    -d '{{"username":"alice","password":"wonderland"}}' | sed -E 's/.*"access_token":"([^"]+)".*/\1/')

  # call the users and orders services with it
  curl -s {gw}/api/users/1 -H "Authorization: Bearer $TOKEN"
  curl -s {gw}/api/orders/7 -H "Authorization: Bearer $TOKEN"
  # both at once: the aggregation route joins user 7 and order 7 in one JSON object
  curl -s {gw}/api/overview/7 -H "Authorization: Bearer $TOKEN"
  # the same over HTTPS (HTTP/2 by ALPN), trusting the stack's throwaway CA
  curl -s --cacert {edge_ca} {gw_tls}/api/users/1 -H "Authorization: Bearer $TOKEN"

  # inspect and change the configuration (the admin token of this stack)
  ADMIN_TOKEN={admin_token}
  grpcurl {transport} {cp} list
  grpcurl {transport} -H "authorization: Bearer $ADMIN_TOKEN" {cp} gateway.v1.AdminService/ListRoutes
  grpcurl {transport} -H "authorization: Bearer $ADMIN_TOKEN" {cp} gateway.v1.AdminService/ListDataPlanes
  grpcurl {transport} -H "authorization: Bearer $ADMIN_TOKEN" \
    -d '{{"route":{{"name":"open-orders","pathPrefix":"/open/orders","upstream":"orders","rewritePrefix":"/orders"}}}}' \
    {cp} gateway.v1.AdminService/UpsertRoute
  curl -s {gw}/open/orders/7

  # data-plane state
  curl -s {ops}/health/circuit-breakers
  curl -s {ops}/metrics | head

Press Ctrl-C to stop everything."#,
            version = self.config_version,
            gateways = list(&self.gateways),
            admins = list(&self.gateway_admins),
            gateways_tls = list(&self.gateways_tls),
            edge_ca = self.edge_ca,
            auth = self.auth,
            redis = self.redis,
            logs = self.log_dir,
            admin_token = self.admin_token,
            console = self.console,
            viewer_token = self.viewer_token,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info() -> StackInfo {
        StackInfo {
            control_plane: "127.0.0.1:50051".into(),
            console: "http://127.0.0.1:8800".into(),
            gateways: vec![
                "http://127.0.0.1:8080".into(),
                "http://127.0.0.1:8081".into(),
            ],
            gateway_admins: vec![
                "http://127.0.0.1:9901".into(),
                "http://127.0.0.1:9902".into(),
            ],
            gateways_tls: vec![
                "https://localhost:8443".into(),
                "https://localhost:8444".into(),
            ],
            edge_ca: "/tmp/devstack-x/edge-tls/edge-ca.pem".into(),
            auth: "http://127.0.0.1:4000".into(),
            redis: "redis://127.0.0.1:6390".into(),
            pids: BTreeMap::from([("control-plane".into(), 10), ("redis".into(), 11)]),
            log_dir: "/tmp/devstack-x/logs".into(),
            config_version: 1,
            admin_token: "0123abcd".into(),
            viewer_token: "4567cdef".into(),
            ca: None,
        }
    }

    #[test]
    fn json_line_has_the_contract_fields() {
        let line = info().to_json_line();
        assert!(!line.contains('\n'));
        let doc: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(doc["control_plane"], "127.0.0.1:50051");
        assert_eq!(doc["gateways"][1], "http://127.0.0.1:8081");
        assert_eq!(doc["gateway_admins"][0], "http://127.0.0.1:9901");
        assert_eq!(doc["gateways_tls"][1], "https://localhost:8444");
        assert_eq!(doc["edge_ca"], "/tmp/devstack-x/edge-tls/edge-ca.pem");
        assert_eq!(doc["auth"], "http://127.0.0.1:4000");
        assert_eq!(doc["redis"], "redis://127.0.0.1:6390");
        assert_eq!(doc["pids"]["control-plane"], 10);
        assert_eq!(doc["admin_token"], "0123abcd");
        assert_eq!(doc["console"], "http://127.0.0.1:8800");
        assert_eq!(doc["viewer_token"], "4567cdef");
        assert!(doc.get("ca").is_none(), "{line}");
        let tls = StackInfo {
            ca: Some("/tmp/devstack-x/tls/ca.pem".into()),
            ..info()
        };
        let doc: serde_json::Value = serde_json::from_str(&tls.to_json_line()).unwrap();
        assert_eq!(doc["ca"], "/tmp/devstack-x/tls/ca.pem");
        assert!(tls.examples().contains(
            "grpcurl -cacert /tmp/devstack-x/tls/ca.pem -cert /tmp/devstack-x/tls/client.pem \
             -key /tmp/devstack-x/tls/client-key.pem 127.0.0.1:50051 list"
        ));
    }

    #[test]
    fn examples_use_the_real_addresses() {
        let text = info().examples();
        assert!(text.contains("curl -s -X POST http://127.0.0.1:8080/auth/login"));
        assert!(text.contains(
            "curl -s http://127.0.0.1:8080/api/users/1 -H \"Authorization: Bearer $TOKEN\""
        ));
        assert!(text.contains(
            "curl -s http://127.0.0.1:8080/api/overview/7 -H \"Authorization: Bearer $TOKEN\""
        ));
        assert!(text.contains(
            "curl -s --cacert /tmp/devstack-x/edge-tls/edge-ca.pem https://localhost:8443/api/users/1"
        ));
        assert!(text.contains("ADMIN_TOKEN=0123abcd\n"));
        assert!(text.contains("console         http://127.0.0.1:8800"));
        assert!(text.contains(
            "grpcurl -plaintext -H \"authorization: Bearer $ADMIN_TOKEN\" 127.0.0.1:50051 \
             gateway.v1.AdminService/ListDataPlanes"
        ));
        assert!(text.contains(r#"{"username":"alice","password":"wonderland"}"#));
    }
}
