//! Block placement: which DataNodes receive a new block's replicas (or join a pipeline).
//!
//! Rules, in order: only Live or Stale DataNodes with room for a whole block, none excluded nor
//! already in the pipeline; Stale ones only when Live ones do not suffice; least used first
//! (fraction of capacity used, in 5 % buckets) and random among near-ties; with two racks or
//! more, HDFS's default rack policy (the 2nd replica on another rack than the 1st, the 3rd on
//! the 2nd's rack), relaxed when the racks cannot satisfy it.

use rand::seq::SliceRandom;
use rand::Rng;
use sluice_common::rpc::NodeState;
use sluice_common::{DatanodeId, MetaError, NodeId};
use std::collections::HashSet;

/// A DataNode as placement sees it.
#[derive(Debug, Clone)]
pub struct Candidate {
    /// Identity, addresses and rack.
    pub id: DatanodeId,
    /// Liveness.
    pub state: NodeState,
    /// Bytes free.
    pub remaining: u64,
    /// Fraction of capacity used (0.0..=1.0).
    pub load: f64,
}

/// What to place.
#[derive(Debug, Clone, Default)]
pub struct PlacementRequest<'a> {
    /// Replicas wanted.
    pub count: usize,
    /// Room each target needs.
    pub block_size: u64,
    /// DataNodes already holding the block (their racks count for the rack policy).
    pub existing: &'a [DatanodeId],
    /// DataNodes not to pick.
    pub exclude: &'a [NodeId],
}

/// Picks `req.count` distinct targets; [`MetaError::NotEnoughDatanodes`] if there are fewer
/// eligible DataNodes.
pub fn choose_targets(
    candidates: &[Candidate],
    req: &PlacementRequest<'_>,
    rng: &mut impl Rng,
) -> Result<Vec<DatanodeId>, MetaError> {
    let excluded: HashSet<&NodeId> = req
        .exclude
        .iter()
        .chain(req.existing.iter().map(|d| &d.node_id))
        .collect();
    let mut eligible: Vec<&Candidate> = candidates
        .iter()
        .filter(|c| c.state != NodeState::Dead)
        .filter(|c| c.remaining >= req.block_size)
        .filter(|c| !excluded.contains(&c.id.node_id))
        .collect();
    if eligible.len() < req.count {
        return Err(MetaError::NotEnoughDatanodes {
            needed: req.count as u32,
            available: eligible.len() as u32,
        });
    }
    eligible.shuffle(rng);
    // Stable sort: random order survives within a bucket.
    eligible.sort_by_key(|c| (c.state == NodeState::Stale, load_bucket(c.load)));
    let racks: HashSet<&str> = eligible
        .iter()
        .map(|c| c.id.rack.as_str())
        .chain(req.existing.iter().map(|d| d.rack.as_str()))
        .collect();
    let multi_rack = racks.len() >= 2;
    let mut chosen: Vec<DatanodeId> = Vec::with_capacity(req.count);
    let mut taken = vec![false; eligible.len()];
    for _ in 0..req.count {
        let placed: Vec<&DatanodeId> = req.existing.iter().chain(chosen.iter()).collect();
        let want = if multi_rack {
            rack_rule(&placed)
        } else {
            RackRule::Any
        };
        let pick = [true, false]
            .into_iter()
            .flat_map(|live| [(live, true), (live, false)])
            .find_map(|(live, strict)| {
                eligible.iter().enumerate().position(|(i, c)| {
                    !taken[i]
                        && (c.state == NodeState::Live) == live
                        && (!strict || want.allows(&c.id.rack))
                })
            });
        let Some(i) = pick else {
            break;
        };
        taken[i] = true;
        chosen.push(eligible[i].id.clone());
    }
    Ok(chosen)
}

/// A DataNode holding a good replica, as the choice of excess replicas sees it.
#[derive(Debug, Clone)]
pub struct Holder {
    /// Identity and rack.
    pub id: DatanodeId,
    /// Bytes free.
    pub remaining: u64,
}

