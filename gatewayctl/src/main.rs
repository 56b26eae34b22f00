//! `gatewayctl` binary: [`gatewayctl::cli`] with the process's arguments.

fn main() -> std::process::ExitCode {
    gatewayctl::cli::main(std::env::args_os())
}
