//! `GET /certificates`: every TLS certificate with its hosts and validity,
//! and how long until it expires (never a private key: `ListCertificates`
//! says only whether one is set).

use chrono::{DateTime, Utc};
use http::StatusCode;

use crate::console::router::{Answer, status_answer};
use crate::console::session::Session;
use crate::console::{Console, html};

/// Certificates expiring within this many days are marked.
const SOON_DAYS: i64 = 14;

fn expiry(not_after: &str, now: DateTime<Utc>) -> String {
    let Ok(t) = DateTime::parse_from_rfc3339(not_after) else {
        return html::escape(not_after);
    };
    let days = (t.with_timezone(&Utc) - now).num_days();
    let badge = if t.with_timezone(&Utc) <= now {
        html::badge("bad", "expired")
    } else if days < SOON_DAYS {
        html::badge("warn", &format!("{days} days left"))
    } else {
        html::badge("ok", &format!("{days} days left"))
    };
    format!("{} {badge}", html::escape(not_after))
}

/// `GET /certificates`.
pub async fn render(c: &Console, session: &Session) -> Answer {
    let list = match c.backend.certificates(&session.caller).await {
        Ok(l) => l,
        Err(status) => return status_answer(&status),
    };
    let now = Utc::now();
    let rows: Vec<Vec<String>> = list
        .certificates
        .iter()
        .map(|cert| {
            vec![
                format!("<code>{}</code>", html::escape(&cert.name)),
                html::escape(&cert.sni_hosts.join(", ")),
                html::escape(&cert.subject_alt_names.join(", ")),
                html::escape(&cert.not_before),
                expiry(&cert.not_after, now),
                if cert.private_key_set {
                    html::badge("ok", "set")
                } else {
                    html::badge("bad", "missing")
                },
                format!(
                    "<code class=\"fingerprint\">{}</code>",
                    html::escape(&cert.sha256_fingerprint)
                ),
            ]
        })
        .collect();
    let content = html::table(
        &[
            "Name",
            "SNI hosts",
            "Names in the certificate",
            "Valid from",
            "Expires",
            "Private key",
            "SHA-256",
        ],
        &rows,
        "No certificate.",
    );
    Answer::html(
        StatusCode::OK,
        html::page(session, "/certificates", "Certificates", &content),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn expiry_is_marked() {
        let now = Utc.with_ymd_and_hms(2030, 1, 1, 0, 0, 0).unwrap();
        assert!(expiry("2030-01-05T00:00:00Z", now).contains("warn\">4 days left"));
        assert!(expiry("2030-06-01T00:00:00Z", now).contains("ok\">151 days left"));
        assert!(expiry("2029-06-01T00:00:00Z", now).contains("expired"));
    }
}
