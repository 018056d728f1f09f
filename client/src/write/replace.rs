//! The two decisions of pipeline recovery that need no I/O (plain logic):
//!
//! - [`ReplaceRule`]: whether a failed DataNode is replaced by a new one (HDFS
//!   `ReplaceDatanodeOnFailure.satisfy`), from `client.write.replace-datanode-on-failure.*`;
//! - [`RecoveryBudget`]: when a packet that keeps failing fails the write (HDFS's limit of 5
//!   recoveries without progress).

use sluice_common::config::{ClientConfig, ReplacePolicy};
use sluice_common::BlockId;

/// Recoveries allowed for one packet (HDFS `DataStreamer`'s 5).
pub(crate) const MAX_RECOVERIES_PER_PACKET: u32 = 5;

/// When to add a replacement DataNode to a pipeline that lost one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReplaceRule {
    /// `write.replace-datanode-on-failure.enable`; `false` is HDFS's `DISABLE` (never replace).
    pub enabled: bool,
    /// `write.replace-datanode-on-failure.policy`.
    pub policy: ReplacePolicy,
    /// `write.replace-datanode-on-failure.best-effort`: go on without a replacement when none
    /// can be added.
    pub best_effort: bool,
}

impl ReplaceRule {
    /// The rule configured in `cfg`.
    pub(crate) fn from_config(cfg: &ClientConfig) -> ReplaceRule {
        ReplaceRule {
            enabled: cfg.replace_enable,
            policy: cfg.replace_policy,
            best_effort: cfg.replace_best_effort,
        }
    }

    /// Whether a pipeline of a file with `replication` replicas, left with `survivors`
    /// DataNodes, gets a replacement. `hflushed`: the writer has hflushed (or hsynced) the file,
    /// so readers may be reading the block being written.
    ///
    /// Never when no DataNode survives or enough do; `ALWAYS`: yes; `NEVER` (or disabled): no;
    /// `DEFAULT`: when `replication >= 3` and at most half survive, or after an hflush.
    pub(crate) fn satisfy(&self, replication: u16, survivors: usize, hflushed: bool) -> bool {
        let r = usize::from(replication);
        if !self.enabled || survivors == 0 || survivors >= r {
            return false;
        }
        match self.policy {
            ReplacePolicy::Never => false,
            ReplacePolicy::Always => true,
            ReplacePolicy::Default => r >= 3 && (survivors <= r / 2 || hflushed),
        }
    }

    /// The policy's name, for errors.
    pub(crate) fn policy_name(&self) -> &'static str {
        if !self.enabled {
            return "DISABLED";
        }
        match self.policy {
            ReplacePolicy::Default => "DEFAULT",
            ReplacePolicy::Always => "ALWAYS",
            ReplacePolicy::Never => "NEVER",
        }
    }
}

/// Counts recoveries of the same packet: a failure with no packet acknowledged since the
/// previous failure (of the same block) is another recovery of the same packet.
#[derive(Debug, Default)]
pub(crate) struct RecoveryBudget {
    /// Block and acknowledged-packet count at the last failure.
    mark: Option<(BlockId, u64)>,
    count: u32,
}

impl RecoveryBudget {
    /// Records a failure of `block` after `acked_packets` packets of it were acknowledged.
    /// Returns the number of recoveries of this packet including this one, or `Err` with that
    /// number once it exceeds [`MAX_RECOVERIES_PER_PACKET`].
    pub(crate) fn on_failure(&mut self, block: BlockId, acked_packets: u64) -> Result<u32, u32> {
        if self.mark == Some((block, acked_packets)) {
            self.count += 1;
        } else {
            self.mark = Some((block, acked_packets));
            self.count = 1;
        }
        if self.count > MAX_RECOVERIES_PER_PACKET {
            Err(self.count)
        } else {
            Ok(self.count)
        }
    }

    /// Recoveries tried for the current packet.
    pub(crate) fn tried(&self) -> u32 {
        self.count.saturating_sub(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(policy: ReplacePolicy) -> ReplaceRule {
        ReplaceRule {
            enabled: true,
            policy,
            best_effort: false,
        }
    }

    #[test]
    fn default_policy_follows_hdfs() {
        let r = rule(ReplacePolicy::Default);
        // Replication 3: losing one of three is tolerated unless hflushed.
        assert!(!r.satisfy(3, 2, false));
        assert!(r.satisfy(3, 2, true));
        // Down to one: always replace.
        assert!(r.satisfy(3, 1, false));
        // Nothing left, or nothing lost: never.
        assert!(!r.satisfy(3, 0, true));
        assert!(!r.satisfy(3, 3, true));
        // Replication below 3: never, even after hflush.
        assert!(!r.satisfy(2, 1, true));
        // Replication 5: replace at two survivors, not at three (unless hflushed).
        assert!(r.satisfy(5, 2, false));
        assert!(!r.satisfy(5, 3, false));
        assert!(r.satisfy(5, 3, true));
    }

    #[test]
    fn always_never_and_disabled() {
        assert!(rule(ReplacePolicy::Always).satisfy(2, 1, false));
        assert!(!rule(ReplacePolicy::Always).satisfy(2, 2, false));
        assert!(!rule(ReplacePolicy::Never).satisfy(3, 1, true));
        let mut off = rule(ReplacePolicy::Always);
        off.enabled = false;
        assert!(!off.satisfy(3, 1, true));
        assert_eq!(off.policy_name(), "DISABLED");
    }

    #[test]
    fn budget_counts_failures_without_progress() {
        let mut b = RecoveryBudget::default();
        let blk = BlockId(1);
        for n in 1..=MAX_RECOVERIES_PER_PACKET {
            assert_eq!(b.on_failure(blk, 4), Ok(n));
        }
        assert_eq!(b.on_failure(blk, 4), Err(6));
        assert_eq!(b.tried(), 5);
        // Progress (a packet acknowledged) starts the count again, so does a new block.
        assert_eq!(b.on_failure(blk, 5), Ok(1));
        assert_eq!(b.on_failure(blk, 5), Ok(2));
        assert_eq!(b.on_failure(BlockId(2), 5), Ok(1));
    }
}
