//! Replica repair decisions with injected time: re-replication after a death (priority, rate
//! limits, pending timeouts), excess replicas, corrupt replicas, what is never repaired.

use super::*;
use crate::events::{CorruptionSource, EventKind};
use sluice_common::config::HumanDuration;

/// A state with `racks.len()` DataNodes `dn<i>` on those racks, registered at the returned
/// instant; stale after 30 s, dead after 60 s.
fn repair_state(racks: &[&str], tune: impl FnOnce(&mut MetadataConfig)) -> (State, Instant) {
    let mut c = cfg();
    c.stale_interval = HumanDuration::secs(30);
    c.dead_interval = HumanDuration::secs(60);
    tune(&mut c);
    let mut s = open(&c, Arc::new(MemStore::new()));
    let t0 = Instant::now();
    for (i, rack) in racks.iter().enumerate() {
        s.register(&dn(&format!("dn{i}"), rack), t0);
    }
    (s, t0)
}

fn at(t0: Instant, secs: u64) -> Instant {
    t0 + Duration::from_secs(secs)
}

/// A closed one-block file of `len` bytes whose replicas are on `nodes`.
fn write_on(s: &mut State, path: &str, len: u64, nodes: &[&str]) -> ExtendedBlock {
    s.create(path, &opts(CLIENT), Instant::now()).unwrap();
    let lb = s.add_block(path, CLIENT, None, &[]).unwrap();
    let b = ExtendedBlock::new(lb.block.id, lb.block.gen_stamp, len);
    for n in nodes {
        s.block_received(&node(n), &[ReplicaEvent::Received(b)])
            .unwrap();
    }
    assert!(s.complete(path, CLIENT, Some(b)).unwrap());
    b
}

/// Heartbeats of every `dn<i>` but `silent`, at `t`; returns their commands.
fn beat(s: &mut State, n: usize, silent: &[&str], t: Instant) -> Vec<(NodeId, DatanodeCommand)> {
    let mut out = vec![];
    for i in 0..n {
        let name = format!("dn{i}");
        if silent.contains(&name.as_str()) {
            continue;
        }
        for c in flushed_heartbeat(s, &hb(&name), t).commands {
            out.push((node(&name), c));
        }
    }
    out
}

fn scheduled(actions: &[MonitorAction]) -> Vec<(BlockId, NodeId, Vec<NodeId>)> {
    actions
        .iter()
        .filter_map(|a| match a {
            MonitorAction::ReplicationScheduled {
                block,
                source,
                targets,
            } => Some((*block, source.clone(), targets.clone())),
            _ => None,
        })
        .collect()
}

fn locations(s: &State, path: &str) -> Vec<NodeId> {
    let fsck = s.fsck(path).unwrap();
    let mut v: Vec<NodeId> = fsck.files[0].blocks[0]
        .locations
        .iter()
        .map(|d| d.node_id.clone())
        .collect();
    v.sort();
    v
}

#[test]
fn a_dead_datanodes_blocks_are_copied_from_live_holders() {
    let (mut s, t0) = repair_state(&["/r"; 5], |_| {});
    let b1 = write_on(&mut s, "/a", 100, &["dn0", "dn1", "dn2"]);
    let b2 = write_on(&mut s, "/b", 50, &["dn1", "dn2", "dn3"]);
    beat(&mut s, 5, &["dn2"], at(t0, 50));
    let actions = s.tick(at(t0, 61));
    assert!(actions.contains(&MonitorAction::NodeDead {
        node: node("dn2"),
        replicas: 2
    }));
    let sched = scheduled(&actions);
    assert_eq!(sched.len(), 2, "{actions:?}");
    assert_eq!(
        kinds(&s),
        vec![EventKind::DatanodeDead {
            node: node("dn2"),
            replicas: 2
        }]
    );
    assert_eq!(s.fsck("/").unwrap().health, Health::UnderReplicated);
    for (block, source, targets) in &sched {
        let holders = if *block == b1.id {
            ["dn0", "dn1"]
        } else {
            ["dn1", "dn3"]
        };
        assert!(holders.contains(&source.0.as_str()), "source {source}");
        assert_eq!(targets.len(), 1);
        assert!(!holders.contains(&targets[0].0.as_str()) && targets[0] != node("dn2"));
    }
    // The commands go out with the sources' heartbeats; the copies arrive.
    let cmds = beat(&mut s, 5, &["dn2"], at(t0, 62));
    assert_eq!(cmds.len(), 2, "{cmds:?}");
    for (src, c) in cmds {
        let DatanodeCommand::Transfer { block, targets, .. } = c else {
            panic!("{c:?}");
        };
        let want = sched.iter().find(|(b, _, _)| *b == block.id).unwrap();
        assert_eq!(
            (&src, targets[0].node_id.clone()),
            (&want.1, want.2[0].clone())
        );
        assert_eq!(block, if block.id == b1.id { b1 } else { b2 });
        s.block_received(&targets[0].node_id, &[ReplicaEvent::Received(block)])
            .unwrap();
    }
    let actions = s.tick(at(t0, 63));
    assert!(scheduled(&actions).is_empty(), "{actions:?}");
    assert_eq!(s.fsck("/").unwrap().health, Health::Healthy);
    assert!(!locations(&s, "/a").contains(&node("dn2")));
    assert_eq!(s.repair_report().needed + s.repair_report().pending, 0);
}