/// Picks `count` replicas to delete from a block that has too many (HDFS's
/// `chooseReplicasToDelete`): keep the rack spread — take from racks holding more than one
/// replica while there are any — and, among those, from the DataNode with the least free space
/// (ties: by id).
pub fn choose_excess(holders: &[Holder], count: usize) -> Vec<NodeId> {
    let mut left: Vec<&Holder> = holders.iter().collect();
    let mut out = Vec::new();
    while out.len() < count && left.len() > 1 {
        let per_rack = |rack: &str| left.iter().filter(|h| h.id.rack == rack).count();
        let crowded = left.iter().any(|h| per_rack(&h.id.rack) > 1);
        let Some(i) = left
            .iter()
            .enumerate()
            .filter(|(_, h)| !crowded || per_rack(&h.id.rack) > 1)
            .min_by(|(_, a), (_, b)| {
                a.remaining
                    .cmp(&b.remaining)
                    .then(a.id.node_id.cmp(&b.id.node_id))
            })
            .map(|(i, _)| i)
        else {
            break;
        };
        out.push(left.remove(i).id.node_id.clone());
    }
    out
}

fn load_bucket(load: f64) -> u32 {
    (load.clamp(0.0, 1.0) * 20.0) as u32
}

/// The rack the next replica should (or should not) go to.
#[derive(Debug, Clone, PartialEq, Eq)]
enum RackRule {
    Any,
    Not(String),
    Same(String),
}

impl RackRule {
    fn allows(&self, rack: &str) -> bool {
        match self {
            RackRule::Any => true,
            RackRule::Not(r) => r != rack,
            RackRule::Same(r) => r == rack,
        }
    }
}

