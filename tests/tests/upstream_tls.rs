//! HTTPS and mTLS to upstream instances (issue 27) against real processes:
//! devstack's control plane and data plane, and the mock service serving
//! TLS (`mock_service::serve_tls`, as `--tls-cert`/`--client-ca` do) with a
//! throwaway CA.
//!
//! * an `https://` instance whose certificate chains to the upstream's
//!   `tls.ca_pem` is proxied to, and health-checked over TLS;
//! * one whose certificate does not (a wrong CA) gives 502 and
//!   `gateway_upstream_errors_total{kind="tls"}`, and its health check fails;
//! * an instance that requires a client certificate gets the
//!   `tls.client_certificate` named, a `Certificate` of the configuration,
//!   and refuses the gateway without it; as an `HTTP2` upstream (ALPN h2)
//!   the same instance takes a gRPC call through the gateway;
//! * the rules: one scheme per upstream, `tls` only over TLS, a CA bundle that
//!   parses, a client certificate that exists and cannot be deleted while named.
//!
//! Needs every binary built in the same target directory
//! (`cargo build --workspace --bins`) and `redis-server` on PATH.
#![allow(
    clippy::unwrap_used,
    reason = "test code: unwrap stops the test where it failed"
)]

use std::time::Duration;

use anyhow::{Result, ensure};
use devstack::Stack;
use devstack::pki::Pki;
use gateway_proto::v1::{
    Certificate, DeleteCertificateRequest, HealthCheck, Instance, UpsertCertificateRequest,
    UpsertUpstreamRequest, Upstream, UpstreamProtocol, UpstreamTls,
};
use gateway_tests::{
    client, metric_sample, one_data_plane, open_route, poll, upsert_route_synced,
    upsert_upstream_synced,
};
use mock_service::grpc::v1::EchoRequest;
use mock_service::grpc::v1::echo_client::EchoClient;

mod tls_mock;

const DEADLINE: Duration = Duration::from_secs(20);

/// An upstream `name` with one https:// instance on `port` (`localhost`,
/// which the mock's certificate is for), checked against `ca`.
fn https_upstream(name: &str, port: u16, ca: &Pki, client_certificate: &str) -> Upstream {
    Upstream {
        name: name.into(),
        instances: vec![Instance {
            id: format!("{name}-1"),
            url: format!("https://localhost:{port}"),
            ..Default::default()
        }],
        tls: Some(UpstreamTls {
            ca_pem: std::fs::read_to_string(&ca.ca).unwrap(),
            server_name: String::new(),
            client_certificate: client_certificate.into(),
        }),
        health_check: Some(HealthCheck {
            path: "/health".into(),
            interval_ms: 300,
            timeout_ms: 300,
            unhealthy_threshold: 1,
            healthy_threshold: 1,
        }),
        ..Default::default()
    }
}

/// GET `path` on the stack's gateway: status and body.
async fn get(stack: &Stack, path: &str) -> Result<(u16, String)> {
    let resp = client()
        .get(format!("{}{path}", stack.gateways()[0]))
        .send()
        .await?;
    Ok((resp.status().as_u16(), resp.text().await?))
}

