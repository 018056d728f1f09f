//! Commit sequence numbers. Every batch applied to the store gets the next number; a flush
//! makes every batch up to a number durable. What a change implies outside the service
//! (replica deletions, block recoveries for DataNodes) is held with a number no smaller than
//! the change's and released only once that number is durable, as HDFS deletes replicas only
//! after `logSync`.
//!
//! A failed flush leaves the store in an unknown state (the batches may or may not be on
//! disk), so the clock is marked failed: nothing held is released any more and the service
//! stops (see `docs/metadata.md`, "Durability").

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// A held command not yet given its number (see [`CommitClock::seal`]).
pub const UNSEALED: u64 = u64::MAX;

/// The applied and durable commit sequence numbers of one store.
#[derive(Debug, Default)]
pub struct CommitClock {
    applied: AtomicU64,
    durable: AtomicU64,
    failed: AtomicBool,
}

impl CommitClock {
    /// A clock at zero (nothing applied, nothing to make durable).
    pub fn new() -> Self {
        Self::default()
    }

    /// The number of the last batch applied.
    pub fn applied(&self) -> u64 {
        self.applied.load(Ordering::SeqCst)
    }

    /// Every batch up to this number is durable.
    pub fn durable(&self) -> u64 {
        self.durable.load(Ordering::SeqCst)
    }

    /// Gives the next batch its number (the store calls this once the batch is applied).
    pub fn next(&self) -> u64 {
        self.applied.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// Records that a flush made every batch up to `seq` durable. Ignored once failed.
    pub fn mark_durable(&self, seq: u64) {
        if !self.failed() {
            self.durable.fetch_max(seq, Ordering::SeqCst);
        }
    }

    /// Records a failed flush: from now on nothing is released.
    pub fn fail(&self) {
        self.failed.store(true, Ordering::SeqCst);
    }

    /// True once a flush failed.
    pub fn failed(&self) -> bool {
        self.failed.load(Ordering::SeqCst)
    }

    /// The number a command queued now, by a change that already applied its batches, is
    /// held with. Every change holds the state lock from its first batch to its last, so the
    /// number read at any later moment covers it: commands are queued [`UNSEALED`] and sealed
    /// with this when they are next looked at.
    pub fn seal(&self) -> u64 {
        self.applied()
    }

    /// True if a command held with `seq` may leave the service.
    pub fn releases(&self, seq: u64) -> bool {
        seq != UNSEALED && seq <= self.durable() && !self.failed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn releases_only_what_is_durable_and_nothing_after_a_failure() {
        let c = CommitClock::new();
        assert!(c.releases(0));
        assert!(!c.releases(UNSEALED));
        assert_eq!(c.next(), 1);
        assert_eq!(c.next(), 2);
        assert_eq!(c.seal(), 2);
        assert!(!c.releases(1));
        c.mark_durable(1);
        assert!(c.releases(1) && !c.releases(2));
        c.fail();
        c.mark_durable(2);
        assert_eq!(c.durable(), 1);
        assert!(!c.releases(1), "nothing leaves after a failed flush");
    }
}
