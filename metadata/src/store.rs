//! The persistent key-value store under the namespace, behind [`MetaStore`] so that sled can be
//! replaced later (Garage shipped sled and had to replace it).
//!
//! sled 0.34 guards batches with a process-wide reader-writer lock that its flush holds (as a
//! reader) while it waits for I/O threads that need the same lock: a batch waiting for the lock
//! during a flush deadlocks every sled database in the process. [`SledStore`] therefore never
//! lets a batch and a flush overlap (one process-wide I/O mutex, taken by both), and coalesces
//! flushes: a flush returns at once when a flush that started after its caller's writes has
//! already completed.
//!
//! sled 0.34 makes its log durable with `sync_file_range`, which neither persists the file's
//! size nor flushes the disk's write cache, and never syncs its blob files (large values).
//! [`SledStore`] completes every flush with `fdatasync` of the log and of any new blob file
//! (and of the blob directory), so that an acknowledged change survives a power loss.
//!
//! The namespace needs little: point reads, ordered prefix scans, atomic multi-key batches and
//! an asynchronous flush that makes every earlier write durable. [`SledStore`] implements it on
//! sled 0.34 with sled's own periodic flusher turned off: the service flushes for every change,
//! before it answers, through [`GroupCommit`] (batches kept in memory until one flush writes
//! them all). [`MemStore`] is an in-memory store for tests (crash, held and failing flushes).

pub mod group;
pub mod mem;

pub use group::GroupCommit;
pub use mem::MemStore;

use crate::commit::CommitClock;
use std::collections::HashSet;
use std::ffi::OsString;
use std::fs::File;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// A failure of the store. The operation that met it was not made.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The underlying database failed.
    #[error("store i/o error: {0}")]
    Backend(String),
    /// A stored record did not decode.
    #[error("corrupt record under key {key}: {reason}")]
    Corrupt {
        /// The key, printable.
        key: String,
        /// What was wrong.
        reason: String,
    },
    /// The store was closed (the service is shutting down).
    #[error("store is closed")]
    Closed,
}

/// One atomic group of writes: every put and delete lands, or none does.
#[derive(Debug, Default, Clone)]
pub struct WriteBatch {
    pub(crate) ops: Vec<(Vec<u8>, Option<Vec<u8>>)>,
}

impl WriteBatch {
    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }
    /// Sets `key` to `value`.
    pub fn put(&mut self, key: Vec<u8>, value: Vec<u8>) {
        self.ops.push((key, Some(value)));
    }
    /// Removes `key`.
    pub fn delete(&mut self, key: Vec<u8>) {
        self.ops.push((key, None));
    }
    /// Number of writes in the batch.
    pub fn len(&self) -> usize {
        self.ops.len()
    }
    /// True if the batch holds no write.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
}

/// Key-value pairs in key order, as a prefix scan returns them.
pub type KvPairs = Vec<(Vec<u8>, Vec<u8>)>;

/// A boxed future of a flush.
pub type FlushFuture<'a> = Pin<Box<dyn Future<Output = Result<(), StoreError>> + Send + 'a>>;

/// The store the namespace is kept in.
pub trait MetaStore: Send + Sync {
    /// The value of `key`.
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError>;
    /// Every `(key, value)` whose key starts with `prefix`, in key order.
    fn scan_prefix(&self, prefix: &[u8]) -> Result<KvPairs, StoreError>;
    /// Applies the batch atomically (not yet durable: see [`MetaStore::flush`]) and gives it
    /// the next number of [`MetaStore::clock`].
    fn apply(&self, batch: WriteBatch) -> Result<(), StoreError>;
    /// Makes every write applied before the call durable (fsync), then marks the clock
    /// durable up to the last batch it covered.
    fn flush(&self) -> FlushFuture<'_>;
    /// The commit sequence numbers of this store's batches.
    fn clock(&self) -> &Arc<CommitClock>;
    /// Flushes and releases the store (file lock included); later calls fail with `Closed`.
    fn close(&self) -> Result<(), StoreError>;
}

/// [`MetaStore`] on a sled database.
pub struct SledStore {
    db: Mutex<Option<sled::Db>>,
    path: PathBuf,
    clock: Arc<CommitClock>,
    files: Arc<Mutex<SyncedFiles>>,
}

/// The files of a sled database that the store syncs itself after sled's flush.
#[derive(Debug, Default)]
struct SyncedFiles {
    /// sled's log file (`None` for a temporary store).
    log: Option<File>,
    /// sled's blob directory.
    blobs: Option<PathBuf>,
    /// Blob files already synced (blobs are written once and never modified).
    synced_blobs: HashSet<OsString>,
}

