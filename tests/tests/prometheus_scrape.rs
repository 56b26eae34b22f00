//! The Prometheus configuration of deploy/observability works against a
//! running gateway: Debian's `prometheus` server, started with that
//! `prometheus.yml` (and its `alerts.yml`), scrapes a devstack's data planes
//! and control plane, every target is `up`, and every rule evaluates without
//! error.
//!
//! Only where the targets are found changes: the compose file finds data
//! planes by Docker DNS (`data-plane:9901`) and the control plane as
//! `control-plane:9090`; here they are the stack's loopback addresses. Jobs,
//! paths, rule files and everything else are the file's own. The scrape
//! interval is 1 s instead of 15 s so the test waits seconds, not minutes.
//!
//! Needs `prometheus` on PATH (`apt-get install -y prometheus`; scripts/test
//! installs it) and every binary built in the same target directory.
#![allow(
    clippy::unwrap_used,
    reason = "test code: unwrap stops the test where it failed"
)]

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use devstack::Stack;
use devstack::ports::free_port;
use gateway_tests::{client, poll};
use serde_json::Value;

const CONFIG_DIR: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../deploy/observability/prometheus"
);

/// `text` with `from` replaced by `to`, which must be there exactly once.
fn replace_once(text: &str, from: &str, to: &str) -> String {
    assert_eq!(
        text.matches(from).count(),
        1,
        "prometheus.yml no longer holds {from:?}: update this test with it"
    );
    text.replacen(from, to, 1)
}

/// The compose stack's prometheus.yml with the stack's addresses.
fn local_config(data_planes: &[String], control_plane: &str, prometheus: &str) -> String {
    let original = std::fs::read_to_string(Path::new(CONFIG_DIR).join("prometheus.yml")).unwrap();
    let targets = data_planes
        .iter()
        .map(|a| format!("\"{a}\""))
        .collect::<Vec<_>>()
        .join(", ");
    let text = replace_once(
        &original,
        "    dns_sd_configs:\n      - names: [data-plane-ops]\n        type: A\n        port: 9901\n        refresh_interval: 15s\n",
        &format!("    static_configs:\n      - targets: [{targets}]\n"),
    );
    let text = replace_once(
        &text,
        "[\"control-plane:9090\"]",
        &format!("[\"{control_plane}\"]"),
    );
    let text = replace_once(
        &text,
        "[\"localhost:9090\"]",
        &format!("[\"{prometheus}\"]"),
    );
    let text = replace_once(&text, "scrape_interval: 15s", "scrape_interval: 1s");
    replace_once(&text, "evaluation_interval: 15s", "evaluation_interval: 1s")
}

