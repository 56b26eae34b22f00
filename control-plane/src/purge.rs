//! `AdminService.PurgeCache`: dropping cached answers (`Route.cache`) on the
//! data planes. A purge is not a configuration change: nothing is committed
//! and no version is made. It is handed to every config stream open on this
//! control plane (a `broadcast` channel), and each stream pushes its data
//! plane the current snapshot with `ConfigResponse.purge` set, ACKed by nonce
//! like any push ([`crate::discovery`]).
//!
//! With several control planes on one Postgres the purge is also announced by
//! `NOTIFY` ([`crate::store::Store::announce_purge`]) and each other replica
//! hands it to its own streams. A data plane that is not connected keeps its
//! cached answers until they expire.

use gateway_proto::v1::{CachePurge, ConfigSnapshot, PurgeCacheRequest};
use tokio::sync::broadcast;

use tonic::Status;

/// Purges waiting on a slow stream before it skips some (it then logs it).
const BACKLOG: usize = 64;

/// The purges of this control plane, handed to its config streams.
#[derive(Debug)]
pub struct Purges {
    tx: broadcast::Sender<CachePurge>,
}

impl Default for Purges {
    fn default() -> Self {
        Self {
            tx: broadcast::channel(BACKLOG).0,
        }
    }
}

impl Purges {
    /// A stream's subscription.
    pub fn subscribe(&self) -> broadcast::Receiver<CachePurge> {
        self.tx.subscribe()
    }

    /// Hands `purge` to every open config stream; returns how many.
    pub fn send(&self, purge: CachePurge) -> u32 {
        self.tx
            .send(purge)
            .map_or(0, |n| u32::try_from(n).unwrap_or(u32::MAX))
    }
}

/// The purge `req` asks for, checked against the current configuration: the
/// route exists and has `cache`, and the path prefix is empty or starts with "/".
pub fn check(current: &ConfigSnapshot, req: PurgeCacheRequest) -> Result<CachePurge, Status> {
    if req.route.is_empty() {
        return Err(Status::invalid_argument("route: required"));
    }
    if !req.path_prefix.is_empty() && !req.path_prefix.starts_with('/') {
        return Err(Status::invalid_argument(format!(
            "path_prefix {:?} must start with \"/\" (empty: the whole route)",
            req.path_prefix
        )));
    }
    let Some(route) = current.routes.iter().find(|r| r.name == req.route) else {
        return Err(Status::not_found(format!(
            "route \"{}\" not found",
            req.route
        )));
    };
    if route.cache.is_none() {
        return Err(Status::failed_precondition(format!(
            "route \"{}\" has no cache",
            req.route
        )));
    }
    Ok(CachePurge {
        route: req.route,
        path_prefix: req.path_prefix,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use gateway_proto::v1::{Route, RouteCache};

    fn config() -> ConfigSnapshot {
        let route = |name: &str, cache: bool| Route {
            name: name.into(),
            cache: cache.then(|| RouteCache {
                ttl_seconds: 5,
                ..Default::default()
            }),
            ..Default::default()
        };
        ConfigSnapshot {
            routes: vec![route("cached", true), route("plain", false)],
            ..Default::default()
        }
    }

    fn ask(route: &str, prefix: &str) -> Result<CachePurge, String> {
        let req = PurgeCacheRequest {
            route: route.into(),
            path_prefix: prefix.into(),
        };
        check(&config(), req).map_err(|e| e.message().to_owned())
    }

    #[test]
    fn purges_are_checked_against_the_configuration() {
        assert_eq!(ask("cached", "/orders").unwrap().path_prefix, "/orders");
        assert_eq!(ask("cached", "").unwrap().route, "cached");
        assert!(
            ask("cached", "orders")
                .unwrap_err()
                .contains("must start with \"/\"")
        );
        assert!(ask("missing", "").unwrap_err().contains("not found"));
        assert!(ask("plain", "").unwrap_err().contains("has no cache"));
        assert!(ask("", "").unwrap_err().contains("route: required"));
    }

    #[test]
    fn a_purge_counts_the_streams_it_reached() {
        let purges = Purges::default();
        assert_eq!(purges.send(CachePurge::default()), 0);
        let mut a = purges.subscribe();
        let _b = purges.subscribe();
        assert_eq!(purges.send(CachePurge::default()), 2);
        assert!(a.try_recv().is_ok());
    }
}
