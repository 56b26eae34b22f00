//! `cargo run --release -p devstack` (the README's run command) must compile
//! the tree once: the dependencies it resolves for devstack alone must have
//! the features the whole workspace resolves, or any `cargo build
//! --workspace` before or after it compiles every crate whose features
//! differ, and everything above it, a second time. devstack depends on the
//! four services' libraries for this (devstack/Cargo.toml) and runs every
//! program from its own binary, so there is no second build; this test fails
//! when a new dependency or feature makes the two differ as `cargo tree`
//! shows them, and names the crates.
#![allow(
    clippy::unwrap_used,
    reason = "test code: unwrap stops the test where it failed"
)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

/// Every package of the build selected by `selection` (cargo arguments), with
/// the features cargo resolves for it (normal and build dependencies, as
/// `cargo build` sees them; a package built twice with different features,
/// for the host and the target, appears with both sets).
fn resolved(selection: &[&str]) -> BTreeMap<String, BTreeSet<String>> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ sits in the repository");
    let out = Command::new(cargo)
        .current_dir(root)
        .args(["tree", "--locked", "--offline", "-e", "normal,build"])
        .args(["--prefix", "none", "--format", "{p}|{f}"])
        .args(selection)
        .output()
        .expect("cargo tree runs");
    assert!(
        out.status.success(),
        "cargo tree {selection:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut packages: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some((package, features)) = line.split_once('|') else {
            continue;
        };
        // `(*)` marks a package already printed above.
        let package = package.trim_end_matches(" (*)").trim();
        let features = features.trim_end_matches(" (*)").trim();
        packages
            .entry(package.to_owned())
            .or_default()
            .insert(features.to_owned());
    }
    packages
}

#[test]
fn devstack_alone_resolves_the_features_of_the_whole_workspace() {
    let devstack = resolved(&["-p", "devstack"]);
    let workspace = resolved(&["--workspace"]);
    let differ: Vec<String> = devstack
        .iter()
        .filter_map(|(package, features)| {
            let all = workspace.get(package)?;
            (all != features)
                .then(|| format!("{package}: devstack {features:?}, workspace {all:?}"))
        })
        .collect();
    assert!(
        differ.is_empty(),
        "`cargo run -p devstack` would compile these with other features than \
         `cargo build --workspace`, and everything above them twice:\n  {}\n\
         Make devstack depend on what brings the missing features in (devstack/Cargo.toml).",
        differ.join("\n  ")
    );
    // What the workspace builds beyond devstack's closure is the test crate,
    // and gatewayctl (a client, not a program of the stack) with what only it
    // uses; those it shares with devstack were compared above.
    let gatewayctl = resolved(&["-p", "gatewayctl"]);
    let extra: Vec<&String> = workspace
        .keys()
        .filter(|p| {
            !devstack.contains_key(*p)
                && !p.starts_with("gateway-tests ")
                && !gatewayctl.contains_key(*p)
        })
        .collect();
    assert!(
        extra.is_empty(),
        "the workspace builds packages devstack's build does not: {extra:?}"
    );
}
