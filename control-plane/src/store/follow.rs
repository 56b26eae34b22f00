//! Following the commits of other control planes on the same Postgres
//! database: `LISTEN` on the channel every commit `NOTIFY`s, and publish the
//! new head on this store's `watch` channel, from which this replica's config
//! streams push it to its own data planes.
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
            listener.listen(db::PG_CHANNEL).await?;
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
