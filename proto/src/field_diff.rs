//! The per-field view of a list of changes (an `ApplyConfig` dry run's, or
//! the control plane's diff of two versions): the control plane says which
//! routes and upstreams are added, updated or removed (it is the authority);
//! this shows which fields differ, from the two sides in the proto's JSON
//! mapping. `gatewayctl diff` prints it, the web console's version history
//! shows it as a table.
//! Secrets are never shown: the control plane never returns them, and a file's
//! are replaced by `<secret>`.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::v1::{JwtIssuer, ResourceChange, Route, Upstream};
use serde_json::Value;

/// Fields of an upstream that hold a secret, or say whether one is set
/// (output only): not compared as values.
const SECRET: &str = "identitySigningSecret";
const SECRET_SET: &str = "identitySigningSecretSet";

/// The current and the desired resources, by kind and name.
#[derive(Debug, Default)]
pub struct Sides {
    current: BTreeMap<(&'static str, String), Value>,
    desired: BTreeMap<(&'static str, String), Value>,
}

impl Sides {
    /// The current configuration's resources and the file's.
    pub fn new(current: (&[Route], &[Upstream]), desired: (&[Route], &[Upstream])) -> Self {
        let mut sides = Sides::default();
        for (map, (routes, upstreams)) in
            [(&mut sides.current, current), (&mut sides.desired, desired)]
        {
            for r in routes {
                map.insert(("route", r.name.clone()), to_json(r));
            }
            for u in upstreams {
                map.insert(("upstream", u.name.clone()), masked(to_json(u)));
            }
        }
        sides
    }

    /// The same sides with the current and the desired JWT issuers (kind `jwt_issuer`).
    pub fn with_jwt_issuers(mut self, current: &[JwtIssuer], desired: &[JwtIssuer]) -> Self {
        for (map, issuers) in [(&mut self.current, current), (&mut self.desired, desired)] {
            for i in issuers {
                map.insert(("jwt_issuer", i.name.clone()), to_json(i));
            }
        }
        self
    }

    /// Each change with the fields that differ, in the order of `changes`.
    pub fn resources<'c>(&self, changes: &'c [ResourceChange]) -> Vec<ResourceDiff<'c>> {
        changes
            .iter()
            .map(|c| {
                let kind: &'static str = match c.kind.as_str() {
                    "upstream" => "upstream",
                    "jwt_issuer" => "jwt_issuer",
                    _ => "route",
                };
                let key = (kind, c.name.clone());
                let (mark, old, new) = match c.action.as_str() {
                    "added" => (Mark::Added, None, self.desired.get(&key)),
                    "removed" => (Mark::Removed, self.current.get(&key), None),
                    _ => (
                        Mark::Updated,
                        self.current.get(&key),
                        self.desired.get(&key),
                    ),
                };
                let old = old.map(leaves).unwrap_or_default();
                let new = new.map(leaves).unwrap_or_default();
                let fields = match mark {
                    Mark::Added => new
                        .into_iter()
                        .map(|(path, v)| FieldChange {
                            path,
                            old: None,
                            new: Some(v),
                        })
                        .collect(),
                    Mark::Removed => Vec::new(),
                    Mark::Updated => {
                        let paths: std::collections::BTreeSet<&String> =
                            old.keys().chain(new.keys()).collect();
                        paths
                            .into_iter()
                            .filter(|p| old.get(*p) != new.get(*p))
                            .map(|p| FieldChange {
                                path: p.clone(),
                                old: old.get(p).cloned(),
                                new: new.get(p).cloned(),
                            })
                            .collect()
                    }
                };
                ResourceDiff {
                    change: c,
                    mark,
                    fields,
                }
            })
            .collect()
    }

    /// The changes, one block each: `+`, `-` or `~`, the kind and name, then
    /// one indented line per field.
    pub fn render(&self, changes: &[ResourceChange]) -> String {
        let mut out = String::new();
        for r in self.resources(changes) {
            let c = r.change;
            let _ = writeln!(out, "{} {} \"{}\"", r.mark.sign(), c.kind, c.name);
            match r.mark {
                Mark::Added => {
                    for f in &r.fields {
                        let _ = writeln!(out, "    {}: {}", f.path, text(f.new.as_ref()));
                    }
                }
                Mark::Removed => {}
                Mark::Updated => {
                    for f in &r.fields {
                        let _ = writeln!(
                            out,
                            "    {}: {} → {}",
                            f.path,
                            text(f.old.as_ref()),
                            text(f.new.as_ref())
                        );
                    }
                    if r.fields.is_empty() {
                        let _ = writeln!(out, "    {HIDDEN_CHANGE}");
                    }
                }
            }
        }
        out
    }
}

/// What an update that changes no visible field says: a secret changed.
pub const HIDDEN_CHANGE: &str = "(no field differs that can be shown: a secret changes)";

/// What happened to a resource, as a diff marks it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mark {
    /// `+`: only on the desired side.
    Added,
    /// `~`: on both sides, different.
    Updated,
    /// `-`: only on the current side.
    Removed,
}

impl Mark {
    /// `+`, `~` or `-`.
    pub fn sign(self) -> char {
        match self {
            Mark::Added => '+',
            Mark::Updated => '~',
            Mark::Removed => '-',
        }
    }
}

