//! The DataNode registry: identity, addresses, space, last heartbeat and liveness of every
//! DataNode that registered since the service started.
//!
//! Liveness is a small state machine driven by [`DatanodeRegistry::check_liveness`], a plain
//! method taking `now` (the monitor task is a thin shell around it):
//!
//! ```text
//!   register/heartbeat          no heartbeat for stale.interval        for dead.interval
//!  ───────────────────> Live ─────────────────────────────> Stale ─────────────────> Dead
//!                        ^  <─────── heartbeat ───────────────┘                       │
//!                        └──────────────────── register (after Reregister) ──────────┘
//! ```

use sluice_common::rpc::{DatanodeRegistration, Heartbeat, NodeState};
use sluice_common::{DatanodeId, NodeId};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// What the registry knows of one DataNode.
#[derive(Debug, Clone)]
pub struct Descriptor {
    /// Identity and advertised addresses.
    pub id: DatanodeId,
    /// Total bytes.
    pub capacity: u64,
    /// Bytes used.
    pub used: u64,
    /// Bytes free.
    pub remaining: u64,
    /// Data-transfer connections being served.
    pub active_transfers: u32,
    /// Write pipelines being served (last heartbeat).
    pub active_pipelines: u32,
    /// Replicas being written through a write-memory buffer (last heartbeat).
    pub buffered_replicas: u32,
    /// Last registration or heartbeat.
    pub last_seen: Instant,
    /// Liveness.
    pub state: NodeState,
}

impl Descriptor {
    /// Fraction of the capacity in use (1.0 when the capacity is unknown).
    pub fn used_fraction(&self) -> f64 {
        if self.capacity == 0 {
            1.0
        } else {
            self.used as f64 / self.capacity as f64
        }
    }
}

/// How a heartbeat was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeartbeatOutcome {
    /// Recorded.
    Accepted,
    /// The node is unknown or was declared dead: it must register again and send a full report.
    Reregister,
}

/// A liveness transition decided by [`DatanodeRegistry::check_liveness`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LivenessChange {
    /// The DataNode.
    pub node: NodeId,
    /// Its new state (`Stale` or `Dead`).
    pub to: NodeState,
}

/// Every DataNode seen since start.
#[derive(Debug)]
pub struct DatanodeRegistry {
    nodes: HashMap<NodeId, Descriptor>,
    stale_after: Duration,
    dead_after: Duration,
}

impl DatanodeRegistry {
    /// An empty registry with the liveness intervals.
    pub fn new(stale_after: Duration, dead_after: Duration) -> Self {
        DatanodeRegistry {
            nodes: HashMap::new(),
            stale_after,
            dead_after,
        }
    }

    /// Adds or updates a DataNode (same node id = same node; addresses may change). It is Live.
    pub fn register(&mut self, reg: &DatanodeRegistration, now: Instant) {
        let d = Descriptor {
            id: reg.id.clone(),
            capacity: reg.capacity,
            used: reg.used,
            remaining: reg.remaining,
            active_transfers: 0,
            active_pipelines: 0,
            buffered_replicas: 0,
            last_seen: now,
            state: NodeState::Live,
        };
        self.nodes.insert(reg.id.node_id.clone(), d);
    }

    /// Records a heartbeat. A Stale node becomes Live again; a Dead or unknown one must
    /// re-register.
    pub fn heartbeat(&mut self, hb: &Heartbeat, now: Instant) -> HeartbeatOutcome {
        match self.nodes.get_mut(&hb.node) {
            Some(d) if d.state != NodeState::Dead => {
                d.capacity = hb.capacity;
                d.used = hb.used;
                d.remaining = hb.remaining;
                d.active_transfers = hb.active_transfers;
                d.active_pipelines = hb.active_pipelines;
                d.buffered_replicas = hb.buffered_replicas;
                d.last_seen = now;
                d.state = NodeState::Live;
                HeartbeatOutcome::Accepted
            }
            _ => HeartbeatOutcome::Reregister,
        }
    }

    /// Decides who turned Stale or Dead at `now`.
    pub fn check_liveness(&mut self, now: Instant) -> Vec<LivenessChange> {
        let mut changes = Vec::new();
        for (id, d) in &mut self.nodes {
            let silent = now.saturating_duration_since(d.last_seen);
            let to = if silent >= self.dead_after {
                NodeState::Dead
            } else if silent >= self.stale_after {
                NodeState::Stale
            } else {
                continue;
            };
            if d.state != to && d.state != NodeState::Dead {
                d.state = to;
                changes.push(LivenessChange {
                    node: id.clone(),
                    to,
                });
            }
        }
        changes.sort_by(|a, b| a.node.cmp(&b.node));
        changes
    }

