//! The data plane's layers, checked from its source: every top-level module
//! of `data-plane/src` (a folder or a file) is a group, and a group may use
//! only the groups below it in [`DATA_PLANE_LAYERS`]. `tests/tests/layers.rs`
//! runs [`check`] over the real tree, so an import that runs back up, and with
//! it any cycle between groups, fails `cargo test` (and `scripts/test`).
//!
//! What counts as a use: every `crate::<group>` path in code, `use` lines
//! and inline paths alike. Comments (doc links included) and test modules
//! (`tests.rs` files, and `#[cfg(test)] mod …` in a file) are not read: a
//! test may reach across layers.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

/// The data plane's groups, top first: each may use only those after it.
pub const DATA_PLANE_LAYERS: &[&str] = &[
    "app",
    "fuzzing",
    "config",
    "composition",
    "upstream",
    "error",
    "policy",
    "metrics",
];

/// One use of a group by another.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Use {
    /// The group whose code has the path.
    pub from: String,
    /// The group named.
    pub to: String,
    /// Where (path relative to the source root, 1-based line).
    pub file: PathBuf,
    /// The line.
    pub line: usize,
}

impl fmt::Display for Use {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} -> {} ({}:{})",
            self.from,
            self.to,
            self.file.display(),
            self.line
        )
    }
}

/// What is wrong with a tree's layering.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Violations {
    /// Groups that use each other, each cycle as its groups in order.
    pub cycles: Vec<Vec<String>>,
    /// Uses of a group listed above the user.
    pub upward: Vec<Use>,
    /// Top-level modules missing from the layer list.
    pub unknown: Vec<String>,
}

impl Violations {
    /// Whether the layering holds.
    pub fn is_empty(&self) -> bool {
        self.cycles.is_empty() && self.upward.is_empty() && self.unknown.is_empty()
    }
}

impl fmt::Display for Violations {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for c in &self.cycles {
            writeln!(f, "import cycle between groups: {}", c.join(" -> "))?;
        }
        for u in &self.upward {
            writeln!(f, "import runs back up: {u}")?;
        }
        for g in &self.unknown {
            writeln!(
                f,
                "group {g:?} is not in the layer list (tests/src/layers.rs DATA_PLANE_LAYERS)"
            )?;
        }
        Ok(())
    }
}

