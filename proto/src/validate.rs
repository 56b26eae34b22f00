//! Validation of a whole configuration (routes + upstreams).
//!
//! The control plane runs this before every commit and the data plane runs it
//! again before compiling a pushed snapshot, so both sides agree on what is
//! valid. Every problem names the resource, the field and the reason, e.g.
//! `route "orders": path_prefix must start with "/"`.

use crate::v1::{
    Aggregate, AuthMode, CircuitBreaker, DnsDiscovery, HashOn, HealthCheck, Instance, LbPolicy,
    RateLimit, Route, Upstream, UpstreamProtocol,
};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::fmt;

/// Largest accepted `timeout_ms` of a route: one hour.
pub const MAX_TIMEOUT_MS: u32 = 3_600_000;
/// Largest accepted rate-limit window: one day.
pub const MAX_WINDOW_SECONDS: u32 = 86_400;
/// Longest accepted name (route, upstream, instance, policy).
pub const MAX_NAME_LEN: usize = 63;
/// Shortest accepted `discovery.refresh_ms`.
pub const MIN_DNS_REFRESH_MS: u32 = 100;
/// Longest accepted `discovery.refresh_ms`: one hour.
pub const MAX_DNS_REFRESH_MS: u32 = 3_600_000;
/// Longest accepted `hash_header`.
pub const MAX_HEADER_NAME_LEN: usize = 128;
/// Hop-by-hop headers (lower case). The data plane removes them before
/// balancing, so hashing on one would never find a key; header transforms may
/// not touch them either.
pub(crate) const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];
/// Most parts an aggregation route may fan out to.
pub const MAX_AGGREGATE_PARTS: usize = 16;
/// The one placeholder an aggregate part's path may use.
pub const REST_PLACEHOLDER: &str = "{rest}";

/// The methods a route effectively answers, for the matcher-collision check:
/// an aggregate route with no methods listed serves GET only.
fn effective_methods(r: &Route) -> std::borrow::Cow<'_, [String]> {
    if r.aggregate.is_some() && r.methods.is_empty() {
        std::borrow::Cow::Owned(vec!["GET".to_owned()])
    } else {
        std::borrow::Cow::Borrowed(&r.methods)
    }
}

/// Every problem found in a configuration. Never empty.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ValidationError {
    /// One entry per problem, in the order found.
    pub problems: Vec<String>,
}

impl fmt::Display for ValidationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.problems.join("; "))
    }
}