#[test]
fn the_fewest_replicas_go_first_within_the_rate_limits() {
    let (mut s, t0) = repair_state(&["/r"; 7], |c| {
        c.replication_max_streams = 2;
        c.replication_work_multiplier = 1;
    });
    // Six blocks on dn0..dn2; one more on dn3, dn4, dn5.
    let blocks: Vec<_> = (0..6)
        .map(|i| write_on(&mut s, &format!("/f{i}"), 10, &["dn0", "dn1", "dn2"]))
        .collect();
    let lonely = write_on(&mut s, "/lonely", 10, &["dn3", "dn4", "dn5"]);
    // dn2 dies, and so do dn4 and dn5: /lonely is down to one replica and goes first.
    beat(&mut s, 7, &["dn2", "dn4", "dn5"], at(t0, 50));
    let actions = s.tick(at(t0, 61));
    let sched = scheduled(&actions);
    // Budget: 4 live DataNodes × 1 = 4 blocks examined this pass.
    assert_eq!(sched.len(), 4, "{sched:?}");
    assert_eq!(sched[0].0, lonely.id);
    assert_eq!(sched[0].2.len(), 2, "two copies for the block down to one");
    for src in ["dn0", "dn1"] {
        let n = sched.iter().filter(|(_, s, _)| s.0 == src).count();
        assert!(n <= 2, "{src} queued {n} copies");
    }
    // A heartbeat hands out max-streams minus the copies the DataNode runs.
    let busy = Heartbeat {
        transfers_in_progress: 1,
        ..hb("dn0")
    };
    let queued = sched.iter().filter(|(_, s, _)| s.0 == "dn0").count();
    let first = flushed_heartbeat(&mut s, &busy, at(t0, 62)).commands;
    assert_eq!(first.len(), queued.min(1), "{first:?}");
    let full = Heartbeat {
        transfers_in_progress: 2,
        ..hb("dn0")
    };
    assert!(flushed_heartbeat(&mut s, &full, at(t0, 62))
        .commands
        .is_empty());
    assert_eq!(
        flushed_heartbeat(&mut s, &hb("dn0"), at(t0, 62))
            .commands
            .len(),
        queued - first.len()
    );
    // The rest is scheduled by later passes, as the sources' queues empty.
    beat(&mut s, 7, &["dn2", "dn4", "dn5"], at(t0, 62));
    let later = scheduled(&s.tick(at(t0, 63)));
    let mut all: Vec<BlockId> = sched.iter().chain(later.iter()).map(|x| x.0).collect();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), 7, "every block scheduled once: {all:?}");
    assert!(blocks.iter().all(|b| all.contains(&b.id)));
}

