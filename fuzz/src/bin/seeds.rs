//! Writes the starting inputs of every target (`sluice_common::fuzzing::seeds`) into
//! `<dir>/<target>/` (`dir`: the first argument, default `fuzz/seeds`). `scripts/fuzz` runs it.

use std::path::PathBuf;

fn main() -> std::io::Result<()> {
    let root = std::env::args_os()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("seeds"));
    for (target, name, bytes) in sluice_common::fuzzing::seeds() {
        let dir = root.join(target);
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join(name), bytes)?;
    }
    Ok(())
}
