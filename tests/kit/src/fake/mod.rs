//! A fake metadata service (`meta`) and a fake DataNode (`datanode`) on real sockets, with
//! knobs to inject behaviour, for tests of the client and the `sluice` command.

mod datanode;
mod meta;

pub use datanode::{start_dn, DnHandle, DnState};
pub use meta::{start_meta, FakeFile, MetaHandle, MetaState};

use sluice_common::rpc::LocatedBlock;
use sluice_common::{BlockId, ExtendedBlock, GenerationStamp};

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
            token: None,
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
