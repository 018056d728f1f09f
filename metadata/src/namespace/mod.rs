//! The namespace: directories and files (HDFS semantics) kept in a [`MetaStore`].
//!
//! Inodes are stored by id, with a children index keyed by (parent id, name) so that a rename
//! rewrites one index entry and one inode whatever the size of the subtree. Every change is
//! built as a [`Txn`] and applied as one atomic batch; the caller flushes the store before it
//! acknowledges the change (see `docs/metadata.md`, "Durability").
//!
//! Reads never touch the store: the whole namespace is also kept in memory ([`tree`], as
//! HDFS's `FSDirectory`), loaded at open and changed with each batch once the store took it.

mod inode;
mod ops;
pub(crate) mod path;
mod tree;

pub use inode::{BlockRecord, BlockState, FileMeta, Inode, InodeId, InodeKind, ROOT};
pub use ops::CreateRequest;
pub use path::NsPath;

use crate::store::{MetaStore, StoreError, WriteBatch};
use inode::{
    child_key, decode_u64, encode, inode_key, NEXT_BLOCK_KEY, NEXT_GENSTAMP_KEY, NEXT_INODE_KEY,
};
use sluice_common::rpc::{FileKind, FileStatus};
use sluice_common::{BlockId, GenerationStamp, MetaError};
use std::sync::Arc;
use tree::{Change, Tree};

/// First block id handed out (HDFS starts sequential block ids at 2^30).
pub const FIRST_BLOCK_ID: u64 = 1 << 30;
/// First generation stamp handed out (HDFS's `GenerationStamp.LAST_RESERVED_STAMP` is 1000).
pub const FIRST_GEN_STAMP: u64 = 1000;

/// A store failure as the RPC caller sees it.
pub fn storage_error(e: StoreError) -> MetaError {
    MetaError::Storage {
        message: e.to_string(),
    }
}

/// Pending writes of one namespace change, applied atomically by [`Namespace::commit`]: each
/// is recorded for the store (bytes) and for the in-memory tree (a [`Change`]) by the same
/// method, so the two never differ.
#[derive(Debug, Default)]
pub struct Txn {
    batch: WriteBatch,
    changes: Vec<Change>,
    files_delta: i64,
    dirs_delta: i64,
}

impl Txn {
    /// An empty change.
    pub fn new() -> Self {
        Self::default()
    }
    /// Writes (creates or replaces) an inode record.
    pub fn put_inode(&mut self, inode: &Inode) -> Result<(), MetaError> {
        let bytes = encode(inode).map_err(storage_error)?;
        self.batch.put(inode_key(inode.id), bytes);
        self.changes.push(Change::Put(inode.clone()));
        Ok(())
    }
    /// Links `child` as `name` under `parent`.
    fn link(&mut self, parent: InodeId, name: &str, child: InodeId) {
        self.batch
            .put(child_key(parent, name), child.0.to_be_bytes().to_vec());
        self.changes.push(Change::Link {
            parent,
            name: name.to_string(),
            child,
        });
    }
    /// Removes the entry `name` of `parent`.
    fn unlink(&mut self, parent: InodeId, name: &str) {
        self.batch.delete(child_key(parent, name));
        self.changes.push(Change::Unlink {
            parent,
            name: name.to_string(),
        });
    }
    /// Adds a new inode under its parent.
    fn add(&mut self, inode: &Inode) -> Result<(), MetaError> {
        self.put_inode(inode)?;
        self.link(inode.parent, &inode.name, inode.id);
        if inode.is_dir() {
            self.dirs_delta += 1;
        } else {
            self.files_delta += 1;
        }
        Ok(())
    }
    /// Removes an inode and its entry in its parent.
    fn remove(&mut self, inode: &Inode) {
        self.unlink(inode.parent, &inode.name);
        self.batch.delete(inode_key(inode.id));
        self.changes.push(Change::Delete(inode.id));
        if inode.is_dir() {
            self.dirs_delta -= 1;
        } else {
            self.files_delta -= 1;
        }
    }
}

/// The namespace over its store.
pub struct Namespace {
    store: Arc<dyn MetaStore>,
    /// Every record of the store, in memory: what every lookup reads.
    tree: Tree,
    next_inode: u64,
    next_block: u64,
    next_gen_stamp: u64,
    /// Counters moved since they were last written: inode, block, generation stamp (only
    /// those are written with the next commit).
    counters_dirty: [bool; 3],
    files: u64,
    dirs: u64,
}

