//! `devstack serve <program> [ARGS…]`: runs one of the gateway's programs
//! (control plane, data plane, auth service, mock backend) in this process,
//! as its own binary would. devstack's binary holds every program, so
//! `cargo run --release -p devstack` compiles the tree once and starts the
//! stack from that one executable, with no second build of the binaries.

use std::ffi::OsString;

/// The first argument that asks for a program.
pub const SUBCOMMAND: &str = "serve";

/// The programs `serve` runs.
pub const PROGRAMS: [&str; 4] = [
    "control-plane",
    "data-plane",
    "auth-service",
    "mock-service",
];

/// Runs the program named by the first of `args`, with the rest as its arguments.
pub fn main(mut args: impl Iterator<Item = OsString>) -> anyhow::Result<()> {
    let Some(name) = args.next() else {
        anyhow::bail!(
            "devstack serve needs a program: one of {}",
            PROGRAMS.join(", ")
        );
    };
    let argv = std::iter::once(name.clone()).chain(args);
    match name.to_str() {
        Some("control-plane") => control_plane::cli::main(argv),
        Some("data-plane") => data_plane::cli::main(argv),
        Some("auth-service") => auth_service::cli::main(argv),
        Some("mock-service") => mock_service::cli::main(argv),
        _ => anyhow::bail!(
            "devstack serve: unknown program {name:?}; one of {}",
            PROGRAMS.join(", ")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_or_missing_program_is_a_clear_error() {
        let e = main(std::iter::empty()).unwrap_err();
        assert!(e.to_string().contains("needs a program"), "{e}");
        let e = main([OsString::from("nginx")].into_iter()).unwrap_err();
        assert!(e.to_string().contains("unknown program \"nginx\""), "{e}");
    }
}
