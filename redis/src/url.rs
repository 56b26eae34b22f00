//! Redis URLs: which forms are accepted ([`RedisUrl`]), and the redacted form
//! ([`redact`]) that every log line, error message and `Debug` output shows
//! instead of the URL itself, so a password in the URL is never printed.

use std::ffi::OsStr;
use std::fmt;
use std::str::FromStr;

/// What replaces a hidden user name or password.
const MASK: &str = "***";

/// What [`redact`] prints for a string that is not a URL at all (it might be
/// a password pasted into the wrong place, so none of it is shown).
pub const NOT_A_URL: &str = "<not a URL>";

/// Query parameters that carry credentials in some Redis URL dialects
/// (`redis+unix:///run/redis.sock?user=…&pass=…`); their values are hidden too.
const SECRET_PARAMS: [&str; 4] = ["user", "username", "pass", "password"];

/// `url` with its user name and password replaced by `***`, for printing.
///
/// * `redis://:hunter2@cache:6379/0` → `redis://:***@cache:6379/0`
/// * `rediss://app:hunter2@cache:6380` → `rediss://***:***@cache:6380`
/// * `redis://hunter2@cache` → `redis://***@cache`
/// * `redis://cache:6379` → unchanged
///
/// It never fails: the user-info part is taken to end at the *last* `@`, so
/// a password with an unescaped `/`, `?`, `#` or `@` is still hidden, and a
/// string without `://` is not shown at all ([`NOT_A_URL`]).
pub fn redact(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return NOT_A_URL.to_owned();
    };
    let (scheme, rest) = url.split_at(scheme_end);
    let mut out = String::with_capacity(url.len());
    out.push_str(scheme);
    let after_userinfo = match rest.rfind('@') {
        Some(at) => {
            let userinfo = &rest[..at];
            match userinfo.split_once(':') {
                Some(("", _)) => out.push(':'),
                Some(_) => {
                    out.push_str(MASK);
                    out.push(':');
                }
                None => {}
            }
            out.push_str(MASK);
            out.push('@');
            &rest[at + 1..]
        }
        None => rest,
    };
    match after_userinfo.split_once('?') {
        None => out.push_str(after_userinfo),
        Some((before, query)) => {
            out.push_str(before);
            out.push('?');
            let (query, fragment) = match query.split_once('#') {
                Some((q, f)) => (q, Some(f)),
                None => (query, None),
            };
            for (i, pair) in query.split('&').enumerate() {
                if i > 0 {
                    out.push('&');
                }
                match pair.split_once('=') {
                    Some((key, _))
                        if SECRET_PARAMS.contains(&key.to_ascii_lowercase().as_str()) =>
                    {
                        out.push_str(key);
                        out.push('=');
                        out.push_str(MASK);
                    }
                    _ => out.push_str(pair),
                }
            }
            if let Some(fragment) = fragment {
                out.push('#');
                out.push_str(fragment);
            }
        }
    }
    out
}

/// A checked Redis URL. `Display` and `Debug` print the [`redact`]ed form;
/// only [`RedisUrl::expose`] gives the URL itself, for the one place that connects.
///
/// Accepted forms (TCP only):
/// * `redis://host:port[/db]`: no password;
/// * `redis://:password@host:port[/db]`: `AUTH password` (Redis `requirepass`);
/// * `redis://user:password@host:port[/db]`: `AUTH user password` (Redis 6 ACL users);
/// * `redis+sentinel://[user:password@]host:port[,host:port…]/MASTER_NAME`: the
///   Sentinels to ask for the current master of `MASTER_NAME` (port 26379 when
///   left out); the credentials are sent to the Sentinels and to the master alike;
/// * `redis+cluster://[user:password@]host:port[,host:port…]`: any nodes of a
///   Redis Cluster (port 6379 when left out), the rest is discovered;
/// * `rediss://…`, `rediss+sentinel://…`, `rediss+cluster://…`: any of the above
///   over TLS; every server certificate is verified against the system roots, or
///   against a CA given separately (`--redis-ca`).
///
/// Refused, with the reason: other schemes, no host, a bad port or database
/// number, a user name without a password (`redis://secret@host` would send
/// no password at all), `#insecure` (certificate verification stays on), a
/// Sentinel URL without its master name, a database, query or extra path on a
/// Sentinel or Cluster URL. Characters such as `@`, `:` or `/` inside a
/// password are percent-encoded (`%40`, `%3A`, `%2F`).
#[derive(Clone, PartialEq, Eq)]
pub struct RedisUrl {
    url: String,
    redacted: String,
    topology: Topology,
}

