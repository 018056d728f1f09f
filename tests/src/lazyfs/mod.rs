//! A file system that loses what was not synced, as a power cut would (after LazyFS).
//!
//! [`LazyFs`] mounts a FUSE pass-through over a backing directory. Writes to a file stay in
//! memory until the file is `fsync`ed or `fdatasync`ed; creates, unlinks, rmdirs and renames
//! reach the backing directory at once but are undone by a crash until the directory that
//! holds the entry is `fsync`ed (see `journal` for the exact rule). Reads see everything, as
//! through the page cache. [`LazyFs::crash`] is the power cut: every operation fails with
//! `EIO` from then on, and the backing directory is left exactly as the durable state;
//! [`LazyFs::power_on`] serves again, so a node restarted on the same paths finds what a
//! machine would find after rebooting.
//!
//! Unlike LazyFS, directory entries are lazy too (LazyFS cannot catch a missing directory
//! fsync). Not modelled: torn writes (a crash keeps a file's writes since its last sync all or
//! nothing), reordering between files, metadata such as permissions and times (applied at
//! once), hard and symbolic links (refused), and the backing file system's own durability
//! (the backing directory is never fsynced: it stands for the disk, and only the mount
//! crashes).
//!
//! Needs `/dev/fuse` and `fusermount3` (Debian `fuse3`, for the automatic unmount when the
//! test process dies). The mount is served by a thread of the test process; dropping the
//! [`LazyFs`] unmounts it, also when a test panics.

mod fuse;
mod journal;
mod namespace;
mod pending;
mod state;
mod tree;

pub use state::{Lost, Unsynced};

use fuser::{BackgroundSession, Config, MountOption, SessionACL};
use state::State;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// A mounted lazyfs. See the module docs.
pub struct LazyFs {
    state: Arc<Mutex<State>>,
    session: Option<BackgroundSession>,
    mountpoint: PathBuf,
    backing: PathBuf,
}

impl LazyFs {
    /// Mounts a lazyfs over `dir/backing` at `dir/mnt` (both created), keeping removed entries
    /// in `dir/trash` until they are durable. Everything already in the backing directory is
    /// durable.
    pub fn mount_in(dir: &Path) -> io::Result<LazyFs> {
        let backing = dir.join("backing");
        let trash = dir.join("trash");
        let mountpoint = dir.join("mnt");
        for d in [&backing, &trash, &mountpoint] {
            std::fs::create_dir_all(d)?;
        }
        let state = Arc::new(Mutex::new(State::new(backing.clone(), trash)));
        let fs = fuse::LazyFuse {
            state: state.clone(),
        };
        let mut config = Config::default();
        config.mount_options = vec![
            MountOption::FSName("lazyfs".into()),
            MountOption::AutoUnmount,
            MountOption::NoAtime,
        ];
        // auto_unmount needs allow_other, which root may use without user_allow_other.
        config.acl = SessionACL::All;
        config.n_threads = Some(1);
        let session = fuser::spawn_mount(fs, &mountpoint, &config)?;
        let lazy = LazyFs {
            state,
            session: Some(session),
            mountpoint,
            backing,
        };
        lazy.wait_mounted(true)?;
        Ok(lazy)
    }

    /// Where the file system is mounted.
    pub fn path(&self) -> &Path {
        &self.mountpoint
    }

    /// The backing directory: after [`LazyFs::crash`], exactly what survived.
    pub fn backing(&self) -> &Path {
        &self.backing
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The power cut: unsynced writes and directory changes are gone, and every operation
    /// fails with `EIO` until [`LazyFs::power_on`]. Returns what was thrown away.
    pub fn crash(&self) -> Lost {
        let lost = self.state().crash();
        tracing::info!(mount = %self.mountpoint.display(), ?lost, "lazyfs: power cut");
        lost
    }

    /// Serves operations again after [`LazyFs::crash`], from the durable state. Handles
    /// opened before the crash stay dead.
    pub fn power_on(&self) {
        self.state().power_on();
    }

    /// Makes everything durable, as `sync(1)` would.
    pub fn sync(&self) -> io::Result<()> {
        self.state().sync_all()
    }

    /// What a crash would throw away now.
    pub fn unsynced(&self) -> Unsynced {
        self.state().unsynced()
    }

    /// Waits (up to 10 s) until the mount point is (or is no longer) a mount.
    fn wait_mounted(&self, mounted: bool) -> io::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if is_mount(&self.mountpoint) == mounted {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(io::Error::other(format!(
                    "{} still {} after 10 s",
                    self.mountpoint.display(),
                    if mounted { "not mounted" } else { "mounted" }
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// True if `p` is on another device than its parent (a mount point).
fn is_mount(p: &Path) -> bool {
    let dev = |p: &Path| std::fs::metadata(p).map(|m| m.dev());
    match (dev(p), p.parent().map(dev)) {
        (Ok(a), Some(Ok(b))) => a != b,
        // An aborted FUSE mount answers ENOTCONN: still mounted.
        (Err(_), _) => true,
        _ => false,
    }
}

impl Drop for LazyFs {
    fn drop(&mut self) {
        // Power back on so that the unmount's last requests are answered.
        self.power_on();
        drop(self.session.take());
        // fusermount3's auto_unmount is there for a test process that dies; here, detach the
        // mount at once (as root).
        if let Err(e) = nix::mount::umount2(&self.mountpoint, nix::mount::MntFlags::MNT_DETACH) {
            tracing::debug!("lazyfs: umount2: {e}");
        }
        if let Err(e) = self.wait_mounted(false) {
            tracing::warn!("lazyfs: unmount: {e}");
        }
    }
}
