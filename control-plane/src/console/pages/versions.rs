//! `GET /versions`: the version history, and the per-field diff between
//! any two versions (`?from=A&to=B`): the control plane's own diff of the two
//! configurations ([`crate::changes::diff`], what `ApplyConfig` reports)
//! shown per field as `gatewayctl diff` shows it
//! ([`gateway_proto::field_diff`]); secrets never appear.
//!
//! Admins also get a rollback link per version. It leads to a confirmation
//! page (`GET /versions/rollback?version=N`: what would change, from the
//! current version), whose form POSTs `RollbackConfig` with
//! `expected_version` = the version current when the page was shown: if
//! anything was committed in between, the rollback is refused (409), not
//! applied over the newer change.

use gateway_proto::field_diff::{Mark, Sides, text};
use gateway_proto::v1::{ConfigVersion, ResourceChange};
use http::StatusCode;
use std::fmt::Write as _;

use crate::changes;
use crate::console::backend::may;
use crate::console::router::{Answer, Req, status_answer};
use crate::console::session::Session;
use crate::console::{Console, html};

/// Versions listed.
const LISTED: u32 = 50;

fn version_param(value: Option<&str>) -> Option<u64> {
    value.and_then(|v| v.trim().parse().ok())
}

/// The diff from version `from` to `to` as HTML (both read through
/// `GetConfig`, so the caller's role is checked).
async fn diff(c: &Console, session: &Session, from: u64, to: u64) -> Result<String, Answer> {
    let caller = &session.caller;
    let old = c
        .backend
        .config(caller, Some(from))
        .await
        .map_err(|s| status_answer(&s))?;
    let new = c
        .backend
        .config(caller, Some(to))
        .await
        .map_err(|s| status_answer(&s))?;
    // Which resources changed is decided on the stored content, secrets
    // included (a changed signing secret is a change); fields are shown
    // from the redacted copies.
    let changes: Vec<ResourceChange> =
        match (c.store.snapshot(from).await, c.store.snapshot(to).await) {
            (Ok(a), Ok(b)) => changes::diff((&a).into(), (&b).into())
                .iter()
                .map(ResourceChange::from)
                .collect(),
            (Err(e), _) | (_, Err(e)) => return Err(status_answer(&tonic::Status::from(e))),
        };
    if changes.is_empty() {
        return Ok(format!(
            "<p class=\"empty\">Versions {from} and {to} have the same routes, upstreams and certificates.</p>"
        ));
    }
    let sides = Sides::new((&old.routes, &old.upstreams), (&new.routes, &new.upstreams))
        .with_jwt_issuers(&old.jwt_issuers, &new.jwt_issuers);
    let mut out = String::from("<div class=\"diff\">");
    for r in sides.resources(&changes) {
        let class = match r.mark {
            Mark::Added => "added",
            Mark::Updated => "updated",
            Mark::Removed => "removed",
        };
        let _ = write!(
            out,
            "<section class=\"{class}\"><h3><span class=\"mark\">{}</span> {} <code>{}</code> \
             <span class=\"muted\">{}</span></h3>",
            r.mark.sign(),
            html::escape(&r.change.kind),
            html::escape(&r.change.name),
            html::escape(&r.change.action),
        );
        if r.change.kind == "certificate" {
            out.push_str("</section>");
            continue;
        }
        if r.mark == Mark::Updated && r.fields.is_empty() {
            let _ = write!(
                out,
                "<p class=\"muted\">{}</p>",
                html::escape(gateway_proto::field_diff::HIDDEN_CHANGE)
            );
        }
        if !r.fields.is_empty() {
            out.push_str("<table class=\"fields\"><tbody>");
            for f in &r.fields {
                let _ = write!(
                    out,
                    "<tr><th><code>{}</code></th><td class=\"old\">{}</td><td class=\"new\">{}</td></tr>",
                    html::escape(&f.path),
                    if r.mark == Mark::Added {
                        String::new()
                    } else {
                        html::escape(text(f.old.as_ref()))
                    },
                    html::escape(text(f.new.as_ref())),
                );
            }
            out.push_str("</tbody></table>");
        }
        out.push_str("</section>");
    }
    out.push_str("</div>");
    Ok(out)
}

fn options(versions: &[ConfigVersion], selected: Option<u64>) -> String {
    let mut out = String::new();
    for v in versions {
        let _ = write!(
            out,
            "<option value=\"{0}\"{1}>{0}</option>",
            v.version,
            if Some(v.version) == selected {
                " selected"
            } else {
                ""
            }
        );
    }
    out
}