/// How far a path resolved: every inode found from the root down.
#[derive(Debug)]
pub struct Walk {
    /// Inodes of the path's prefix that exist, starting with the root.
    pub found: Vec<Inode>,
    /// Components of the path.
    pub wanted: usize,
}

impl Walk {
    /// The inode at the full path, if it exists.
    pub fn target(&self) -> Option<&Inode> {
        (self.found.len() == self.wanted + 1)
            .then(|| self.found.last())
            .flatten()
    }
    /// The deepest inode found.
    pub fn deepest(&self) -> &Inode {
        // `found` always holds the root.
        &self.found[self.found.len() - 1]
    }
}

impl Namespace {
    /// Opens the namespace in `store` (read into memory), creating the root on first use.
    /// Returns it with every file inode (by id), from which the block manager and leases are
    /// rebuilt. Counters are raised past every id found, so they never go backwards.
    pub fn open(store: Arc<dyn MetaStore>) -> Result<(Namespace, Vec<Inode>), StoreError> {
        let counter = |key: &[u8], default: u64| -> Result<u64, StoreError> {
            match store.get(key)? {
                Some(v) => decode_u64(key, &v),
                None => Ok(default),
            }
        };
        let mut ns = Namespace {
            next_inode: counter(NEXT_INODE_KEY, ROOT.0 + 1)?,
            next_block: counter(NEXT_BLOCK_KEY, FIRST_BLOCK_ID)?,
            next_gen_stamp: counter(NEXT_GENSTAMP_KEY, FIRST_GEN_STAMP)?,
            tree: Tree::load(store.as_ref())?,
            store,
            counters_dirty: [true; 3],
            files: 0,
            dirs: 0,
        };
        let mut files = Vec::new();
        for inode in ns.tree.inodes() {
            ns.next_inode = ns.next_inode.max(inode.id.0 + 1);
            match &inode.kind {
                InodeKind::Directory => ns.dirs += 1,
                InodeKind::File(f) => {
                    ns.files += 1;
                    for b in &f.blocks {
                        ns.next_block = ns.next_block.max(b.id.0 + 1);
                        ns.next_gen_stamp = ns.next_gen_stamp.max(b.gen_stamp.0 + 1);
                    }
                    files.push(inode.clone());
                }
            }
        }
        files.sort_by_key(|f| f.id);
        let mut txn = Txn::new();
        if ns.dirs == 0 {
            let root = Inode {
                id: ROOT,
                parent: ROOT,
                name: String::new(),
                mtime_ms: now_ms(),
                kind: InodeKind::Directory,
            };
            txn.put_inode(&root)
                .map_err(|e| StoreError::Backend(e.to_string()))?;
            txn.dirs_delta += 1;
        }
        ns.commit(txn)
            .map_err(|e| StoreError::Backend(e.to_string()))?;
        Ok((ns, files))
    }

    /// The store (for flushing).
    pub fn store(&self) -> &Arc<dyn MetaStore> {
        &self.store
    }

    /// Number of files.
    pub fn file_count(&self) -> u64 {
        self.files
    }

    /// Number of directories (the root included).
    pub fn dir_count(&self) -> u64 {
        self.dirs
    }

    /// Allocates a block id (persisted with the next commit).
    pub fn alloc_block_id(&mut self) -> BlockId {
        self.counters_dirty[1] = true;
        self.next_block += 1;
        BlockId(self.next_block - 1)
    }

    /// Allocates a generation stamp (persisted with the next commit).
    pub fn alloc_gen_stamp(&mut self) -> GenerationStamp {
        self.counters_dirty[2] = true;
        self.next_gen_stamp += 1;
        GenerationStamp(self.next_gen_stamp - 1)
    }

    fn alloc_inode_id(&mut self) -> InodeId {
        self.counters_dirty[0] = true;
        self.next_inode += 1;
        InodeId(self.next_inode - 1)
    }

    /// Applies a change atomically (with the counters, if they moved). Not yet durable.
    pub fn commit(&mut self, mut txn: Txn) -> Result<(), MetaError> {
        let counters = [
            (NEXT_INODE_KEY, self.next_inode),
            (NEXT_BLOCK_KEY, self.next_block),
            (NEXT_GENSTAMP_KEY, self.next_gen_stamp),
        ];
        for ((key, value), dirty) in counters.into_iter().zip(self.counters_dirty) {
            if dirty {
                txn.batch.put(key.to_vec(), value.to_be_bytes().to_vec());
            }
        }
        if txn.batch.is_empty() {
            return Ok(());
        }
        self.store.apply(txn.batch).map_err(storage_error)?;
        self.tree.apply(txn.changes);
        self.counters_dirty = [false; 3];
        self.files = self.files.saturating_add_signed(txn.files_delta);
        self.dirs = self.dirs.saturating_add_signed(txn.dirs_delta);
        Ok(())
    }

