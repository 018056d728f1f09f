//! Namespace operations of the client protocol that touch no block: mkdirs, list, stat,
//! rename, delete (which drops blocks), and lease renewal.

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

    /// Renews every lease of `client`.
    pub fn renew_lease(&mut self, client: &str, now: Instant) {
        self.leases.renew(client, now);
    }
}
