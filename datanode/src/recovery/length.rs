//! The agreed length of a block recovery, HDFS's rules (`BlockRecoveryWorker.syncBlock`), as a
//! pure function of what the locations answered to `InitReplicaRecovery`, with the
//! acknowledged length as a floor.
//!
//! 1. Candidates: replicas with a generation stamp not older than the block's, at least one
//!    byte, and at least the block's length as the metadata service knows it (what the writer
//!    hsynced: acknowledged by every replica, so a replica holding less lost acknowledged
//!    bytes and cannot set the length). None: if the metadata service knows no byte and every
//!    location answered, the block is deleted; if it knows bytes, the recovery fails
//!    ([`LengthError::BelowAcknowledged`]) rather than cut them.
//! 2. The best original state among them wins: Finalized, then Rbw, then Rwr.
//! 3. Finalized: the length is the finalized length; two finalized replicas of different
//!    lengths are an error; participants are the finalized replicas and the Rbw replicas of
//!    exactly that length. Rbw: the length is the **minimum** over the Rbw replicas, which all
//!    participate (and are truncated to it): a running DataNode's replica holds every byte it
//!    received, hence every acknowledged one (a buffering writer flushes when it is stopped).
//!    Rwr: the length is the **maximum** over the Rwr replicas and only those that long take
//!    part: after a restart a replica may have lost bytes it had acknowledged (a buffering
//!    DataNode killed with hflushed bytes in memory), so a shorter Rwr replica is excluded
//!    when there are longer ones; every byte of the longest one verified against its
//!    checksums at the start-up scan, and every acknowledged byte is on it (a DataNode that
//!    writes before it acks keeps what it wrote across a kill).

use sluice_common::proto::ReplicaState;
use sluice_common::{ExtendedBlock, GenerationStamp, NodeId};
use thiserror::Error;

/// One location's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaAnswer {
    /// The DataNode.
    pub node: NodeId,
    /// Its replica's generation stamp.
    pub gen_stamp: GenerationStamp,
    /// Its replica's length (bytes on disk; the final length if finalized).
    pub length: u64,
    /// Its replica's state before recovery.
    pub state: ReplicaState,
}

/// What the recovery does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// No replica holds any byte: remove the block.
    Delete,
    /// Bring `participants` to `length` under the recovery id.
    Keep {
        /// The agreed length.
        length: u64,
        /// The replicas that take part (they are truncated and finalized).
        participants: Vec<ReplicaAnswer>,
    },
}

/// Answers that cannot be reconciled.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum LengthError {
    /// HDFS's "Inconsistent size of finalized replicas".
    #[error("inconsistent finalized replicas: {a} holds {a_len} bytes, {b} holds {b_len}")]
    InconsistentFinalized {
        /// One DataNode.
        a: NodeId,
        /// Its length.
        a_len: u64,
        /// Another.
        b: NodeId,
        /// Its length.
        b_len: u64,
    },
    /// Every replica is shorter than what the metadata service knows was acknowledged.
    #[error("no replica holds the {acked} acknowledged bytes (the longest holds {longest})")]
    BelowAcknowledged {
        /// The block's length as the metadata service knows it.
        acked: u64,
        /// The longest replica answered.
        longest: u64,
    },
}

/// Decides the recovery of `block` (generation stamp and acknowledged length as the metadata
/// service knows them) from the answers.
pub fn decide(block: ExtendedBlock, answers: &[ReplicaAnswer]) -> Result<Decision, LengthError> {
    let rank = |s: ReplicaState| match s {
        ReplicaState::Finalized => Some(0),
        ReplicaState::Rbw => Some(1),
        ReplicaState::Rwr => Some(2),
        ReplicaState::Rur | ReplicaState::Temporary => None,
    };
    let current: Vec<&ReplicaAnswer> = answers
        .iter()
        .filter(|a| a.gen_stamp >= block.gen_stamp && rank(a.state).is_some())
        .collect();
    let cands: Vec<&ReplicaAnswer> = current
        .iter()
        .copied()
        .filter(|a| a.length > 0 && a.length >= block.num_bytes)
        .collect();
    let Some(best) = cands.iter().filter_map(|a| rank(a.state)).min() else {
        if block.num_bytes == 0 {
            return Ok(Decision::Delete);
        }
        return Err(LengthError::BelowAcknowledged {
            acked: block.num_bytes,
            longest: current.iter().map(|a| a.length).max().unwrap_or(0),
        });
    };
    if best == 0 {
        return finalized(&cands);
    }
    let same: Vec<&ReplicaAnswer> = cands
        .iter()
        .copied()
        .filter(|a| rank(a.state) == Some(best))
        .collect();
    let lengths = same.iter().map(|a| a.length);
    let length = if best == 1 {
        lengths.min()
    } else {
        lengths.max()
    }
    .unwrap_or(0);
    let participants = same
        .into_iter()
        .filter(|a| a.length >= length)
        .cloned()
        .collect();
    Ok(Decision::Keep {
        length,
        participants,
    })
}

