//! [`RedisConnection`]: the one connection handle both services use, whatever
//! the URL names: one Redis, a master found through Sentinel, or a Cluster.
//!
//! * **One Redis** (`redis://`, `rediss://`): the redis crate's
//!   `ConnectionManager`, one multiplexed connection that reconnects by itself.
//! * **Sentinel** (`redis+sentinel://`): the redis crate's `SentinelClient`
//!   asks the Sentinels, in the order given, which node is the master (and
//!   checks with `ROLE` that the node agrees); commands go over one multiplexed
//!   connection to it. A connection error, a timeout or a `READONLY` answer (a
//!   demoted master) drops that connection, and the next command asks the
//!   Sentinels again, so a failover is followed as soon as a Sentinel names the
//!   new master. A command refused with `READONLY` never ran, so it is sent
//!   once more to the new master; others are not repeated (they may have run).
//! * **Cluster** (`redis+cluster://`): the redis crate's async
//!   `ClusterConnection`, which routes each command by its key's slot, follows
//!   `MOVED` and `ASK` redirects and refreshes its slot map. It is opened at the
//!   first command, so building a client never waits on the network.
//!
//! Every form is lazy: nothing connects until the first command, and a failed
//! connect is tried again at the next one. The handle is cheap to clone (an
//! `Arc`), and every clone shares the connection.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, MultiplexedConnection};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::sentinel::SentinelClient;
use redis::{AsyncConnectionConfig, Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, Value};

/// Timeouts and retries of a [`RedisConnection`]. The two services want
/// different ones: the rate limiter gives up within milliseconds and decides
/// locally, the auth service waits a little and answers 503.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// Bound on one TCP (and TLS) connect, to a node or a Sentinel.
    pub connect_timeout: Duration,
    /// Bound on one command's answer.
    pub response_timeout: Duration,
    /// How often a failed command is retried inside the client (one Redis:
    /// reconnect attempts; Cluster: retries after a redirect or a broken node).
    pub retries: usize,
    /// Shortest wait before such a retry.
    pub min_retry_delay: Duration,
    /// Longest wait before such a retry.
    pub max_retry_delay: Duration,
}

/// A connection to whatever the URL names; see the module documentation.
#[derive(Clone)]
pub struct RedisConnection {
    inner: Inner,
}

#[derive(Clone)]
enum Inner {
    Single(ConnectionManager),
    Sentinel(Arc<SentinelConnection>),
    Cluster(Arc<LazyCluster>),
}

impl RedisConnection {
    pub(crate) fn single(conn: ConnectionManager) -> Self {
        Self {
            inner: Inner::Single(conn),
        }
    }

    pub(crate) fn sentinel(client: SentinelClient, options: &ConnectOptions) -> Self {
        Self {
            inner: Inner::Sentinel(Arc::new(SentinelConnection {
                client: tokio::sync::Mutex::new(client),
                current: parking_lot::Mutex::new(None),
                generation: AtomicU64::new(0),
                config: AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(options.connect_timeout))
                    .set_response_timeout(Some(options.response_timeout)),
                lookup_timeout: options.connect_timeout * 2 + options.response_timeout,
            })),
        }
    }

    pub(crate) fn cluster(client: ClusterClient) -> Self {
        Self {
            inner: Inner::Cluster(Arc::new(LazyCluster {
                client,
                conn: tokio::sync::OnceCell::new(),
            })),
        }
    }

    /// True for a Redis Cluster: keys of one command or script must share a
    /// slot (a hash tag), and commands go to the master of that slot.
    pub fn is_cluster(&self) -> bool {
        matches!(self.inner, Inner::Cluster(_))
    }
}

impl std::fmt::Debug for RedisConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.inner {
            Inner::Single(_) => "single",
            Inner::Sentinel(_) => "sentinel",
            Inner::Cluster(_) => "cluster",
        };
        f.debug_tuple("RedisConnection").field(&kind).finish()
    }
}