/// What a [`RedisUrl`] points at.
#[derive(Clone, PartialEq, Eq)]
pub enum Topology {
    /// One Redis (`redis://`, `rediss://`); the redis crate's client reads the URL itself.
    Standalone,
    /// Sentinels that name the current master (`redis+sentinel://`).
    Sentinel {
        /// The Sentinels, in the order given.
        sentinels: Vec<Node>,
        /// The master's name, as the Sentinels know it (`sentinel monitor NAME …`).
        master: String,
        /// User name and password, if any.
        credentials: Credentials,
    },
    /// Seed nodes of a Redis Cluster (`redis+cluster://`).
    Cluster {
        /// The nodes given; the client learns the others from them.
        nodes: Vec<Node>,
        /// User name and password, if any.
        credentials: Credentials,
    },
}

/// One `host:port` of a Sentinel or Cluster URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// Host name or address (IPv6 without brackets).
    pub host: String,
    /// Port.
    pub port: u16,
}

/// The user name and password of a Sentinel or Cluster URL, percent-decoded.
/// `Debug` hides both.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Credentials {
    /// ACL user name (None: the default user).
    pub username: Option<String>,
    /// Password (None: no `AUTH`).
    pub password: Option<String>,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username.as_ref().map(|_| MASK))
            .field("password", &self.password.as_ref().map(|_| MASK))
            .finish()
    }
}

impl fmt::Debug for Topology {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Topology::Standalone => f.write_str("Standalone"),
            Topology::Sentinel {
                sentinels, master, ..
            } => f
                .debug_struct("Sentinel")
                .field("sentinels", sentinels)
                .field("master", master)
                .finish_non_exhaustive(),
            Topology::Cluster { nodes, .. } => f
                .debug_struct("Cluster")
                .field("nodes", nodes)
                .finish_non_exhaustive(),
        }
    }
}

/// Why a Redis URL was refused. Its text names the URL in its [`redact`]ed form only.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{url}: {reason}")]
pub struct RedisUrlError {
    /// The URL, redacted.
    pub url: String,
    /// Why it was refused.
    pub reason: String,
}

/// The schemes accepted, with TLS or not and the topology they name.
const SCHEMES: [(&str, bool, Kind); 6] = [
    ("redis://", false, Kind::Standalone),
    ("rediss://", true, Kind::Standalone),
    ("redis+sentinel://", false, Kind::Sentinel),
    ("rediss+sentinel://", true, Kind::Sentinel),
    ("redis+cluster://", false, Kind::Cluster),
    ("rediss+cluster://", true, Kind::Cluster),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Standalone,
    Sentinel,
    Cluster,
}

impl RedisUrl {
    /// Checks `url` (see the type's documentation for the accepted forms).
    pub fn parse(url: &str) -> Result<RedisUrl, RedisUrlError> {
        let refuse = |reason: &str| RedisUrlError {
            url: redact(url),
            reason: reason.to_owned(),
        };
        let Some(&(scheme, _, kind)) = SCHEMES.iter().find(|(s, _, _)| url.starts_with(s)) else {
            return Err(refuse(
                "must start with redis://, rediss:// (TLS), redis+sentinel://, \
                 rediss+sentinel://, redis+cluster:// or rediss+cluster://",
            ));
        };
        let topology = match kind {
            Kind::Standalone => {
                check_standalone(url).map_err(|r| refuse(&r))?;
                Topology::Standalone
            }
            Kind::Sentinel | Kind::Cluster => {
                parse_multi(&url[scheme.len()..], kind).map_err(|r| refuse(&r))?
            }
        };
        Ok(RedisUrl {
            url: url.to_owned(),
            redacted: redact(url),
            topology,
        })
    }

    /// The URL itself, password included: only for building the client.
    pub fn expose(&self) -> &str {
        &self.url
    }

