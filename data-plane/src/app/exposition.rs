//! The `/metrics` page: every counter of [`crate::metrics`] in the Prometheus
//! text format (version 0.0.4), walked through the current snapshot's routes
//! and upstreams so a route or instance that left the configuration leaves
//! the page too.

use std::fmt::Write as _;
use std::sync::atomic::Ordering;

use crate::config::{Compiled, Target};
use crate::metrics::{
    CoalesceAlone, Metrics, MirrorOutcome, PartOutcome, PolicyRefusal, esc, header,
};
use crate::upstream::breaker::BreakerState;
use crate::upstream::retry::RetryReason;

/// Renders every metric in the Prometheus text format (version 0.0.4).
pub fn render(m: &Metrics, cfg: &Compiled) -> String {
    let mut out = String::with_capacity(4096);
    let routes = || {
        std::iter::once(("", &m.unmatched))
            .chain(cfg.router.routes().iter().map(|r| (&*r.name, &*r.metrics)))
    };

    header(
        &mut out,
        "gateway_requests_total",
        "counter",
        "Requests answered by the proxy listener, by route (empty: none matched), method and status class.",
    );
    for (route, rm) in routes() {
        rm.write_requests(&mut out, route);
    }
    header(
        &mut out,
        "gateway_request_duration_seconds",
        "histogram",
        "Time from request to response head, by route.",
    );
    // Routes that have seen no request yet export no histogram (keeps large tables cheap to scrape).
    for (route, rm) in routes() {
        rm.write_latency(&mut out, route);
    }

    render_composition(&mut out, cfg);
    render_mirror(&mut out, m, cfg);
    render_policy(&mut out, cfg);
    render_proxy(&mut out, cfg);

    let instances = || {
        cfg.upstreams
            .iter()
            .flat_map(|u| u.instances.iter().map(move |i| (u, i)))
    };
    let labels = |u: &str, i: &str| format!("upstream=\"{}\",instance=\"{}\"", esc(u), esc(i));

    header(
        &mut out,
        "gateway_upstream_attempts_total",
        "counter",
        "Requests sent to an upstream instance, retries included.",
    );
    for (u, i) in instances() {
        let _ = writeln!(
            out,
            "gateway_upstream_attempts_total{{{}}} {}",
            labels(&u.name, &i.id),
            i.metrics.attempts.load(Ordering::Relaxed)
        );
    }
    header(
        &mut out,
        "gateway_upstream_retries_total",
        "counter",
        "Retries sent to an upstream instance after another instance failed (default once-rules and route retry policies).",
    );
    for (u, i) in instances() {
        let _ = writeln!(
            out,
            "gateway_upstream_retries_total{{{}}} {}",
            labels(&u.name, &i.id),
            i.metrics.retries.load(Ordering::Relaxed)
        );
    }
    header(
        &mut out,
        "gateway_upstream_errors_total",
        "counter",
        "Upstream failures by instance and kind (connect, timeout, protocol, status_5xx).",
    );
    for (u, i) in instances() {
        for (kind, n) in i.metrics.errors() {
            let _ = writeln!(
                out,
                "gateway_upstream_errors_total{{{},kind=\"{kind}\"}} {n}",
                labels(&u.name, &i.id),
            );
        }
    }
    header(
        &mut out,
        "gateway_upstream_in_flight",
        "gauge",
        "Requests in progress at an upstream instance.",
    );
    for (u, i) in instances() {
        let _ = writeln!(
            out,
            "gateway_upstream_in_flight{{{}}} {}",
            labels(&u.name, &i.id),
            i.in_flight()
        );
    }
    header(
        &mut out,
        "gateway_upstream_healthy",
        "gauge",
        "1 when active health checks consider the instance healthy (always 1 without checks).",
    );
    for (u, i) in instances() {
        let _ = writeln!(
            out,
            "gateway_upstream_healthy{{{}}} {}",
            labels(&u.name, &i.id),
            u8::from(i.is_healthy())
        );
    }
    header(
        &mut out,
        "gateway_upstream_health_check_failures_total",
        "counter",
        "Active health checks that failed.",
    );
    for (u, i) in instances() {
        let _ = writeln!(
            out,
            "gateway_upstream_health_check_failures_total{{{}}} {}",
            labels(&u.name, &i.id),
            i.metrics.health_check_failures.load(Ordering::Relaxed)
        );
    }
    header(
        &mut out,
        "gateway_circuit_breaker_state",
        "gauge",
        "1 for the current breaker state of an instance (closed, open, half_open).",
    );
    for (u, i) in instances() {
        let now = i.breaker.state();
        for s in [
            BreakerState::Closed,
            BreakerState::Open,
            BreakerState::HalfOpen,
        ] {
            let _ = writeln!(
                out,
                "gateway_circuit_breaker_state{{{},state=\"{}\"}} {}",
                labels(&u.name, &i.id),
                s.as_str(),
                u8::from(s == now)
            );
        }
    }
    header(
        &mut out,
        "gateway_circuit_breaker_opened_total",
        "counter",
        "Times an instance's breaker opened.",
    );
    for (u, i) in instances() {
        let _ = writeln!(
            out,
            "gateway_circuit_breaker_opened_total{{{}}} {}",
            labels(&u.name, &i.id),
            i.metrics.breaker_opened.load(Ordering::Relaxed)
        );
    }
    render_outliers(&mut out, cfg);

    header(
        &mut out,
        "gateway_config_version",
        "gauge",
        "Version of the configuration being served (0: none loaded).",
    );
    let _ = writeln!(out, "gateway_config_version {}", cfg.version);
    header(
        &mut out,
        "gateway_config_loaded",
        "gauge",
        "1 once a configuration is loaded.",
    );
    let _ = writeln!(out, "gateway_config_loaded {}", u8::from(cfg.loaded));
    header(
        &mut out,
        "gateway_config_last_applied_timestamp_seconds",
        "gauge",
        "When the configuration being served was applied (Unix time; 0: never).",
    );
    let applied_ms = m.config_applied_unix_ms.load(Ordering::Relaxed);
    let _ = writeln!(
        out,
        "gateway_config_last_applied_timestamp_seconds {}.{:03}",
        applied_ms / 1000,
        applied_ms % 1000
    );
    header(
        &mut out,
        "gateway_config_updates_total",
        "counter",
        "Configuration snapshots received from the control plane, by result (ack, nack).",
    );
    let _ = writeln!(
        out,
        "gateway_config_updates_total{{result=\"ack\"}} {}",
        m.config_acks.load(Ordering::Relaxed)
    );
    let _ = writeln!(
        out,
        "gateway_config_updates_total{{result=\"nack\"}} {}",
        m.config_nacks.load(Ordering::Relaxed)
    );
    header(
        &mut out,
        "gateway_control_plane_connected",
        "gauge",
        "1 while the configuration stream to the control plane is open.",
    );
    let _ = writeln!(
        out,
        "gateway_control_plane_connected {}",
        u8::from(m.control_plane_connected.load(Ordering::Relaxed))
    );
    header(
        &mut out,
        "gateway_control_plane_connects_total",
        "counter",
        "Configuration streams opened to the control plane.",
    );
    let _ = writeln!(
        out,
        "gateway_control_plane_connects_total {}",
        m.control_plane_connects.load(Ordering::Relaxed)
    );
    out
}

