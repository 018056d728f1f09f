//! Identifiers: blocks, generation stamps, DataNodes.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A block's id, allocated by the metadata service from a persisted counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct BlockId(pub u64);

impl fmt::Display for BlockId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "blk_{}", self.0)
    }
}

/// A block's generation stamp. It grows every time the block's pipeline is rebuilt, so that
/// replicas left behind by a failed pipeline can be told apart and dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct GenerationStamp(pub u64);

impl fmt::Display for GenerationStamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A DataNode's stable identity: generated on first start and stored in each of its volumes.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct NodeId(pub String);

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A block as the protocol names it: id, generation stamp and a length whose meaning depends on
/// the message (bytes acknowledged, bytes to copy, final length).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ExtendedBlock {
    /// The block id.
    pub id: BlockId,
    /// The generation stamp.
    pub gen_stamp: GenerationStamp,
    /// Length in bytes.
    pub num_bytes: u64,
}

impl ExtendedBlock {
    /// A block with the given id, generation stamp and length.
    pub fn new(id: BlockId, gen_stamp: GenerationStamp, num_bytes: u64) -> Self {
        Self {
            id,
            gen_stamp,
            num_bytes,
        }
    }
}

impl fmt::Display for ExtendedBlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}_{} ({} B)", self.id, self.gen_stamp, self.num_bytes)
    }
}

/// How to reach a DataNode: what it registered with the metadata service.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct DatanodeId {
    /// Stable identity.
    pub node_id: NodeId,
    /// Data-transfer address as clients and peers dial it (`host:port`, advertised).
    pub data_addr: String,
    /// HTTP address (`host:port`, advertised).
    pub http_addr: String,
    /// Topology label (rack), `/default-rack` when none is configured.
    pub rack: String,
}

impl fmt::Display for DatanodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.node_id, self.data_addr)
    }
}