/// Validates a complete configuration and returns it typed and defaulted
/// ([`ConfigSpec`](crate::spec::ConfigSpec)). `Ok` means a data plane can compile it.
pub fn validate_config<'a>(
    routes: &'a [Route],
    upstreams: &'a [Upstream],
) -> Result<crate::spec::ConfigSpec<'a>, ValidationError> {
    let mut v = Validator::default();
    let mut upstream_names = HashSet::new();
    // Upstreams spoken to over HTTP/2, which cannot carry a WebSocket upgrade.
    let mut http2 = HashSet::new();
    for u in upstreams {
        v.upstream(u);
        if !upstream_names.insert(u.name.as_str()) {
            v.push(format!("upstream \"{}\": duplicate name", u.name));
        }
        if u.protocol == UpstreamProtocol::Http2 as i32 {
            http2.insert(u.name.as_str());
        }
    }
    v.distinct_signing_secrets(upstreams);
    let mut route_names = HashSet::new();
    // (sorted hosts, prefix) -> routes seen with it, to find identical matchers.
    let mut matchers: HashMap<(Vec<&str>, &str), Vec<&Route>> = HashMap::new();
    // policy -> (route that defined it first, its limit), to keep shared budgets consistent.
    let mut policies: HashMap<&str, (&str, &RateLimit)> = HashMap::new();
    for r in routes {
        v.route(r);
        if !route_names.insert(r.name.as_str()) {
            v.push(format!("route \"{}\": duplicate name", r.name));
        }
        if !r.upstream.is_empty() && !upstream_names.contains(r.upstream.as_str()) {
            v.push(format!(
                "route \"{}\": upstream \"{}\" does not exist",
                r.name, r.upstream
            ));
        }
        if r.websocket && http2.contains(r.upstream.as_str()) {
            v.push(format!(
                "route \"{}\": websocket needs an HTTP1 upstream; upstream \"{}\" has protocol HTTP2",
                r.name, r.upstream
            ));
        }
        for (i, side) in r.split.iter().enumerate() {
            if side.upstream.is_empty() {
                continue;
            }
            if !upstream_names.contains(side.upstream.as_str()) {
                v.push(format!(
                    "route \"{}\": split[{i}]: upstream \"{}\" does not exist",
                    r.name, side.upstream
                ));
            } else if r.websocket && http2.contains(side.upstream.as_str()) {
                v.push(format!(
                    "route \"{}\": websocket needs HTTP1 upstreams; split[{i}] upstream \"{}\" has protocol HTTP2",
                    r.name, side.upstream
                ));
            }
        }
        v.mirror(r, &upstream_names);
        for (i, part) in r.aggregate.iter().flat_map(|a| a.parts.iter().enumerate()) {
            if !part.upstream.is_empty() && !upstream_names.contains(part.upstream.as_str()) {
                v.push(format!(
                    "route \"{}\": aggregate.parts[{i}] \"{}\": upstream \"{}\" does not exist",
                    r.name, part.name, part.upstream
                ));
            }
        }
        for (field, rl) in route_limits(r) {
            match policies.get(rl.policy.as_str()) {
                Some((first, other)) if !same_budget(rl, other) => v.push(format!(
                    "route \"{}\": {field}.policy \"{}\" is already defined differently by route \"{first}\"; routes sharing a policy must use the same algorithm, key (and key_header), limit and window",
                    r.name, rl.policy
                )),
                Some(_) => {}
                None => {
                    policies.insert(rl.policy.as_str(), (r.name.as_str(), rl));
                }
            }
        }
        let mut hosts: Vec<&str> = r.hosts.iter().map(String::as_str).collect();
        hosts.sort_unstable();
        let same = matchers.entry((hosts, r.path_prefix.as_str())).or_default();
        for other in same.iter() {
            if !methods_overlap(&effective_methods(r), &effective_methods(other)) {
                continue;
            }
            let (mine, theirs) = (r.r#match.as_ref(), other.r#match.as_ref());
            if (mine.is_some() || theirs.is_some())
                && !r.policy_differs_from_siblings
                && !other.policy_differs_from_siblings
                && let Some(what) = sibling_policy_difference(r, other)
            {
                v.push(format!(
                    "route \"{}\": differs in {what} from route \"{}\" at the same hosts, path_prefix and methods, and one of them has a match: a client choosing the matched header would pick the weaker one; make them agree, or set policy_differs_from_siblings on one of them",
                    r.name, other.name
                ));
            }
            if matcher_count(mine) != matcher_count(theirs) {
                // The one with more matchers is tried first.
                continue;
            }
            if mine.is_none() {
                v.push(format!(
                    "route \"{}\": same hosts, path_prefix and methods as route \"{}\"",
                    r.name, other.name
                ));
            } else if can_both_match(mine, theirs) {
                v.push(format!(
                    "route \"{}\": same hosts, path_prefix and methods as route \"{}\", with as many matchers ({}) that one request could satisfy both; make them exclude each other (e.g. different EXACT values of one header) or give one more matchers",
                    r.name,
                    other.name,
                    matcher_count(mine)
                ));
            }
        }
        same.push(r);
    }
    v.finish()?;
    crate::spec::build(routes, upstreams).map_err(|problem| ValidationError {
        problems: vec![problem],
    })
}

/// Two method lists collide when both are "any", or both name a common method.
/// A route with explicit methods next to an "any" route is not a collision:
/// the explicit one is more specific and wins.
fn methods_overlap(a: &[String], b: &[String]) -> bool {
    if a.is_empty() || b.is_empty() {
        return a.is_empty() && b.is_empty();
    }
    a.iter().any(|m| b.contains(m))
}

fn same_budget(a: &RateLimit, b: &RateLimit) -> bool {
    a.algorithm == b.algorithm
        && a.key == b.key
        && a.key_header.eq_ignore_ascii_case(&b.key_header)
        && a.limit == b.limit
        && a.window_seconds == b.window_seconds
}

/// True when `name` matches `[a-z0-9][a-z0-9-]*` and is at most [`MAX_NAME_LEN`] long.
pub fn is_valid_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= MAX_NAME_LEN
        && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