/// Appends the counters of `coalesce` and aggregation routes.
fn render_composition(out: &mut String, cfg: &Compiled) {
    let routes = cfg.router.routes();
    header(
        out,
        "gateway_coalesced_requests_total",
        "counter",
        "Requests of coalesce routes answered with an identical in-flight request's upstream response.",
    );
    for r in routes.iter().filter(|r| r.coalesce.is_some()) {
        let _ = writeln!(
            out,
            "gateway_coalesced_requests_total{{route=\"{}\"}} {}",
            esc(&r.name),
            r.metrics.coalesced.load(Ordering::Relaxed)
        );
    }
    header(
        out,
        "gateway_coalesce_alone_total",
        "counter",
        "Requests of coalesce routes that made their own upstream call although an identical one was in flight, by reason.",
    );
    for r in routes.iter().filter(|r| r.coalesce.is_some()) {
        for reason in CoalesceAlone::ALL {
            let _ = writeln!(
                out,
                "gateway_coalesce_alone_total{{route=\"{}\",reason=\"{}\"}} {}",
                esc(&r.name),
                reason.as_str(),
                r.metrics.coalesced_alone(reason)
            );
        }
    }
    header(
        out,
        "gateway_split_failovers_total",
        "counter",
        "Requests of split routes sent to another upstream than the weights chose, because that one had no available instance.",
    );
    for r in routes
        .iter()
        .filter(|r| matches!(r.target, Target::Split(_)))
    {
        let _ = writeln!(
            out,
            "gateway_split_failovers_total{{route=\"{}\"}} {}",
            esc(&r.name),
            r.metrics.split_failovers.load(Ordering::Relaxed)
        );
    }
    header(
        out,
        "gateway_aggregate_parts_total",
        "counter",
        "Parts of aggregation requests by route, part and outcome (ok, status, timeout, unreachable, unavailable, invalid_json, too_large).",
    );
    for r in routes {
        let Target::Aggregate(agg) = &r.target else {
            continue;
        };
        for part in agg.parts() {
            for outcome in PartOutcome::ALL {
                let _ = writeln!(
                    out,
                    "gateway_aggregate_parts_total{{route=\"{}\",part=\"{}\",outcome=\"{}\"}} {}",
                    esc(&r.name),
                    esc(part.name()),
                    outcome.as_str(),
                    part.metrics().count(outcome)
                );
            }
        }
    }
}

