//! `mock-service` binary: [`mock_service::cli`] with the process's arguments.

fn main() -> anyhow::Result<()> {
    mock_service::cli::main(std::env::args_os())
}