/// True for a lower-case DNS host name (RFC 1123 labels) or an IPv4 address.
pub fn is_valid_hostname(host: &str) -> bool {
    if host.is_empty() || host.len() > 253 {
        return false;
    }
    host.split('.').all(|label| {
        let b = label.as_bytes();
        !b.is_empty()
            && b.len() <= 63
            && b[0] != b'-'
            && b[b.len() - 1] != b'-'
            && b.iter()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
    })
}

/// True for an HTTP header field name (RFC 9110 `token`), at most
/// [`MAX_HEADER_NAME_LEN`] characters.
pub fn is_valid_header_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_HEADER_NAME_LEN
        && name
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&c))
}

/// Checks a path prefix: starts with "/", no trailing "/" (except "/" itself),
/// no empty, "." or ".." segments, no query, fragment, percent-escape or control characters.
pub fn check_path_prefix(p: &str) -> Result<(), &'static str> {
    if !p.starts_with('/') {
        return Err("must start with \"/\"");
    }
    if p.len() > 1 && p.ends_with('/') {
        return Err("must not end with \"/\" (prefixes match whole segments)");
    }
    if p.bytes()
        .any(|c| c <= b' ' || c == 0x7f || c == b'?' || c == b'#' || c == b'%' || c == b'\\')
    {
        return Err("must not contain spaces, control characters, '?', '#', '%' or '\\'");
    }
    if p.len() > 1
        && p[1..]
            .split('/')
            .any(|s| s.is_empty() || s == "." || s == "..")
    {
        return Err("must not contain empty, \".\" or \"..\" segments");
    }
    Ok(())
}

/// Checks an aggregate part's path template: "/" first; a path of URI path
/// characters (percent-escapes allowed) with no "." or ".." segment and at most
/// one `{rest}`, optionally followed by "?" and a fixed query without
/// placeholders; no fragment, spaces or control characters.
pub fn check_part_path(p: &str) -> Result<(), &'static str> {
    if !p.starts_with('/') {
        return Err("must start with \"/\"");
    }
    let (path, query) = match p.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (p, None),
    };
    let allowed = |c: u8| c.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:@/%".contains(&c);
    if let Some(q) = query {
        if q.contains(['{', '}']) {
            return Err("must not use a placeholder in the query (only the path may use {rest})");
        }
        if !q.bytes().all(|c| allowed(c) || c == b'?') || !valid_escapes(q) {
            return Err(
                "query must contain only URI query characters (no spaces, '#' or control characters)",
            );
        }
    }
    let rests = path.matches(REST_PLACEHOLDER).count();
    if rests > 1 {
        return Err("may use {rest} at most once");
    }
    let bare = path.replacen(REST_PLACEHOLDER, "", 1);
    if bare.contains(['{', '}']) {
        return Err("may use no placeholder but {rest}");
    }
    if !bare.bytes().all(allowed) {
        return Err(
            "must contain only URI path characters (no spaces, '#', '\\' or control characters)",
        );
    }
    if !valid_escapes(&bare) {
        return Err("has a malformed percent-escape");
    }
    if path[1..].split('/').any(|s| s == "." || s == "..") {
        return Err("must not contain \".\" or \"..\" segments");
    }
    Ok(())
}

/// Every '%' starts a two-hex-digit escape.
fn valid_escapes(s: &str) -> bool {
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            match (b.get(i + 1), b.get(i + 2)) {
                (Some(h), Some(l)) if h.is_ascii_hexdigit() && l.is_ascii_hexdigit() => i += 3,
                _ => return false,
            }
        } else {
            i += 1;
        }
    }
    true
}

/// An instance URL's parts ([`parse_instance_url`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InstanceUrl<'a> {
    /// `https://`: spoken to over TLS.
    pub tls: bool,
    /// The host: a DNS name, an IPv4 address, or an IPv6 address (without brackets).
    pub host: &'a str,
    /// The port.
    pub port: u16,
    /// `host:port` as written (`[v6]:port`): what to connect to.
    pub authority: &'a str,
}