/// Rule 3 when a finalized replica is among the candidates.
fn finalized(cands: &[&ReplicaAnswer]) -> Result<Decision, LengthError> {
    let fin: Vec<&&ReplicaAnswer> = cands
        .iter()
        .filter(|a| a.state == ReplicaState::Finalized)
        .collect();
    let first = fin[0];
    if let Some(other) = fin.iter().find(|a| a.length != first.length) {
        return Err(LengthError::InconsistentFinalized {
            a: first.node.clone(),
            a_len: first.length,
            b: other.node.clone(),
            b_len: other.length,
        });
    }
    let participants = cands
        .iter()
        .filter(|a| {
            a.state == ReplicaState::Finalized
                || (a.state == ReplicaState::Rbw && a.length == first.length)
        })
        .map(|a| (*a).clone())
        .collect();
    Ok(Decision::Keep {
        length: first.length,
        participants,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_common::BlockId;
    use ReplicaState::*;

    fn ans(n: &str, gs: u64, length: u64, state: ReplicaState) -> ReplicaAnswer {
        ReplicaAnswer {
            node: NodeId(n.into()),
            gen_stamp: GenerationStamp(gs),
            length,
            state,
        }
    }

    fn keep(d: Decision) -> (u64, Vec<String>) {
        match d {
            Decision::Keep {
                length,
                participants,
            } => (length, participants.into_iter().map(|a| a.node.0).collect()),
            Decision::Delete => panic!("expected Keep"),
        }
    }

    /// The block as the metadata service knows it: stamp 1005, `acked` bytes hsynced.
    fn blk(acked: u64) -> ExtendedBlock {
        ExtendedBlock::new(BlockId(1), GenerationStamp(1005), acked)
    }

    #[test]
    fn rbw_replicas_agree_on_their_shortest_length() {
        let d = decide(
            blk(0),
            &[
                ans("a", 1005, 3000, Rbw),
                ans("b", 1005, 2048, Rbw),
                ans("c", 1006, 2500, Rbw),
            ],
        )
        .unwrap();
        assert_eq!(keep(d), (2048, vec!["a".into(), "b".into(), "c".into()]));
    }

    #[test]
    fn a_finalized_length_wins_and_only_matching_rbw_join() {
        let d = decide(
            blk(0),
            &[
                ans("a", 1005, 900, Rbw),
                ans("b", 1005, 1000, Finalized),
                ans("c", 1005, 1000, Rbw),
                ans("d", 1005, 5000, Rwr),
            ],
        )
        .unwrap();
        assert_eq!(keep(d), (1000, vec!["b".into(), "c".into()]));
    }

    #[test]
    fn two_finalized_lengths_are_an_error() {
        let err = decide(
            blk(0),
            &[
                ans("a", 1005, 1000, Finalized),
                ans("b", 1005, 999, Finalized),
            ],
        )
        .unwrap_err();
        assert!(matches!(
            err,
            LengthError::InconsistentFinalized {
                a_len: 1000,
                b_len: 999,
                ..
            }
        ));
    }

    #[test]
    fn rwr_replicas_take_part_only_when_nothing_better_exists() {
        let both = [ans("a", 1005, 700, Rwr), ans("b", 1005, 900, Rbw)];
        assert_eq!(
            keep(decide(blk(0), &both).unwrap()),
            (900, vec!["b".into()])
        );
        let rwr = [
            ans("a", 1005, 700, Rwr),
            ans("b", 1005, 650, Rwr),
            ans("c", 1005, 700, Rwr),
        ];
        assert_eq!(
            keep(decide(blk(0), &rwr).unwrap()),
            (700, vec!["a".into(), "c".into()]),
            "the longest Rwr replicas: a shorter one may have lost acknowledged bytes"
        );
    }

    #[test]
    fn a_restarted_buffering_replica_short_of_its_hflushed_bytes_does_not_cut_the_others() {
        // Last DataNode killed with 0.5 MiB of hflushed bytes in its buffer, all restarted.
        let (full, flushed) = (1_573_864, 1_048_576);
        let d = decide(
            blk(0),
            &[
                ans("first", 1005, full, Rwr),
                ans("middle", 1005, full, Rwr),
                ans("last", 1005, flushed, Rwr),
            ],
        )
        .unwrap();
        assert_eq!(keep(d), (full, vec!["first".into(), "middle".into()]));
    }

    #[test]
    fn the_acknowledged_length_is_the_floor() {
        let d = decide(
            blk(1000),
            &[ans("a", 1005, 900, Rbw), ans("b", 1005, 1200, Rbw)],
        )
        .unwrap();
        assert_eq!(keep(d), (1200, vec!["b".into()]), "a lost acked bytes");
        let err = decide(blk(1000), &[ans("a", 1005, 900, Rbw)]).unwrap_err();
        assert_eq!(
            err,
            LengthError::BelowAcknowledged {
                acked: 1000,
                longest: 900
            }
        );
        // Acknowledged bytes are never deleted, even when no replica shows any.
        let err = decide(blk(1000), &[ans("a", 1005, 0, Rwr)]).unwrap_err();
        assert!(
            matches!(err, LengthError::BelowAcknowledged { .. }),
            "{err}"
        );
    }

    #[test]
    fn stale_empty_or_absent_replicas_delete_the_block() {
        assert_eq!(decide(blk(0), &[]).unwrap(), Decision::Delete);
        let d = decide(
            blk(0),
            &[
                ans("a", 1004, 5000, Rbw),
                ans("b", 1005, 0, Rbw),
                ans("c", 1005, 0, Finalized),
            ],
        )
        .unwrap();
        assert_eq!(d, Decision::Delete);
        // A stale replica never sets the length.
        let d = decide(
            blk(0),
            &[ans("a", 1004, 5000, Rbw), ans("b", 1005, 10, Rbw)],
        )
        .unwrap();
        assert_eq!(keep(d), (10, vec!["b".into()]));
    }
}