    /// The inode `id`.
    pub fn get(&self, id: InodeId) -> Result<Option<Inode>, MetaError> {
        Ok(self.tree.get(id).cloned())
    }

    /// The child `name` of directory `parent`.
    pub fn lookup(&self, parent: InodeId, name: &str) -> Result<Option<Inode>, MetaError> {
        match self.tree.child(parent, name) {
            Some(id) => self.existing(id, parent, name).map(|i| Some(i.clone())),
            None => Ok(None),
        }
    }

    /// The inode a children index entry points to (a missing one is a corrupt store).
    fn existing(&self, id: InodeId, parent: InodeId, name: &str) -> Result<&Inode, MetaError> {
        self.tree.get(id).ok_or_else(|| {
            storage_error(StoreError::Corrupt {
                key: inode::printable(&child_key(parent, name)),
                reason: format!("child entry points to missing inode {}", id.0),
            })
        })
    }

    /// The children of directory `dir`, sorted by name.
    pub fn children(&self, dir: InodeId) -> Result<Vec<Inode>, MetaError> {
        self.tree
            .children(dir)
            .map(|(name, id)| self.existing(id, dir, name).cloned())
            .collect()
    }

    fn root(&self) -> Result<&Inode, MetaError> {
        self.tree.get(ROOT).ok_or_else(|| MetaError::Storage {
            message: "root inode missing".into(),
        })
    }

    /// Resolves `path` as far as it exists. A file in the middle stops the walk.
    pub fn walk(&self, path: &NsPath) -> Result<Walk, MetaError> {
        let mut found = vec![self.root()?.clone()];
        for name in path.components() {
            let cur = &found[found.len() - 1];
            if !cur.is_dir() {
                break;
            }
            match self.lookup(cur.id, name)? {
                Some(child) => found.push(child),
                None => break,
            }
        }
        Ok(Walk {
            found,
            wanted: path.components().len(),
        })
    }

    /// The inode at `path`, borrowed (`None` if missing, or if a file stands on the way).
    pub fn find(&self, path: &NsPath) -> Result<Option<&Inode>, MetaError> {
        let mut cur = self.root()?;
        for name in path.components() {
            if !cur.is_dir() {
                return Ok(None);
            }
            match self.tree.child(cur.id, name) {
                Some(id) => cur = self.existing(id, cur.id, name)?,
                None => return Ok(None),
            }
        }
        Ok(Some(cur))
    }

    /// The inode at `path` (`None` if missing, or if a file stands on the way).
    pub fn resolve(&self, path: &NsPath) -> Result<Option<Inode>, MetaError> {
        Ok(self.find(path)?.cloned())
    }

    /// The absolute path of an inode, from its parent links.
    pub fn path_of(&self, inode: &Inode) -> Result<String, MetaError> {
        let mut names = vec![];
        let mut cur = inode;
        while cur.id != ROOT {
            names.push(cur.name.as_str());
            cur = self
                .tree
                .get(cur.parent)
                .ok_or_else(|| MetaError::Storage {
                    message: format!("inode {} has a missing parent", cur.id.0),
                })?;
            if names.len() > path::MAX_PATH_BYTES {
                return Err(MetaError::Storage {
                    message: "cycle in parent links".into(),
                });
            }
        }
        names.reverse();
        Ok(format!("/{}", names.join("/")))
    }
}

/// What `stat` shows for an inode at `path`.
pub fn file_status(path: String, inode: &Inode) -> FileStatus {
    match &inode.kind {
        InodeKind::Directory => FileStatus {
            path,
            kind: FileKind::Directory,
            length: 0,
            replication: 0,
            block_size: 0,
            modification_time_ms: inode.mtime_ms,
            under_construction: false,
            block_count: 0,
        },
        InodeKind::File(f) => FileStatus {
            path,
            kind: FileKind::File,
            length: f.length(),
            replication: f.replication,
            block_size: f.block_size,
            modification_time_ms: inode.mtime_ms,
            under_construction: f.writer.is_some(),
            block_count: f.blocks.len() as u64,
        },
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests;
