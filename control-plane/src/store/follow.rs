//! Following the commits of other control planes on the same Postgres
//! database: `LISTEN` on the channel every commit `NOTIFY`s, and publish the
//! new head on this store's `watch` channel, from which this replica's config
//! streams push it to its own data planes. Cache purges (`PurgeCache`, which
//! are not versions) travel the same way on a channel of their own
//! ([`Store::announce_purge`]), each handed to this replica's streams.
//!
//! Notifications are not queued for a listener that is not connected, so
//! after every (re)connection, once `LISTEN` is in place, the head is read
//! again: nothing committed while the connection was down is missed. A quiet
//! listener also re-reads the head every [`RESYNC_INTERVAL`], a safety net
//! for a connection that died without a word (not a polling loop: one
//! `SELECT MAX(version)` per interval). When Postgres is down the follower
//! retries with a capped backoff and recovers by itself once it is back.

use super::{Store, db, load_latest};
use crate::database::Database;
use crate::error::StoreError;
use crate::purge::Purges;
use gateway_proto::v1::CachePurge;
use sqlx::postgres::PgListener;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// How often a listener that heard nothing re-reads the head anyway.
pub const RESYNC_INTERVAL: Duration = Duration::from_secs(10);

/// First and longest wait between reconnection attempts.
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(2);

impl Store {
    /// Keeps the published snapshot at the database's head until `shutdown`
    /// turns true. Returns at once for SQLite, whose only writer is this process.
    pub async fn follow_commits(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        let Database::Postgres(url) = &self.database else {
            return;
        };
        let mut backoff = BACKOFF_MIN;
        loop {
            tokio::select! {
                e = self.follow_once(url, &mut backoff) => {
                    // Loud once per outage (a reconnection resets the backoff), quiet while it lasts.
                    if backoff == BACKOFF_MIN {
                        tracing::warn!(error = %e,
                            "lost the commit notifications of the other control planes; reconnecting");
                    } else {
                        tracing::debug!(error = %e, retry_in_ms = backoff.as_millis() as u64,
                            "still no connection for the commit notifications");
                    }
                }
                _ = crate::shutdown::requested(&mut shutdown) => return,
            }
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = crate::shutdown::requested(&mut shutdown) => return,
            }
            backoff = (backoff * 2).min(BACKOFF_MAX);
        }
    }

    /// One listening connection, until it fails.
    async fn follow_once(
        &self,
        url: &crate::database::PostgresUrl,
        backoff: &mut Duration,
    ) -> StoreError {
        let result: Result<std::convert::Infallible, StoreError> = async {
            // Its own one-connection pool: the listener holds its connection for good.
            let pool = db::open_postgres(url, 1).await?;
            let mut listener = PgListener::connect_with(&pool).await?;
            listener
                .listen_all([db::PG_CHANNEL, db::PG_PURGE_CHANNEL])
                .await?;
            // From here on every commit is heard; catch up on what came before.
            self.catch_up().await?;
            *backoff = BACKOFF_MIN;
            tracing::info!(
                version = self.current().version,
                "following the commits of every control plane"
            );
            loop {
                match tokio::time::timeout(RESYNC_INTERVAL, listener.try_recv()).await {
                    Err(_quiet) => self.catch_up().await?,
                    Ok(Ok(Some(notification)))
                        if notification.channel() == db::PG_PURGE_CHANNEL =>
                    {
                        self.heard_purge(notification.payload());
                    }
                    Ok(Ok(Some(notification))) => {
                        let newer = notification
                            .payload()
                            .parse::<u64>()
                            .map_or(true, |v| v > self.current().version);
                        if newer {
                            self.catch_up().await?;
                        }
                    }
                    Ok(Ok(None)) => {
                        return Err(StoreError::Unavailable(
                            "the listening connection to Postgres was lost".into(),
                        ));
                    }
                    Ok(Err(e)) => return Err(e.into()),
                }
            }
        }
        .await;
        match result {
            Err(e) => e,
            Ok(never) => match never {},
        }
    }

    /// Hands the cache purges other control planes announce to `purges` (this
    /// replica's config streams).
    pub fn follow_purges(&self, purges: Arc<Purges>) {
        let _ = self.purges.set(purges);
    }

    /// Tells the other control planes on the same Postgres about `purge`, for
    /// their data planes (nothing to do on SQLite: one control plane).
    pub async fn announce_purge(&self, purge: &CachePurge) -> Result<(), StoreError> {
        if !matches!(self.database, Database::Postgres(_)) {
            return Ok(());
        }
        let payload = serde_json::json!({
            "origin": self.origin.to_string(),
            "route": purge.route,
            "path_prefix": purge.path_prefix,
        })
        .to_string();
        let mut conn = self.pool.acquire().await?;
        conn.exec().notify_on(db::PG_PURGE_CHANNEL, &payload).await
    }

    /// A purge another control plane announced: to this replica's streams.
    fn heard_purge(&self, payload: &str) {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(payload) else {
            tracing::warn!(
                payload,
                "ignoring a cache purge notification that is not JSON"
            );
            return;
        };
        if v["origin"].as_str() == Some(self.origin.to_string().as_str()) {
            return; // ours: already handed to our streams
        }
        let (Some(route), Some(path_prefix)) = (v["route"].as_str(), v["path_prefix"].as_str())
        else {
            return;
        };
        let purge = CachePurge {
            route: route.to_owned(),
            path_prefix: path_prefix.to_owned(),
        };
        if let Some(purges) = self.purges.get() {
            let data_planes = purges.send(purge);
            tracing::info!(
                route,
                path_prefix,
                data_planes,
                "cache purge from another control plane sent"
            );
        }
    }

    /// Reads the head and publishes it when it is newer than the published one.
    async fn catch_up(&self) -> Result<(), StoreError> {
        let mut conn = self.pool.acquire().await?;
        let head = conn.exec().head().await?;
        if head <= self.current().version {
            return Ok(());
        }
        let latest = load_latest(&mut conn.exec(), &self.hash_key, self.secrets.as_deref()).await?;
        drop(conn);
        let (version, author) = (latest.version, latest.author.clone());
        if self.publish(Arc::new(latest)) {
            tracing::info!(
                version,
                author,
                "published a version committed by another control plane"
            );
        }
        Ok(())
    }
}
