//! Inodes as stored: a directory or a file (with its block list and writer), keyed by id, and
//! the key layout of the store.
//!
//! ```text
//! "i" ++ id (u64 BE)                 -> Inode (bincode 2, serde)
//! "c" ++ parent id (u64 BE) ++ name  -> child id (u64 BE)      children index, sorted by name
//! "m:next-inode" / "m:next-block" / "m:next-genstamp" -> u64 BE counters
//! ```

use crate::store::StoreError;
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use sluice_common::{BlockId, ExtendedBlock, GenerationStamp, MetaError};

/// An inode number. The root directory is [`ROOT`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct InodeId(pub u64);

/// The root directory's inode.
pub const ROOT: InodeId = InodeId(1);

/// A block's persisted state (the in-memory block manager adds replicas).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum BlockState {
    /// Being written; its length is what the writer last reported.
    UnderConstruction,
    /// The writer gave its final length; not yet `replication.min` replicas reported.
    Committed,
    /// Final length and enough replicas (every block of a closed file).
    Complete,
}

/// One block of a file as stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockRecord {
    /// Block id.
    pub id: BlockId,
    /// Current generation stamp.
    pub gen_stamp: GenerationStamp,
    /// Known length.
    pub num_bytes: u64,
    /// State.
    pub state: BlockState,
}

impl BlockRecord {
    /// The block as the protocol names it.
    pub fn extended(&self) -> ExtendedBlock {
        ExtendedBlock::new(self.id, self.gen_stamp, self.num_bytes)
    }
}

/// What only files have.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileMeta {
    /// Replicas per block.
    pub replication: u16,
    /// Block size.
    pub block_size: u64,
    /// Blocks in order.
    pub blocks: Vec<BlockRecord>,
    /// The lease holder while the file is under construction.
    pub writer: Option<String>,
    /// The client that closed the file (so that its retried `complete` succeeds).
    pub closed_by: Option<String>,
}

impl FileMeta {
    /// Sum of the known block lengths (saturating; lengths are checked when they are set, see
    /// [`FileMeta::check_last_length`]).
    pub fn length(&self) -> u64 {
        self.blocks
            .iter()
            .fold(0u64, |sum, b| sum.saturating_add(b.num_bytes))
    }

    /// Checks a length given by a client (or a DataNode) for the file's last block: at most the
    /// file's block size, and the file's length with it must fit in a u64. `arg` names the
    /// argument in the error, which gives the value.
    pub fn check_last_length(&self, given: u64, arg: &str) -> Result<(), MetaError> {
        if given > self.block_size {
            return Err(MetaError::invalid_argument(
                arg,
                format!(
                    "block length {given} exceeds the file's block size {}",
                    self.block_size
                ),
            ));
        }
        let before = self.blocks.split_last().map_or(&[][..], |(_, b)| b);
        let total = before
            .iter()
            .try_fold(given, |sum, b| sum.checked_add(b.num_bytes));
        match total {
            Some(_) => Ok(()),
            None => Err(MetaError::invalid_argument(
                arg,
                format!("block length {given} makes the file length overflow"),
            )),
        }
    }
}

/// File or directory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum InodeKind {
    /// A directory; its children are in the children index.
    Directory,
    /// A file.
    File(FileMeta),
}

/// One namespace entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Inode {
    /// Its id.
    pub id: InodeId,
    /// Its parent directory (the root is its own parent).
    pub parent: InodeId,
    /// Its name in the parent (empty for the root).
    pub name: String,
    /// Last modification, milliseconds since the Unix epoch.
    pub mtime_ms: u64,
    /// File or directory.
    pub kind: InodeKind,
}

impl Inode {
    /// The file part, if a file.
    pub fn file(&self) -> Option<&FileMeta> {
        match &self.kind {
            InodeKind::File(f) => Some(f),
            InodeKind::Directory => None,
        }
    }
    /// The file part, mutable.
    pub fn file_mut(&mut self) -> Option<&mut FileMeta> {
        match &mut self.kind {
            InodeKind::File(f) => Some(f),
            InodeKind::Directory => None,
        }
    }
    /// True for a directory.
    pub fn is_dir(&self) -> bool {
        matches!(self.kind, InodeKind::Directory)
    }
}

/// Prefix of inode records.
pub const INODE_PREFIX: &[u8] = b"i";
/// Prefix of the children index.
pub const CHILD_PREFIX: &[u8] = b"c";
/// Counter keys.
pub const NEXT_INODE_KEY: &[u8] = b"m:next-inode";
/// Next block id.
pub const NEXT_BLOCK_KEY: &[u8] = b"m:next-block";
/// Next generation stamp.
pub const NEXT_GENSTAMP_KEY: &[u8] = b"m:next-genstamp";

/// Key of an inode record.
pub fn inode_key(id: InodeId) -> Vec<u8> {
    let mut k = INODE_PREFIX.to_vec();
    k.extend_from_slice(&id.0.to_be_bytes());
    k
}

/// Prefix of every child entry of `parent`.
pub fn children_prefix(parent: InodeId) -> Vec<u8> {
    let mut k = CHILD_PREFIX.to_vec();
    k.extend_from_slice(&parent.0.to_be_bytes());
    k
}

/// Key of the child entry `name` of `parent`.
pub fn child_key(parent: InodeId, name: &str) -> Vec<u8> {
    let mut k = children_prefix(parent);
    k.extend_from_slice(name.as_bytes());
    k
}

/// Encodes a record.
pub fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, StoreError> {
    bincode::serde::encode_to_vec(value, bincode::config::standard())
        .map_err(|e| StoreError::Backend(format!("cannot encode record: {e}")))
}

/// Decodes the record stored under `key`.
pub fn decode<T: DeserializeOwned>(key: &[u8], bytes: &[u8]) -> Result<T, StoreError> {
    bincode::serde::decode_from_slice(bytes, bincode::config::standard())
        .map(|(v, _)| v)
        .map_err(|e| StoreError::Corrupt {
            key: printable(key),
            reason: e.to_string(),
        })
}

/// Decodes a u64 stored big-endian under `key`.
pub fn decode_u64(key: &[u8], bytes: &[u8]) -> Result<u64, StoreError> {
    let arr: [u8; 8] = bytes.try_into().map_err(|_| StoreError::Corrupt {
        key: printable(key),
        reason: format!("expected 8 bytes, found {}", bytes.len()),
    })?;
    Ok(u64::from_be_bytes(arr))
}

/// A key, printable in errors.
pub fn printable(key: &[u8]) -> String {
    key.iter()
        .map(|&b| {
            if b.is_ascii_graphic() {
                (b as char).to_string()
            } else {
                format!("\\x{b:02x}")
            }
        })
        .collect()
}
