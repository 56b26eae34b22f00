//! HTML output: escaping, and the frame every page shares (navigation, who is
//! signed in, the sign-out form). Pages are plain strings built with
//! [`escape`] around every value that comes from the configuration, a data
//! plane or a form; no value is ever placed in a script, style or URL
//! scheme position.

use std::fmt::Write as _;

use crate::console::csrf;
use crate::console::session::Session;

/// `text` safe inside an element or a double-quoted attribute.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The pages in the navigation: path and label.
pub const NAV: [(&str, &str); 6] = [
    ("/overview", "Overview"),
    ("/config", "Routes and upstreams"),
    ("/health", "Upstream health"),
    ("/versions", "Version history"),
    ("/api-keys", "API keys"),
    ("/certificates", "Certificates"),
];

/// The hidden field carrying the session's CSRF token, for every form.
pub fn csrf_field(session: &Session) -> String {
    format!(
        r#"<input type="hidden" name="{}" value="{}">"#,
        csrf::FIELD,
        escape(&session.csrf)
    )
}

/// A whole document: `<head>` with the stylesheet, then `body`.
pub fn document(title: &str, body: &str) -> String {
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{} · gateway console</title>\
         <link rel=\"icon\" href=\"/static/favicon.svg\" type=\"image/svg+xml\">\
         <link rel=\"stylesheet\" href=\"/static/console.css\"></head>\
         <body>{body}</body></html>\n",
        escape(title)
    )
}

/// A signed-in page: the navigation with `active` marked, who is signed in
/// with the sign-out form, the title and `content`.
pub fn page(session: &Session, active: &str, title: &str, content: &str) -> String {
    let mut nav = String::new();
    for (path, label) in NAV {
        let current = if path == active {
            r#" aria-current="page""#
        } else {
            ""
        };
        let _ = write!(nav, r#"<a href="{path}"{current}>{label}</a>"#);
    }
    let body = format!(
        "<header><span class=\"brand\">gateway console</span><nav>{nav}</nav>\
         <form class=\"signout\" method=\"post\" action=\"/signout\">{csrf}\
         <span class=\"who\">{name} <span class=\"role\">{role}</span></span>\
         <button type=\"submit\">Sign out</button></form></header>\
         <main><h1>{title}</h1>{content}</main>",
        csrf = csrf_field(session),
        name = escape(&session.caller.name),
        role = session.caller.role,
        title = escape(title),
    );
    document(title, &body)
}

/// A status badge: `class` is one of the stylesheet's badge classes.
pub fn badge(class: &str, text: &str) -> String {
    format!(r#"<span class="badge {class}">{}</span>"#, escape(text))
}

/// A table with `headers` and already rendered `rows` (each a list of cells'
/// HTML), or `empty` when there is no row.
pub fn table(headers: &[&str], rows: &[Vec<String>], empty: &str) -> String {
    if rows.is_empty() {
        return format!(r#"<p class="empty">{}</p>"#, escape(empty));
    }
    let mut out = String::from("<table><thead><tr>");
    for h in headers {
        let _ = write!(out, "<th>{}</th>", escape(h));
    }
    out.push_str("</tr></thead><tbody>");
    for row in rows {
        out.push_str("<tr>");
        for cell in row {
            let _ = write!(out, "<td>{cell}</td>");
        }
        out.push_str("</tr>");
    }
    out.push_str("</tbody></table>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::{Caller, Role};

    #[test]
    fn escapes_markup_and_quotes() {
        assert_eq!(
            escape(r#"<script>"a" & 'b'</script>"#),
            "&lt;script&gt;&quot;a&quot; &amp; &#39;b&#39;&lt;/script&gt;"
        );
    }

    #[test]
    fn the_frame_has_the_csrf_token_and_escapes_the_name() {
        let s = Session {
            caller: Caller {
                name: "<b>".into(),
                role: Role::Viewer,
            },
            csrf: "tok".into(),
        };
        let html = page(&s, "/health", "Upstream health", "<p>x</p>");
        assert!(html.contains(r#"<input type="hidden" name="csrf" value="tok">"#));
        assert!(html.contains("&lt;b&gt; <span class=\"role\">viewer</span>"));
        assert!(html.contains(r#"<a href="/health" aria-current="page">"#));
        assert!(!html.contains("<script"));
        assert_eq!(
            table(&["a"], &[], "nothing"),
            r#"<p class="empty">nothing</p>"#
        );
    }
}