    /// The URL with user name and password hidden (also what `Display` prints).
    pub fn redacted(&self) -> &str {
        &self.redacted
    }

    /// True for `rediss://`, `rediss+sentinel://` and `rediss+cluster://` (TLS).
    pub fn is_tls(&self) -> bool {
        self.url.starts_with("rediss")
    }

    /// One Redis, Sentinels, or a Cluster.
    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// True for `redis+cluster://` and `rediss+cluster://`.
    pub fn is_cluster(&self) -> bool {
        matches!(self.topology, Topology::Cluster { .. })
    }
}

/// `redis://` and `rediss://`: the url crate and then the redis crate's own parser.
fn check_standalone(url: &str) -> Result<(), String> {
    // The url crate's reasons ("invalid port number", "empty host") never quote the input.
    let parsed = url::Url::parse(url).map_err(|e| format!("not a valid URL: {e}"))?;
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err("has no host".into());
    }
    check_fragment(parsed.fragment())?;
    if !parsed.username().is_empty() && parsed.password().is_none() {
        return Err(no_password());
    }
    // The redis crate's own parser has the last word (database number, protocol).
    // Its messages are fixed strings that never contain the URL.
    redis::Client::open(url).map_err(|e| e.to_string())?;
    Ok(())
}

fn check_fragment(fragment: Option<&str>) -> Result<(), String> {
    match fragment {
        None => Ok(()),
        Some("insecure") => Err(
            "#insecure would turn off certificate verification; give the CA that signed \
             the server's certificate instead (--redis-ca)"
                .into(),
        ),
        Some(_) => Err("must not have a #fragment".into()),
    }
}

fn no_password() -> String {
    "has a user name but no password; a password alone is written \
     redis://:PASSWORD@host:port"
        .into()
}

/// The part after `redis+sentinel://` or `redis+cluster://`:
/// `[user:password@]host[:port][,host[:port]…][/MASTER_NAME]`.
///
/// The user information ends at the last `@`, as in [`redact`], so a password
/// that was not percent-encoded is never taken for a host (nor quoted in an error).
fn parse_multi(rest: &str, kind: Kind) -> Result<Topology, String> {
    let (rest, fragment) = match rest.split_once('#') {
        Some((r, f)) => (r, Some(f)),
        None => (rest, None),
    };
    check_fragment(fragment)?;
    let (userinfo, rest) = match rest.rfind('@') {
        Some(at) => (Some(&rest[..at]), &rest[at + 1..]),
        None => (None, rest),
    };
    if rest.contains('?') {
        return Err("takes no ?query: Sentinel and Cluster URLs have no options".into());
    }
    let credentials = match userinfo {
        None => Credentials::default(),
        Some(info) => {
            let Some((user, password)) = info.split_once(':') else {
                return Err(no_password());
            };
            let decode = |s: &str, what: &str| {
                percent_encoding::percent_decode_str(s)
                    .decode_utf8()
                    .map(|c| c.into_owned())
                    .map_err(|_| format!("its {what} is not valid UTF-8 once percent-decoded"))
            };
            Credentials {
                username: (!user.is_empty())
                    .then(|| decode(user, "user name"))
                    .transpose()?,
                password: Some(decode(password, "password")?),
            }
        }
    };
    let (hosts, path) = match rest.find('/') {
        Some(slash) => (&rest[..slash], &rest[slash..]),
        None => (rest, ""),
    };
    let default_port = match kind {
        Kind::Sentinel => 26379,
        _ => 6379,
    };
    let nodes = hosts
        .split(',')
        .map(|h| parse_node(h, default_port))
        .collect::<Result<Vec<_>, _>>()?;
    match kind {
        Kind::Sentinel => {
            let master = path.strip_prefix('/').unwrap_or(path);
            if master.is_empty() {
                return Err(
                    "has no master name: redis+sentinel://host:port[,host:port…]/MASTER_NAME"
                        .into(),
                );
            }
            if master.contains('/') {
                return Err("has more than a master name after the hosts (a database \
                            number is not supported with Sentinel)"
                    .into());
            }
            if master.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err("has a master name with spaces or control characters".into());
            }
            Ok(Topology::Sentinel {
                sentinels: nodes,
                master: master.to_owned(),
                credentials,
            })
        }
        _ => {
            if !(path.is_empty() || path == "/") {
                return Err("has a path: a Cluster URL names nodes only (Redis Cluster \
                            has database 0 only)"
                    .into());
            }
            Ok(Topology::Cluster { nodes, credentials })
        }
    }
}

