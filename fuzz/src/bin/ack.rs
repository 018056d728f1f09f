//! Fuzz target `ack`: see `sluice_client::fuzzing::acks`.

fn main() {
    afl::fuzz!(|data: &[u8]| sluice_client::fuzzing::acks(data));
}
