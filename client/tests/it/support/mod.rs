//! Test support: the shared fakes and helpers (`sluice-testkit`) and the client configuration
//! the client tests run with.
#![allow(dead_code, unused_imports)]
// Test scaffolding: a panic here is a failed test, as in the tests themselves.
#![allow(clippy::unwrap_used, clippy::result_large_err)]

use sluice_client::{ClientConfig, FileSystem};
use sluice_common::config::{ByteSize, HumanDuration};

pub use sluice_testkit::fake::{seed_file, start_dn, start_meta, DnHandle, FakeFile, MetaHandle};
pub use sluice_testkit::{random_bytes, wait_for, within};

/// A client config for the fakes: 1 KiB packets, small buffers, short timeouts.
pub fn config(meta: &MetaHandle) -> ClientConfig {
    ClientConfig {
        metadata_address: meta.addr.clone(),
        write_packet_size: ByteSize::kib(1),
        read_piece_bytes: ByteSize::kib(1),
        read_buffer_bytes: ByteSize::kib(4),
        read_chunk_size: ByteSize::kib(2),
        socket_timeout: HumanDuration::secs(10),
        rpc_timeout: HumanDuration::secs(10),
        ..ClientConfig::default()
    }
}

pub async fn connect(cfg: ClientConfig) -> FileSystem {
    FileSystem::connect(cfg).await.expect("connect")
}
