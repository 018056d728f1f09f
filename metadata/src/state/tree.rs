//! Namespace operations of the client protocol that touch no block: mkdirs, list, stat,
//! rename, delete (which drops blocks), set_replication (which repair then acts on), and
//! lease renewal.

use super::State;
use crate::namespace::{now_ms, NsPath};
use sluice_common::rpc::FileStatus;
use sluice_common::MetaError;
use std::time::Instant;

impl State {
    /// Creates a directory (and its parents with `parents`).
    pub fn mkdirs(&mut self, path: &str, parents: bool) -> Result<(), MetaError> {
        let p = NsPath::parse(path)?;
        self.ns.mkdirs(&p, parents, now_ms())
    }

    /// One entry.
    pub fn stat(&self, path: &str) -> Result<FileStatus, MetaError> {
        self.ns.stat(&NsPath::parse(path)?)
    }

    /// A directory's entries sorted by name (a file lists itself).
    pub fn list(&self, path: &str) -> Result<Vec<FileStatus>, MetaError> {
        self.ns.list(&NsPath::parse(path)?)
    }

    /// Renames `src` to `dst`.
    pub fn rename(&mut self, src: &str, dst: &str) -> Result<(), MetaError> {
        let (s, d) = (NsPath::parse(src)?, NsPath::parse(dst)?);
        self.ns.rename(&s, &d, now_ms())
    }

    /// Deletes `path`; its blocks are deleted by their DataNodes at their next heartbeats.
    pub fn delete(&mut self, path: &str, recursive: bool) -> Result<bool, MetaError> {
        let p = NsPath::parse(path)?;
        let Some(files) = self.ns.delete(&p, recursive, now_ms())? else {
            return Ok(false);
        };
        for f in &files {
            self.drop_file(f);
        }
        Ok(true)
    }

    /// Sets the replication factor of the file at `path` (1 to `replication.max`) and marks
    /// its blocks for the repair pass, which copies or deletes replicas to match.
    pub fn set_replication(&mut self, path: &str, replication: u16) -> Result<(), MetaError> {
        if replication == 0 || replication > self.cfg.max_replication {
            return Err(MetaError::invalid_argument(
                "replication",
                format!(
                    "{replication} must be between 1 and replication.max {}",
                    self.cfg.max_replication
                ),
            ));
        }
        let p = NsPath::parse(path)?;
        let mut inode = self.file_at(&p)?;
        let Some(f) = inode.file_mut() else {
            return Err(MetaError::IsADirectory {
                path: p.to_string(),
            });
        };
        if f.replication == replication {
            return Ok(());
        }
        f.replication = replication;
        let blocks: Vec<_> = f.blocks.iter().map(|b| b.id).collect();
        self.ns.update(&inode)?;
        for id in blocks {
            if let Some(info) = self.blocks.get_mut(id) {
                info.replication = replication;
            }
            self.blocks.mark_dirty(id);
        }
        tracing::info!(path, replication, "replication set");
        Ok(())
    }

    /// Renews every lease of `client`.
    pub fn renew_lease(&mut self, client: &str, now: Instant) {
        self.leases.renew(client, now);
    }
}
