//! Fuzz target `frame`: see `sluice_common::fuzzing::frame`.

fn main() {
    afl::fuzz!(|data: &[u8]| sluice_common::fuzzing::frame(data));
}
