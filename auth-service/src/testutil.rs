//! Test support: a throwaway `redis-server` (devstack's launcher, the one every
//! suite of the workspace uses) and connections configured like the service's.

use gateway_redis::RedisConnection;

pub(crate) use devstack::RedisServer;

/// A plain `redis-server` on a free loopback port, answering `PING`.
pub(crate) async fn start_redis() -> RedisServer {
    RedisServer::start().await.expect("redis-server starts")
}

/// A connection to `redis`, configured like the service's.
pub(crate) fn connection_manager(redis: &RedisServer) -> RedisConnection {
    crate::redis_connection(&redis.target()).expect("redis client")
}