/// `gateway_upstream_healthy{upstream,instance}` of the stack's data plane.
async fn healthy(stack: &Stack, upstream: &str) -> Result<f64> {
    metric_sample(
        &stack.gateway_admins()[0],
        &format!("gateway_upstream_healthy{{upstream=\"{upstream}\",instance=\"{upstream}-1\"}}"),
    )
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn an_https_upstream_is_proxied_to_and_health_checked_and_a_wrong_ca_is_a_502() -> Result<()>
{
    let dir = tempfile::tempdir()?;
    let pki = Pki::generate(&dir.path().join("upstream"))?;
    let other = Pki::generate(&dir.path().join("other"))?;
    let (addr, _mock) = tls_mock::start(&pki, false).await;
    let port = addr.port();
    let stack = one_data_plane(&[]).await;

    upsert_upstream_synced(&stack, https_upstream("secure", port, &pki, "")).await?;
    upsert_route_synced(&stack, open_route("secure", "/secure", "secure", "/orders")).await?;
    let (status, body) = get(&stack, "/secure/7").await?;
    ensure!(status == 200, "{status} {body}");
    let doc: serde_json::Value = serde_json::from_str(&body)?;
    ensure!(doc["instance"] == "orders-tls" && doc["id"] == "7", "{doc}");
    // The health check goes over TLS too, and passes.
    poll(DEADLINE, "the https instance healthy", || async {
        match healthy(&stack, "secure").await {
            Ok(1.0) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await?;

    // A CA that did not sign the instance's certificate: 502, counted as a TLS failure.
    // (First without its health check, which would soon make it 503 instead.)
    let unchecked = Upstream {
        health_check: None,
        ..https_upstream("secure", port, &other, "")
    };
    upsert_upstream_synced(&stack, unchecked).await?;
    let (status, body) = get(&stack, "/secure/7").await?;
    ensure!(status == 502, "{status} {body}");
    let tls_failures = metric_sample(
        &stack.gateway_admins()[0],
        "gateway_upstream_errors_total{upstream=\"secure\",instance=\"secure-1\",kind=\"tls\"}",
    )
    .await?;
    ensure!(tls_failures >= 1.0, "{tls_failures}");
    upsert_upstream_synced(&stack, https_upstream("secure", port, &other, "")).await?;
    poll(DEADLINE, "the https instance unhealthy", || async {
        match healthy(&stack, "secure").await {
            Ok(0.0) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn mtls_presents_the_named_certificate_to_an_upstream_that_requires_one() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let pki = Pki::generate(dir.path())?;
    let (addr, _mock) = tls_mock::start(&pki, true).await;
    let port = addr.port();
    let stack = one_data_plane(&[]).await;
    // No health check here: it would mark the instance down while the
    // gateway has no client certificate, and this test is about requests.
    let https_upstream = |name: &str, port, ca: &Pki, client: &str| Upstream {
        health_check: None,
        ..https_upstream(name, port, ca, client)
    };

    // Without a client certificate the instance refuses the handshake: 502.
    upsert_upstream_synced(&stack, https_upstream("mtls", port, &pki, "")).await?;
    upsert_route_synced(&stack, open_route("mtls", "/mtls", "mtls", "/orders")).await?;
    let (status, body) = get(&stack, "/mtls/3").await?;
    ensure!(status == 502, "{status} {body}");

    // A client certificate of the configuration, then named by the upstream.
    let mut admin = stack.admin_client().await;
    let upsert = |c: Certificate| UpsertCertificateRequest {
        certificate: Some(c),
        expected_version: None,
    };
    let version = admin
        .upsert_certificate(upsert(Certificate {
            name: "mesh-client".into(),
            cert_chain_pem: std::fs::read_to_string(&pki.client_cert)?,
            private_key_pem: std::fs::read_to_string(&pki.client_key)?,
            ..Default::default()
        }))
        .await?
        .into_inner()
        .version;
    stack.wait_synced(version).await?;
    upsert_upstream_synced(&stack, https_upstream("mtls", port, &pki, "mesh-client")).await?;
    let (status, body) = get(&stack, "/mtls/3").await?;
    ensure!(status == 200, "{status} {body}");
    let doc: serde_json::Value = serde_json::from_str(&body)?;
    ensure!(doc["instance"] == "orders-tls", "{doc}");

    // The same instance as an HTTP2 upstream (ALPN h2), with the client
    // certificate: a gRPC call through the gateway reaches it.
    let h2 = Upstream {
        protocol: UpstreamProtocol::Http2 as i32,
        ..https_upstream("mtls", port, &pki, "mesh-client")
    };
    upsert_upstream_synced(&stack, h2).await?;
    upsert_route_synced(&stack, open_route("mtls-grpc", "/mock.v1.Echo", "mtls", "")).await?;
    let mut echo = EchoClient::connect(stack.gateways()[0].clone()).await?;
    let reply = echo
        .unary(EchoRequest {
            message: "over h2 and mTLS".into(),
            ..Default::default()
        })
        .await?
        .into_inner();
    ensure!(
        reply.instance == "orders-tls" && reply.message == "over h2 and mTLS",
        "{reply:?}"
    );

    // The certificate an upstream names cannot be deleted.
    let e = admin
        .delete_certificate(DeleteCertificateRequest {
            name: "mesh-client".into(),
            expected_version: None,
        })
        .await
        .unwrap_err();
    ensure!(e.code() == tonic::Code::InvalidArgument, "{e:?}");
    ensure!(
        e.message()
            .contains("upstream \"mtls\": tls.client_certificate \"mesh-client\" does not exist"),
        "{e:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn upstream_tls_mistakes_are_refused_with_the_reason() -> Result<()> {
    let stack = one_data_plane(&[]).await;
    let dir = tempfile::tempdir()?;
    let pki = Pki::generate(dir.path())?;
    let mut admin = stack.admin_client().await;
    let refused = |u: Upstream| {
        let mut admin = admin.clone();
        async move {
            admin
                .upsert_upstream(UpsertUpstreamRequest {
                    upstream: Some(u),
                    expected_version: None,
                })
                .await
                .unwrap_err()
        }
    };
    let mut mixed = https_upstream("mixed", 1, &pki, "");
    mixed.instances.push(Instance {
        id: "mixed-2".into(),
        url: "http://localhost:2".into(),
        ..Default::default()
    });
    let e = refused(mixed).await;
    ensure!(
        e.message()
            .contains("instances must all be http:// or all https://"),
        "{e:?}"
    );
    let mut cleartext = https_upstream("plain", 1, &pki, "");
    cleartext.instances[0].url = "http://localhost:1".into();
    let e = refused(cleartext).await;
    ensure!(
        e.message().contains("tls is only for https:// instances"),
        "{e:?}"
    );
    let mut bad_ca = https_upstream("bad-ca", 1, &pki, "");
    bad_ca.tls.as_mut().unwrap().ca_pem =
        "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n".into();
    let e = refused(bad_ca).await;
    ensure!(
        e.message().contains("upstream \"bad-ca\": tls.ca_pem"),
        "{e:?}"
    );
    let e = refused(https_upstream("ghost", 1, &pki, "nobody")).await;
    ensure!(
        e.message()
            .contains("tls.client_certificate \"nobody\" does not exist"),
        "{e:?}"
    );
    ensure!(e.code() == tonic::Code::InvalidArgument, "{e:?}");
    // Nothing of it was committed.
    let listed = admin
        .list_upstreams(gateway_proto::v1::ListUpstreamsRequest {})
        .await?
        .into_inner();
    ensure!(
        listed.upstreams.iter().all(|u| u.tls.is_none()),
        "{listed:?}"
    );
    Ok(())
}