/// One field that differs, by its path in the proto's JSON mapping.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldChange {
    /// `rateLimits[0].limit`.
    pub path: String,
    /// Its JSON value on the current side (`None`: unset).
    pub old: Option<String>,
    /// Its JSON value on the desired side (`None`: unset).
    pub new: Option<String>,
}

/// One changed resource with its fields.
#[derive(Clone, Debug)]
pub struct ResourceDiff<'c> {
    /// The change as the control plane reported it.
    pub change: &'c ResourceChange,
    /// Added, updated or removed.
    pub mark: Mark,
    /// Added: every field set; updated: those that differ (none: a secret
    /// changed, see [`HIDDEN_CHANGE`]); removed: none.
    pub fields: Vec<FieldChange>,
}

/// A message in the proto's JSON mapping (default values left out).
fn to_json<T: serde::Serialize>(message: &T) -> Value {
    serde_json::to_value(message).unwrap_or(Value::Null)
}

/// An upstream with its secret as `<secret>` and the output-only field gone.
fn masked(mut upstream: Value) -> Value {
    if let Value::Object(map) = &mut upstream {
        map.remove(SECRET_SET);
        if let Some(v) = map.get_mut(SECRET) {
            *v = Value::String("<secret>".into());
        }
    }
    upstream
}

/// Every leaf of `value` by its path (`rateLimits[0].limit`); a list of
/// scalars is one leaf.
pub fn leaves(value: &Value) -> BTreeMap<String, String> {
    fn walk(value: &Value, path: String, out: &mut BTreeMap<String, String>) {
        match value {
            Value::Object(map) => {
                for (k, v) in map {
                    let p = if path.is_empty() {
                        k.clone()
                    } else {
                        format!("{path}.{k}")
                    };
                    walk(v, p, out);
                }
            }
            Value::Array(items) if items.iter().any(|i| i.is_object() || i.is_array()) => {
                for (i, v) in items.iter().enumerate() {
                    walk(v, format!("{path}[{i}]"), out);
                }
            }
            other => {
                out.insert(path, other.to_string());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(value, String::new(), &mut out);
    out
}

/// A field's value as shown: its JSON, or `(unset)`.
pub fn text(v: Option<&String>) -> &str {
    v.map_or("(unset)", String::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1::RateLimit;

    fn change(kind: &str, name: &str, action: &str) -> ResourceChange {
        ResourceChange {
            kind: kind.into(),
            name: name.into(),
            action: action.into(),
        }
    }

    #[test]
    fn jwt_issuers_are_diffed_by_field() {
        use crate::v1::JwtIssuer;
        let old = JwtIssuer {
            name: "kc".into(),
            audiences: vec!["a".into()],
            ..JwtIssuer::default()
        };
        let new = JwtIssuer {
            audiences: vec!["b".into()],
            ..old.clone()
        };
        let sides = Sides::new((&[], &[]), (&[], &[]))
            .with_jwt_issuers(std::slice::from_ref(&old), std::slice::from_ref(&new));
        let text = sides.render(&[change("jwt_issuer", "kc", "updated")]);
        assert!(text.contains("~ jwt_issuer \"kc\""), "{text}");
        assert!(text.contains("audiences: [\"a\"] → [\"b\"]"), "{text}");
    }

    #[test]
    fn fields_that_differ_are_shown_and_secrets_never() {
        let old_route = Route {
            name: "users".into(),
            path_prefix: "/api/users".into(),
            timeout_ms: 1500,
            rate_limits: vec![RateLimit {
                policy: "p".into(),
                limit: 20,
                ..RateLimit::default()
            }],
            ..Route::default()
        };
        let mut new_route = old_route.clone();
        new_route.timeout_ms = 2000;
        new_route.rate_limits[0].limit = 40;
        new_route.methods = vec!["GET".into()];
        let old_up = Upstream {
            name: "u".into(),
            identity_signing_secret_set: true,
            ..Upstream::default()
        };
        let new_up = Upstream {
            name: "u".into(),
            identity_signing_secret: "hunter2hunter2hunter2hunter2hunter2".into(),
            ..Upstream::default()
        };
        let added = Route {
            name: "new".into(),
            path_prefix: "/n".into(),
            ..Route::default()
        };
        let sides = Sides::new(
            (
                std::slice::from_ref(&old_route),
                std::slice::from_ref(&old_up),
            ),
            (&[new_route, added], &[new_up]),
        );
        let text = sides.render(&[
            change("route", "new", "added"),
            change("route", "users", "updated"),
            change("route", "gone", "removed"),
            change("upstream", "u", "updated"),
        ]);
        assert_eq!(
            text,
            "+ route \"new\"\n    name: \"new\"\n    pathPrefix: \"/n\"\n\
             ~ route \"users\"\n    methods: (unset) → [\"GET\"]\n    rateLimits[0].limit: 20 → 40\n    timeoutMs: 1500 → 2000\n\
             - route \"gone\"\n\
             ~ upstream \"u\"\n    identitySigningSecret: (unset) → \"<secret>\"\n"
        );
        assert!(!text.contains("hunter2"));
    }
}
