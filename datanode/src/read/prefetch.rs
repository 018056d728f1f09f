//! DataNode-side prefetch for streaming reads: tell the kernel what comes next
//! (`posix_fadvise(WILLNEED)` over the next `read.prefetch.bytes`), and, for reads longer than
//! `read.ahead.cache.bytes.threshold`, drop the pages behind the reader
//! (`posix_fadvise(DONTNEED)`) so that one streaming reader does not push hot data out of the
//! page cache.
//!
//! As HDFS's `ReadaheadPool` does, WILLNEED is issued in large steps — a new window once the
//! reader has passed half of the last one — and off the reading thread (on the blocking pool),
//! because the kernel allocates the pages and queues their reads inside the `posix_fadvise`
//! call, and the reader should not wait for that. Drop-behind goes in steps of a piece, inline.
//! Failures of advice are ignored: it is a hint, never a correctness matter.
//!
//! With `read.prefetch.fadvise = "auto"` the advice is dropped when the device under the
//! replica already reads ahead at least the prefetch window by itself (`read_ahead_kb`): the
//! kernel then fetches that far on its own, and on the benchmark machine (8 MiB device
//! read-ahead) the advice on top made cold streaming reads ~40% slower.

use crate::metrics::Metrics;
use crate::sys::{fadvise, Advice};
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;

/// Prefetch and drop-behind state of one streaming read.
#[derive(Debug, Clone)]
pub struct Prefetcher {
    window: u64,
    advise_step: u64,
    drop_step: u64,
    drop_behind: bool,
    /// Decide on the first read whether the device's own read-ahead makes advice useless.
    auto: bool,
    advised_to: u64,
    dropped_to: u64,
    end: u64,
}

impl Prefetcher {
    /// For a read of `[start, end)`: advise `window` bytes ahead (0: off) in steps of at least
    /// `step` and half the window; drop pages behind in steps of `step` when the read is longer
    /// than `drop_threshold`.
    pub fn new(start: u64, end: u64, window: u64, step: u64, drop_threshold: u64) -> Self {
        Prefetcher {
            window,
            advise_step: step.max(window / 2).max(1),
            drop_step: step.max(1),
            drop_behind: end - start > drop_threshold,
            auto: false,
            advised_to: start,
            dropped_to: start,
            end,
        }
    }

    /// Advice only where the device does not read ahead the window by itself (`"auto"`): the
    /// first read looks at the device and drops the advice if it does.
    pub fn auto(mut self) -> Self {
        self.auto = true;
        self
    }

    /// For a read whose range ends before the replica does: the kernel's own read-ahead is
    /// off for it (it would read past the range), so `"auto"` keeps the advice — bounded by
    /// the range — instead of leaving the read-ahead to the device.
    pub fn within_range(mut self) -> Self {
        self.auto = false;
        self
    }

    /// Settles `"auto"` given the device's own read-ahead in bytes (`None`: unknown, advise).
    pub fn settle_auto(&mut self, device_read_ahead: Option<u64>) {
        if std::mem::take(&mut self.auto) && device_read_ahead.is_some_and(|ra| ra >= self.window) {
            self.window = 0;
        }
    }

    /// The range to advise WILLNEED before reading at `pos`, if one is due.
    pub fn ahead(&mut self, pos: u64) -> Option<(u64, u64)> {
        if self.window == 0 {
            return None;
        }
        let want = (pos + self.window).min(self.end);
        if want <= self.advised_to || (want - self.advised_to < self.advise_step && want < self.end)
        {
            return None;
        }
        let from = self.advised_to.max(pos);
        self.advised_to = want;
        Some((from, want - from))
    }

    /// The range to advise DONTNEED after everything before `pos` was read, if one is due.
    pub fn behind(&mut self, pos: u64) -> Option<(u64, u64)> {
        if !self.drop_behind || pos <= self.dropped_to {
            return None;
        }
        if pos - self.dropped_to < self.drop_step && pos < self.end {
            return None;
        }
        let from = self.dropped_to;
        self.dropped_to = pos;
        Some((from, pos - from))
    }