/// The uses between groups in the source tree at `src` (a crate's `src`
/// folder): every `.rs` file but `lib.rs` and `main.rs` belongs to the group
/// of its first path component.
pub fn uses(src: &Path) -> anyhow::Result<(BTreeSet<String>, Vec<Use>)> {
    let mut groups = BTreeSet::new();
    let mut found = Vec::new();
    let mut files = Vec::new();
    collect(src, &mut files)?;
    for file in files {
        let rel = file.strip_prefix(src).context("a file under the root")?;
        let first = rel
            .components()
            .next()
            .context("a file has a name")?
            .as_os_str()
            .to_string_lossy()
            .into_owned();
        if matches!(first.as_str(), "lib.rs" | "main.rs") {
            continue;
        }
        let group = first.strip_suffix(".rs").unwrap_or(&first).to_owned();
        groups.insert(group.clone());
        if rel.file_name().is_some_and(|n| n == "tests.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&file)
            .with_context(|| format!("reading {}", file.display()))?;
        for (i, line) in code_lines(&text) {
            for to in crate_paths(line) {
                if to != group {
                    found.push(Use {
                        from: group.clone(),
                        to,
                        file: rel.to_path_buf(),
                        line: i + 1,
                    });
                }
            }
        }
    }
    Ok((groups, found))
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            collect(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    out.sort();
    Ok(())
}

/// The lines of `text` that are code, numbered from 0, comments dropped. A
/// top-level `#[cfg(test)] mod name { … }` is left out up to its closing
/// brace at column 0, and a `#[cfg(test)] mod name;` line too; any other
/// `#[cfg(test)]` item is read like code (stricter, never silently skipped).
fn code_lines(text: &str) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    let mut lines = text.lines().enumerate().peekable();
    while let Some((i, line)) = lines.next() {
        if line == "#[cfg(test)]"
            && let Some((_, next)) = lines.peek()
            && (next.starts_with("mod ") || next.starts_with("pub(crate) mod "))
        {
            let inline = next.trim_end().ends_with('{');
            lines.next();
            if inline {
                for (_, l) in lines.by_ref() {
                    if l == "}" {
                        break;
                    }
                }
            }
            continue;
        }
        out.push((i, line.find("//").map_or(line, |c| &line[..c])));
    }
    out
}

/// The group of every `crate::<group>` path on `line`, also inside a
/// `crate::{a, b::c}` list.
fn crate_paths(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("crate::") {
        let before = rest[..at].chars().next_back();
        rest = &rest[at + "crate::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        if let Some(list) = rest.strip_prefix('{') {
            let end = list.find('}').unwrap_or(list.len());
            for item in list[..end].split(',') {
                let name = ident(item.trim());
                if !name.is_empty() {
                    out.push(name.to_owned());
                }
            }
        } else {
            let name = ident(rest);
            if !name.is_empty() {
                out.push(name.to_owned());
            }
        }
    }
    out
}

fn ident(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// Checks the uses in `src` against `layers` (top first).
pub fn check(src: &Path, layers: &[&str]) -> anyhow::Result<Violations> {
    let (groups, found) = uses(src)?;
    if groups.is_empty() {
        bail!("no module found under {}", src.display());
    }
    let rank = |g: &str| layers.iter().position(|l| *l == g);
    let mut v = Violations {
        unknown: groups
            .iter()
            .filter(|g| rank(g).is_none())
            .cloned()
            .collect(),
        ..Violations::default()
    };
    // Uses of a name that is not a group (a `pub use` of the crate root, a
    // macro) are not layer arrows.
    let arrows: Vec<&Use> = found.iter().filter(|u| groups.contains(&u.to)).collect();
    let mut graph: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for u in &arrows {
        graph.entry(&u.from).or_default().insert(&u.to);
    }
    v.cycles = cycles(&groups, &graph);
    v.upward = arrows
        .into_iter()
        .filter(|u| match (rank(&u.from), rank(&u.to)) {
            (Some(from), Some(to)) => to <= from,
            _ => false,
        })
        .cloned()
        .collect();
    Ok(v)
}

/// The strongly connected groups of more than one member (Tarjan), each in
/// the order of a path around it.
fn cycles(groups: &BTreeSet<String>, graph: &BTreeMap<&str, BTreeSet<&str>>) -> Vec<Vec<String>> {
    struct Tarjan<'g> {
        graph: &'g BTreeMap<&'g str, BTreeSet<&'g str>>,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        on_stack: BTreeSet<&'g str>,
        out: Vec<Vec<String>>,
    }
    impl<'g> Tarjan<'g> {
        fn visit(&mut self, g: &'g str) {
            let i = self.index.len();
            self.index.insert(g, i);
            self.low.insert(g, i);
            self.stack.push(g);
            self.on_stack.insert(g);
            let next: Vec<&'g str> = self
                .graph
                .get(g)
                .map(|s| s.iter().copied().collect())
                .unwrap_or_default();
            for n in next {
                if !self.index.contains_key(n) {
                    self.visit(n);
                    let low = self.low[g].min(self.low[n]);
                    self.low.insert(g, low);
                } else if self.on_stack.contains(n) {
                    let low = self.low[g].min(self.index[n]);
                    self.low.insert(g, low);
                }
            }
            if self.low[g] == self.index[g] {
                let mut component = Vec::new();
                while let Some(top) = self.stack.pop() {
                    self.on_stack.remove(top);
                    component.push(top.to_owned());
                    if top == g {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.reverse();
                    self.out.push(component);
                }
            }
        }
    }
    let mut t = Tarjan {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for g in groups {
        if !t.index.contains_key(g.as_str()) {
            t.visit(g);
        }
    }
    t.out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (path, text) in files {
            let p = dir.path().join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        dir
    }

    #[test]
    fn paths_are_found_in_use_lines_lists_and_inline_code() {
        assert_eq!(crate_paths("use crate::a::b;"), ["a"]);
        assert_eq!(crate_paths("use crate::{a, b::c, d};"), ["a", "b", "d"]);
        assert_eq!(
            crate_paths("let x = crate::p::f() + crate::q::g();"),
            ["p", "q"]
        );
        assert!(crate_paths("use other_crate::x;").is_empty());
        assert!(crate_paths("use super::x;").is_empty());
    }

    #[test]
    fn a_cycle_between_two_groups_is_reported_with_the_lines() {
        let t = tree(&[
            ("lib.rs", "pub mod low; pub mod high;"),
            ("high/mod.rs", "use crate::low::A;\n"),
            (
                "low.rs",
                "// use crate::high::x; (a comment)\nfn f() { crate::high::g(); }\n",
            ),
        ]);
        let v = check(t.path(), &["high", "low"]).unwrap();
        assert_eq!(v.cycles, [vec!["high".to_owned(), "low".to_owned()]]);
        assert_eq!(v.upward.len(), 1);
        assert_eq!(v.upward[0].to_string(), "low -> high (low.rs:2)");
        assert!(!v.is_empty());
    }

    #[test]
    fn a_layered_tree_passes_and_test_code_and_comments_are_not_read() {
        let t = tree(&[
            ("lib.rs", "pub mod a; pub mod b; use crate::a::X;"),
            ("a/mod.rs", "use crate::b::Y;\n"),
            ("a/inner.rs", "use crate::a::Z;\n"),
            (
                "b/mod.rs",
                "/// See [`crate::a::X`].\n#[cfg(test)]\nmod tests { use crate::a::X; }\n",
            ),
            ("b/tests.rs", "use crate::a::X;\n"),
        ]);
        let v = check(t.path(), &["a", "b"]).unwrap();
        assert!(v.is_empty(), "{v}");
    }

    #[test]
    fn an_upward_use_without_a_cycle_and_an_unlisted_group_fail() {
        let t = tree(&[("a.rs", ""), ("b.rs", "use crate::a::X;\n"), ("c.rs", "")]);
        let v = check(t.path(), &["b", "a"]).unwrap();
        assert!(v.cycles.is_empty());
        assert!(v.upward.is_empty());
        assert_eq!(v.unknown, ["c"]);
        let v = check(t.path(), &["a", "b", "c"]).unwrap();
        assert_eq!(v.upward.len(), 1);
        assert!(
            v.to_string()
                .contains("import runs back up: b -> a (b.rs:1)")
        );
    }

    #[test]
    fn only_test_modules_are_skipped_and_code_after_them_is_read() {
        let text = "use crate::a::X;\n#[cfg(test)]\nmod tests {\n    use crate::b::Y;\n}\n#[cfg(test)]\nfn helper() { crate::c::z(); }\nuse crate::d::W;\n";
        let paths: Vec<String> = code_lines(text)
            .into_iter()
            .flat_map(|(_, l)| crate_paths(l))
            .collect();
        assert_eq!(paths, ["a", "c", "d"]);
    }

    #[test]
    fn three_groups_in_a_ring_are_one_cycle() {
        let t = tree(&[
            ("a.rs", "use crate::b::X;\n"),
            ("b.rs", "use crate::c::X;\n"),
            ("c.rs", "use crate::a::X;\n"),
        ]);
        let v = check(t.path(), &["a", "b", "c"]).unwrap();
        assert_eq!(v.cycles.len(), 1);
        assert_eq!(v.cycles[0].len(), 3);
    }
}
