//! `data-plane` binary: [`data_plane::cli`] with the process's arguments, and
//! jemalloc as the allocator when built with the `jemalloc` feature (as it
//! ships: Cargo.toml says where it is turned on).

// jemalloc instead of glibc's malloc (BENCHMARKS.md, eighth session): every request makes
// a few allocations of 1 KiB or more (its future's box, the response's header map), and
// glibc sweeps all its fastbins (`malloc_consolidate`) before each of those; its allocator
// was 12 % of the workers' user time. jemalloc: 1.1-1.4 µs less user time per request on a
// slow host (0.3-0.5 µs on a fast one), idle RSS +1.3 MB. (mimalloc saved about as much but
// doubled idle RSS, over the 15 MB target.)
#[cfg(feature = "jemalloc")]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> anyhow::Result<()> {
    data_plane::cli::main(std::env::args_os())
}
