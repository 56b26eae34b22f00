//! Client connection counters of each listener (`--max-connections`,
//! [`gateway_transport::conn_limit`]): `gateway_connections_open`,
//! `gateway_connections_max` and `gateway_connections_refused_total`,
//! labelled with the listener.

use std::fmt::Write as _;

use super::header;
use gateway_transport::conn_limit::Connections;

/// A metric family: name, type, help, and how to read it off a listener.
type Family = (
    &'static str,
    &'static str,
    &'static str,
    fn(&Connections) -> u64,
);

/// Prometheus text for every listener's connections.
pub fn write_connections(out: &mut String, listeners: &[&Connections]) {
    let families: [Family; 3] = [
        (
            "gateway_connections_open",
            "gauge",
            "Client connections open now.",
            |c| c.open() as u64,
        ),
        (
            "gateway_connections_max",
            "gauge",
            "The cap on open client connections (--max-connections).",
            |c| c.max() as u64,
        ),
        (
            "gateway_connections_refused_total",
            "counter",
            "Connections closed at once because the cap was reached.",
            Connections::refused,
        ),
    ];
    for (name, kind, help, value) in families {
        header(out, name, kind, help);
        for c in listeners {
            let _ = writeln!(out, "{name}{{listener=\"{}\"}} {}", c.listener(), value(c));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_listener_is_labelled() {
        let proxy = Connections::new("proxy", 2);
        let ops = Connections::new("ops", 5);
        let _held = (proxy.admit(), proxy.admit(), proxy.admit());
        let mut out = String::new();
        write_connections(&mut out, &[&proxy, &ops]);
        assert!(out.contains("gateway_connections_refused_total{listener=\"proxy\"} 1"));
        assert!(out.contains("gateway_connections_open{listener=\"proxy\"} 2"));
        assert!(out.contains("gateway_connections_max{listener=\"ops\"} 5"));
        assert!(out.contains("# TYPE gateway_connections_refused_total counter"));
    }
}