async fn api(prometheus: &str, path: &str) -> Result<Value, String> {
    let response = client()
        .get(format!("http://{prometheus}{path}"))
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let body: Value = response.json().await.map_err(|e| e.to_string())?;
    if body["status"] != "success" {
        return Err(format!("{path}: {body}"));
    }
    Ok(body["data"].clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrapes_every_data_plane_and_the_control_plane_with_the_shipped_config() {
    let cp_metrics = format!("127.0.0.1:{}", free_port().unwrap());
    let stack = Stack::new()
        .data_planes(2)
        .auth(false)
        .env("control-plane", "CONTROL_PLANE_METRICS_LISTEN", &cp_metrics)
        .start()
        .await
        .unwrap_or_else(|e| panic!("stack did not start: {e}"));
    let ops: Vec<String> = stack
        .ports()
        .gateway_admins
        .iter()
        .map(|p| format!("127.0.0.1:{p}"))
        .collect();
    let prometheus = format!("127.0.0.1:{}", free_port().unwrap());

    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("prometheus.yml"),
        local_config(&ops, &cp_metrics, &prometheus),
    )
    .unwrap();
    std::fs::copy(
        Path::new(CONFIG_DIR).join("alerts.yml"),
        dir.path().join("alerts.yml"),
    )
    .unwrap();
    let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
    let mut server = tokio::process::Command::new("prometheus")
        .arg(format!(
            "--config.file={}",
            dir.path().join("prometheus.yml").display()
        ))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.path().join("data").display()
        ))
        .arg(format!("--web.listen-address={prometheus}"))
        .stdout(Stdio::null())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .expect("prometheus on PATH (apt-get install -y prometheus; scripts/test installs it)");

    // Every target of the three jobs up: two data planes, the control plane, Prometheus itself.
    let up = poll(Duration::from_secs(60), "every target up", || {
        let prometheus = prometheus.clone();
        async move {
            let data = api(&prometheus, "/api/v1/targets?state=active").await?;
            let targets = data["activeTargets"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let mut by_job: BTreeMap<String, Vec<String>> = BTreeMap::new();
            for t in &targets {
                if t["health"] != "up" {
                    return Err(format!("not up yet: {t}"));
                }
                by_job
                    .entry(t["labels"]["job"].as_str().unwrap_or_default().to_owned())
                    .or_default()
                    .push(
                        t["labels"]["instance"]
                            .as_str()
                            .unwrap_or_default()
                            .to_owned(),
                    );
            }
            if by_job.get("data-plane").map(Vec::len) == Some(2)
                && by_job.contains_key("control-plane")
                && by_job.contains_key("prometheus")
            {
                Ok(by_job)
            } else {
                Err(format!("targets so far: {by_job:?}"))
            }
        }
    })
    .await
    .unwrap_or_else(|e| {
        let log = std::fs::read_to_string(dir.path().join("prometheus.log")).unwrap_or_default();
        panic!("{e}\nprometheus log:\n{log}")
    });
    let mut scraped = up["data-plane"].clone();
    scraped.sort();
    let mut expected = ops.clone();
    expected.sort();
    assert_eq!(scraped, expected);
    assert_eq!(up["control-plane"], vec![cp_metrics.clone()]);

    // The gateway's own series arrived under the jobs the rules and the dashboard use.
    let versions = poll(
        Duration::from_secs(30),
        "the data planes' config version",
        || {
            let prometheus = prometheus.clone();
            async move {
                let data = api(&prometheus, "/api/v1/query?query=gateway_config_version").await?;
                let n = data["result"].as_array().map_or(0, Vec::len);
                if n == 2 {
                    Ok(data)
                } else {
                    Err(format!("{n} series: {data}"))
                }
            }
        },
    )
    .await
    .unwrap();
    for series in versions["result"].as_array().unwrap() {
        assert_eq!(series["metric"]["job"], "data-plane", "{series}");
        assert_eq!(
            series["value"][1],
            stack.seeded_version().to_string(),
            "{series}"
        );
    }
    let cp = api(
        &prometheus,
        "/api/v1/query?query=control_plane_config_version",
    )
    .await
    .unwrap();
    assert_eq!(cp["result"][0]["metric"]["job"], "control-plane", "{cp}");

    // alerts.yml is loaded and every rule evaluates (a rule whose query fails has health "err").
    let rules = poll(Duration::from_secs(30), "every rule evaluated once", || {
        let prometheus = prometheus.clone();
        async move {
            let data = api(&prometheus, "/api/v1/rules").await?;
            let rules: Vec<Value> = data["groups"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
                .collect();
            if !rules.is_empty() && rules.iter().all(|r| r["health"] != "unknown") {
                Ok(rules)
            } else {
                Err(format!("{} rules, not all evaluated yet", rules.len()))
            }
        }
    })
    .await
    .unwrap();
    for rule in &rules {
        assert_eq!(rule["health"], "ok", "{rule}");
    }
    assert!(
        rules
            .iter()
            .any(|r| r["name"] == "GatewayCertificateExpiringSoon"),
        "alerts.yml not loaded"
    );

    server.kill().await.unwrap();
    stack.shutdown().await;
}
