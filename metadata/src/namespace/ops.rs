//! Namespace operations (HDFS semantics): mkdirs, create, delete, rename, list, stat. Each
//! builds one [`Txn`] and commits it; none flushes (the caller does, before answering).

use super::{file_status, FileMeta, Inode, InodeId, InodeKind, Namespace, NsPath, Txn, Walk};
use sluice_common::rpc::FileStatus;
use sluice_common::MetaError;

/// A validated `create`.
#[derive(Debug, Clone)]
pub struct CreateRequest {
    /// The writer, who becomes the lease holder.
    pub client: String,
    /// Replace an existing file.
    pub overwrite: bool,
    /// Create missing parents.
    pub create_parent: bool,
    /// Replicas per block (already defaulted and bounded).
    pub replication: u16,
    /// Block size (already defaulted and checked).
    pub block_size: u64,
}

fn not_found(path: &NsPath) -> MetaError {
    MetaError::NotFound {
        path: path.to_string(),
    }
}

/// The path of the first `n` components of `path`.
fn prefix(path: &NsPath, n: usize) -> NsPath {
    let mut p = NsPath::root();
    for c in path.components().iter().take(n) {
        p = p.join(c);
    }
    p
}

impl Namespace {
    /// Creates `path` as a directory, with its missing ancestors if `parents`. An existing
    /// directory is fine; a file at the path is `AlreadyExists`, a file above it
    /// `NotADirectory`.
    pub fn mkdirs(&mut self, path: &NsPath, parents: bool, now: u64) -> Result<(), MetaError> {
        let walk = self.walk(path)?;
        if let Some(t) = walk.target() {
            return match t.kind {
                InodeKind::Directory => Ok(()),
                InodeKind::File(_) => Err(MetaError::AlreadyExists {
                    path: path.to_string(),
                }),
            };
        }
        self.check_walk_dir(path, &walk)?;
        let missing = walk.wanted + 1 - walk.found.len();
        if missing > 1 && !parents {
            return Err(not_found(&prefix(path, walk.found.len())));
        }
        let mut txn = Txn::new();
        self.make_dirs(&mut txn, path, &walk, now)?;
        self.commit(txn)
    }

    /// Errors if the deepest inode found on an incomplete walk is a file.
    fn check_walk_dir(&self, path: &NsPath, walk: &Walk) -> Result<(), MetaError> {
        if !walk.deepest().is_dir() {
            return Err(MetaError::NotADirectory {
                path: prefix(path, walk.found.len() - 1).to_string(),
            });
        }
        Ok(())
    }

    /// Adds the directories of `path` that `walk` did not find; returns the deepest one.
    fn make_dirs(
        &mut self,
        txn: &mut Txn,
        path: &NsPath,
        walk: &Walk,
        now: u64,
    ) -> Result<InodeId, MetaError> {
        let mut parent = walk.deepest().clone();
        if walk.found.len() <= walk.wanted {
            parent.mtime_ms = now;
            txn.put_inode(&parent)?;
        }
        let mut id = parent.id;
        for name in path.components().iter().skip(walk.found.len() - 1) {
            let dir = Inode {
                id: self.alloc_inode_id(),
                parent: id,
                name: name.clone(),
                mtime_ms: now,
                kind: InodeKind::Directory,
            };
            txn.add(&dir)?;
            id = dir.id;
        }
        Ok(id)
    }

    /// Creates a file open for writing by `req.client`. Returns the new inode and the file it
    /// replaced (overwrite), whose blocks and lease the caller drops.
    pub fn create(
        &mut self,
        path: &NsPath,
        req: &CreateRequest,
        now: u64,
    ) -> Result<(Inode, Option<Inode>), MetaError> {
        let Some(parent_path) = path.parent() else {
            return Err(MetaError::IsADirectory {
                path: path.to_string(),
            });
        };
        let name = path.name().unwrap_or_default().to_string();
        let mut txn = Txn::new();
        let walk = self.walk(&parent_path)?;
        let (parent_id, replaced) = match walk.target() {
            Some(parent) if parent.is_dir() => {
                let existing = self.lookup(parent.id, &name)?;
                if let Some(old) = &existing {
                    check_replace(path, old, req)?;
                    txn.remove(old);
                }
                let mut parent = parent.clone();
                parent.mtime_ms = now;
                txn.put_inode(&parent)?;
                (parent.id, existing)
            }
            Some(_) => {
                return Err(MetaError::NotADirectory {
                    path: parent_path.to_string(),
                })
            }
            None => {
                self.check_walk_dir(&parent_path, &walk)?;
                if !req.create_parent {
                    return Err(not_found(&parent_path));
                }
                (self.make_dirs(&mut txn, &parent_path, &walk, now)?, None)
            }
        };
        let inode = Inode {
            id: self.alloc_inode_id(),
            parent: parent_id,
            name,
            mtime_ms: now,
            kind: InodeKind::File(FileMeta {
                replication: req.replication,
                block_size: req.block_size,
                blocks: vec![],
                writer: Some(req.client.clone()),
                closed_by: None,
            }),
        };
        txn.add(&inode)?;
        self.commit(txn)?;
        Ok((inode, replaced))
    }

