//! Redis Cluster and Sentinel sets for `redis_cluster.rs` and `redis_sentinel.rs`,
//! made of devstack's one `redis-server` launcher (`devstack::RedisServer`) and
//! `redis-cli --cluster create`. Every wait polls a condition under a deadline.

#![allow(dead_code)]

use std::time::Duration;

use anyhow::{Context, ensure};
use devstack::RedisServer;
use gateway_redis::{RedisTarget, RedisUrl};
use gateway_tests::poll;

/// A Redis Cluster of masters without replicas, on loopback.
pub(crate) struct Cluster {
    pub(crate) nodes: Vec<RedisServer>,
}

/// Cluster options every node gets: a short node timeout, so a dead master is
/// marked failed (and a returning one accepted) within seconds.
const NODE_TIMEOUT_MS: &str = "1000";

impl Cluster {
    /// `masters` nodes, slots spread evenly by `redis-cli --cluster create`,
    /// waiting until every node says `cluster_state:ok`.
    pub(crate) async fn start(masters: usize) -> anyhow::Result<Self> {
        let mut nodes = Vec::with_capacity(masters);
        for _ in 0..masters {
            nodes.push(
                RedisServer::builder()
                    .arg("--cluster-enabled")
                    .arg("yes")
                    .arg("--cluster-config-file")
                    .arg("nodes.conf")
                    .arg("--cluster-node-timeout")
                    .arg(NODE_TIMEOUT_MS)
                    .start()
                    .await?,
            );
        }
        let mut create = tokio::process::Command::new("redis-cli");
        create.arg("--cluster").arg("create");
        for node in &nodes {
            create.arg(format!("127.0.0.1:{}", node.port()));
        }
        let out = create
            .arg("--cluster-yes")
            .output()
            .await
            .context("running redis-cli --cluster create")?;
        ensure!(
            out.status.success(),
            "redis-cli --cluster create: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let cluster = Self { nodes };
        cluster.wait_ok(Duration::from_secs(20)).await?;
        Ok(cluster)
    }

    /// `redis+cluster://` naming only the first two nodes: the rest is discovered.
    pub(crate) fn url(&self) -> String {
        let seeds: Vec<String> = self
            .nodes
            .iter()
            .take(2)
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        format!("redis+cluster://{}", seeds.join(","))
    }

    /// Waits until every running node reports `cluster_state:ok`.
    pub(crate) async fn wait_ok(&self, timeout: Duration) -> anyhow::Result<()> {
        poll(timeout, "cluster_state:ok on every node", || async {
            for node in &self.nodes {
                let info = command(node, &["CLUSTER", "INFO"]).await?;
                if !info.contains("cluster_state:ok") {
                    return Err(format!("node {}: {info}", node.port()));
                }
            }
            Ok(())
        })
        .await
    }

    /// The index of the node serving `slot`, and every node's id.
    pub(crate) async fn owner(&self, slot: u16) -> anyhow::Result<(usize, Vec<String>)> {
        let mut ids = Vec::new();
        for node in &self.nodes {
            let id = command(node, &["CLUSTER", "MYID"])
                .await
                .map_err(anyhow::Error::msg)?;
            ids.push(id);
        }
        let view = command(&self.nodes[0], &["CLUSTER", "NODES"])
            .await
            .map_err(anyhow::Error::msg)?;
        for line in view.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let serves = fields.iter().skip(8).any(|range| {
                let (lo, hi) = range.split_once('-').unwrap_or((range, range));
                matches!((lo.parse::<u16>(), hi.parse::<u16>()), (Ok(lo), Ok(hi)) if (lo..=hi).contains(&slot))
            });
            if serves && let Some(i) = ids.iter().position(|id| id == fields[0]) {
                return Ok((i, ids));
            }
        }
        anyhow::bail!("no node serves slot {slot}: {view}")
    }
}

/// One command on one node (as a string reply; integers and arrays are joined).
pub(crate) async fn command(node: &RedisServer, args: &[&str]) -> Result<String, String> {
    let mut conn = node.connection().await.map_err(|e| e.to_string())?;
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    let value: redis::Value = cmd
        .query_async(&mut conn)
        .await
        .map_err(|e| e.to_string())?;
    Ok(text(&value))
}

fn text(value: &redis::Value) -> String {
    match value {
        redis::Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        redis::Value::SimpleString(s) => s.clone(),
        redis::Value::VerbatimString { text, .. } => text.clone(),
        redis::Value::Int(i) => i.to_string(),
        redis::Value::Array(items) => items.iter().map(text).collect::<Vec<_>>().join("\n"),
        redis::Value::Nil => String::new(),
        other => format!("{other:?}"),
    }
}

/// The target of a URL without TLS.
pub(crate) fn target(url: &str) -> RedisTarget {
    let url: RedisUrl = url.parse().expect("a valid URL");
    RedisTarget::new(url, None).expect("a valid target")
}

/// The slot of `key`, as the cluster computes it (`CLUSTER KEYSLOT`).
pub(crate) async fn keyslot(node: &RedisServer, key: &[u8]) -> anyhow::Result<u16> {
    let key = std::str::from_utf8(key)?;
    let slot = command(node, &["CLUSTER", "KEYSLOT", key])
        .await
        .map_err(anyhow::Error::msg)?;
    Ok(slot.parse()?)
}
