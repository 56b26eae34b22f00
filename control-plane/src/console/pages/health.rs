//! `GET /health`: every upstream instance as each data plane sees it, from
//! the status reports they send on their config streams (every 5 s):
//! health-check verdict, breaker state, requests in flight and the error
//! rate since the report before. A report older than [`STALE_AFTER`], or
//! from a data plane that is no longer connected, is shown as such.

use chrono::Utc;
use gateway_proto::v1::{DataPlaneState, InstanceHealth};
use http::StatusCode;
use std::collections::BTreeMap;

use crate::console::router::{Answer, status_answer};
use crate::console::session::Session;
use crate::console::{Console, html};

/// A report this old says little about now (three report intervals).
pub const STALE_AFTER: chrono::Duration = chrono::Duration::seconds(15);

fn breaker(state: &str) -> String {
    let class = match state {
        "closed" => "ok",
        "half_open" => "warn",
        _ => "bad",
    };
    html::badge(class, &state.replace('_', "-"))
}

fn error_rate(i: &InstanceHealth) -> String {
    if i.attempts == 0 {
        return "<span class=\"muted\">no requests</span>".to_owned();
    }
    format!(
        "{:.1} % <span class=\"muted\">({} of {})</span>",
        i.error_rate * 100.0,
        i.errors,
        i.attempts
    )
}

/// `GET /health`.
pub async fn render(c: &Console, session: &Session) -> Answer {
    // The same role check as ListDataPlanes: what a viewer may see.
    let planes = match c.backend.data_planes(&session.caller).await {
        Ok(p) => p,
        Err(status) => return status_answer(&status),
    };
    let connected: BTreeMap<&str, bool> = planes
        .data_planes
        .iter()
        .map(|d| {
            (
                d.node_id.as_str(),
                d.status != DataPlaneState::Disconnected as i32,
            )
        })
        .collect();
    let now = Utc::now();
    let reports = c.health.list();
    // By upstream, then instance, then data plane.
    let mut rows: BTreeMap<(String, String, String), Vec<String>> = BTreeMap::new();
    for r in &reports {
        let age = now - r.received;
        let live = connected.get(r.node_id.as_str()).copied().unwrap_or(false);
        let freshness = if !live {
            html::badge("off", "disconnected")
        } else if age > STALE_AFTER {
            html::badge("warn", &format!("{} s old", age.num_seconds()))
        } else {
            format!(
                "<span class=\"muted\">{} s ago</span>",
                age.num_seconds().max(0)
            )
        };
        for i in &r.report.instances {
            rows.insert(
                (i.upstream.clone(), i.instance.clone(), r.node_id.clone()),
                vec![
                    format!("<code>{}</code>", html::escape(&i.upstream)),
                    format!(
                        "<code>{}</code> <span class=\"muted\">{}</span>",
                        html::escape(&i.instance),
                        html::escape(&i.url)
                    ),
                    format!("<code>{}</code>", html::escape(&r.node_id)),
                    if i.healthy {
                        html::badge("ok", "healthy")
                    } else {
                        html::badge("bad", "unhealthy")
                    },
                    breaker(&i.breaker),
                    i.in_flight.to_string(),
                    error_rate(i),
                    freshness.clone(),
                ],
            );
        }
    }
    let rows: Vec<Vec<String>> = rows.into_values().collect();
    let content = format!(
        "<p>As each data plane's balancer sees its instances, reported every 5 s over the \
         config stream. The error rate counts failed attempts and 5xx answers since the \
         data plane's previous report.</p>{}",
        html::table(
            &[
                "Upstream",
                "Instance",
                "Data plane",
                "Health",
                "Breaker",
                "In flight",
                "Error rate",
                "Reported"
            ],
            &rows,
            "No data plane has reported yet.",
        )
    );
    Answer::html(
        StatusCode::OK,
        html::page(session, "/health", "Upstream health", &content),
    )
}
