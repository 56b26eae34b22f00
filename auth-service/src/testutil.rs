//! Test support: a throwaway `redis-server` (devstack's launcher, the one every
//! suite of the workspace uses) and connections configured like the service's.

use redis::aio::ConnectionManager;

pub(crate) use devstack::RedisServer;

/// A plain `redis-server` on a free loopback port, answering `PING`.
pub(crate) async fn start_redis() -> RedisServer {
    RedisServer::start().await.expect("redis-server starts")
}

/// A connection manager to `redis`, configured like the service's.
pub(crate) fn connection_manager(redis: &RedisServer) -> ConnectionManager {
    crate::redis_connection(&redis.target()).expect("redis client")
}
