//! The HTTPS listener's certificates in `/metrics`:
//! `gateway_certificate_expiry_seconds{name}`, the seconds until each
//! certificate of the current snapshot expires (negative once it has).

use std::fmt::Write as _;

use super::header;

/// Prometheus text for the certificates of the current snapshot, as of now:
/// each one's name and notAfter (Unix seconds).
pub fn write_certificates<'a>(
    out: &mut String,
    certificates: impl IntoIterator<Item = (&'a str, i64)>,
) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    write_certificates_at(out, certificates, now);
}

fn write_certificates_at<'a>(
    out: &mut String,
    certificates: impl IntoIterator<Item = (&'a str, i64)>,
    now: i64,
) {
    header(
        out,
        "gateway_certificate_expiry_seconds",
        "gauge",
        "Seconds until the certificate expires (negative: expired), for each certificate the HTTPS listener offers.",
    );
    for (name, not_after) in certificates {
        // Certificate names are validated ([a-z0-9-]): nothing to escape.
        let _ = writeln!(
            out,
            "gateway_certificate_expiry_seconds{{name=\"{name}\"}} {}",
            not_after.saturating_sub(now)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_left_and_past() {
        let mut out = String::new();
        write_certificates_at(&mut out, [("api", 1_000_100), ("old", 999_000)], 1_000_000);
        assert!(
            out.contains("# TYPE gateway_certificate_expiry_seconds gauge\n"),
            "{out}"
        );
        assert!(
            out.contains("gateway_certificate_expiry_seconds{name=\"api\"} 100\n"),
            "{out}"
        );
        assert!(
            out.contains("gateway_certificate_expiry_seconds{name=\"old\"} -1000\n"),
            "{out}"
        );
    }
}
