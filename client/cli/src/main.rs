//! `sluice`: the command line of a Sluice cluster (see the `sluice_cli` library).

/// mimalloc keeps freed pages for reuse: with glibc every 1 MiB read piece and packet buffer
/// came back from the kernel zero-filled and went back to it (page faults and TLB shootdowns
/// between the runtime threads; docs/benchmarks.md, "fifth round"). Its arenas are kept
/// off transparent huge pages (`sluice_common::memory`).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    sluice_common::memory::disable_transparent_huge_pages();
    sluice_cli::main(std::env::args_os())
}
