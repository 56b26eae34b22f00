//! The data-plane registry in Postgres, shared by every control plane of the
//! database (tables `control_planes` and `data_planes`, migration 0004).
//!
//! Each control plane writes only the streams it holds, from memory: a
//! writer task upserts every entry that changed as soon as it changes, and
//! beats its `control_planes` row every [`HEARTBEAT_INTERVAL`]. A row is
//! overwritten only by the same stream or by a stream that opened later, so
//! the control plane a data plane left cannot undo what the one it moved to
//! wrote. A control plane that dies stops beating: its data planes read as
//! DISCONNECTED once its heartbeat is [`HEARTBEAT_TIMEOUT`] old (or at once,
//! when it stops cleanly). Heartbeats are dated by the database's clock, so
//! the replicas' clocks need not agree. A write that fails (Postgres down)
//! is retried on the next beat. A data plane that is not connected and was
//! not written for [`FORGET_AFTER`] is forgotten, as a restart forgets it
//! with SQLite.

use super::{NodeRegistry, state};
use crate::error::StoreError;
use gateway_proto::v1::DataPlaneStatus;
use sqlx::{PgPool, Row as _};
use std::time::Duration;
use tokio::sync::{Notify, watch};

/// How often a control plane beats its `control_planes` row.
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(2);