/// HDFS's default: 1st anywhere, 2nd off the 1st's rack, 3rd on the 2nd's rack (or off the
/// 1st's rack if the first two share one), the rest anywhere.
fn rack_rule(placed: &[&DatanodeId]) -> RackRule {
    match placed {
        [] => RackRule::Any,
        [first] => RackRule::Not(first.rack.clone()),
        [first, second] if first.rack == second.rack => RackRule::Not(first.rack.clone()),
        [_, second] => RackRule::Same(second.rack.clone()),
        _ => RackRule::Any,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    fn cand(n: &str, rack: &str, load: f64) -> Candidate {
        Candidate {
            id: DatanodeId {
                node_id: NodeId(n.into()),
                data_addr: format!("{n}:9866"),
                http_addr: format!("{n}:9864"),
                rack: rack.into(),
            },
            state: NodeState::Live,
            remaining: 1 << 30,
            load,
        }
    }

    fn names(v: &[DatanodeId]) -> Vec<&str> {
        v.iter().map(|d| d.node_id.0.as_str()).collect()
    }

    fn req(count: usize) -> PlacementRequest<'static> {
        PlacementRequest {
            count,
            block_size: 1 << 20,
            ..Default::default()
        }
    }

    #[test]
    fn distinct_and_excluded() {
        let cands: Vec<_> = (0..5).map(|i| cand(&format!("n{i}"), "/r", 0.1)).collect();
        let mut rng = StdRng::seed_from_u64(7);
        for _ in 0..50 {
            let exclude = [NodeId("n1".into()), NodeId("n3".into())];
            let r = PlacementRequest {
                exclude: &exclude,
                ..req(3)
            };
            let got = choose_targets(&cands, &r, &mut rng).unwrap();
            let set: HashSet<_> = names(&got).into_iter().collect();
            assert_eq!(set.len(), 3);
            assert!(!set.contains("n1") && !set.contains("n3"));
        }
    }

    #[test]
    fn not_enough_full_dead_or_excluded() {
        let mut cands: Vec<_> = (0..4).map(|i| cand(&format!("n{i}"), "/r", 0.1)).collect();
        cands[0].state = NodeState::Dead;
        cands[1].remaining = 1000;
        let exclude = [NodeId("n2".into())];
        let r = PlacementRequest {
            exclude: &exclude,
            ..req(2)
        };
        let err = choose_targets(&cands, &r, &mut StdRng::seed_from_u64(1)).unwrap_err();
        assert_eq!(
            err,
            MetaError::NotEnoughDatanodes {
                needed: 2,
                available: 1
            }
        );
    }

    #[test]
    fn least_used_first_and_random_among_ties() {
        let cands = vec![
            cand("busy", "/r", 0.9),
            cand("a", "/r", 0.10),
            cand("b", "/r", 0.11),
            cand("mid", "/r", 0.5),
        ];
        let mut rng = StdRng::seed_from_u64(3);
        let mut firsts = HashSet::new();
        for _ in 0..40 {
            let got = choose_targets(&cands, &req(2), &mut rng).unwrap();
            let mut n = names(&got);
            firsts.insert(n[0].to_string());
            n.sort();
            assert_eq!(n, ["a", "b"]);
        }
        assert_eq!(firsts.len(), 2, "near-ties are picked at random");
    }

    #[test]
    fn stale_only_when_live_do_not_suffice() {
        let mut cands = vec![
            cand("s", "/r", 0.0),
            cand("l1", "/r", 0.5),
            cand("l2", "/r", 0.5),
        ];
        cands[0].state = NodeState::Stale;
        let mut rng = StdRng::seed_from_u64(5);
        let got = choose_targets(&cands, &req(2), &mut rng).unwrap();
        assert!(!names(&got).contains(&"s"));
        let got = choose_targets(&cands, &req(3), &mut rng).unwrap();
        assert_eq!(names(&got)[2], "s");
    }

    #[test]
    fn rack_policy_two_racks() {
        let cands = vec![
            cand("a1", "/a", 0.1),
            cand("a2", "/a", 0.1),
            cand("a3", "/a", 0.1),
            cand("b1", "/b", 0.1),
            cand("b2", "/b", 0.1),
        ];
        let rack = |d: &DatanodeId| d.rack.clone();
        let mut rng = StdRng::seed_from_u64(11);
        for _ in 0..50 {
            let got = choose_targets(&cands, &req(3), &mut rng).unwrap();
            assert_ne!(rack(&got[0]), rack(&got[1]));
            assert_eq!(rack(&got[1]), rack(&got[2]));
        }
        // An additional node for a pipeline whose nodes share a rack goes to the other rack.
        let existing = vec![cands[0].id.clone(), cands[1].id.clone()];
        let r = PlacementRequest {
            existing: &existing,
            ..req(1)
        };
        let got = choose_targets(&cands, &r, &mut rng).unwrap();
        assert_eq!(got[0].rack, "/b");
    }

    #[test]
    fn excess_keeps_rack_spread_then_frees_the_fullest() {
        let h = |n: &str, rack: &str, remaining: u64| Holder {
            id: cand(n, rack, 0.0).id,
            remaining,
        };
        // Rack /a holds two replicas: one of them goes, the one with less room.
        let holders = vec![
            h("a1", "/a", 500),
            h("a2", "/a", 900),
            h("b1", "/b", 100),
            h("c1", "/c", 50),
        ];
        assert_eq!(choose_excess(&holders, 1), vec![NodeId("a1".into())]);
        // Two to go: after a1, every rack holds one; the fullest of the rest goes.
        assert_eq!(
            choose_excess(&holders, 2),
            vec![NodeId("a1".into()), NodeId("c1".into())]
        );
        // One rack: least room first; never the last replica.
        let one_rack = vec![h("x", "/r", 10), h("y", "/r", 5)];
        assert_eq!(choose_excess(&one_rack, 5), vec![NodeId("y".into())]);
    }

    #[test]
    fn rack_policy_relaxes_when_racks_cannot_satisfy_it() {
        // One node on rack b: the 3rd replica cannot share the 2nd's rack.
        let cands = vec![
            cand("a1", "/a", 0.1),
            cand("a2", "/a", 0.1),
            cand("b1", "/b", 0.1),
        ];
        let got = choose_targets(&cands, &req(3), &mut StdRng::seed_from_u64(2)).unwrap();
        assert_eq!(got.len(), 3);
        let racks: HashSet<_> = got.iter().map(|d| d.rack.as_str()).collect();
        assert_eq!(racks.len(), 2);
    }
}
