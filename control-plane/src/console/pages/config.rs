//! `GET /config`: every route and upstream of the current version with its
//! policies. Each policy field is shown by its name in the proto's JSON
//! mapping (what `gatewayctl dump` writes); a signing secret is shown only
//! as "set" (the AdminService never returns it).

use gateway_proto::field_diff::leaves;
use gateway_proto::v1::{Route, Upstream};
use http::StatusCode;
use serde_json::Value;
use std::fmt::Write as _;

use crate::console::router::{Answer, status_answer};
use crate::console::session::Session;
use crate::console::{Console, html};

/// Fields shown in their own column, not among the policies.
const ROUTE_COLUMNS: [&str; 5] = ["name", "hosts", "pathPrefix", "methods", "upstream"];
const UPSTREAM_COLUMNS: [&str; 4] = [
    "name",
    "instances",
    "identitySigningSecret",
    "identitySigningSecretSet",
];

/// Every other field of `message` as `path: value` lines.
fn policies<T: serde::Serialize>(message: &T, columns: &[&str]) -> String {
    let value = serde_json::to_value(message).unwrap_or(Value::Null);
    let mut out = String::new();
    for (path, v) in leaves(&value) {
        let top = path.split(['.', '[']).next().unwrap_or_default();
        if columns.contains(&top) {
            continue;
        }
        let _ = write!(
            out,
            "<div><span class=\"field\">{}</span> {}</div>",
            html::escape(&path),
            html::escape(&v)
        );
    }
    if out.is_empty() {
        out.push_str("<span class=\"muted\">defaults</span>");
    }
    out
}

fn list(items: &[String], empty: &str) -> String {
    if items.is_empty() {
        format!("<span class=\"muted\">{empty}</span>")
    } else {
        items
            .iter()
            .map(|i| html::escape(i))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

fn route_row(r: &Route) -> Vec<String> {
    vec![
        format!("<code>{}</code>", html::escape(&r.name)),
        format!(
            "{}<div><code>{}</code></div><div>{}</div>",
            list(&r.hosts, "any host"),
            html::escape(&r.path_prefix),
            list(&r.methods, "any method")
        ),
        if !r.split.is_empty() {
            r.split
                .iter()
                .map(|t| {
                    format!(
                        "<div>{} <span class=\"muted\">×{}</span></div>",
                        html::escape(&t.upstream),
                        t.weight
                    )
                })
                .collect()
        } else if r.upstream.is_empty() {
            "<span class=\"muted\">aggregation</span>".to_owned()
        } else {
            html::escape(&r.upstream)
        },
        policies(r, &ROUTE_COLUMNS),
    ]
}

fn upstream_row(u: &Upstream) -> Vec<String> {
    let instances: Vec<String> = u
        .instances
        .iter()
        .map(|i| {
            format!(
                "<div><code>{}</code> {}</div>",
                html::escape(&i.id),
                html::escape(&i.url)
            )
        })
        .collect();
    vec![
        format!("<code>{}</code>", html::escape(&u.name)),
        if instances.is_empty() {
            "<span class=\"muted\">discovered in DNS</span>".to_owned()
        } else {
            instances.concat()
        },
        policies(u, &UPSTREAM_COLUMNS),
        if u.identity_signing_secret_set {
            html::badge("ok", "set")
        } else {
            "<span class=\"muted\">not set</span>".to_owned()
        },
    ]
}

/// `GET /config`.
pub async fn render(c: &Console, session: &Session) -> Answer {
    let config = match c.backend.config(&session.caller, None).await {
        Ok(s) => s,
        Err(status) => return status_answer(&status),
    };
    let routes: Vec<Vec<String>> = config.routes.iter().map(route_row).collect();
    let upstreams: Vec<Vec<String>> = config.upstreams.iter().map(upstream_row).collect();
    let content = format!(
        "<p>Version {}.</p><h2>Routes <span class=\"count\">{}</span></h2>{}\
         <h2>Upstreams <span class=\"count\">{}</span></h2>{}",
        config.version,
        routes.len(),
        html::table(
            &["Route", "Matches", "Upstream", "Policies"],
            &routes,
            "No route."
        ),
        upstreams.len(),
        html::table(
            &["Upstream", "Instances", "Policies", "Signing secret"],
            &upstreams,
            "No upstream."
        ),
    );
    Answer::html(
        StatusCode::OK,
        html::page(session, "/config", "Routes and upstreams", &content),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_show_as_set_and_policies_by_field() {
        let u = Upstream {
            name: "orders".into(),
            identity_signing_secret_set: true,
            ..Default::default()
        };
        let row = upstream_row(&u);
        assert!(row[3].contains(">set<"), "{row:?}");
        assert!(!row[2].contains("identitySigningSecret"), "{row:?}");
        let r = Route {
            name: "a".into(),
            path_prefix: "/a".into(),
            upstream: "orders".into(),
            timeout_ms: 1500,
            ..Default::default()
        };
        let row = route_row(&r);
        assert!(row[3].contains("timeoutMs</span> 1500"), "{row:?}");
        assert!(!row[3].contains("pathPrefix"), "{row:?}");
    }
}
