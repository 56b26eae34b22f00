//! Every input saved for the fuzz targets (`fuzz/`), replayed on stable Rust
//! through the harness its target runs: the seeds (`fuzz/seeds/<target>/`)
//! and each input that once failed (`fuzz/regressions/<target>/`). A harness
//! panics when its parser breaks one of its invariants.
#![allow(
    clippy::unwrap_used,
    reason = "test code: unwrap stops the test where it failed"
)]

use std::path::PathBuf;

/// Runs `harness` on every file saved for `target`; returns how many there were.
fn replay(target: &str, harness: fn(&[u8])) -> usize {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
    let mut count = 0;
    for dir in ["seeds", "regressions"] {
        let dir = root.join(dir).join(target);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        let mut files: Vec<PathBuf> = entries
            .map(|e| e.expect("a directory entry").path())
            .collect();
        files.sort();
        for file in files {
            let data = std::fs::read(&file).expect("a readable input");
            let run = std::panic::catch_unwind(|| harness(&data));
            assert!(run.is_ok(), "{target}: {} fails", file.display());
            count += 1;
        }
    }
    count
}

macro_rules! targets {
    ($($target:ident => $harness:path,)*) => {$(
        #[test]
        fn $target() {
            let count = replay(stringify!($target), $harness);
            assert!(count > 0, "no saved input for {}", stringify!($target));
        }
    )*};
}

targets! {
    h1_request => data_plane::fuzzing::h1_request,
    h1_response => data_plane::fuzzing::h1_response,
    proxy_header => data_plane::fuzzing::proxy_header,
    normalize_path => data_plane::fuzzing::normalize_path,
    config => data_plane::fuzzing::config,
    trace_context => gateway_telemetry::fuzzing::trace_context,
    jwt => gateway_jwt::fuzzing::token,
}