/// `host`, `host:port`, `[v6]` or `[v6]:port`.
fn parse_node(text: &str, default_port: u16) -> Result<Node, String> {
    if text.is_empty() {
        return Err("has an empty host in its list (host:port,host:port…)".into());
    }
    let v6 = text.starts_with('[');
    let (host, port) = if let Some(v6) = text.strip_prefix('[') {
        let Some((host, after)) = v6.split_once(']') else {
            return Err(format!(
                "host {text:?}: an IPv6 address needs its closing ]"
            ));
        };
        let port = match after {
            "" => None,
            p => Some(
                p.strip_prefix(':')
                    .ok_or_else(|| format!("host {text:?}: expected :PORT after ]"))?,
            ),
        };
        host.parse::<std::net::Ipv6Addr>()
            .map_err(|_| format!("host {text:?}: not an IPv6 address"))?;
        (host, port)
    } else {
        match text.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (text, None),
        }
    };
    if host.is_empty() {
        return Err(format!("host {text:?} has no name"));
    }
    if !v6 && (host.contains(['[', ']', ':', '/']) || url::Host::parse(host).is_err()) {
        return Err(format!("host {text:?} is not a valid host name"));
    }
    let port = match port {
        None => default_port,
        Some(p) => match p.parse::<u16>() {
            Ok(0) | Err(_) => return Err(format!("host {text:?}: invalid port number")),
            Ok(p) => p,
        },
    };
    Ok(Node {
        host: host.to_owned(),
        port,
    })
}

impl FromStr for RedisUrl {
    type Err = RedisUrlError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        RedisUrl::parse(s)
    }
}

impl fmt::Display for RedisUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted)
    }
}

impl fmt::Debug for RedisUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("RedisUrl").field(&self.redacted).finish()
    }
}

/// The clap value parser for a [`RedisUrl`] flag:
/// `#[arg(long, value_parser = RedisUrlParser, hide_env_values = true)]`.
///
/// clap's own parsers quote the rejected value in their error message
/// (`invalid value 'redis://:hunter2@…'`); this one quotes only the redacted form.
/// Pair it with `hide_env_values = true`, or `--help` prints the value of the
/// flag's environment variable.
#[derive(Debug, Clone, Copy, Default)]
pub struct RedisUrlParser;