/// How old a control plane's heartbeat may be before its data planes show DISCONNECTED.
pub const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a data plane that is not connected stays listed (and a control
/// plane that stopped beating stays in `control_planes`): data planes named
/// `hostname-pid` get a new name at every start, and would pile up forever.
pub const FORGET_AFTER: Duration = Duration::from_secs(3600);

/// One `data_planes` row, as this control plane knows it.
#[derive(Debug)]
pub(super) struct Row {
    pub node_id: String,
    pub hostname: String,
    pub build_version: String,
    pub stream: i64,
    pub connected_at: i64,
    pub connected: bool,
    pub acked_version: Option<i64>,
    pub last_nack_version: Option<i64>,
    pub last_nack_error: String,
    pub last_seen: String,
}

/// This control plane's handle on the shared registry.
pub(super) struct Shared {
    pool: PgPool,
    /// Random per process start: the `control_planes.id` of this one.
    id: String,
    /// Its listen address, for operators reading the table.
    listen: String,
    wake: Notify,
}

const UPSERT: &str = "\
INSERT INTO data_planes (node_id, hostname, build_version, control_plane, stream, connected_at, \
                         connected, acked_version, last_nack_version, last_nack_error, last_seen) \
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) \
ON CONFLICT (node_id) DO UPDATE SET \
    hostname = EXCLUDED.hostname, build_version = EXCLUDED.build_version, \
    control_plane = EXCLUDED.control_plane, stream = EXCLUDED.stream, \
    connected_at = EXCLUDED.connected_at, connected = EXCLUDED.connected, \
    acked_version = EXCLUDED.acked_version, \
    last_nack_version = COALESCE(EXCLUDED.last_nack_version, data_planes.last_nack_version), \
    last_nack_error = CASE WHEN EXCLUDED.last_nack_version IS NULL \
                           THEN data_planes.last_nack_error ELSE EXCLUDED.last_nack_error END, \
    last_seen = EXCLUDED.last_seen, updated_at = now() \
WHERE (data_planes.control_plane = EXCLUDED.control_plane AND data_planes.stream = EXCLUDED.stream) \
   OR EXCLUDED.connected_at > data_planes.connected_at";

/// Forgets data planes neither connected nor written for `$1` seconds, then
/// control planes that stopped beating that long ago and hold no row.
const FORGET: &str = "\
WITH gone AS ( \
    DELETE FROM data_planes d \
    WHERE d.updated_at < now() - make_interval(secs => $1) \
      AND NOT (d.connected AND EXISTS ( \
          SELECT 1 FROM control_planes c \
          WHERE c.id = d.control_plane AND c.heartbeat_at > now() - make_interval(secs => $2))) \
    RETURNING 1) \
DELETE FROM control_planes c \
WHERE c.heartbeat_at < now() - make_interval(secs => $1) \
  AND NOT EXISTS (SELECT 1 FROM data_planes d WHERE d.control_plane = c.id)";

const LIST: &str = "\
SELECT d.node_id, d.hostname, d.build_version, d.acked_version, d.last_nack_version, \
       d.last_nack_error, d.last_seen, \
       d.connected AND COALESCE(c.heartbeat_at > now() - make_interval(secs => $1), false) AS live \
FROM data_planes d LEFT JOIN control_planes c ON c.id = d.control_plane \
ORDER BY d.node_id";

impl Shared {
    pub(super) fn new(pool: PgPool, listen: String) -> Self {
        Shared {
            pool,
            id: format!("{:016x}", rand::random::<u64>()),
            listen,
            wake: Notify::new(),
        }
    }

    /// Asks the writer to write the changed entries now.
    pub(super) fn wake(&self) {
        self.wake.notify_one();
    }

    /// The writer: beats and writes changes until `shutdown`, then marks this
    /// control plane gone so its data planes read DISCONNECTED at once.
    pub(super) async fn run(&self, registry: &NodeRegistry, mut shutdown: watch::Receiver<bool>) {
        let mut beat = tokio::time::interval(HEARTBEAT_INTERVAL);
        beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failing = false;
        loop {
            tokio::select! {
                _ = beat.tick() => {
                    let beaten = match self.beat().await {
                        Ok(()) => self.forget().await,
                        Err(e) => Err(e),
                    };
                    if let Err(e) = beaten {
                        if !failing {
                            tracing::warn!(error = %e, "cannot write the data-plane registry heartbeat; retrying");
                        }
                        failing = true;
                        continue;
                    }
                    failing = false;
                }
                _ = self.wake.notified() => {}
                _ = crate::shutdown::requested(&mut shutdown) => break,
            }
            self.flush(registry).await;
        }
        // The streams have ended (or are ending): say so, and that this one is gone.
        self.flush(registry).await;
        if let Err(e) =
            sqlx::query("UPDATE control_planes SET heartbeat_at = 'epoch' WHERE id = $1")
                .bind(&self.id)
                .execute(&self.pool)
                .await
        {
            tracing::debug!(error = %e, "control plane not marked gone in the registry");
        }
    }

    /// Writes the changed entries; on failure they stay changed, for the next beat.
    async fn flush(&self, registry: &NodeRegistry) {
        let rows = registry.take_dirty();
        if rows.is_empty() {
            return;
        }
        if let Err(e) = self.write(&rows).await {
            tracing::debug!(error = %e, rows = rows.len(), "data-plane registry not written; retrying");
            registry.mark_dirty(rows.into_iter().map(|r| r.node_id));
        }
    }

    /// Forgets long-gone data planes and control planes (every replica does,
    /// on every beat; the statement is idempotent).
    async fn forget(&self) -> Result<(), sqlx::Error> {
        sqlx::query(FORGET)
            .bind(FORGET_AFTER.as_secs_f64())
            .bind(HEARTBEAT_TIMEOUT.as_secs_f64())
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn beat(&self) -> Result<(), sqlx::Error> {
        sqlx::query(
            "INSERT INTO control_planes (id, listen) VALUES ($1, $2) \
             ON CONFLICT (id) DO UPDATE SET heartbeat_at = now()",
        )
        .bind(&self.id)
        .bind(&self.listen)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn write(&self, rows: &[Row]) -> Result<(), sqlx::Error> {
        // A row may name this control plane before its first beat: write the beat first.
        self.beat().await?;
        let mut tx = self.pool.begin().await?;
        for r in rows {
            sqlx::query(UPSERT)
                .bind(&r.node_id)
                .bind(&r.hostname)
                .bind(&r.build_version)
                .bind(&self.id)
                .bind(r.stream)
                .bind(r.connected_at)
                .bind(r.connected)
                .bind(r.acked_version)
                .bind(r.last_nack_version)
                .bind(&r.last_nack_error)
                .bind(&r.last_seen)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await
    }

    /// The last version `node_id` NACKed on any control plane, and why.
    pub(super) async fn nack_history(
        &self,
        node_id: &str,
    ) -> Result<Option<(u64, String)>, StoreError> {
        let row = sqlx::query(
            "SELECT last_nack_version, last_nack_error FROM data_planes WHERE node_id = $1",
        )
        .bind(node_id)
        .fetch_optional(&self.pool)
        .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        let version: Option<i64> = row.try_get("last_nack_version")?;
        let error: String = row.try_get("last_nack_error")?;
        Ok(version
            .and_then(|v| u64::try_from(v).ok())
            .map(|v| (v, error)))
    }

    /// Every data plane of every control plane of the database.
    pub(super) async fn list(
        &self,
        current_version: u64,
    ) -> Result<Vec<DataPlaneStatus>, StoreError> {
        let rows = sqlx::query(LIST)
            .bind(HEARTBEAT_TIMEOUT.as_secs_f64())
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|row| {
                let version = |name: &str| -> Result<Option<u64>, StoreError> {
                    let v: Option<i64> = row.try_get(name)?;
                    Ok(v.and_then(|v| u64::try_from(v).ok()))
                };
                let live: bool = row.try_get("live")?;
                let acked = version("acked_version")?;
                let nack = version("last_nack_version")?;
                Ok(DataPlaneStatus {
                    node_id: row.try_get("node_id")?,
                    hostname: row.try_get("hostname")?,
                    connected: live,
                    acked_version: acked.unwrap_or(0),
                    last_nack_version: nack.unwrap_or(0),
                    last_nack_error: row.try_get("last_nack_error")?,
                    last_seen: row.try_get("last_seen")?,
                    status: state(live, acked, nack, current_version) as i32,
                    build_version: row.try_get("build_version")?,
                })
            })
            .collect()
    }
}
