//! What differs between two configurations: the `changes` list of
//! `ApplyConfig` and the one-line summary stored with each version.

use crate::config::ConfigRef;
use gateway_proto::v1::ResourceChange;
use std::cmp::Ordering;
use std::fmt::Write as _;

/// The kind of resource that changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// A route (listed first).
    Route,
    /// An upstream.
    Upstream,
    /// A TLS certificate.
    Certificate,
    /// A JWT issuer (listed last).
    JwtIssuer,
}

/// What happened to a resource.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Action {
    /// Present only in the new configuration.
    Added,
    /// Present in both, with different content.
    Updated,
    /// Present only in the old configuration.
    Removed,
}

/// One difference between two configurations.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    /// Route, upstream or certificate.
    pub kind: Kind,
    /// Its name.
    pub name: String,
    /// Added, updated or removed.
    pub action: Action,
}

impl Kind {
    /// The name shown in `ResourceChange.kind` and in summaries.
    pub fn noun(self) -> &'static str {
        match self {
            Kind::Route => "route",
            Kind::Upstream => "upstream",
            Kind::Certificate => "certificate",
            Kind::JwtIssuer => "jwt_issuer",
        }
    }
}

impl From<&Change> for ResourceChange {
    fn from(c: &Change) -> Self {
        ResourceChange {
            kind: c.kind.noun().into(),
            name: c.name.clone(),
            action: match c.action {
                Action::Added => "added",
                Action::Updated => "updated",
                Action::Removed => "removed",
            }
            .into(),
        }
    }
}

/// Every difference from `old` to `new`: routes first, then upstreams, then
/// certificates, then JWT issuers, each sorted by name.
///
/// Both sides must be sorted by name with unique names (every stored or
/// validated configuration is), so one merge pass finds everything.
pub fn diff(old: ConfigRef<'_>, new: ConfigRef<'_>) -> Vec<Change> {
    let mut out = Vec::new();
    diff_kind(&mut out, Kind::Route, old.routes, new.routes, |r| &r.name);
    diff_kind(
        &mut out,
        Kind::Upstream,
        old.upstreams,
        new.upstreams,
        |u| &u.name,
    );
    diff_kind(
        &mut out,
        Kind::Certificate,
        old.certificates,
        new.certificates,
        |c| &c.name,
    );
    diff_kind(
        &mut out,
        Kind::JwtIssuer,
        old.jwt_issuers,
        new.jwt_issuers,
        |i| &i.name,
    );
    out
}

fn diff_kind<T: PartialEq>(
    out: &mut Vec<Change>,
    kind: Kind,
    old: &[T],
    new: &[T],
    name: impl Fn(&T) -> &String,
) {
    let (mut i, mut j) = (0, 0);
    loop {
        match (old.get(i), new.get(j)) {
            (Some(o), Some(n)) => match name(o).cmp(name(n)) {
                Ordering::Less => {
                    out.push(change(kind, name(o), Action::Removed));
                    i += 1;
                }
                Ordering::Greater => {
                    out.push(change(kind, name(n), Action::Added));
                    j += 1;
                }
                Ordering::Equal => {
                    if o != n {
                        out.push(change(kind, name(n), Action::Updated));
                    }
                    i += 1;
                    j += 1;
                }
            },
            (Some(o), None) => {
                out.push(change(kind, name(o), Action::Removed));
                i += 1;
            }
            (None, Some(n)) => {
                out.push(change(kind, name(n), Action::Added));
                j += 1;
            }
            (None, None) => break,
        }
    }
}

fn change(kind: Kind, name: &str, action: Action) -> Change {
    Change {
        kind,
        name: name.to_owned(),
        action,
    }
}

