//! `docs/flags.md` is generated from the binaries' clap definitions
//! (`gateway_tests::flags_reference`); this test fails when the file differs
//! from what the code says, and when a binary reads an environment variable
//! (or the compose files use one) that the file does not list.
//!
//! Regenerate the file with
//! `UPDATE_DOCS=1 cargo test -p gateway-tests --test flags_reference`.
#![allow(
    clippy::unwrap_used,
    reason = "test code: unwrap stops the test where it failed"
)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use clap::CommandFactory as _;
use gateway_tests::flags_reference::{REGENERATE, render};

/// The repository root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ sits in the repository")
        .to_path_buf()
}

/// `docs/flags.md` as the code defines it.
fn generated() -> String {
    render(&[
        control_plane::Args::command(),
        data_plane::args::Args::command(),
        auth_service::args::Cli::command(),
        mock_service::args::Args::command(),
        devstack::args::Cli::command(),
        gatewayctl::Args::command(),
    ])
}

#[test]
fn docs_flags_md_matches_the_clap_definitions() {
    let path = root().join("docs/flags.md");
    let want = generated();
    if std::env::var_os("UPDATE_DOCS").is_some_and(|v| v == "1") {
        std::fs::write(&path, &want).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        return;
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    if have != want {
        let first = have
            .lines()
            .zip(want.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| have.lines().count().min(want.lines().count()));
        panic!(
            "{} is not what the clap definitions generate (first difference at line {}):\n  file:      {:?}\n  generated: {:?}\nRegenerate it with:\n  {REGENERATE}",
            path.display(),
            first + 1,
            have.lines().nth(first).unwrap_or("<end of file>"),
            want.lines().nth(first).unwrap_or("<end of file>"),
        );
    }
}

/// The crates whose non-test sources the binaries run.
const SOURCE_DIRS: &[&str] = &[
    "control-plane/src",
    "data-plane/src",
    "data-plane/jwt/src",
    "data-plane/ratelimit/src",
    "auth-service/src",
    "mocks/src",
    "devstack/src",
    "gatewayctl/src",
    "telemetry/src",
    "redis/src",
    "proto/src",
];

/// Every `.rs` file under `dir` that is not a test file.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("a directory entry").path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if path.is_dir() {
            if name != "tests" {
                sources(&path, out);
            }
        } else if name.ends_with(".rs")
            && name != "tests.rs"
            && name != "testutil.rs"
            && !name.ends_with("_tests.rs")
        {
            out.push(path);
        }
    }
}

/// `text` without its inline test module (`#[cfg(test)]` then `mod … {`,
/// which by this workspace's habit ends the file).
fn without_tests(text: &str) -> &str {
    let mut at = 0;
    while let Some(i) = text[at..].find("#[cfg(test)]") {
        let start = at + i;
        let rest = text[start + "#[cfg(test)]".len()..].trim_start();
        let line = rest.lines().next().unwrap_or("");
        if (line.starts_with("mod ")
            || line.starts_with("pub mod ")
            || line.starts_with("pub(crate) mod "))
            && line.trim_end().ends_with('{')
        {
            return &text[..start];
        }
        at = start + 1;
    }
    text
}

/// The upper-case variable names quoted right after each `needle`.
fn quoted_after(text: &str, needle: &str, found: &mut BTreeSet<String>) {
    for (i, _) in text.match_indices(needle) {
        let rest = &text[i + needle.len()..];
        if let Some(end) = rest.find('"') {
            let name = &rest[..end];
            if is_variable(name) {
                found.insert(name.to_owned());
            }
        }
    }
}

fn is_variable(name: &str) -> bool {
    !name.is_empty()
        && name.starts_with(|c: char| c.is_ascii_uppercase())
        && name
            .bytes()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == b'_')
}

/// Every environment variable the binaries read outside clap: the literal
/// names given to `env::var`, `env::var_os` and `EnvFilter::try_from_env`,
/// `const …_ENV: &str = "…"` names, and every `"OTEL_…"` literal of the
/// telemetry crate (its lookups go through a closure).
fn variables_in_sources() -> BTreeSet<String> {
    let mut files = Vec::new();
    for dir in SOURCE_DIRS {
        sources(&root().join(dir), &mut files);
    }
    assert!(files.len() > 50, "found only {} source files", files.len());
    let mut found = BTreeSet::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        let text = without_tests(&text);
        for needle in ["env::var(\"", "env::var_os(\"", "try_from_env(\""] {
            quoted_after(text, needle, &mut found);
        }
        for line in text.lines() {
            let line = line.trim_start();
            if (line.starts_with("const ") || line.starts_with("pub const "))
                && line.contains("_ENV: &str = \"")
            {
                quoted_after(line, "_ENV: &str = \"", &mut found);
            }
        }
        if file.starts_with(root().join("telemetry")) {
            for (i, _) in text.match_indices("\"OTEL_") {
                let rest = &text[i + 1..];
                let end = rest.find('"').unwrap_or(0);
                if is_variable(&rest[..end]) && rest[..end].len() > "OTEL_".len() {
                    found.insert(rest[..end].to_owned());
                }
            }
        }
    }
    found
}