impl SyncedFiles {
    /// Syncs sled's configuration file and the store directory (its entries: log, conf,
    /// blob directory), and opens the log for later syncs.
    fn open(dir: &Path) -> std::io::Result<SyncedFiles> {
        match File::open(dir.join("conf")) {
            Ok(conf) => conf.sync_all()?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        File::open(dir)?.sync_all()?;
        Ok(SyncedFiles {
            log: Some(File::open(dir.join("db"))?),
            blobs: Some(dir.join("blobs")),
            synced_blobs: HashSet::new(),
        })
    }

    /// fdatasync of the log, new blob files and the blob directory.
    fn sync(&mut self) -> std::io::Result<()> {
        if let Some(log) = &self.log {
            log.sync_data()?;
        }
        let Some(blobs) = &self.blobs else {
            return Ok(());
        };
        let entries = match std::fs::read_dir(blobs) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        let mut new_blobs = false;
        for entry in entries {
            let entry = entry?;
            if self.synced_blobs.contains(&entry.file_name()) {
                continue;
            }
            match File::open(entry.path()) {
                Ok(f) => f.sync_data()?,
                // Collected by sled meanwhile.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            }
            self.synced_blobs.insert(entry.file_name());
            new_blobs = true;
        }
        if new_blobs {
            File::open(blobs)?.sync_all()?;
        }
        Ok(())
    }
}

/// Serialises sled batches and flushes across the process (see the module docs).
static SLED_IO: Mutex<()> = Mutex::new(());

fn io_lock() -> MutexGuard<'static, ()> {
    SLED_IO.lock().unwrap_or_else(|e| e.into_inner())
}

/// How long `open` keeps retrying while another handle in this process still holds the lock
/// (sled's thread pool may hold the database for a moment after it was closed).
const LOCK_RETRY: Duration = Duration::from_secs(5);

impl SledStore {
    /// Opens (or creates) the database in `dir`.
    ///
    /// `dir` and every ancestor it creates are made durable in their parents before the store
    /// is used (`dir`'s parent is synced even when `dir` existed: someone may have just made
    /// it): sled never syncs them, so a power cut soon after the first start would remove the
    /// whole store with every acknowledged change. sled's files are synced too (see
    /// [`SyncedFiles::open`]).
    pub fn open(dir: &Path) -> Result<SledStore, StoreError> {
        let created = first_missing(dir);
        let deadline = Instant::now() + LOCK_RETRY;
        loop {
            let res = {
                let _io = io_lock();
                sled::Config::new()
                    .path(dir)
                    .flush_every_ms(None)
                    .cache_capacity(64 * 1024 * 1024)
                    .open()
            };
            match res {
                Ok(db) => {
                    let files = SyncedFiles::open(dir)
                        .map_err(|e| StoreError::Backend(format!("cannot open sled files: {e}")))?;
                    let top = created.as_deref().unwrap_or(dir);
                    sync_new_dirs(dir, top).map_err(|e| {
                        StoreError::Backend(format!(
                            "cannot sync the store directory {} into its parent: {e}",
                            dir.display()
                        ))
                    })?;
                    return Ok(SledStore {
                        db: Mutex::new(Some(db)),
                        path: dir.to_path_buf(),
                        clock: Arc::default(),
                        files: Arc::new(Mutex::new(files)),
                    });
                }
                Err(e) if is_lock_error(&e) && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => return Err(StoreError::Backend(e.to_string())),
            }
        }
    }

    /// A store in a temporary directory removed on close (tests).
    pub fn temporary() -> Result<SledStore, StoreError> {
        let db = sled::Config::new()
            .temporary(true)
            .flush_every_ms(None)
            .open()
            .map_err(|e| StoreError::Backend(e.to_string()))?;
        Ok(SledStore {
            db: Mutex::new(Some(db)),
            path: PathBuf::new(),
            clock: Arc::default(),
            files: Arc::default(),
        })
    }

    /// The directory of the database.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn db(&self) -> Result<sled::Db, StoreError> {
        let guard = self.db.lock().unwrap_or_else(|e| e.into_inner());
        guard.clone().ok_or(StoreError::Closed)
    }
}

/// The topmost missing directory of `dir` and its ancestors (`None`: `dir` exists).
fn first_missing(dir: &Path) -> Option<PathBuf> {
    let mut top = None;
    let mut p = Some(dir);
    while let Some(d) = p.filter(|d| !d.as_os_str().is_empty() && !d.exists()) {
        top = Some(d.to_path_buf());
        p = d.parent();
    }
    top
}

