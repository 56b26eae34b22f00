//! Validation of route policies: `ip_allow` / `ip_deny`, `request_headers` /
//! `response_headers` and `cors`.

use std::collections::{BTreeSet, HashSet};

use super::{HOP_BY_HOP, MAX_HEADER_NAME_LEN, Validator, is_valid_header_name, is_valid_hostname};
use crate::cidr::Cidr;
use crate::v1::{Cors, HeaderTransform, Route};

/// Most entries (set + add + remove) of one header transform.
pub const MAX_HEADER_TRANSFORMS: usize = 64;
/// Longest value a header transform may set or add.
pub const MAX_HEADER_VALUE_LEN: usize = 4096;
/// Headers a transform may not touch besides the hop-by-hop ones: the gateway
/// owns them (identity, routing, framing). Lower case.
pub const PROTECTED_HEADERS: &[&str] = &[
    "host",
    "content-length",
    "x-user-id",
    "x-user-role",
    "x-api-key-name",
    "x-gateway-signature",
    // Marks a mirror copy, which signed identity v3 covers: set by the gateway only.
    "x-gateway-mirror",
];

/// Whether a transform may not touch `lower` (a lower-case header name).
fn is_protected(lower: &str) -> bool {
    PROTECTED_HEADERS.contains(&lower) || HOP_BY_HOP.contains(&lower)
}

/// The protected headers `allow_identity_and_host` opens up.
const OVERRIDABLE: [&str; 3] = ["host", "x-user-id", "x-user-role"];

/// With `allow_identity_and_host`: whether operation `op` ("set", "add",
/// "remove") of transform `field` ("request_headers" / "response_headers")
/// may touch the protected header `lower`. The identity headers may be set
/// or removed (a second value would make the identity ambiguous); Host may
/// only be set, and only on the request (a request needs exactly one).
fn overridable(field: &str, op: &str, lower: &str) -> bool {
    match lower {
        "x-user-id" | "x-user-role" => op != "add",
        "host" => op == "set" && field == "request_headers",
        _ => false,
    }
}
/// Most `cors.allow_origins` entries.
pub const MAX_CORS_ORIGINS: usize = 100;
/// Most `cors.allow_methods` entries.
pub const MAX_CORS_METHODS: usize = 32;
/// Most `cors.allow_headers` / `cors.expose_headers` entries.
pub const MAX_CORS_HEADERS: usize = 64;
/// Largest `cors.max_age_seconds`: one day.
pub const MAX_CORS_MAX_AGE_SECONDS: u32 = 86_400;
/// Most entries in one of a route's `ip_allow` / `ip_deny` lists.
pub const MAX_IP_RULES: usize = 1000;
/// True for a header value a transform may send: at most
/// [`MAX_HEADER_VALUE_LEN`] visible ASCII characters, spaces and tabs, with
/// no leading or trailing whitespace (which HTTP would strip).
pub fn is_valid_header_value(v: &str) -> bool {
    v.len() <= MAX_HEADER_VALUE_LEN
        && v.bytes().all(|c| c == b'\t' || (b' '..=b'~').contains(&c))
        && v.trim_matches([' ', '\t']).len() == v.len()
}

/// Checks a CORS origin: `http://` or `https://`, then a lower-case host
/// name, IPv4 address or bracketed IPv6 address, then an optional port
/// 1–65535, and nothing else (browsers send exactly that form).
pub fn check_origin(o: &str) -> Result<(), &'static str> {
    const MSG: &str = "is not an origin like https://app.example.com or http://localhost:3000 (lower case, no path)";
    let rest = o
        .strip_prefix("https://")
        .or_else(|| o.strip_prefix("http://"))
        .ok_or(MSG)?;
    let (host, port) = if let Some(v6) = rest.strip_prefix('[') {
        let (h, after) = v6.split_once(']').ok_or(MSG)?;
        if h.parse::<std::net::Ipv6Addr>().is_err() || h != h.to_ascii_lowercase() {
            return Err(MSG);
        }
        match after {
            "" => (h, None),
            p => (h, Some(p.strip_prefix(':').ok_or(MSG)?)),
        }
    } else {
        match rest.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (rest, None),
        }
    };
    if !rest.starts_with('[') && !is_valid_hostname(host) {
        return Err(MSG);
    }
    if let Some(p) = port
        && (p.is_empty()
            || p.starts_with('0')
            || !p.bytes().all(|c| c.is_ascii_digit())
            || !matches!(p.parse::<u16>(), Ok(1..)))
    {
        return Err(MSG);
    }
    Ok(())
}

impl Validator {
    /// Every policy field of route `r` (`who` names it in messages).
    pub(super) fn policies(&mut self, who: &str, r: &Route) {
        self.ip_rules(who, "ip_allow", &r.ip_allow);
        self.ip_rules(who, "ip_deny", &r.ip_deny);
        if let Some(t) = &r.request_headers {
            if r.aggregate.is_some() {
                self.push(format!(
                    "{who}: request_headers is not supported on an aggregate route (its parts build their own requests)"
                ));
            }
            self.header_transform(who, "request_headers", t);
        }
        if let Some(t) = &r.response_headers {
            self.header_transform(who, "response_headers", t);
        }
        if let Some(c) = &r.cors {
            self.cors(who, c);
        }
    }

