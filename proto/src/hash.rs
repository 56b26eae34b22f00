//! Content hash of a configuration: the same routes and upstreams always give
//! the same hash, whatever the version number or the order they were given in.

use crate::v1::{ConfigSnapshot, Route, Upstream};
use prost::Message;
use sha2::{Digest, Sha256};

/// Hex SHA-256 over the protobuf encoding of the routes and upstreams, each sorted by name.
///
/// prost encodes fields in tag order and this model has no maps, so the
/// encoding (and therefore the hash) is deterministic.
pub fn config_hash(routes: &[Route], upstreams: &[Upstream]) -> String {
    let mut routes = routes.to_vec();
    routes.sort_by(|a, b| a.name.cmp(&b.name));
    let mut upstreams = upstreams.to_vec();
    upstreams.sort_by(|a, b| a.name.cmp(&b.name));
    let content = ConfigSnapshot {
        routes,
        upstreams,
        ..Default::default()
    };
    hex::encode(Sha256::digest(content.encode_to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(name: &str) -> Route {
        Route {
            name: name.into(),
            path_prefix: format!("/{name}"),
            upstream: "u".into(),
            ..Default::default()
        }
    }

    #[test]
    fn order_does_not_matter_but_content_does() {
        let a = config_hash(&[route("a"), route("b")], &[]);
        let b = config_hash(&[route("b"), route("a")], &[]);
        assert_eq!(a, b);
        assert_eq!(a.len(), 64);
        let c = config_hash(&[route("a"), route("c")], &[]);
        assert_ne!(a, c);
    }
}
