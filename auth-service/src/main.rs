//! `auth-service` binary: [`auth_service::cli`] with the process's arguments.

fn main() -> anyhow::Result<()> {
    auth_service::cli::main(std::env::args_os())
}