    /// One of a route's client network lists: each entry a CIDR (or bare
    /// address) without host bits, not IPv4-mapped, at most [`MAX_IP_RULES`].
    fn ip_rules(&mut self, who: &str, field: &str, list: &[String]) {
        if list.len() > MAX_IP_RULES {
            self.push(format!(
                "{who}: {field} lists {} entries, at most {MAX_IP_RULES} are allowed",
                list.len()
            ));
        }
        for entry in list {
            match entry.parse::<Cidr>() {
                Err(_) => self.push(format!(
                    "{who}: {field}: \"{entry}\" is not an IP address or network like 203.0.113.0/24 or 2001:db8::/32"
                )),
                Ok(net) if net.has_host_bits() => self.push(format!(
                    "{who}: {field}: \"{entry}\" has host bits set (did you mean {}?)",
                    net.network()
                )),
                Ok(net) if net.is_ipv4_mapped() => self.push(format!(
                    "{who}: {field}: \"{entry}\" is an IPv4-mapped IPv6 network; write it as IPv4 (mapped client addresses are matched as IPv4)"
                )),
                Ok(_) => {}
            }
        }
    }

    fn cors(&mut self, who: &str, c: &Cors) {
        let n = c.allow_origins.len();
        if n == 0 || n > MAX_CORS_ORIGINS {
            self.push(format!(
                "{who}: cors.allow_origins must list 1 to {MAX_CORS_ORIGINS} origins (got {n})"
            ));
        }
        let any = c.allow_origins.iter().any(|o| o == "*");
        if any && n > 1 {
            self.push(format!(
                "{who}: cors.allow_origins: \"*\" must be the only entry"
            ));
        }
        if any && c.allow_credentials {
            self.push(format!(
                "{who}: cors: allow_origins \"*\" cannot be combined with allow_credentials (browsers refuse it; list the origins)"
            ));
        }
        let mut seen = HashSet::new();
        for o in c.allow_origins.iter().filter(|o| *o != "*") {
            if let Err(why) = check_origin(o) {
                self.push(format!("{who}: cors.allow_origins: \"{o}\" {why}"));
            } else if !seen.insert(o.as_str()) {
                self.push(format!(
                    "{who}: cors.allow_origins: \"{o}\" is listed twice"
                ));
            }
        }
        if c.allow_methods.len() > MAX_CORS_METHODS {
            self.push(format!(
                "{who}: cors.allow_methods lists more than {MAX_CORS_METHODS} methods"
            ));
        }
        for m in &c.allow_methods {
            if m.is_empty() || m.len() > 32 || !m.bytes().all(|c| c.is_ascii_uppercase()) {
                self.push(format!(
                    "{who}: cors.allow_methods: \"{m}\" is not an upper-case HTTP method"
                ));
            }
        }
        for (field, list) in [
            ("allow_headers", &c.allow_headers),
            ("expose_headers", &c.expose_headers),
        ] {
            if list.len() > MAX_CORS_HEADERS {
                self.push(format!(
                    "{who}: cors.{field} lists more than {MAX_CORS_HEADERS} headers"
                ));
            }
            for h in list.iter().filter(|h| !is_valid_header_name(h)) {
                self.push(format!(
                    "{who}: cors.{field}: \"{h}\" is not a valid header name"
                ));
            }
        }
        if c.max_age_seconds > MAX_CORS_MAX_AGE_SECONDS {
            self.push(format!(
                "{who}: cors.max_age_seconds must be at most {MAX_CORS_MAX_AGE_SECONDS}"
            ));
        }
    }

    /// One header transform: valid, unprotected names, each used once; valid
    /// values; at most [`MAX_HEADER_TRANSFORMS`] entries.
    fn header_transform(&mut self, who: &str, field: &str, t: &HeaderTransform) {
        let total = t.set.len() + t.add.len() + t.remove.len();
        if total > MAX_HEADER_TRANSFORMS {
            self.push(format!(
                "{who}: {field} has {total} entries, at most {MAX_HEADER_TRANSFORMS} are allowed"
            ));
        }
        let mut seen = HashSet::new();
        // Maps are sorted so problems come out in a stable order.
        let set: BTreeSet<(&String, &String)> = t.set.iter().collect();
        let add: BTreeSet<(&String, &String)> = t.add.iter().collect();
        let named = set
            .iter()
            .map(|(n, v)| ("set", *n, Some(*v)))
            .chain(add.iter().map(|(n, v)| ("add", *n, Some(*v))))
            .chain(t.remove.iter().map(|n| ("remove", n, None)));
        for (op, name, value) in named {
            let at = format!("{who}: {field}.{op}");
            let lower = name.to_ascii_lowercase();
            if !is_valid_header_name(name) {
                self.push(format!(
                    "{at}: \"{name}\" is not a valid header name (letters, digits and !#$%&'*+-.^_`|~, at most {MAX_HEADER_NAME_LEN})"
                ));
            } else if is_protected(&lower)
                && !(t.allow_identity_and_host && overridable(field, op, &lower))
            {
                let hint = if !OVERRIDABLE.contains(&lower.as_str()) {
                    ""
                } else if t.allow_identity_and_host {
                    " (allow_identity_and_host permits only set and remove of X-User-Id and X-User-Role, and set of Host in request_headers)"
                } else {
                    " (set allow_identity_and_host to change Host, X-User-Id or X-User-Role on purpose)"
                };
                self.push(format!(
                    "{at}: \"{name}\" is a protected header (Host, Content-Length, X-User-Id, X-User-Role, X-Api-Key-Name, X-Gateway-Signature, X-Gateway-Mirror and hop-by-hop headers are the gateway's){hint}"
                ));
            } else if !seen.insert(lower) {
                self.push(format!(
                    "{at}: \"{name}\" is named more than once (each header may appear once across set, add and remove)"
                ));
            }
            if let Some(v) = value
                && !is_valid_header_value(v)
            {
                self.push(format!(
                    "{at}: the value of \"{name}\" must be at most {MAX_HEADER_VALUE_LEN} visible ASCII characters, spaces or tabs, without leading or trailing whitespace"
                ));
            }
        }
    }
}