/// Parses `http://host:port` or `https://host:port`. Host is a DNS name, an
/// IPv4 address or a bracketed IPv6 address; nothing may follow the port.
pub fn parse_instance_url(url: &str) -> Result<InstanceUrl<'_>, &'static str> {
    const MSG: &str =
        "must be http://host:port or https://host:port (no path, query or credentials)";
    let (tls, rest) = match url.strip_prefix("https://") {
        Some(rest) => (true, rest),
        None => (false, url.strip_prefix("http://").ok_or(MSG)?),
    };
    let (host, port) = if let Some(v6) = rest.strip_prefix('[') {
        let (h, p) = v6.split_once("]:").ok_or(MSG)?;
        h.parse::<std::net::Ipv6Addr>().map_err(|_| MSG)?;
        (h, p)
    } else {
        let (h, p) = rest.rsplit_once(':').ok_or(MSG)?;
        if !is_valid_hostname(h) {
            return Err(MSG);
        }
        (h, p)
    };
    if port.is_empty() || !port.bytes().all(|c| c.is_ascii_digit()) {
        return Err(MSG);
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => Ok(InstanceUrl {
            tls,
            host,
            port: p,
            authority: rest,
        }),
        _ => Err("port must be 1 to 65535"),
    }
}

#[derive(Default)]
struct Validator {
    problems: Vec<String>,
}

impl Validator {
    fn push(&mut self, p: String) {
        self.problems.push(p);
    }

    fn finish(self) -> Result<(), ValidationError> {
        if self.problems.is_empty() {
            Ok(())
        } else {
            Err(ValidationError {
                problems: self.problems,
            })
        }
    }

