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
/// Accepted forms (the redis crate's syntax, TCP only):
/// * `redis://host:port[/db]`: no password;
/// * `redis://:password@host:port[/db]`: `AUTH password` (Redis `requirepass`);
/// * `redis://user:password@host:port[/db]`: `AUTH user password` (Redis 6 ACL users);
/// * `rediss://…`: any of the above over TLS; the server certificate is verified
///   against the system roots, or against a CA given separately (`--redis-ca`).
///
/// Refused, with the reason: other schemes, no host, a bad port or database
/// number, a user name without a password (`redis://secret@host` would send
/// no password at all), and `#insecure` (certificate verification stays on).
/// Characters such as `@`, `:` or `/` inside a password are percent-encoded
/// (`%40`, `%3A`, `%2F`).
#[derive(Clone, PartialEq, Eq)]
pub struct RedisUrl {
    url: String,
    redacted: String,
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

impl RedisUrl {
    /// Checks `url` (see the type's documentation for the accepted forms).
    pub fn parse(url: &str) -> Result<RedisUrl, RedisUrlError> {
        let refuse = |reason: &str| RedisUrlError {
            url: redact(url),
            reason: reason.to_owned(),
        };
        if !(url.starts_with("redis://") || url.starts_with("rediss://")) {
            return Err(refuse("must start with redis:// or rediss:// (TLS)"));
        }
        // The url crate's reasons ("invalid port number", "empty host") never quote the input.
        let parsed = url::Url::parse(url).map_err(|e| refuse(&format!("not a valid URL: {e}")))?;
        if parsed.host_str().is_none_or(str::is_empty) {
            return Err(refuse("has no host"));
        }
        match parsed.fragment() {
            None => {}
            Some("insecure") => {
                return Err(refuse(
                    "#insecure would turn off certificate verification; give the CA that signed \
                     the server's certificate instead (--redis-ca)",
                ));
            }
            Some(_) => return Err(refuse("must not have a #fragment")),
        }
        if !parsed.username().is_empty() && parsed.password().is_none() {
            return Err(refuse(
                "has a user name but no password; a password alone is written \
                 redis://:PASSWORD@host:port",
            ));
        }
        // The redis crate's own parser has the last word (database number, protocol).
        // Its messages are fixed strings that never contain the URL.
        redis::Client::open(url).map_err(|e| refuse(&e.to_string()))?;
        Ok(RedisUrl {
            url: url.to_owned(),
            redacted: redact(url),
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

    /// True for `rediss://` (TLS).
    pub fn is_tls(&self) -> bool {
        self.url.starts_with("rediss://")
    }
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
            ("http://:hunter2@cache:6379", "redis:// or rediss://"),
            ("hunter2", "redis:// or rediss://"),
            (
                "redis+unix:///tmp/r.sock?pass=hunter2",
                "redis:// or rediss://",
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