/// The variables of the compose files (`${NAME…}`) and the `GATEWAY_*`
/// variables of the container entrypoint.
fn variables_in_container_files() -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for file in ["docker-compose.yml", "docker/compose.offline.yml"] {
        let text = std::fs::read_to_string(root().join(file)).unwrap();
        for (i, _) in text.match_indices("${") {
            let rest = &text[i + 2..];
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            if is_variable(&rest[..end]) {
                found.insert(rest[..end].to_owned());
            }
        }
    }
    let entrypoint = std::fs::read_to_string(root().join("docker/entrypoint.sh")).unwrap();
    for (i, _) in entrypoint.match_indices("GATEWAY_") {
        let rest = &entrypoint[i..];
        let end = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        // `GATEWAY_*_TOKEN` in a comment names a family, not a variable.
        if !rest[..end].ends_with('_') {
            found.insert(rest[..end].to_owned());
        }
    }
    found
}

#[test]
fn every_variable_the_code_reads_is_documented() {
    let doc = generated();
    let from_sources = variables_in_sources();
    // Known readers, so a scanner that silently finds nothing fails here.
    for expected in [
        "RUST_LOG",
        "HOSTNAME",
        "FAIL_RATE",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "GATEWAY_BIN_DIR",
        "DEVSTACK_LOG",
    ] {
        assert!(
            from_sources.contains(expected),
            "the scan missed {expected}: {from_sources:?}"
        );
    }
    let from_containers = variables_in_container_files();
    assert!(
        from_containers.contains("GATEWAY_REDIS_PASSWORD"),
        "{from_containers:?}"
    );
    let missing: Vec<&String> = from_sources
        .iter()
        .chain(&from_containers)
        .filter(|name| !doc.contains(&format!("`{name}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "read by the code but not in docs/flags.md: {missing:?}; add a row to \
         OTHER_ENVIRONMENT in tests/src/flags_reference.rs, then run {REGENERATE}"
    );
}

/// A switch that can be set from the environment (`--insecure-open`,
/// `CONTROL_PLANE_INSECURE_OPEN`) takes what people write there: `1`, `true`,
/// `yes`, `on` and their opposites. clap's default for a switch takes only
/// `true` and `false`, so `DEVSTACK_KEEP_TEMP=1` was refused. (What
/// `BoolishValueParser` accepts is clap's own, tested there.)
#[test]
fn every_switch_set_from_the_environment_takes_1_yes_and_true() {
    fn visit(c: &clap::Command, found: &mut Vec<String>) {
        for arg in c.get_arguments() {
            let switch = matches!(
                arg.get_action(),
                clap::ArgAction::SetTrue | clap::ArgAction::SetFalse
            );
            let Some(env) = arg.get_env() else { continue };
            if !switch {
                continue;
            }
            let env = env.to_string_lossy().into_owned();
            // clap's own parser for a switch (`ValueParser::bool`) takes only
            // `true` and `false`; `BoolishValueParser` takes the rest too. The
            // parser itself is private to clap, so its kind is told by its name.
            let parser = format!("{:?}", arg.get_value_parser());
            assert_ne!(
                parser, "ValueParser::bool",
                "{env}: a switch set from the environment needs \
                 `value_parser = BoolishValueParser::new()` so that {env}=1 works"
            );
            found.push(env);
        }
        for sub in c.get_subcommands() {
            visit(sub, found);
        }
    }
    let mut found = Vec::new();
    for command in [
        control_plane::Args::command(),
        data_plane::args::Args::command(),
        auth_service::args::Cli::command(),
        mock_service::args::Args::command(),
        devstack::args::Cli::command(),
        gatewayctl::Args::command(),
    ] {
        let mut command = command;
        command.build();
        visit(&command, &mut found);
    }
    assert!(
        found.iter().any(|e| e == "DEVSTACK_KEEP_TEMP")
            && found.iter().any(|e| e == "CONTROL_PLANE_INSECURE_OPEN"),
        "the switches set from the environment: {found:?}"
    );
}
