//! The WebHDFS JSON documents, with the field names of the specification (`FileStatus`,
//! `FileStatuses`, `DirectoryListing`, `ContentSummary`, `FileChecksum`, `boolean`, `Path`,
//! `Location`). Sluice has no owners or permissions: every entry is owned by [`OWNER`] in
//! [`GROUP`], files `644` and directories `755` (HDFS's defaults without a umask).

use crate::rpc::{FileKind, FileStatus};
use serde_json::{json, Value};

/// The owner every entry reports.
pub const OWNER: &str = "sluice";
/// The group every entry reports.
pub const GROUP: &str = "supergroup";

/// A `FileStatus` object (without its wrapper); `suffix` is the `pathSuffix` ("" for the path
/// itself, the entry's name in a listing).
pub fn file_status(st: &FileStatus, suffix: &str) -> Value {
    let dir = st.kind == FileKind::Directory;
    json!({
        "accessTime": if dir { 0 } else { st.modification_time_ms },
        "blockSize": st.block_size,
        "group": GROUP,
        "length": st.length,
        "modificationTime": st.modification_time_ms,
        "owner": OWNER,
        "pathSuffix": suffix,
        "permission": if dir { "755" } else { "644" },
        "replication": st.replication,
        "storagePolicy": 0,
        "type": if dir { "DIRECTORY" } else { "FILE" },
    })
}

/// `{"FileStatus": {...}}` for the path itself.
pub fn file_status_doc(st: &FileStatus) -> Value {
    json!({ "FileStatus": file_status(st, "") })
}

/// The last component of a path ("" for `/`).
pub fn name_of(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or("")
}

/// The `pathSuffix` of a listed entry: its name, or "" when `listed` is the file itself.
fn suffix<'a>(listed: &str, entry: &'a FileStatus) -> &'a str {
    if entry.path == listed {
        ""
    } else {
        name_of(&entry.path)
    }
}

/// `{"FileStatuses": {"FileStatus": [...]}}` for the entries of `listed`.
pub fn file_statuses(listed: &str, entries: &[FileStatus]) -> Value {
    let list: Vec<Value> = entries
        .iter()
        .map(|e| file_status(e, suffix(listed, e)))
        .collect();
    json!({ "FileStatuses": { "FileStatus": list } })
}

/// `{"DirectoryListing": {...}}`: one batch of a listing and how many entries remain.
pub fn directory_listing(listed: &str, batch: &[FileStatus], remaining: usize) -> Value {
    json!({ "DirectoryListing": {
        "partialListing": file_statuses(listed, batch),
        "remainingEntries": remaining,
    }})
}

/// Totals under a path.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ContentSummary {
    /// Directories, the path itself included when it is one.
    pub directory_count: u64,
    /// Files.
    pub file_count: u64,
    /// Bytes of the files.
    pub length: u64,
    /// Bytes times replication.
    pub space_consumed: u64,
}

impl ContentSummary {
    /// `{"ContentSummary": {...}}`; Sluice has no quotas (`-1`, as HDFS reports none).
    pub fn to_json(&self) -> Value {
        json!({ "ContentSummary": {
            "directoryCount": self.directory_count,
            "fileCount": self.file_count,
            "length": self.length,
            "quota": -1,
            "spaceConsumed": self.space_consumed,
            "spaceQuota": -1,
            "typeQuota": {},
        }})
    }
}

/// `{"FileChecksum": {...}}`.
pub fn file_checksum(algorithm: &str, bytes: &[u8]) -> Value {
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    json!({ "FileChecksum": {
        "algorithm": algorithm,
        "bytes": hex,
        "length": bytes.len(),
    }})
}

/// `{"boolean": b}`.
pub fn boolean(b: bool) -> Value {
    json!({ "boolean": b })
}

/// `{"Path": p}`.
pub fn path(p: &str) -> Value {
    json!({ "Path": p })
}

/// `{"Location": url}` (the `noredirect=true` answer).
pub fn location(url: &str) -> Value {
    json!({ "Location": url })
}