    /// Deletes `path` (a non-empty directory only if `recursive`). Returns `None` if nothing
    /// was there, else the files removed (their blocks and leases are the caller's to drop).
    /// Deleting `/` removes its contents (recursive only) and never the root itself.
    pub fn delete(
        &mut self,
        path: &NsPath,
        recursive: bool,
        now: u64,
    ) -> Result<Option<Vec<Inode>>, MetaError> {
        let Some(target) = self.resolve(path)? else {
            return Ok(None);
        };
        let mut txn = Txn::new();
        let mut files = Vec::new();
        if target.is_dir() {
            let children = self.children(target.id)?;
            if !children.is_empty() && !recursive {
                return Err(MetaError::DirectoryNotEmpty {
                    path: path.to_string(),
                });
            }
            if path.is_root() && children.is_empty() {
                return Ok(None);
            }
            for child in children {
                self.remove_subtree(&mut txn, child, &mut files)?;
            }
        }
        if path.is_root() {
            let mut root = target;
            root.mtime_ms = now;
            txn.put_inode(&root)?;
        } else {
            if let Some(mut parent) = self.get(target.parent)? {
                parent.mtime_ms = now;
                txn.put_inode(&parent)?;
            }
            if !target.is_dir() {
                files.push(target.clone());
            }
            txn.remove(&target);
        }
        self.commit(txn)?;
        Ok(Some(files))
    }

    /// Removes `inode` and everything below it, collecting files.
    fn remove_subtree(
        &self,
        txn: &mut Txn,
        inode: Inode,
        files: &mut Vec<Inode>,
    ) -> Result<(), MetaError> {
        let mut stack = vec![inode];
        while let Some(node) = stack.pop() {
            if node.is_dir() {
                stack.extend(self.children(node.id)?);
            }
            txn.remove(&node);
            if !node.is_dir() {
                files.push(node);
            }
        }
        Ok(())
    }

    /// Moves `src` to `dst` (HDFS rename2 without overwrite): `dst` must not exist, its parent
    /// must be a directory, and a directory cannot move below itself.
    pub fn rename(&mut self, src: &NsPath, dst: &NsPath, now: u64) -> Result<(), MetaError> {
        if src.is_root() {
            return Err(MetaError::invalid_argument("src", "cannot rename /"));
        }
        let Some(mut inode) = self.resolve(src)? else {
            return Err(not_found(src));
        };
        if dst.starts_with(src) && dst != src {
            return Err(MetaError::invalid_argument(
                "dst",
                format!("cannot move {src} below itself ({dst})"),
            ));
        }
        let Some(dst_parent_path) = dst.parent() else {
            return Err(MetaError::AlreadyExists {
                path: dst.to_string(),
            });
        };
        let walk = self.walk(&dst_parent_path)?;
        let mut dst_parent = match walk.target() {
            Some(p) if p.is_dir() => p.clone(),
            Some(_) => {
                return Err(MetaError::NotADirectory {
                    path: dst_parent_path.to_string(),
                })
            }
            None => {
                self.check_walk_dir(&dst_parent_path, &walk)?;
                return Err(not_found(&dst_parent_path));
            }
        };
        let dst_name = dst.name().unwrap_or_default().to_string();
        if self.lookup(dst_parent.id, &dst_name)?.is_some() {
            return Err(MetaError::AlreadyExists {
                path: dst.to_string(),
            });
        }
        let mut txn = Txn::new();
        txn.unlink(inode.parent, &inode.name);
        if dst_parent.id != inode.parent {
            if let Some(mut src_parent) = self.get(inode.parent)? {
                src_parent.mtime_ms = now;
                txn.put_inode(&src_parent)?;
            }
        }
        dst_parent.mtime_ms = now;
        txn.put_inode(&dst_parent)?;
        inode.parent = dst_parent.id;
        inode.name = dst_name;
        txn.put_inode(&inode)?;
        txn.link(inode.parent, &inode.name, inode.id);
        self.commit(txn)
    }

    /// The entry at `path`.
    pub fn stat(&self, path: &NsPath) -> Result<FileStatus, MetaError> {
        let inode = self.find(path)?.ok_or_else(|| not_found(path))?;
        Ok(file_status(path.to_string(), inode))
    }

    /// The entries of the directory at `path`, sorted by name (a file lists itself).
    pub fn list(&self, path: &NsPath) -> Result<Vec<FileStatus>, MetaError> {
        let inode = self.find(path)?.ok_or_else(|| not_found(path))?;
        if !inode.is_dir() {
            return Ok(vec![file_status(path.to_string(), inode)]);
        }
        Ok(self
            .children(inode.id)?
            .iter()
            .map(|c| file_status(path.join(&c.name).to_string(), c))
            .collect())
    }

    /// Writes an updated file inode (block list, writer, times).
    pub fn update(&mut self, inode: &Inode) -> Result<(), MetaError> {
        let mut txn = Txn::new();
        txn.put_inode(inode)?;
        self.commit(txn)
    }
}

/// Whether `create` may replace the existing entry `old`.
fn check_replace(path: &NsPath, old: &Inode, req: &CreateRequest) -> Result<(), MetaError> {
    match &old.kind {
        InodeKind::Directory => Err(MetaError::IsADirectory {
            path: path.to_string(),
        }),
        InodeKind::File(f) => match &f.writer {
            Some(holder) if *holder != req.client => Err(MetaError::LeaseConflict {
                path: path.to_string(),
                holder: holder.clone(),
            }),
            _ if !req.overwrite => Err(MetaError::AlreadyExists {
                path: path.to_string(),
            }),
            _ => Ok(()),
        },
    }
}
