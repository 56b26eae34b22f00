//! `control-plane` binary: [`control_plane::cli`] with the process's arguments.

fn main() -> anyhow::Result<()> {
    control_plane::cli::main(std::env::args_os())
}
