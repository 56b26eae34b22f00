//! `GET /overview`: the current version (who committed it, when, what
//! changed) and every data plane with its state, as `ListDataPlanes` says.

use gateway_proto::v1::{DataPlaneState, DataPlaneStatus};
use http::StatusCode;

use crate::clock::rfc3339;
use crate::console::router::{Answer, status_answer};
use crate::console::session::Session;
use crate::console::{Console, html};

/// The badge of a data plane's state: SYNCED, STALE, NACKED (with the reason
/// below it) or DISCONNECTED.
fn state(d: &DataPlaneStatus) -> String {
    let s = DataPlaneState::try_from(d.status).unwrap_or(DataPlaneState::Unspecified);
    let (class, text) = match s {
        DataPlaneState::Synced => ("ok", "SYNCED"),
        DataPlaneState::Stale => ("warn", "STALE"),
        DataPlaneState::Nacked => ("bad", "NACKED"),
        DataPlaneState::Disconnected => ("off", "DISCONNECTED"),
        DataPlaneState::Unspecified => ("off", "UNKNOWN"),
    };
    let mut out = html::badge(class, text);
    if s == DataPlaneState::Nacked {
        out.push_str(&format!(
            r#"<div class="reason">version {}: {}</div>"#,
            d.last_nack_version,
            html::escape(&d.last_nack_error)
        ));
    }
    out
}

/// `GET /overview`.
pub async fn render(c: &Console, session: &Session) -> Answer {
    let caller = &session.caller;
    let versions = match c.backend.versions(caller, 1).await {
        Ok(v) => v,
        Err(status) => return status_answer(&status),
    };
    let planes = match c.backend.data_planes(caller).await {
        Ok(p) => p,
        Err(status) => return status_answer(&status),
    };
    let current = match versions.first() {
        Some(v) => format!(
            "<dl class=\"current\"><dt>Current version</dt><dd class=\"version\">{}</dd>\
             <dt>Committed by</dt><dd>{}</dd><dt>At</dt><dd>{}</dd>\
             <dt>Changes</dt><dd>{}</dd></dl>",
            v.version,
            html::escape(&v.author),
            html::escape(&v.created_at),
            html::escape(&v.summary)
        ),
        None => {
            "<p class=\"empty\">No version committed yet (version 0, the empty configuration).</p>"
                .to_owned()
        }
    };
    let synced = planes
        .data_planes
        .iter()
        .filter(|d| d.status == DataPlaneState::Synced as i32)
        .count();
    let rows: Vec<Vec<String>> = planes
        .data_planes
        .iter()
        .map(|d| {
            vec![
                format!("<code>{}</code>", html::escape(&d.node_id)),
                html::escape(&d.hostname),
                state(d),
                if d.acked_version == 0 {
                    "—".to_owned()
                } else {
                    d.acked_version.to_string()
                },
                match c.acks.get(&d.node_id) {
                    Some((version, at)) => format!(
                        "{} <span class=\"muted\">(version {version})</span>",
                        html::escape(&rfc3339(at))
                    ),
                    None => "<span class=\"muted\">none yet</span>".to_owned(),
                },
                html::escape(&d.last_seen),
                html::escape(&d.build_version),
            ]
        })
        .collect();
    let content = format!(
        "{current}<h2>Data planes <span class=\"count\">{synced} of {} synced to version {}</span></h2>{}",
        planes.data_planes.len(),
        planes.current_version,
        html::table(
            &[
                "Node",
                "Host",
                "State",
                "Serves version",
                "Last ACK",
                "Last message",
                "Build"
            ],
            &rows,
            "No data plane has connected since the control plane started.",
        )
    );
    Answer::html(
        StatusCode::OK,
        html::page(session, "/overview", "Overview", &content),
    )
}