/// Counts per kind and action, e.g. `+2 routes, ~1 upstream, -1 certificate`, or `no changes`.
pub fn summarize(changes: &[Change]) -> String {
    let mut out = String::new();
    for kind in [
        Kind::Route,
        Kind::Upstream,
        Kind::Certificate,
        Kind::JwtIssuer,
    ] {
        for (action, sign) in [
            (Action::Added, '+'),
            (Action::Updated, '~'),
            (Action::Removed, '-'),
        ] {
            let n = changes
                .iter()
                .filter(|c| c.kind == kind && c.action == action)
                .count();
            if n == 0 {
                continue;
            }
            if !out.is_empty() {
                out.push_str(", ");
            }
            let noun = kind.noun();
            let _ = write!(out, "{sign}{n} {noun}{}", if n == 1 { "" } else { "s" });
        }
    }
    if out.is_empty() {
        out.push_str("no changes");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use gateway_proto::v1::{Route, Upstream};

    fn route(name: &str, timeout_ms: u32) -> Route {
        Route {
            name: name.into(),
            timeout_ms,
            ..Default::default()
        }
    }

    fn upstream(name: &str) -> Upstream {
        Upstream {
            name: name.into(),
            ..Default::default()
        }
    }

    #[test]
    fn lists_routes_first_each_sorted_by_name() {
        let old = Config::new(
            vec![route("keep", 1), route("change", 1), route("drop", 1)],
            vec![upstream("old-u")],
        );
        let new = Config::new(
            vec![route("keep", 1), route("change", 2), route("add", 1)],
            vec![upstream("new-u")],
        );
        let changes = diff(old.view(), new.view());
        let got: Vec<(Kind, &str, Action)> = changes
            .iter()
            .map(|c| (c.kind, c.name.as_str(), c.action))
            .collect();
        let names: Vec<_> = got.iter().map(|(_, n, _)| *n).collect();
        assert_eq!(names, ["add", "change", "drop", "new-u", "old-u"]);
        assert_eq!(got[0].2, Action::Added);
        assert_eq!(got[1].2, Action::Updated);
        assert_eq!(got[2].2, Action::Removed);
        assert_eq!((got[3].0, got[3].2), (Kind::Upstream, Action::Added));
        assert_eq!((got[4].0, got[4].2), (Kind::Upstream, Action::Removed));
        let pb: ResourceChange = (&changes[1]).into();
        assert_eq!(
            (pb.kind.as_str(), pb.name.as_str(), pb.action.as_str()),
            ("route", "change", "updated")
        );
    }

    #[test]
    fn certificates_are_listed_last() {
        use gateway_proto::v1::Certificate;
        let cert = |name: &str, chain: &str| Certificate {
            name: name.into(),
            cert_chain_pem: chain.into(),
            ..Default::default()
        };
        let old = Config::new(vec![], vec![upstream("u")])
            .with_certificates(vec![cert("a", "1"), cert("b", "1")]);
        let new = Config::new(vec![route("r", 1)], vec![])
            .with_certificates(vec![cert("b", "2"), cert("c", "1")]);
        let changes = diff(old.view(), new.view());
        let got: Vec<ResourceChange> = changes.iter().map(ResourceChange::from).collect();
        let got: Vec<(&str, &str, &str)> = got
            .iter()
            .map(|c| (c.kind.as_str(), c.name.as_str(), c.action.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("route", "r", "added"),
                ("upstream", "u", "removed"),
                ("certificate", "a", "removed"),
                ("certificate", "b", "updated"),
                ("certificate", "c", "added"),
            ]
        );
        assert_eq!(
            summarize(&changes),
            "+1 route, -1 upstream, +1 certificate, ~1 certificate, -1 certificate"
        );
    }

    #[test]
    fn summary_counts_each_kind_and_action() {
        let old = Config::new(vec![route("a", 1)], vec![upstream("u")]);
        let new = Config::new(
            vec![route("b", 1), route("c", 1)],
            vec![upstream("u"), upstream("v")],
        );
        assert_eq!(
            summarize(&diff(old.view(), new.view())),
            "+2 routes, -1 route, +1 upstream"
        );
        assert_eq!(summarize(&diff(old.view(), old.view())), "no changes");
    }
}
