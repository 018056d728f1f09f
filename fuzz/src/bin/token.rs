//! Fuzz target `token`: see `sluice_common::fuzzing::token`.

fn main() {
    afl::fuzz!(|data: &[u8]| sluice_common::fuzzing::token(data));
}