#[test]
fn a_copy_that_never_arrives_is_scheduled_again() {
    let (mut s, t0) = repair_state(&["/r"; 4], |c| {
        c.replication_pending_timeout = HumanDuration::secs(10);
    });
    let b = write_on(&mut s, "/f", 10, &["dn0", "dn1", "dn2"]);
    beat(&mut s, 4, &["dn2"], at(t0, 50));
    assert_eq!(scheduled(&s.tick(at(t0, 61))).len(), 1);
    assert_eq!(s.repair_report().pending, 1);
    let cmds = beat(&mut s, 4, &["dn2"], at(t0, 62));
    assert_eq!(cmds.len(), 1);
    // Still in flight: nothing new.
    beat(&mut s, 4, &["dn2"], at(t0, 70));
    assert!(scheduled(&s.tick(at(t0, 71))).is_empty());
    // Lost: scheduled again after the timeout (counted from the hand-out).
    beat(&mut s, 4, &["dn2"], at(t0, 72));
    let again = scheduled(&s.tick(at(t0, 72)));
    assert_eq!(again.len(), 1, "rescheduled");
    assert_eq!(again[0].0, b.id);
}

#[test]
fn excess_replicas_go_from_the_crowded_rack_then_the_fullest_node() {
    let (mut s, t0) = repair_state(&["/a", "/a", "/b", "/c"], |_| {});
    let b = write_on(&mut s, "/f", 10, &["dn0", "dn1", "dn2"]);
    let space = |n: &str, remaining| Heartbeat { remaining, ..hb(n) };
    for (n, r) in [("dn0", 100), ("dn1", 50), ("dn2", 200), ("dn3", 10)] {
        flushed_heartbeat(&mut s, &space(n, r), at(t0, 1));
    }
    // A fourth replica turns up (a DataNode came back, a copy arrived twice).
    s.block_received(&node("dn3"), &[ReplicaEvent::Received(b)])
        .unwrap();
    let actions = s.tick(at(t0, 2));
    assert!(
        actions.contains(&MonitorAction::ExcessReplicas {
            block: b.id,
            nodes: vec![node("dn1")]
        }),
        "rack /a holds two: its fuller node loses its copy, not the fuller dn3: {actions:?}"
    );
    assert_eq!(s.fsck("/f").unwrap().health, Health::Healthy);
    assert_eq!(
        flushed_heartbeat(&mut s, &hb("dn1"), at(t0, 3)).commands,
        vec![DatanodeCommand::Delete { blocks: vec![b] }]
    );
    // Chosen once: later passes do not pick another one.
    s.block_report(
        &node("dn1"),
        &[ReplicaReport {
            block: b,
            state: ReplicaState::Finalized,
        }],
    )
    .unwrap();
    assert!(s.tick(at(t0, 4)).is_empty());
    // The report says the replica is still there (the command was lost): asked again.
    assert_eq!(
        flushed_heartbeat(&mut s, &hb("dn1"), at(t0, 4)).commands,
        vec![DatanodeCommand::Delete { blocks: vec![b] }]
    );
    s.block_received(&node("dn1"), &[ReplicaEvent::Deleted(b)])
        .unwrap();
    assert_eq!(
        locations(&s, "/f"),
        vec![node("dn0"), node("dn2"), node("dn3")]
    );
    assert_eq!(s.repair_report().counters.excess_deleted, 1);
}

#[test]
fn excess_waits_while_a_holder_is_stale() {
    let (mut s, t0) = repair_state(&["/r"; 4], |_| {});
    let b = write_on(&mut s, "/f", 10, &["dn0", "dn1", "dn2", "dn3"]);
    beat(&mut s, 4, &["dn3"], at(t0, 25));
    let actions = s.tick(at(t0, 31));
    assert_eq!(
        actions,
        vec![MonitorAction::NodeStale { node: node("dn3") }]
    );
    assert!(s.tick(at(t0, 32)).is_empty(), "postponed");
    beat(&mut s, 4, &[], at(t0, 33));
    let actions = s.tick(at(t0, 33));
    assert!(
        matches!(&actions[..], [MonitorAction::ExcessReplicas { block, nodes }] if *block == b.id && nodes.len() == 1),
        "{actions:?}"
    );
}

/// The recent events' kinds, newest first.
fn kinds(s: &State) -> Vec<EventKind> {
    s.events().into_iter().map(|e| e.kind).collect()
}

