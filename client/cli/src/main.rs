//! `sluice`: the command line of a Sluice cluster (see the `sluice_cli` library).

fn main() -> std::process::ExitCode {
    sluice_cli::main(std::env::args_os())
}