    /// The DataNode `id`.
    pub fn get(&self, id: &NodeId) -> Option<&Descriptor> {
        self.nodes.get(id)
    }

    /// The state of `id` (`None` if unknown).
    pub fn state(&self, id: &NodeId) -> Option<NodeState> {
        self.nodes.get(id).map(|d| d.state)
    }

    /// True if `id` is registered and not dead.
    pub fn is_usable(&self, id: &NodeId) -> bool {
        matches!(self.state(id), Some(NodeState::Live | NodeState::Stale))
    }

    /// Every DataNode, sorted by id.
    pub fn all(&self) -> Vec<&Descriptor> {
        let mut v: Vec<&Descriptor> = self.nodes.values().collect();
        v.sort_by(|a, b| a.id.node_id.cmp(&b.id.node_id));
        v
    }

    /// Live and dead counts: (live, stale, dead).
    pub fn counts(&self) -> (u64, u64, u64) {
        let mut c = (0, 0, 0);
        for d in self.nodes.values() {
            match d.state {
                NodeState::Live => c.0 += 1,
                NodeState::Stale => c.1 += 1,
                NodeState::Dead => c.2 += 1,
            }
        }
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reg(n: &str) -> DatanodeRegistration {
        DatanodeRegistration {
            id: DatanodeId {
                node_id: NodeId(n.into()),
                data_addr: format!("{n}:9866"),
                http_addr: format!("{n}:9864"),
                rack: "/default-rack".into(),
            },
            capacity: 100,
            used: 10,
            remaining: 90,
        }
    }

    fn hb(n: &str) -> Heartbeat {
        Heartbeat {
            node: NodeId(n.into()),
            capacity: 100,
            used: 20,
            remaining: 80,
            active_transfers: 1,
            transfers_in_progress: 0,
            active_pipelines: 0,
            buffered_replicas: 0,
        }
    }

    #[test]
    fn live_stale_dead_and_back() {
        let t0 = Instant::now();
        let s = Duration::from_secs(30);
        let mut r = DatanodeRegistry::new(s, Duration::from_secs(600));
        r.register(&reg("a"), t0);
        r.register(&reg("b"), t0);
        assert!(r.check_liveness(t0 + Duration::from_secs(29)).is_empty());
        assert_eq!(
            r.heartbeat(&hb("b"), t0 + Duration::from_secs(20)),
            HeartbeatOutcome::Accepted
        );
        let changes = r.check_liveness(t0 + s);
        assert_eq!(
            changes,
            vec![LivenessChange {
                node: NodeId("a".into()),
                to: NodeState::Stale
            }]
        );
        // Reported once only.
        assert!(r.check_liveness(t0 + s + Duration::from_secs(1)).is_empty());
        // A heartbeat revives a stale node.
        assert_eq!(
            r.heartbeat(&hb("a"), t0 + Duration::from_secs(40)),
            HeartbeatOutcome::Accepted
        );
        assert_eq!(r.state(&NodeId("a".into())), Some(NodeState::Live));
        assert_eq!(r.get(&NodeId("a".into())).unwrap().used, 20);
        // Silent past the dead interval: straight to Dead, whatever the state was.
        let changes = r.check_liveness(t0 + Duration::from_secs(700));
        assert_eq!(changes.len(), 2);
        assert!(changes.iter().all(|c| c.to == NodeState::Dead));
        assert_eq!(r.counts(), (0, 0, 2));
        // A dead node's heartbeat asks it to register again; registering makes it Live.
        assert_eq!(
            r.heartbeat(&hb("a"), t0 + Duration::from_secs(701)),
            HeartbeatOutcome::Reregister
        );
        assert_eq!(r.heartbeat(&hb("zz"), t0), HeartbeatOutcome::Reregister);
        r.register(&reg("a"), t0 + Duration::from_secs(702));
        assert_eq!(r.state(&NodeId("a".into())), Some(NodeState::Live));
        assert!(r.is_usable(&NodeId("a".into())));
        assert!(!r.is_usable(&NodeId("b".into())));
    }
}
