//! `sluice-proc metadata|datanode|sluice ARGS...`: the three Sluice commands in one binary, for
//! the process tests (`sluice_tests::process`). Cargo builds it for the tests
//! (`CARGO_BIN_EXE_sluice-proc`), so a test never runs `cargo build` and never picks up a stale
//! service binary. Each command is the same library function its own binary calls.

use std::process::ExitCode;

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    let Some(command) = args.next() else {
        eprintln!("usage: sluice-proc metadata|datanode|sluice ARGS...");
        return ExitCode::from(2);
    };
    // The command name stands in for the program name.
    let argv = || std::iter::once(command.clone()).chain(args);
    let result = match command.to_str() {
        Some("metadata") => sluice_metadata::command::main(argv()),
        Some("datanode") => sluice_datanode::command::main(argv()),
        Some("sluice") => return sluice_cli::main(argv()),
        _ => {
            eprintln!("sluice-proc: unknown command {command:?} (metadata, datanode, sluice)");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("Error: {e:?}");
            ExitCode::FAILURE
        }
    }
}