impl ConnectionLike for RedisConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match &mut self.inner {
            Inner::Single(conn) => conn.req_packed_command(cmd),
            Inner::Sentinel(s) => {
                let s = Arc::clone(s);
                Box::pin(async move { s.command(cmd).await })
            }
            Inner::Cluster(c) => {
                let c = Arc::clone(c);
                Box::pin(async move { c.connection().await?.req_packed_command(cmd).await })
            }
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match &mut self.inner {
            Inner::Single(conn) => conn.req_packed_commands(pipeline, offset, count),
            Inner::Sentinel(s) => {
                let s = Arc::clone(s);
                Box::pin(async move {
                    let (mut conn, generation) = s.master().await?;
                    let result = conn.req_packed_commands(pipeline, offset, count).await;
                    if let Err(error) = &result {
                        s.forget_if_broken(error, generation);
                    }
                    result
                })
            }
            Inner::Cluster(c) => {
                let c = Arc::clone(c);
                Box::pin(async move {
                    c.connection()
                        .await?
                        .req_packed_commands(pipeline, offset, count)
                        .await
                })
            }
        }
    }

    fn get_db(&self) -> i64 {
        match &self.inner {
            Inner::Single(conn) => conn.get_db(),
            Inner::Sentinel(_) | Inner::Cluster(_) => 0,
        }
    }
}

/// The master named by the Sentinels, and the connection to it.
struct SentinelConnection {
    /// Asks the Sentinels; one lookup at a time.
    client: tokio::sync::Mutex<SentinelClient>,
    /// The connection to the master last found, and its generation.
    current: parking_lot::Mutex<Option<(MultiplexedConnection, u64)>>,
    /// Counts lookups, so a failing command only drops the connection it used.
    generation: AtomicU64,
    config: AsyncConnectionConfig,
    /// Bound on one lookup: asking the Sentinels, then connecting to the master.
    lookup_timeout: Duration,
}

impl SentinelConnection {
    async fn command(&self, cmd: &Cmd) -> Result<Value, RedisError> {
        let (mut conn, generation) = self.master().await?;
        match conn.req_packed_command(cmd).await {
            Ok(value) => Ok(value),
            Err(error) => {
                self.forget_if_broken(&error, generation);
                if is_read_only(&error) {
                    // A demoted master refused it: it did not run. Once more, on the master
                    // the Sentinels name now.
                    let (mut conn, generation) = self.master().await?;
                    let result = conn.req_packed_command(cmd).await;
                    if let Err(error) = &result {
                        self.forget_if_broken(error, generation);
                    }
                    return result;
                }
                Err(error)
            }
        }
    }

    /// The current master's connection, asking the Sentinels when there is none.
    async fn master(&self) -> Result<(MultiplexedConnection, u64), RedisError> {
        if let Some(current) = self.current.lock().clone() {
            return Ok(current);
        }
        let mut client = self.client.lock().await;
        // Another command may have found it while this one waited for the lock.
        if let Some(current) = self.current.lock().clone() {
            return Ok(current);
        }
        let lookup = async {
            let master = client.async_get_client().await?;
            master
                .get_multiplexed_async_connection_with_config(&self.config)
                .await
        };
        let conn = tokio::time::timeout(self.lookup_timeout, lookup)
            .await
            .map_err(|_| {
                RedisError::from((ErrorKind::Io, "no master found through Sentinel in time"))
            })??;
        let generation = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
        *self.current.lock() = Some((conn.clone(), generation));
        tracing::debug!(generation, "connected to the master named by Sentinel");
        Ok((conn, generation))
    }

    /// Drops the connection of `generation` when `error` says its node is gone,
    /// unreachable or no longer the master: the next command asks the Sentinels.
    fn forget_if_broken(&self, error: &RedisError, generation: u64) {
        let broken = error.is_io_error()
            || error.is_connection_dropped()
            || error.is_connection_refusal()
            || error.is_timeout()
            || error.is_unrecoverable_error()
            || is_read_only(error);
        if !broken {
            return;
        }
        let mut current = self.current.lock();
        if current.as_ref().is_some_and(|(_, g)| *g == generation) {
            *current = None;
        }
    }
}

/// A cluster connection opened at its first use.
struct LazyCluster {
    client: ClusterClient,
    conn: tokio::sync::OnceCell<ClusterConnection>,
}

impl LazyCluster {
    async fn connection(&self) -> Result<ClusterConnection, RedisError> {
        self.conn
            .get_or_try_init(|| self.client.get_async_connection())
            .await
            .cloned()
    }
}

/// `READONLY`: the node is a replica now (a master demoted by a failover).
fn is_read_only(error: &RedisError) -> bool {
    error.code() == Some("READONLY")
}
