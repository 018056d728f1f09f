//! Fuzz target `path`: see `sluice_metadata::fuzzing::path`.

fn main() {
    afl::fuzz!(|data: &[u8]| sluice_metadata::fuzzing::path(data));
}
