//! `https_only` routes (issue 27): a request that did not come over TLS (the
//! listener's scheme, or a trusted proxy's `X-Forwarded-Proto`, both already
//! in `X-Forwarded-Proto` after [`super::sanitize::set_forwarded`]) is sent
//! to the same URL in https when it is a GET or HEAD, and refused otherwise:
//! a body or a credential it carried has already crossed in clear, and
//! redirecting a POST would make the client send them again.

use std::fmt::Write as _;

use http::header::{self, HeaderValue};
use http::request::Parts;
use http::{Method, Uri};

use super::sanitize::X_FORWARDED_PROTO;

/// What an `https_only` route does with a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// It came over HTTPS: served.
    Served,
    /// A cleartext GET or HEAD: 301 to this `Location`.
    Redirect(HeaderValue),
    /// Any other cleartext request, or one without a host to redirect to: 403.
    Refused,
}

/// The verdict for the request `parts` (sanitised) with the original target
/// `uri`; `port` is the HTTPS port redirects name (443: none).
pub fn verdict(parts: &Parts, uri: &Uri, port: u16) -> Verdict {
    if parts
        .headers
        .get(&X_FORWARDED_PROTO)
        .is_some_and(|p| p.as_bytes().eq_ignore_ascii_case(b"https"))
    {
        return Verdict::Served;
    }
    if parts.method != Method::GET && parts.method != Method::HEAD {
        return Verdict::Refused;
    }
    // The host the client asked for (`Host`, else an HTTP/2 `:authority`), without its port.
    let host = parts
        .headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| uri.authority().map(|a| a.as_str()))
        .and_then(|h| h.parse::<http::uri::Authority>().ok());
    let Some(host) = host else {
        return Verdict::Refused;
    };
    let mut location = String::with_capacity(64);
    location.push_str("https://");
    location.push_str(host.host());
    if port != 443 {
        let _ = write!(location, ":{port}");
    }
    location.push_str(uri.path_and_query().map_or("/", |p| p.as_str()));
    HeaderValue::try_from(location).map_or(Verdict::Refused, Verdict::Redirect)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(method: &str, target: &str, host: Option<&str>, proto: &str) -> (Parts, Uri) {
        let mut b = http::Request::builder().method(method).uri(target);
        if let Some(h) = host {
            b = b.header("host", h);
        }
        let (parts, ()) = b
            .header("x-forwarded-proto", proto)
            .body(())
            .unwrap()
            .into_parts();
        let uri = parts.uri.clone();
        (parts, uri)
    }

    #[test]
    fn cleartext_get_is_redirected_with_path_query_and_port() {
        let (p, u) = parts("GET", "/api/x?a=1&b=2", Some("gw.example:8080"), "http");
        assert_eq!(
            verdict(&p, &u, 8443),
            Verdict::Redirect(HeaderValue::from_static(
                "https://gw.example:8443/api/x?a=1&b=2"
            ))
        );
        let (p, u) = parts("HEAD", "/", Some("gw.example"), "http");
        assert_eq!(
            verdict(&p, &u, 443),
            Verdict::Redirect(HeaderValue::from_static("https://gw.example/"))
        );
        // An HTTP/2 request's authority.
        let (p, u) = parts("GET", "http://h2.example:80/p", None, "http");
        assert_eq!(
            verdict(&p, &u, 443),
            Verdict::Redirect(HeaderValue::from_static("https://h2.example/p"))
        );
    }

    #[test]
    fn other_methods_and_hostless_requests_are_refused_and_https_is_served() {
        let (p, u) = parts("POST", "/api/x", Some("gw.example"), "http");
        assert_eq!(verdict(&p, &u, 443), Verdict::Refused);
        let (p, u) = parts("GET", "/api/x", None, "http");
        assert_eq!(verdict(&p, &u, 443), Verdict::Refused);
        let (p, u) = parts("GET", "/api/x", Some("bad host"), "http");
        assert_eq!(verdict(&p, &u, 443), Verdict::Refused);
        let (p, u) = parts("POST", "/api/x", Some("gw.example"), "https");
        assert_eq!(verdict(&p, &u, 443), Verdict::Served);
    }
}
