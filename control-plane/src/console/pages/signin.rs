//! `GET /signin` shows the form (and pairs it with this browser, see
//! [`crate::console::csrf`]); `POST /signin` checks the token
//! ([`crate::console::signin`]) and starts a session.

use http::StatusCode;

use crate::console::router::{Answer, Req};
use crate::console::session;
use crate::console::signin::{REFUSED, Refusal, THROTTLED};
use crate::console::{Console, csrf, html};

/// The sign-in form, with `error` above it when set. The browser's pairing
/// token is kept while its cookie lives, so two tabs (or the browser's own
/// requests, such as the favicon's) do not invalidate each other's form.
fn render(c: &Console, req: &Req, status: StatusCode, error: Option<&str>) -> Answer {
    let token = session::cookie(&req.headers, csrf::SIGNIN_COOKIE)
        .filter(|t| t.len() == 64 && t.bytes().all(|b| b.is_ascii_hexdigit()))
        .map_or_else(csrf::new_token, str::to_owned);
    let error = error
        .map(|e| format!(r#"<p class="error" role="alert">{}</p>"#, html::escape(e)))
        .unwrap_or_default();
    let body = format!(
        "<main class=\"narrow\"><h1>gateway console</h1>{error}\
         <form method=\"post\" action=\"/signin\" class=\"signin\">\
         <input type=\"hidden\" name=\"{field}\" value=\"{token}\">\
         <label for=\"token\">Admin or viewer token</label>\
         <input id=\"token\" name=\"token\" type=\"password\" autocomplete=\"off\" required autofocus>\
         <button type=\"submit\">Sign in</button></form>\
         <p class=\"hint\">The tokens of the control plane's <code>--auth-tokens-file</code>, \
         as for grpcurl.</p></main>",
        field = csrf::FIELD,
    );
    Answer::html(status, html::document("Sign in", &body))
        .with_cookie(csrf::signin_cookie(&token, c.tls))
}

/// `GET /signin`.
pub fn form(c: &Console, req: &Req) -> Answer {
    render(c, req, StatusCode::OK, None)
}

/// `POST /signin`.
pub fn submit(c: &Console, req: &Req) -> Answer {
    let paired = session::cookie(&req.headers, csrf::SIGNIN_COOKIE)
        .is_some_and(|expected| csrf::matches(expected, req.form(csrf::FIELD)));
    if !paired {
        return Answer::message(
            StatusCode::FORBIDDEN,
            "Forbidden",
            "The sign-in form's CSRF token is missing or wrong. Reload the sign-in page.",
        );
    }
    let token = req.form("token").unwrap_or_default();
    match c.throttle.sign_in(&c.tokens, req.peer, token) {
        Ok(caller) => {
            tracing::info!(name = %caller.name, role = %caller.role, peer = %req.peer, "console sign-in");
            let (id, _) = c.sessions.create(caller);
            Answer::see_other("/overview")
                .with_cookie(session::set_cookie(&id, c.tls))
                .with_cookie(session::clear_cookie(csrf::SIGNIN_COOKIE, c.tls))
        }
        Err(Refusal::Refused) => {
            tracing::info!(peer = %req.peer, "console sign-in refused");
            render(c, req, StatusCode::UNAUTHORIZED, Some(REFUSED))
        }
        Err(Refusal::Throttled) => render(c, req, StatusCode::TOO_MANY_REQUESTS, Some(THROTTLED)),
    }
}
