//! The namespace in memory (HDFS's `FSDirectory`): every inode by id and every directory's
//! children by name. It is loaded from the store when the service opens and changed only by
//! [`Tree::apply`] with the changes of a batch the store has just accepted (a [`super::Txn`]
//! records each write twice: as bytes for the store and as a [`Change`] for the tree), under
//! the state lock. Lookups (stat, open, path resolution, list) therefore never read the store,
//! and the store stays the log that a restart rebuilds the tree from.

use super::inode::{decode, decode_u64, printable, CHILD_PREFIX, INODE_PREFIX};
use super::{Inode, InodeId};
use crate::store::{MetaStore, StoreError};
use std::collections::{BTreeMap, HashMap};

/// One write of a batch, as the tree applies it.
#[derive(Debug, Clone)]
pub enum Change {
    /// Creates or replaces an inode record.
    Put(Inode),
    /// Removes an inode record.
    Delete(InodeId),
    /// Sets the entry `name` of `parent` to `child`.
    Link {
        /// The directory.
        parent: InodeId,
        /// The entry's name.
        name: String,
        /// The inode it names.
        child: InodeId,
    },
    /// Removes the entry `name` of `parent`.
    Unlink {
        /// The directory.
        parent: InodeId,
        /// The entry's name.
        name: String,
    },
}

/// Every inode and children index entry of the store, in memory.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Tree {
    inodes: HashMap<InodeId, Inode>,
    /// Directory id → name → child id (sorted by name, as the store's keys are).
    children: HashMap<InodeId, BTreeMap<String, InodeId>>,
}

impl Tree {
    /// Reads every inode record and children index entry of `store`.
    pub fn load(store: &dyn MetaStore) -> Result<Tree, StoreError> {
        let mut tree = Tree::default();
        for (key, value) in store.scan_prefix(INODE_PREFIX)? {
            let inode: Inode = decode(&key, &value)?;
            tree.inodes.insert(inode.id, inode);
        }
        for (key, value) in store.scan_prefix(CHILD_PREFIX)? {
            let corrupt = |reason: &str| StoreError::Corrupt {
                key: printable(&key),
                reason: reason.to_string(),
            };
            let (parent, name) = key[CHILD_PREFIX.len()..]
                .split_first_chunk::<8>()
                .ok_or_else(|| corrupt("child key shorter than its parent id"))?;
            let name = std::str::from_utf8(name).map_err(|_| corrupt("child name is not UTF-8"))?;
            let child = InodeId(decode_u64(&key, &value)?);
            tree.link(
                InodeId(u64::from_be_bytes(*parent)),
                name.to_string(),
                child,
            );
        }
        Ok(tree)
    }

    /// Applies the changes of a batch the store accepted, in order (the last write of a key
    /// wins, as in the batch).
    pub fn apply(&mut self, changes: Vec<Change>) {
        for change in changes {
            match change {
                Change::Put(inode) => {
                    self.inodes.insert(inode.id, inode);
                }
                Change::Delete(id) => {
                    self.inodes.remove(&id);
                }
                Change::Link {
                    parent,
                    name,
                    child,
                } => self.link(parent, name, child),
                Change::Unlink { parent, name } => {
                    if let Some(entries) = self.children.get_mut(&parent) {
                        entries.remove(&name);
                        if entries.is_empty() {
                            self.children.remove(&parent);
                        }
                    }
                }
            }
        }
    }

    fn link(&mut self, parent: InodeId, name: String, child: InodeId) {
        self.children.entry(parent).or_default().insert(name, child);
    }

    /// The inode `id`.
    pub fn get(&self, id: InodeId) -> Option<&Inode> {
        self.inodes.get(&id)
    }

    /// The id of the entry `name` of directory `parent`.
    pub fn child(&self, parent: InodeId, name: &str) -> Option<InodeId> {
        self.children.get(&parent)?.get(name).copied()
    }

    /// The entries of directory `dir`, sorted by name.
    pub fn children(&self, dir: InodeId) -> impl Iterator<Item = (&str, InodeId)> {
        self.children
            .get(&dir)
            .into_iter()
            .flat_map(|m| m.iter().map(|(n, id)| (n.as_str(), *id)))
    }

    /// Every inode, in no order.
    pub fn inodes(&self) -> impl Iterator<Item = &Inode> {
        self.inodes.values()
    }
}
