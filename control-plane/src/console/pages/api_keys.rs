//! `GET /api-keys`: every API key (never its hash); admins also get the
//! form that creates one (`POST /api-keys`: the key is shown once, on the
//! answer, and never again) and a revoke button per key (`POST /api-keys/revoke`).

use http::StatusCode;

use crate::console::backend::may;
use crate::console::router::{Answer, Req, status_answer};
use crate::console::session::Session;
use crate::console::{Console, html};

/// `GET /api-keys`.
pub async fn render(c: &Console, session: &Session) -> Answer {
    let caller = &session.caller;
    let keys = match c.backend.api_keys(caller).await {
        Ok(k) => k,
        Err(status) => return status_answer(&status),
    };
    let revoke = may(caller, "RevokeApiKey");
    let rows: Vec<Vec<String>> = keys
        .api_keys
        .iter()
        .map(|k| {
            let mut row = vec![
                format!("<code>{}</code>", html::escape(&k.name)),
                html::escape(&k.subject),
                html::escape(&k.role),
                format!("<code>{}…</code>", html::escape(&k.prefix)),
                html::escape(&k.created_at),
            ];
            if revoke {
                row.push(format!(
                    "<form method=\"post\" action=\"/api-keys/revoke\">{}\
                     <input type=\"hidden\" name=\"name\" value=\"{}\">\
                     <button type=\"submit\" class=\"danger\">Revoke</button></form>",
                    html::csrf_field(session),
                    html::escape(&k.name)
                ));
            }
            row
        })
        .collect();
    let mut headers = vec!["Name", "Subject", "Role", "Key starts", "Created"];
    if revoke {
        headers.push("");
    }
    let mut content = html::table(&headers, &rows, "No API key.");
    if may(caller, "CreateApiKey") {
        content.push_str(&format!(
            "<h2>New API key</h2><form method=\"post\" action=\"/api-keys\" class=\"create\">{}\
             <label>Name <input name=\"name\" required pattern=\"[a-z0-9][a-z0-9\\-]*\" maxlength=\"63\"></label>\
             <label>Subject (X-User-Id) <input name=\"subject\" required maxlength=\"256\"></label>\
             <label>Role (X-User-Role) <input name=\"role\" required maxlength=\"64\"></label>\
             <button type=\"submit\">Create</button></form>",
            html::csrf_field(session)
        ));
    }
    Answer::html(
        StatusCode::OK,
        html::page(session, "/api-keys", "API keys", &content),
    )
}

/// `POST /api-keys` (name, subject, role): the new key, shown once.
pub async fn create(c: &Console, session: &Session, req: &Req) -> Answer {
    let field = |n: &str| req.form(n).unwrap_or_default().trim().to_owned();
    match c
        .backend
        .create_api_key(
            &session.caller,
            field("name"),
            field("subject"),
            field("role"),
        )
        .await
    {
        Ok(created) => {
            let name = created.api_key.map(|k| k.name).unwrap_or_default();
            let content = format!(
                "<p>API key <code>{}</code> is in version {}. Copy the key now: it is shown \
                 this once and cannot be read again.</p>\
                 <p class=\"secret\"><code>{}</code></p><p><a href=\"/api-keys\">Back to API keys</a></p>",
                html::escape(&name),
                created.version,
                html::escape(&created.key)
            );
            Answer::html(
                StatusCode::OK,
                html::page(session, "/api-keys", "API key created", &content),
            )
        }
        Err(status) => status_answer(&status),
    }
}

/// `POST /api-keys/revoke` (name).
pub async fn revoke(c: &Console, session: &Session, req: &Req) -> Answer {
    let name = req.form("name").unwrap_or_default().to_owned();
    match c.backend.revoke_api_key(&session.caller, name).await {
        Ok(_) => Answer::see_other("/api-keys"),
        Err(status) => status_answer(&status),
    }
}