#[test]
fn a_corrupt_replica_is_replaced_then_deleted() {
    let (mut s, t0) = repair_state(&["/r"; 4], |_| {});
    let b = write_on(&mut s, "/f", 10, &["dn0", "dn1", "dn2"]);
    s.report_bad_blocks(&[BadReplica {
        block: b,
        node: node("dn1"),
        reason: "checksum".into(),
    }]);
    assert_eq!(s.fsck("/f").unwrap().health, Health::Corrupt);
    let corrupt = EventKind::CorruptReplica {
        block: b.id,
        node: node("dn1"),
        found_by: CorruptionSource::Reader,
    };
    assert_eq!(kinds(&s), vec![corrupt.clone()]);
    let sched = scheduled(&s.tick(at(t0, 1)));
    assert_eq!(sched.len(), 1);
    assert_ne!(
        sched[0].1,
        node("dn1"),
        "never copied from the corrupt replica"
    );
    assert_eq!(sched[0].2, vec![node("dn3")]);
    // Not deleted before the copy is there.
    assert!(flushed_heartbeat(&mut s, &hb("dn1"), at(t0, 2))
        .commands
        .is_empty());
    s.block_received(&node("dn3"), &[ReplicaEvent::Received(b)])
        .unwrap();
    let done = EventKind::ReplicationDone {
        block: b.id,
        target: node("dn3"),
    };
    assert_eq!(kinds(&s), vec![done, corrupt], "newest first");
    let actions = s.tick(at(t0, 3));
    assert!(actions.contains(&MonitorAction::CorruptReplicasDeleted {
        block: b.id,
        nodes: vec![node("dn1")]
    }));
    assert_eq!(
        s.fsck("/f").unwrap().health,
        Health::Corrupt,
        "until deleted"
    );
    assert_eq!(
        flushed_heartbeat(&mut s, &hb("dn1"), at(t0, 4)).commands,
        vec![DatanodeCommand::Delete { blocks: vec![b] }]
    );
    assert!(s.tick(at(t0, 5)).is_empty(), "deleted once");
    s.block_received(&node("dn1"), &[ReplicaEvent::Deleted(b)])
        .unwrap();
    assert_eq!(s.fsck("/f").unwrap().health, Health::Healthy);
}

#[test]
fn the_block_scanner_reports_corrupt_and_stale_replicas() {
    let (mut s, t0) = repair_state(&["/r"; 4], |_| {});
    let b = write_on(&mut s, "/f", 10, &["dn0", "dn1", "dn2"]);
    s.block_received(&node("dn2"), &[ReplicaEvent::Corrupt(b)])
        .unwrap();
    assert_eq!(s.fsck("/f").unwrap().health, Health::Corrupt);
    assert_eq!(scheduled(&s.tick(at(t0, 1))).len(), 1);
    // A corrupt report of an older generation stamp: that replica is simply deleted.
    let old = ExtendedBlock::new(b.id, GenerationStamp(b.gen_stamp.0 - 1), 10);
    s.block_received(&node("dn3"), &[ReplicaEvent::Corrupt(old)])
        .unwrap();
    assert_eq!(
        kinds(&s),
        vec![EventKind::CorruptReplica {
            block: b.id,
            node: node("dn2"),
            found_by: CorruptionSource::Scanner,
        }],
        "an old stamp's replica is only deleted"
    );
    let cmds = flushed_heartbeat(&mut s, &hb("dn3"), at(t0, 2)).commands;
    assert!(
        cmds.contains(&DatanodeCommand::Delete { blocks: vec![old] }),
        "{cmds:?}"
    );
}

#[test]
fn open_and_missing_blocks_are_not_repaired() {
    let (mut s, t0) = repair_state(&["/r"; 5], |_| {});
    let gone = write_on(&mut s, "/gone", 10, &["dn0", "dn1", "dn2"]);
    s.create("/open", &opts("w"), t0).unwrap();
    let lb = s.add_block("/open", "w", None, &[]).unwrap();
    let silent: Vec<String> = ["dn0", "dn1", "dn2"]
        .into_iter()
        .map(String::from)
        .chain(lb.locations.iter().take(1).map(|d| d.node_id.0.clone()))
        .collect();
    let silent: Vec<&str> = silent.iter().map(String::as_str).collect();
    s.renew_lease("w", at(t0, 50));
    beat(&mut s, 5, &silent, at(t0, 50));
    let actions = s.tick(at(t0, 61));
    assert!(scheduled(&actions).is_empty(), "{actions:?}");
    assert_eq!(s.fsck("/gone").unwrap().health, Health::Missing);
    assert!(s.fsck("/open").unwrap().files[0].under_construction);
    assert_eq!(
        s.repair_report().needed,
        0,
        "{gone:?} has nothing to copy from"
    );
}