/// `GET /versions[?from=A&to=B]`.
pub async fn render(c: &Console, session: &Session, req: &Req) -> Answer {
    let caller = &session.caller;
    let versions = match c.backend.versions(caller, LISTED).await {
        Ok(v) => v,
        Err(status) => return status_answer(&status),
    };
    let current = versions.first().map_or(0, |v| v.version);
    let from = version_param(req.query("from"));
    let to = version_param(req.query("to"));
    let mut content = String::new();
    let default_from = from.or_else(|| versions.get(1).map(|v| v.version));
    let _ = write!(
        content,
        "<form method=\"get\" action=\"/versions\" class=\"compare\">\
         <label>From <select name=\"from\">{}</select></label>\
         <label>to <select name=\"to\">{}</select></label>\
         <button type=\"submit\">Compare</button></form>",
        options(&versions, default_from),
        options(&versions, to.or(Some(current))),
    );
    if let (Some(from), Some(to)) = (from, to) {
        let _ = write!(content, "<h2>Changes from version {from} to {to}</h2>");
        match diff(c, session, from, to).await {
            Ok(d) => content.push_str(&d),
            Err(answer) => return answer,
        }
    }
    let admin = may(caller, "RollbackConfig");
    let rows: Vec<Vec<String>> = versions
        .iter()
        .map(|v| {
            let mut row = vec![
                format!("<span class=\"version\">{}</span>", v.version),
                html::escape(&v.created_at),
                html::escape(&v.author),
                html::escape(&v.summary),
                format!(
                    "<a href=\"/versions?from={}&amp;to={}\">diff with previous</a>",
                    v.version.saturating_sub(1),
                    v.version
                ),
            ];
            if admin {
                row.push(if v.version == current {
                    "<span class=\"muted\">current</span>".to_owned()
                } else {
                    format!(
                        "<a class=\"button\" href=\"/versions/rollback?version={}\">Roll back to {}</a>",
                        v.version, v.version
                    )
                });
            }
            row
        })
        .collect();
    let mut headers = vec!["Version", "Committed", "Author", "Changes", ""];
    if admin {
        headers.push("Rollback");
    }
    let _ = write!(
        content,
        "<h2>History <span class=\"count\">newest {}</span></h2>{}",
        versions.len(),
        html::table(&headers, &rows, "No version committed yet.")
    );
    Answer::html(
        StatusCode::OK,
        html::page(session, "/versions", "Version history", &content),
    )
}

/// `GET /versions/rollback?version=N`: what rolling back would change, and the confirmation form.
pub async fn confirm(c: &Console, session: &Session, req: &Req) -> Answer {
    if !may(&session.caller, "RollbackConfig") {
        return Answer::message(
            StatusCode::FORBIDDEN,
            "Not allowed",
            "Your role may not roll back the configuration.",
        );
    }
    let Some(target) = version_param(req.query("version")).filter(|v| *v > 0) else {
        return Answer::message(StatusCode::BAD_REQUEST, "Invalid", "version: required");
    };
    let current = c.store.current().version;
    let changes = match diff(c, session, current, target).await {
        Ok(d) => d,
        Err(answer) => return answer,
    };
    let content = format!(
        "<p>Rolling back commits a new version whose content is version {target}'s. \
         It is refused if anything is committed after version {current} before you confirm.</p>\
         <h2>What changes from version {current}</h2>{changes}\
         <form method=\"post\" action=\"/versions/rollback\" class=\"confirm\">{csrf}\
         <input type=\"hidden\" name=\"version\" value=\"{target}\">\
         <input type=\"hidden\" name=\"expected_version\" value=\"{current}\">\
         <button type=\"submit\" class=\"danger\">Roll back to version {target}</button> \
         <a href=\"/versions\">Cancel</a></form>",
        csrf = html::csrf_field(session),
    );
    Answer::html(
        StatusCode::OK,
        html::page(
            session,
            "/versions",
            &format!("Roll back to version {target}?"),
            &content,
        ),
    )
}

/// `POST /versions/rollback` (version, expected_version): `RollbackConfig`
/// with compare-and-swap.
pub async fn rollback(c: &Console, session: &Session, req: &Req) -> Answer {
    let (Some(version), Some(expected)) = (
        version_param(req.form("version")),
        version_param(req.form("expected_version")),
    ) else {
        return Answer::message(
            StatusCode::BAD_REQUEST,
            "Invalid",
            "version and expected_version: required",
        );
    };
    match c.backend.rollback(&session.caller, version, expected).await {
        Ok(change) => {
            tracing::info!(name = %session.caller.name, to = version, version = change.version, "console rollback");
            Answer::see_other("/overview")
        }
        Err(status) => status_answer(&status),
    }
}