impl clap::builder::TypedValueParser for RedisUrlParser {
    type Value = RedisUrl;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &OsStr,
    ) -> Result<RedisUrl, clap::Error> {
        let flag = arg.map_or_else(
            || "the Redis URL".to_owned(),
            |a| match a.get_long() {
                Some(long) => format!("--{long}"),
                None => a.get_id().to_string(),
            },
        );
        let fail = |message: String| {
            clap::Error::raw(
                clap::error::ErrorKind::ValueValidation,
                format!("{message}\n"),
            )
            .with_cmd(cmd)
        };
        let text = value
            .to_str()
            .ok_or_else(|| fail(format!("invalid value for {flag}: not valid UTF-8")))?;
        RedisUrl::parse(text).map_err(|e| fail(format!("invalid value for {flag}: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redaction_hides_user_and_password_and_keeps_the_rest() {
        let cases = [
            ("redis://127.0.0.1:6379", "redis://127.0.0.1:6379"),
            ("redis://:hunter2@cache:6379", "redis://:***@cache:6379"),
            ("redis://:hunter2@cache:6379/3", "redis://:***@cache:6379/3"),
            (
                "rediss://app:hunter2@cache:6380",
                "rediss://***:***@cache:6380",
            ),
            ("redis://hunter2@cache", "redis://***@cache"),
            ("redis://:@cache", "redis://:***@cache"),
            // Unescaped separators inside the password: everything up to the last @ is hidden.
            ("redis://:a/b?c#d@cache:1", "redis://:***@cache:1"),
            ("redis://u:p@ss@cache:1", "redis://***:***@cache:1"),
            (
                "redis+unix:///run/redis.sock?db=1&pass=hunter2&User=admin",
                "redis+unix:///run/redis.sock?db=1&pass=***&User=***",
            ),
            (
                "redis://cache:6379/0?protocol=resp3#frag",
                "redis://cache:6379/0?protocol=resp3#frag",
            ),
            ("http://nope", "http://nope"),
            ("hunter2", NOT_A_URL),
            ("cache:6379", NOT_A_URL),
            ("", NOT_A_URL),
        ];
        for (input, want) in cases {
            let got = redact(input);
            assert_eq!(got, want, "redact({input:?})");
            assert!(!got.contains("hunter2"), "{got}");
        }
    }

    #[test]
    fn accepted_forms() {
        for (url, tls) in [
            ("redis://127.0.0.1:6379", false),
            ("redis://localhost", false),
            ("redis://:pw@127.0.0.1:6379/2", false),
            ("redis://app:pw@[::1]:6379", false),
            ("redis://:p%40ss%2Fw@cache:6379", false),
            ("rediss://cache.example:6380", true),
            ("rediss://:pw@cache.example:6380/0", true),
        ] {
            let parsed = RedisUrl::parse(url).unwrap_or_else(|e| panic!("{url}: {e}"));
            assert_eq!(parsed.expose(), url);
            assert_eq!(parsed.is_tls(), tls, "{url}");
            assert_eq!(parsed.to_string(), redact(url));
        }
    }

    #[test]
    fn refusals_give_the_reason_and_never_the_password() {
        for (url, reason) in [
            ("http://:hunter2@cache:6379", "must start with redis://"),
            ("hunter2", "must start with redis://"),
            (
                "redis+unix:///tmp/r.sock?pass=hunter2",
                "must start with redis://",
            ),
            ("redis://:hunter2@cache:99999", "invalid port number"),
            ("redis://:hunter2@", "host"),
            ("redis://hunter2@cache:6379", "user name but no password"),
            ("rediss://:hunter2@cache:6380/#insecure", "--redis-ca"),
            ("redis://:hunter2@cache:6379/#x", "fragment"),
            ("redis://:hunter2@cache:6379/x", "database number"),
        ] {
            let err = RedisUrl::parse(url).unwrap_err();
            let text = err.to_string();
            assert!(text.contains(reason), "{url}: {text}");
            assert!(!text.contains("hunter2"), "{url}: {text}");
            assert!(!format!("{err:?}").contains("hunter2"), "{err:?}");
        }
    }

    #[test]
    fn sentinel_and_cluster_urls_name_their_nodes() {
        let url =
            RedisUrl::parse("redis+sentinel://:p%40ss@s1:26380,[::1],10.0.0.3:26381/mymaster")
                .unwrap();
        assert!(!url.is_tls() && !url.is_cluster());
        let Topology::Sentinel {
            sentinels,
            master,
            credentials,
        } = url.topology()
        else {
            panic!("{url:?}");
        };
        assert_eq!(master, "mymaster");
        assert_eq!(
            sentinels,
            &[
                Node {
                    host: "s1".into(),
                    port: 26380
                },
                Node {
                    host: "::1".into(),
                    port: 26379
                },
                Node {
                    host: "10.0.0.3".into(),
                    port: 26381
                },
            ]
        );
        assert_eq!(credentials.username, None);
        assert_eq!(credentials.password.as_deref(), Some("p@ss"));
        assert_eq!(
            url.to_string(),
            "redis+sentinel://:***@s1:26380,[::1],10.0.0.3:26381/mymaster"
        );
        assert!(!format!("{url:?} {:?}", url.topology()).contains("p@ss"));

        let url = RedisUrl::parse("rediss+cluster://app:hunter2@n1:7000,n2,[::1]:7002/").unwrap();
        assert!(url.is_tls() && url.is_cluster());
        let Topology::Cluster { nodes, credentials } = url.topology() else {
            panic!("{url:?}");
        };
        assert_eq!(nodes.len(), 3);
        assert_eq!(
            nodes[1],
            Node {
                host: "n2".into(),
                port: 6379
            }
        );
        assert_eq!(
            nodes[2],
            Node {
                host: "::1".into(),
                port: 7002
            }
        );
        assert_eq!(credentials.username.as_deref(), Some("app"));
        assert_eq!(
            url.redacted(),
            "rediss+cluster://***:***@n1:7000,n2,[::1]:7002/"
        );
        let debug = format!("{url:?} {:?} {credentials:?}", url.topology());
        assert!(
            !debug.contains("hunter2") && !debug.contains("app"),
            "{debug}"
        );

        assert!(RedisUrl::parse("rediss+sentinel://s1/m").unwrap().is_tls());
        // The user information ends at the last @: an unescaped / or @ stays in the password.
        let url = RedisUrl::parse("redis+cluster://:hun/t@r2@n1").unwrap();
        let Topology::Cluster { credentials, .. } = url.topology() else {
            panic!("{url:?}");
        };
        assert_eq!(credentials.password.as_deref(), Some("hun/t@r2"));
        assert_eq!(url.redacted(), "redis+cluster://:***@n1");
        assert!(RedisUrl::parse("redis+cluster://n1").is_ok());
    }

    #[test]
    fn bad_sentinel_and_cluster_urls_say_what_is_wrong() {
        for (url, reason) in [
            ("redis+sentinel://:hunter2@s1:26379", "no master name"),
            ("redis+sentinel://:hunter2@s1:26379/", "no master name"),
            (
                "redis+sentinel://:hunter2@s1/m/0",
                "more than a master name",
            ),
            ("redis+sentinel://:hunter2@s1,,s2/m", "empty host"),
            ("redis+sentinel://:hunter2@/m", "empty host"),
            ("redis+sentinel://:hunter2@s1:0/m", "invalid port"),
            ("redis+sentinel://:hunter2@s1:99999/m", "invalid port"),
            ("redis+sentinel://:hunter2@s1:x/m", "invalid port"),
            ("redis+sentinel://hunter2@s1/m", "user name but no password"),
            ("redis+sentinel://:hunter2@s1/m?db=1", "no ?query"),
            ("rediss+sentinel://:hunter2@s1/m#insecure", "--redis-ca"),
            ("redis+cluster://:hunter2@n1,n2/0", "has a path"),
            ("redis+cluster://:hunter2@n1,[::1/", "closing ]"),
            ("redis+cluster://:hunter2@[nope]:1", "not an IPv6"),
            ("redis+cluster://:hunter2@bad host:1", "not a valid host"),
            ("redis+cluster://:hunter2@n1:1:2", "not a valid host"),
            ("redis+cluster://:hunter2@n1#x", "fragment"),
            ("redis+clusters://:hunter2@n1", "must start with"),
        ] {
            let err = RedisUrl::parse(url).unwrap_err();
            let text = err.to_string();
            assert!(text.contains(reason), "{url}: {text}");
            assert!(
                !text.contains("hunter2") && !text.contains("ter2"),
                "{url}: {text}"
            );
        }
    }

    #[test]
    fn display_and_debug_are_redacted() {
        let url: RedisUrl = "redis://app:hunter2@cache:6379".parse().unwrap();
        assert_eq!(url.to_string(), "redis://***:***@cache:6379");
        assert_eq!(
            format!("{url:?}"),
            r#"RedisUrl("redis://***:***@cache:6379")"#
        );
        assert_eq!(url.redacted(), "redis://***:***@cache:6379");
        assert_eq!(url.expose(), "redis://app:hunter2@cache:6379");
    }

    #[test]
    fn clap_errors_show_only_the_redacted_url() {
        use clap::Parser;
        #[derive(Debug, Parser)]
        struct Cli {
            #[arg(long, env = "GATEWAY_REDIS_TEST_URL", value_parser = RedisUrlParser, hide_env_values = true)]
            redis_url: Option<RedisUrl>,
        }
        let err = Cli::try_parse_from(["x", "--redis-url", "http://:hunter2@cache"]).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("--redis-url"), "{text}");
        assert!(text.contains("http://:***@cache"), "{text}");
        assert!(!text.contains("hunter2"), "{text}");
        let ok = Cli::try_parse_from(["x", "--redis-url", "redis://:hunter2@cache"]).unwrap();
        assert_eq!(ok.redis_url.unwrap().expose(), "redis://:hunter2@cache");
    }
}
