//! Fuzz target `packet`: see `sluice_datanode::fuzzing::packets`.

fn main() {
    afl::fuzz!(|data: &[u8]| sluice_datanode::fuzzing::packets(data));
}