    fn route(&mut self, r: &Route) {
        let who = format!("route \"{}\"", r.name);
        if !is_valid_name(&r.name) {
            self.push(format!(
                "{who}: name must match [a-z0-9][a-z0-9-]* and be at most {MAX_NAME_LEN} characters"
            ));
        }
        let mut seen_hosts = HashSet::new();
        for h in &r.hosts {
            let bare = h.strip_prefix("*.").unwrap_or(h);
            if !is_valid_hostname(bare) {
                self.push(format!(
                    "{who}: hosts: \"{h}\" is not a lower-case host name or \"*.suffix\""
                ));
            }
            if !seen_hosts.insert(h.as_str()) {
                self.push(format!("{who}: hosts: \"{h}\" is listed twice"));
            }
        }
        if let Err(why) = check_path_prefix(&r.path_prefix) {
            self.push(format!("{who}: path_prefix {why}"));
        }
        let mut seen_methods = BTreeSet::new();
        for m in &r.methods {
            if m.is_empty() || m.len() > 32 || !m.bytes().all(|c| c.is_ascii_uppercase()) {
                self.push(format!(
                    "{who}: methods: \"{m}\" is not an upper-case HTTP method"
                ));
            }
            if !seen_methods.insert(m.as_str()) {
                self.push(format!("{who}: methods: \"{m}\" is listed twice"));
            }
        }
        match &r.aggregate {
            None if r.upstream.is_empty() && r.split.is_empty() => {
                self.push(format!("{who}: upstream is required"));
            }
            None => {}
            Some(agg) => self.aggregate(&who, r, agg),
        }
        if !r.rewrite_prefix.is_empty()
            && let Err(why) = check_path_prefix(&r.rewrite_prefix)
        {
            self.push(format!("{who}: rewrite_prefix {why}"));
        }
        let auth = AuthMode::try_from(r.auth);
        if auth.is_err() {
            self.push(format!("{who}: auth: unknown value {}", r.auth));
        }
        if r.timeout_ms > MAX_TIMEOUT_MS {
            self.push(format!(
                "{who}: timeout_ms must be at most {MAX_TIMEOUT_MS}"
            ));
        }
        self.rate_limits(&who, r, auth.ok());
        self.policies(&who, r);
        self.mtls_allow(&who, r);
        self.forwarding(&who, r);
        self.cache(&who, r);
        self.split(&who, r);
        if let Some(m) = &r.r#match {
            self.route_match(&who, m);
        }
    }

    /// The route-level rules of an aggregation route and its parts (that each
    /// part's upstream exists is checked with the whole configuration).
    fn aggregate(&mut self, who: &str, r: &Route, agg: &Aggregate) {
        if !r.upstream.is_empty() {
            self.push(format!(
                "{who}: upstream must be empty on an aggregate route (each part names its own upstream)"
            ));
        }
        if !r.rewrite_prefix.is_empty() {
            self.push(format!(
                "{who}: rewrite_prefix must be empty on an aggregate route (each part has its own path)"
            ));
        }
        if r.methods.iter().any(|m| m != "GET") {
            self.push(format!(
                "{who}: methods: an aggregate route serves GET only (leave methods empty or [\"GET\"])"
            ));
        }
        if r.coalesce {
            self.push(format!(
                "{who}: coalesce is not supported on an aggregate route"
            ));
        }
        if agg.parts.is_empty() || agg.parts.len() > MAX_AGGREGATE_PARTS {
            self.push(format!(
                "{who}: aggregate.parts must list 1 to {MAX_AGGREGATE_PARTS} parts (got {})",
                agg.parts.len()
            ));
        }
        let mut names = HashSet::new();
        for (i, part) in agg.parts.iter().enumerate() {
            let at = format!("{who}: aggregate.parts[{i}] \"{}\"", part.name);
            if !is_valid_name(&part.name) {
                self.push(format!(
                    "{at}: name must match [a-z0-9][a-z0-9-]* and be at most {MAX_NAME_LEN} characters"
                ));
            } else if !names.insert(part.name.as_str()) {
                self.push(format!("{at}: duplicate part name"));
            }
            if part.upstream.is_empty() {
                self.push(format!("{at}: upstream is required"));
            }
            if let Err(why) = check_part_path(&part.path) {
                self.push(format!("{at}: path {why}"));
            }
            if part.timeout_ms > MAX_TIMEOUT_MS {
                self.push(format!(
                    "{at}: timeout_ms must be at most {MAX_TIMEOUT_MS} (0: the route's timeout)"
                ));
            }
        }
    }

    fn upstream(&mut self, u: &Upstream) {
        let who = format!("upstream \"{}\"", u.name);
        if !is_valid_name(&u.name) {
            self.push(format!(
                "{who}: name must match [a-z0-9][a-z0-9-]* and be at most {MAX_NAME_LEN} characters"
            ));
        }
        match (&u.discovery, u.instances.is_empty()) {
            (None, true) => self.push(format!(
                "{who}: instances must not be empty (or set discovery to find them in DNS)"
            )),
            (Some(_), false) => self.push(format!(
                "{who}: set either instances or discovery, not both"
            )),
            (Some(d), true) => self.discovery(&who, d),
            (None, false) => {}
        }
        self.balancing(&who, u);
        let mut ids = HashSet::new();
        for Instance { id, url, .. } in &u.instances {
            if !is_valid_name(id) {
                self.push(format!(
                    "{who}: instance \"{id}\": id must match [a-z0-9][a-z0-9-]*"
                ));
            }
            if !ids.insert(id.as_str()) {
                self.push(format!("{who}: instance \"{id}\": duplicate id"));
            }
            if let Err(why) = parse_instance_url(url) {
                self.push(format!("{who}: instance \"{id}\": url \"{url}\" {why}"));
            }
        }
        self.upstream_tls(&who, u);
        self.instance_weights(&who, u);
        if UpstreamProtocol::try_from(u.protocol).is_err() {
            self.push(format!(
                "{who}: protocol: unknown value {} (HTTP1 or HTTP2)",
                u.protocol
            ));
        }
        if let Some(hc) = &u.health_check {
            self.health_check(&who, hc);
        }
        if let Some(cb) = &u.circuit_breaker {
            self.circuit_breaker(&who, cb);
        }
        if let Some(o) = &u.outlier_detection {
            self.outlier_detection(&who, o);
        }
        self.identity_signing(&who, u);
    }

    fn balancing(&mut self, who: &str, u: &Upstream) {
        let policy = LbPolicy::try_from(u.lb_policy);
        if policy.is_err() {
            self.push(format!("{who}: lb_policy: unknown value {}", u.lb_policy));
        }
        let hash_on = HashOn::try_from(u.hash_on);
        match (policy, hash_on) {
            (_, Err(_)) => self.push(format!("{who}: hash_on: unknown value {}", u.hash_on)),
            (Ok(LbPolicy::ConsistentHash), Ok(HashOn::Unspecified)) => self.push(format!(
                "{who}: hash_on is required with lb_policy CONSISTENT_HASH (HASH_ON_USER, HASH_ON_IP or HASH_ON_HEADER)"
            )),
            (Ok(p), Ok(h)) if p != LbPolicy::ConsistentHash && h != HashOn::Unspecified => self
                .push(format!(
                    "{who}: hash_on is only used with lb_policy CONSISTENT_HASH"
                )),
            _ => {}
        }
        let header = u.hash_header.as_str();
        match hash_on {
            Ok(HashOn::Header) if header.is_empty() => self.push(format!(
                "{who}: hash_header is required with hash_on HASH_ON_HEADER"
            )),
            Ok(HashOn::Header) if !is_valid_header_name(header) => self.push(format!(
                "{who}: hash_header \"{header}\" is not a valid header name (letters, digits and !#$%&'*+-.^_`|~, at most {MAX_HEADER_NAME_LEN})"
            )),
            Ok(HashOn::Header) if HOP_BY_HOP.contains(&header.to_ascii_lowercase().as_str()) => {
                self.push(format!(
                    "{who}: hash_header \"{header}\" is a hop-by-hop header, removed before balancing"
                ))
            }
            Ok(HashOn::Header) => {}
            _ if !header.is_empty() => self.push(format!(
                "{who}: hash_header is only used with hash_on HASH_ON_HEADER"
            )),
            _ => {}
        }
    }

    fn discovery(&mut self, who: &str, d: &DnsDiscovery) {
        if !is_valid_hostname(&d.dns_name) {
            self.push(format!(
                "{who}: discovery.dns_name \"{}\" is not a lower-case host name",
                d.dns_name
            ));
        }
        self.range(who, "discovery.port", d.port, 1, 65_535);
        if d.refresh_ms != 0 {
            self.range(
                who,
                "discovery.refresh_ms",
                d.refresh_ms,
                MIN_DNS_REFRESH_MS,
                MAX_DNS_REFRESH_MS,
            );
        }
    }

    fn range(&mut self, who: &str, field: &str, value: u32, lo: u32, hi: u32) {
        if value < lo || value > hi {
            self.push(format!("{who}: {field} must be {lo} to {hi} (got {value})"));
        }
    }

    fn health_check(&mut self, who: &str, hc: &HealthCheck) {
        if let Err(why) = check_path_prefix(&hc.path) {
            self.push(format!("{who}: health_check.path {why}"));
        }
        self.range(
            who,
            "health_check.interval_ms",
            hc.interval_ms,
            100,
            3_600_000,
        );
        self.range(who, "health_check.timeout_ms", hc.timeout_ms, 1, 60_000);
        if hc.timeout_ms > hc.interval_ms {
            self.push(format!(
                "{who}: health_check.timeout_ms must not exceed interval_ms"
            ));
        }
        self.range(
            who,
            "health_check.unhealthy_threshold",
            hc.unhealthy_threshold,
            1,
            100,
        );
        self.range(
            who,
            "health_check.healthy_threshold",
            hc.healthy_threshold,
            1,
            100,
        );
    }

    fn circuit_breaker(&mut self, who: &str, cb: &CircuitBreaker) {
        self.range(
            who,
            "circuit_breaker.failure_threshold",
            cb.failure_threshold,
            1,
            1000,
        );
        self.range(
            who,
            "circuit_breaker.reset_timeout_ms",
            cb.reset_timeout_ms,
            100,
            3_600_000,
        );
        self.range(
            who,
            "circuit_breaker.half_open_max_requests",
            cb.half_open_max_requests,
            1,
            1000,
        );
        if cb.max_open_percent != 0 {
            self.range(
                who,
                "circuit_breaker.max_open_percent",
                cb.max_open_percent,
                1,
                100,
            );
        }
    }
}

mod limits;
mod policy;
pub use limits::*;
pub use policy::*;

mod identity;
pub use identity::*;
mod certificate;
pub use certificate::*;
mod proxy;
pub use proxy::*;
mod upstream_tls;
pub use upstream_tls::*;
mod jwt_issuer;
pub use jwt_issuer::*;
mod cache;
pub use cache::*;
mod matching;
pub use matching::*;
mod split;
pub use split::*;
mod traffic;
pub use traffic::*;
mod mtls_allow;
pub use mtls_allow::*;

#[cfg(test)]
mod tests;

#[cfg(test)]
mod traffic_tests;

#[cfg(test)]
mod mirror_outlier_tests;

#[cfg(test)]
mod composition_tests;

#[cfg(test)]
mod policy_tests;

#[cfg(test)]
mod proxy_tests;

#[cfg(test)]
mod limits_tests;

/// [`validate_config`] for the tests, which look at the verdict only.
#[cfg(test)]
fn valid(routes: &[Route], upstreams: &[Upstream]) -> Result<(), ValidationError> {
    validate_config(routes, upstreams).map(drop)
}