    /// Issues the advice due before reading at `pos`: on the blocking pool when called inside
    /// a tokio runtime (the reader does not wait for the kernel to queue the reads), else inline.
    pub fn before_read(&mut self, file: &Arc<File>, pos: u64, metrics: &Metrics) {
        if self.auto && self.window > 0 {
            self.settle_auto(device_read_ahead(file));
        }
        let Some((off, len)) = self.ahead(pos) else {
            return;
        };
        metrics.prefetch_advised_bytes.add(len);
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                let file = Arc::clone(file);
                drop(rt.spawn_blocking(move || fadvise(&file, off, len, Advice::WillNeed)));
            }
            Err(_) => fadvise(file, off, len, Advice::WillNeed),
        }
    }

    /// Issues the advice due once everything before `pos` was read.
    pub fn after_read(&mut self, file: &File, pos: u64, metrics: &Metrics) {
        if let Some((off, len)) = self.behind(pos) {
            fadvise(file, off, len, Advice::DontNeed);
            metrics.dropbehind_bytes.add(len);
        }
    }
}

/// The read-ahead of the block device holding `file`, in bytes, from
/// `/sys/dev/block/<major>:<minor>` (a partition's is its disk's); `None` when unknown.
pub fn device_read_ahead(file: &File) -> Option<u64> {
    let dev = file.metadata().ok()?.dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    if major == 0 {
        return None; // not a block device (tmpfs, overlay...)
    }
    let real = std::fs::canonicalize(format!("/sys/dev/block/{major}:{minor}")).ok()?;
    [
        real.join("queue/read_ahead_kb"),
        real.join("../queue/read_ahead_kb"),
    ]
    .iter()
    .find_map(|p| std::fs::read_to_string(p).ok())
    .and_then(|s| s.trim().parse::<u64>().ok())
    .map(|kb| kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advises_ahead_in_steps_and_drops_behind_long_reads() {
        let mb = 1 << 20;
        let mut p = Prefetcher::new(0, 10 * mb, 4 * mb, mb, 256 * 1024);
        assert_eq!(p.ahead(0), Some((0, 4 * mb)));
        assert_eq!(p.ahead(mb), None, "less than half a window new");
        assert_eq!(
            p.ahead(2 * mb),
            Some((4 * mb, 2 * mb)),
            "half a window at once"
        );
        assert_eq!(
            p.ahead(9 * mb),
            Some((9 * mb, mb)),
            "from the reader on, clamped to the end"
        );
        assert_eq!(p.ahead(10 * mb), None);
        assert_eq!(p.behind(mb), Some((0, mb)), "drop-behind goes by piece");
        assert_eq!(p.behind(mb + 10), None);
        let mut small = Prefetcher::new(0, 10 * mb, mb, mb, 0);
        assert_eq!(small.ahead(0), Some((0, mb)));
        assert_eq!(
            small.ahead(mb),
            Some((mb, mb)),
            "never less than a piece per step"
        );
        let mut auto = Prefetcher::new(0, 10 * mb, 8 * mb, mb, 0).auto();
        auto.settle_auto(Some(8 * mb));
        assert_eq!(auto.ahead(0), None, "the device reads ahead 8 MiB itself");
        let mut auto = Prefetcher::new(0, 10 * mb, 8 * mb, mb, 0).auto();
        auto.settle_auto(Some(128 * 1024));
        assert_eq!(
            auto.ahead(0),
            Some((0, 8 * mb)),
            "a small device read-ahead: advise"
        );
        let mut ranged = Prefetcher::new(0, 4 * mb, 8 * mb, mb, 0)
            .auto()
            .within_range();
        ranged.settle_auto(Some(8 * mb));
        assert_eq!(
            ranged.ahead(0),
            Some((0, 4 * mb)),
            "a ranged read (kernel read-ahead off) advises its range, however the device reads ahead"
        );
        let mut auto = Prefetcher::new(0, 10 * mb, 8 * mb, mb, 0).auto();
        auto.settle_auto(None);
        assert!(auto.ahead(0).is_some(), "unknown device: advise");
        let f = tempfile::tempfile().unwrap();
        let _ = device_read_ahead(&f); // whatever the machine, no panic
        let mut short = Prefetcher::new(0, 1000, 0, 512, 256 * 1024);
        assert_eq!(short.ahead(0), None, "window 0 turns prefetch off");
        assert_eq!(short.behind(1000), None, "short reads keep their pages");
    }
}
