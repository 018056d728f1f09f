//! Test support: a fake metadata service and fake DataNodes on real sockets, plus helpers.
#![allow(dead_code)]
// Test scaffolding: a panic here is a failed test, as in the tests themselves.
#![allow(clippy::unwrap_used, clippy::result_large_err)]

pub mod datanode;
pub mod meta;

use sluice_client::{ClientConfig, FileSystem};
use sluice_common::config::{ByteSize, HumanDuration};
use sluice_common::rpc::LocatedBlock;
use sluice_common::{BlockId, ExtendedBlock, GenerationStamp};
use std::future::Future;
use std::time::Duration;

pub use datanode::{start_dn, DnHandle};
pub use meta::{start_meta, FakeFile, MetaHandle};

/// Runs a test body under an outer timeout.
pub async fn within<F: Future<Output = T>, T>(secs: u64, f: F) -> T {
    tokio::time::timeout(Duration::from_secs(secs), f)
        .await
        .expect("test timed out")
}

/// Polls `cond` every 10 ms until it holds or `secs` pass.
pub async fn wait_until(secs: u64, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    while !cond() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "condition not reached in {secs}s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

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

/// Deterministic test bytes.
pub fn bytes(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| ((i * 31 + seed as usize * 7) % 253) as u8)
        .collect()
}

/// Puts a complete file on the fakes: each block's data on the given DataNodes.
pub fn seed_file(meta: &MetaHandle, path: &str, blocks: &[(&[u8], &[&DnHandle])]) {
    let mut located = Vec::new();
    let mut offset = 0u64;
    for (i, (data, dns)) in blocks.iter().enumerate() {
        let id = 900 + i as u64;
        for dn in dns.iter() {
            let mut st = dn.st();
            st.blocks.insert(id, data.to_vec());
            st.finalized.push(id);
        }
        located.push(LocatedBlock {
            block: ExtendedBlock::new(BlockId(id), GenerationStamp(5), data.len() as u64),
            offset,
            locations: dns.iter().map(|d| d.id.clone()).collect(),
            corrupt: false,
        });
        offset += data.len() as u64;
    }
    meta.st().files.insert(
        path.to_string(),
        FakeFile {
            blocks: located,
            under_construction: false,
            block_size: 4096,
            replication: blocks.first().map_or(1, |b| b.1.len() as u16),
            fsync_len: None,
        },
    );
}
