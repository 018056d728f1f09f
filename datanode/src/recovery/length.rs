//! The agreed length of a block recovery, HDFS's rules (`BlockRecoveryWorker.syncBlock`), as a
//! pure function of what the locations answered to `InitReplicaRecovery`.
//!
//! 1. Candidates: replicas with a generation stamp not older than the block's and at least one
//!    byte. None (every location answered, none holds data): the block is deleted.
//! 2. The best original state among them wins: Finalized, then Rbw, then Rwr.
//! 3. Finalized: the length is the finalized length; two finalized replicas of different
//!    lengths are an error; participants are the finalized replicas and the Rbw replicas of
//!    exactly that length. Rbw (or Rwr): the length is the **minimum** over the replicas of
//!    that state, which all participate (and are truncated to it).

use sluice_common::proto::ReplicaState;
use sluice_common::{GenerationStamp, NodeId};
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
}

/// Decides the recovery of a block whose generation stamp is `block_gs` from the answers.
pub fn decide(
    block_gs: GenerationStamp,
    answers: &[ReplicaAnswer],
) -> Result<Decision, LengthError> {
    let rank = |s: ReplicaState| match s {
        ReplicaState::Finalized => Some(0),
        ReplicaState::Rbw => Some(1),
        ReplicaState::Rwr => Some(2),
        ReplicaState::Rur | ReplicaState::Temporary => None,
    };
    let cands: Vec<&ReplicaAnswer> = answers
        .iter()
        .filter(|a| a.gen_stamp >= block_gs && a.length > 0 && rank(a.state).is_some())
        .collect();
    let Some(best) = cands.iter().filter_map(|a| rank(a.state)).min() else {
        return Ok(Decision::Delete);
    };
    if best == 0 {
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
        return Ok(Decision::Keep {
            length: first.length,
            participants,
        });
    }
    let participants: Vec<ReplicaAnswer> = cands
        .iter()
        .filter(|a| rank(a.state) == Some(best))
        .map(|a| (*a).clone())
        .collect();
    let length = participants.iter().map(|a| a.length).min().unwrap_or(0);
    Ok(Decision::Keep {
        length,
        participants,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
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

    const GS: GenerationStamp = GenerationStamp(1005);

    #[test]
    fn rbw_replicas_agree_on_their_shortest_length() {
        let d = decide(
            GS,
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
            GS,
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
            GS,
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
        assert_eq!(keep(decide(GS, &both).unwrap()), (900, vec!["b".into()]));
        let rwr = [ans("a", 1005, 700, Rwr), ans("b", 1005, 650, Rwr)];
        assert_eq!(
            keep(decide(GS, &rwr).unwrap()),
            (650, vec!["a".into(), "b".into()])
        );
    }

    #[test]
    fn stale_empty_or_absent_replicas_delete_the_block() {
        assert_eq!(decide(GS, &[]).unwrap(), Decision::Delete);
        let d = decide(
            GS,
            &[
                ans("a", 1004, 5000, Rbw),
                ans("b", 1005, 0, Rbw),
                ans("c", 1005, 0, Finalized),
            ],
        )
        .unwrap();
        assert_eq!(d, Decision::Delete);
        // A stale replica never sets the length.
        let d = decide(GS, &[ans("a", 1004, 5000, Rbw), ans("b", 1005, 10, Rbw)]).unwrap();
        assert_eq!(keep(d), (10, vec!["b".into()]));
    }
}