/// fsyncs every directory from `dir` up to the parent of `top` (the topmost one created, or
/// `dir`), so that each new directory's entry is durable in its parent.
fn sync_new_dirs(dir: &Path, top: &Path) -> std::io::Result<()> {
    let mut d = dir;
    loop {
        File::open(d)?.sync_all()?;
        if d == top {
            break;
        }
        match d.parent() {
            Some(p) => d = p,
            None => return Ok(()),
        }
    }
    let parent = match top.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    File::open(parent)?.sync_all()
}

fn is_lock_error(e: &sled::Error) -> bool {
    matches!(e, sled::Error::Io(io) if io.to_string().contains("could not acquire lock"))
}

fn sync_files(files: &Mutex<SyncedFiles>) -> Result<(), StoreError> {
    let mut files = files.lock().unwrap_or_else(|e| e.into_inner());
    files
        .sync()
        .map_err(|e| StoreError::Backend(format!("fdatasync failed: {e}")))
}

fn backend(e: sled::Error) -> StoreError {
    StoreError::Backend(e.to_string())
}

impl MetaStore for SledStore {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.db()?.get(key).map_err(backend)?.map(|v| v.to_vec()))
    }

    fn scan_prefix(&self, prefix: &[u8]) -> Result<KvPairs, StoreError> {
        self.db()?
            .scan_prefix(prefix)
            .map(|kv| kv.map(|(k, v)| (k.to_vec(), v.to_vec())).map_err(backend))
            .collect()
    }

    fn apply(&self, batch: WriteBatch) -> Result<(), StoreError> {
        let mut b = sled::Batch::default();
        for (k, v) in batch.ops {
            match v {
                Some(v) => b.insert(k, v),
                None => b.remove(k),
            }
        }
        let db = self.db()?;
        let _io = io_lock();
        db.apply_batch(b).map_err(backend)?;
        self.clock.next();
        Ok(())
    }

    fn flush(&self) -> FlushFuture<'_> {
        Box::pin(async move {
            let db = self.db()?;
            let target = self.clock.applied();
            let clock = self.clock.clone();
            let files = self.files.clone();
            let flushed = tokio::task::spawn_blocking(move || {
                let _io = io_lock();
                if clock.durable() >= target {
                    return Ok(());
                }
                let covered = clock.applied();
                db.flush().map_err(backend)?;
                sync_files(&files)?;
                clock.mark_durable(covered);
                Ok(())
            })
            .await;
            flushed.map_err(|e| StoreError::Backend(format!("flush task failed: {e}")))?
        })
    }

    fn clock(&self) -> &Arc<CommitClock> {
        &self.clock
    }

    fn close(&self) -> Result<(), StoreError> {
        let db = self.db.lock().unwrap_or_else(|e| e.into_inner()).take();
        match db {
            Some(db) => {
                let _io = io_lock();
                db.flush().map_err(backend)?;
                sync_files(&self.files)
            }
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_scan_and_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open(dir.path()).unwrap();
        let mut b = WriteBatch::new();
        b.put(b"a/2".to_vec(), b"two".to_vec());
        b.put(b"a/1".to_vec(), b"one".to_vec());
        b.put(b"b/1".to_vec(), b"other".to_vec());
        store.apply(b).unwrap();
        let mut b = WriteBatch::new();
        b.delete(b"a/2".to_vec());
        store.apply(b).unwrap();
        store.close().unwrap();
        assert!(matches!(store.get(b"a/1"), Err(StoreError::Closed)));

        let store = SledStore::open(dir.path()).unwrap();
        let rows = store.scan_prefix(b"a/").unwrap();
        assert_eq!(rows, vec![(b"a/1".to_vec(), b"one".to_vec())]);
        assert_eq!(store.get(b"b/1").unwrap(), Some(b"other".to_vec()));
        store.close().unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn flush_syncs_large_values_and_survives_reopen() {
        tokio::time::timeout(Duration::from_secs(30), async {
            let dir = tempfile::tempdir().unwrap();
            let store = SledStore::open(dir.path()).unwrap();
            let big = vec![7u8; 512 * 1024];
            let mut b = WriteBatch::new();
            b.put(b"big".to_vec(), big.clone());
            store.apply(b).unwrap();
            store.flush().await.unwrap();
            // A second flush with nothing new returns without syncing again.
            store.flush().await.unwrap();
            let synced = store.files.lock().unwrap().synced_blobs.len();
            assert!(
                synced >= 1,
                "the large value went to a blob file that was synced"
            );
            store.close().unwrap();
            let store = SledStore::open(dir.path()).unwrap();
            assert_eq!(store.get(b"big").unwrap(), Some(big));
            store.close().unwrap();
        })
        .await
        .unwrap();
    }
}