/// Appends the refusal counters of every route (zeros included, so a rate
/// query works before the first refusal).
fn render_policy(out: &mut String, cfg: &Compiled) {
    header(
        out,
        "gateway_policy_refusals_total",
        "counter",
        "Requests refused by a route policy, by route and reason (ip, cors, upgrade, api_key_missing, api_key_invalid).",
    );
    for r in cfg.router.routes() {
        for reason in PolicyRefusal::ALL {
            let _ = writeln!(
                out,
                "gateway_policy_refusals_total{{route=\"{}\",reason=\"{}\"}} {}",
                esc(&r.name),
                reason.as_str(),
                r.metrics.policy.count(reason)
            );
        }
    }
}

/// Appends the tunnel counters of every `websocket` route and the retry
/// counters of every upstream (zeros included).
fn render_proxy(out: &mut String, cfg: &Compiled) {
    let ws_routes = || cfg.router.routes().iter().filter(|r| r.websocket.is_some());
    header(
        out,
        "gateway_websocket_tunnels_open",
        "gauge",
        "WebSocket tunnels open now, by route.",
    );
    for r in ws_routes() {
        let _ = writeln!(
            out,
            "gateway_websocket_tunnels_open{{route=\"{}\"}} {}",
            esc(&r.name),
            r.metrics.websocket.open()
        );
    }
    header(
        out,
        "gateway_websocket_tunnels_total",
        "counter",
        "WebSocket tunnels opened (upstream answered 101), by route.",
    );
    for r in ws_routes() {
        let _ = writeln!(
            out,
            "gateway_websocket_tunnels_total{{route=\"{}\"}} {}",
            esc(&r.name),
            r.metrics.websocket.total()
        );
    }
    header(
        out,
        "gateway_retries_total",
        "counter",
        "Retries sent under a route retry policy, by upstream and reason (connect_failure, status_5xx, timeout).",
    );
    for u in &cfg.upstreams {
        for reason in RetryReason::ALL {
            let _ = writeln!(
                out,
                "gateway_retries_total{{upstream=\"{}\",reason=\"{}\"}} {}",
                esc(&u.name),
                reason.as_str(),
                u.retry.retries(reason)
            );
        }
    }
    header(
        out,
        "gateway_retry_budget_refusals_total",
        "counter",
        "Retries not sent because the upstream's retry budget was spent, by upstream.",
    );
    for u in &cfg.upstreams {
        let _ = writeln!(
            out,
            "gateway_retry_budget_refusals_total{{upstream=\"{}\"}} {}",
            esc(&u.name),
            u.retry.refused()
        );
    }
}

/// Appends the outlier-detection series of every instance of an upstream with
/// `outlier_detection` (`gateway_outlier_ejections_total`, `gateway_outlier_ejected`).
fn render_outliers(out: &mut String, cfg: &Compiled) {
    let labels = |u: &str, i: &str| format!("upstream=\"{}\",instance=\"{}\"", esc(u), esc(i));
    let instances = || {
        cfg.upstreams
            .iter()
            .filter(|u| u.outlier.is_some())
            .flat_map(|u| u.instances.iter().map(move |i| (u, i)))
    };
    header(
        out,
        "gateway_outlier_ejections_total",
        "counter",
        "Times outlier detection ejected an instance (failure rate over the threshold).",
    );
    for (u, i) in instances() {
        let _ = writeln!(
            out,
            "gateway_outlier_ejections_total{{{}}} {}",
            labels(&u.name, &i.id),
            i.outlier.ejections()
        );
    }
    header(
        out,
        "gateway_outlier_ejected",
        "gauge",
        "1 while outlier detection keeps an instance out of balancing.",
    );
    let now = crate::upstream::outlier::now_ms();
    for (u, i) in instances() {
        let _ = writeln!(
            out,
            "gateway_outlier_ejected{{{}}} {}",
            labels(&u.name, &i.id),
            u8::from(i.outlier.ejected_for(now).is_some())
        );
    }
}

/// Appends the counters of `mirror` routes and the replica's copies in flight.
fn render_mirror(out: &mut String, m: &Metrics, cfg: &Compiled) {
    header(
        out,
        "gateway_mirror_requests_total",
        "counter",
        "Sampled copies of mirror routes' requests, by outcome (sent, shed, failed, body_too_large).",
    );
    for r in cfg.router.routes().iter().filter(|r| r.mirror.is_some()) {
        for outcome in MirrorOutcome::ALL {
            let _ = writeln!(
                out,
                "gateway_mirror_requests_total{{route=\"{}\",outcome=\"{}\"}} {}",
                esc(&r.name),
                outcome.as_str(),
                r.metrics.mirror.count(outcome)
            );
        }
    }
    header(
        out,
        "gateway_mirror_in_flight",
        "gauge",
        "Mirrored copies in flight in this replica (at most --mirror-max-in-flight).",
    );
    let _ = writeln!(
        out,
        "gateway_mirror_in_flight {}",
        m.mirror_in_flight.load(Ordering::Relaxed)
    );
}
