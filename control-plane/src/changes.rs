//! What differs between two configurations: the `changes` list of
//! `ApplyConfig` and the one-line summary stored with each version.

use crate::config::Config;
use gateway_proto::v1::ResourceChange;
use std::collections::HashMap;
use std::fmt::Write as _;

/// The kind of resource that changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// A route (listed first).
    Route,
    /// An upstream.
    Upstream,
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
    /// Route or upstream.
    pub kind: Kind,
    /// Its name.
    pub name: String,
    /// Added, updated or removed.
    pub action: Action,
}

impl From<&Change> for ResourceChange {
    fn from(c: &Change) -> Self {
        ResourceChange {
            kind: match c.kind {
                Kind::Route => "route",
                Kind::Upstream => "upstream",
            }
            .into(),
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

/// Every difference from `old` to `new`: routes first, then upstreams, each sorted by name.
pub fn diff(old: &Config, new: &Config) -> Vec<Change> {
    let mut out = diff_kind(Kind::Route, &old.routes, &new.routes, |r| &r.name);
    out.extend(diff_kind(
        Kind::Upstream,
        &old.upstreams,
        &new.upstreams,
        |u| &u.name,
    ));
    out
}

fn diff_kind<T: PartialEq>(
    kind: Kind,
    old: &[T],
    new: &[T],
    name: impl Fn(&T) -> &String,
) -> Vec<Change> {
    let old_by_name: HashMap<&str, &T> = old.iter().map(|x| (name(x).as_str(), x)).collect();
    let new_by_name: HashMap<&str, &T> = new.iter().map(|x| (name(x).as_str(), x)).collect();
    let mut out = Vec::new();
    for (n, x) in &new_by_name {
        match old_by_name.get(n) {
            None => out.push(change(kind, n, Action::Added)),
            Some(o) if *o != *x => out.push(change(kind, n, Action::Updated)),
            Some(_) => {}
        }
    }
    for n in old_by_name.keys() {
        if !new_by_name.contains_key(n) {
            out.push(change(kind, n, Action::Removed));
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

fn change(kind: Kind, name: &str, action: Action) -> Change {
    Change {
        kind,
        name: name.to_owned(),
        action,
    }
}

/// Counts per kind and action, e.g. `+2 routes, ~1 upstream, -1 upstream`, or `no changes`.
pub fn summarize(changes: &[Change]) -> String {
    let mut out = String::new();
    for kind in [Kind::Route, Kind::Upstream] {
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
            let noun = match kind {
                Kind::Route => "route",
                Kind::Upstream => "upstream",
            };
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
        let changes = diff(&old, &new);
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
    fn summary_counts_each_kind_and_action() {
        let old = Config::new(vec![route("a", 1)], vec![upstream("u")]);
        let new = Config::new(
            vec![route("b", 1), route("c", 1)],
            vec![upstream("u"), upstream("v")],
        );
        assert_eq!(
            summarize(&diff(&old, &new)),
            "+2 routes, -1 route, +1 upstream"
        );
        assert_eq!(summarize(&diff(&old, &old)), "no changes");
    }
}
