//! DataNode reports, heartbeat commands, liveness, fsck verdicts, lease expiry.

use super::*;

#[test]
fn block_report_invalidates_unknown_and_stale() {
    let mut s = must_state();
    with_nodes(&mut s, 3);
    let blocks = must_write(&mut s, "/f", &[10]);
    let good = ReplicaReport {
        block: blocks[0],
        state: ReplicaState::Finalized,
    };
    let stale = ReplicaReport {
        block: ExtendedBlock {
            gen_stamp: GenerationStamp(blocks[0].gen_stamp.0 - 1),
            ..blocks[0]
        },
        state: ReplicaState::Finalized,
    };
    let unknown = ReplicaReport {
        block: ExtendedBlock::new(BlockId(42), GenerationStamp(1000), 5),
        state: ReplicaState::Finalized,
    };
    assert_eq!(s.block_report(&node("dn0"), &[good, unknown]).unwrap(), 1);
    assert_eq!(s.block_report(&node("dn1"), &[stale]).unwrap(), 1);
    assert!(matches!(
        s.block_report(&node("ghost"), &[]),
        Err(MetaError::UnknownDatanode { .. })
    ));
    assert_eq!(
        flushed_heartbeat(&mut s, &hb("dn0"), Instant::now()).commands,
        vec![DatanodeCommand::Delete {
            blocks: vec![unknown.block]
        }]
    );
    assert_eq!(
        flushed_heartbeat(&mut s, &hb("dn1"), Instant::now()).commands,
        vec![DatanodeCommand::Delete {
            blocks: vec![stale.block]
        }]
    );
    // dn1's full report no longer holds the block.
    let fsck = s.fsck("/f").unwrap();
    assert_eq!(fsck.files[0].blocks[0].locations.len(), 2);
    assert_eq!(fsck.health, Health::UnderReplicated);
    // Unknown node heartbeat → re-register.
    assert_eq!(
        flushed_heartbeat(&mut s, &hb("ghost"), Instant::now()).commands,
        vec![DatanodeCommand::Reregister]
    );
}

#[test]
fn delete_sends_bounded_delete_commands() {
    let mut s = must_state();
    with_nodes(&mut s, 3);
    let mut all = vec![];
    for i in 0..3 {
        all.extend(must_write(
            &mut s,
            &format!("/d/f{i}").replace("/d/", "/"),
            &[1, 1],
        ));
    }
    assert!(s.delete("/f0", false).unwrap());
    let r = flushed_heartbeat(&mut s, &hb("dn0"), Instant::now());
    let DatanodeCommand::Delete { blocks } = &r.commands[0] else {
        panic!("{r:?}")
    };
    assert_eq!(blocks.len(), 2);
    assert_eq!(
        flushed_heartbeat(&mut s, &hb("dn0"), Instant::now()).commands,
        vec![]
    );
    // Bounded per heartbeat.
    let id = blocks[0].id;
    for i in 0..(MAX_DELETES_PER_HEARTBEAT as u64 + 5) {
        s.blocks.schedule_delete(
            &node("dn1"),
            ExtendedBlock::new(BlockId(id.0 + 1000 + i), GenerationStamp(1), 0),
        );
    }
    let r = flushed_heartbeat(&mut s, &hb("dn1"), Instant::now());
    let DatanodeCommand::Delete { blocks } = &r.commands[0] else {
        panic!()
    };
    assert_eq!(blocks.len(), MAX_DELETES_PER_HEARTBEAT);
}

#[test]
fn liveness_and_fsck_verdicts() {
    let mut c = cfg();
    c.stale_interval = sluice_common::config::HumanDuration::secs(30);
    c.dead_interval = sluice_common::config::HumanDuration::secs(60);
    let mut s = open(&c, Arc::new(MemStore::new()));
    let t0 = Instant::now();
    for i in 0..3 {
        s.register(&dn(&format!("dn{i}"), "/r"), t0);
    }
    let blocks = must_write(&mut s, "/f", &[10]);
    assert_eq!(s.fsck("/").unwrap().health, Health::Healthy);
    // dn0 and dn1 keep heart-beating; dn2 goes silent.
    let at = |secs| t0 + Duration::from_secs(secs);
    for t in [20, 40, 59] {
        flushed_heartbeat(&mut s, &hb("dn0"), at(t));
        flushed_heartbeat(&mut s, &hb("dn1"), at(t));
    }
    assert_eq!(
        s.tick(at(31)),
        vec![MonitorAction::NodeStale { node: node("dn2") }]
    );
    let lbs = s.get_block_locations("/f", 0, 10).unwrap();
    assert_eq!(
        lbs.blocks[0].locations.last().unwrap().node_id,
        node("dn2"),
        "stale last"
    );
    assert_eq!(s.fsck("/").unwrap().health, Health::Healthy);
    assert_eq!(
        s.tick(at(61)),
        vec![MonitorAction::NodeDead {
            node: node("dn2"),
            replicas: 1
        }]
    );
    let fsck = s.fsck("/").unwrap();
    assert_eq!(fsck.health, Health::UnderReplicated);
    assert_eq!(fsck.files[0].blocks[0].block, blocks[0]);
    assert_eq!(s.cluster_report(at(61)).under_replicated_blocks, 1);
    // Placement now avoids the dead node: a new block starts on the two live ones.
    s.create("/g", &opts(CLIENT), at(61)).unwrap();
    let g = s.add_block("/g", CLIENT, None, &[]).unwrap();
    let mut placed: Vec<NodeId> = g.locations.iter().map(|d| d.node_id.clone()).collect();
    placed.sort();
    assert_eq!(placed, [node("dn0"), node("dn1")]);
    s.abandon_block("/g", CLIENT, g.block).unwrap();
    // A dead node's heartbeat asks it to re-register; after that and a report it counts.
    assert_eq!(
        flushed_heartbeat(&mut s, &hb("dn2"), at(62)).commands,
        vec![DatanodeCommand::Reregister]
    );
    assert!(s.block_received(&node("dn2"), &[]).is_err());
    s.register(&dn("dn2", "/r"), at(62));
    s.block_report(
        &node("dn2"),
        &[ReplicaReport {
            block: blocks[0],
            state: ReplicaState::Finalized,
        }],
    )
    .unwrap();
    assert_eq!(s.fsck("/").unwrap().health, Health::Healthy);
    // Everything silent: missing.
    let actions = s.tick(at(200));
    assert_eq!(
        actions
            .iter()
            .filter(|a| matches!(a, MonitorAction::NodeDead { .. }))
            .count(),
        3
    );
    assert_eq!(s.fsck("/f").unwrap().health, Health::Missing);
    assert_eq!(s.cluster_report(at(200)).missing_blocks, 1);
}

#[test]
fn under_construction_fsck_counts_the_pipeline_and_rbw_reports() {
    let mut s = must_state();
    with_nodes(&mut s, 3);
    s.create("/f", &opts(CLIENT), Instant::now()).unwrap();
    let lb = s.add_block("/f", CLIENT, None, &[]).unwrap();
    let fsck = s.fsck("/f").unwrap();
    assert!(fsck.files[0].under_construction);
    assert_eq!(fsck.files[0].blocks[0].locations.len(), 3);
    assert_eq!(fsck.health, Health::Healthy);
    let rbw = ReplicaReport {
        block: lb.block,
        state: ReplicaState::Rbw,
    };
    assert_eq!(s.block_report(&lb.locations[0].node_id, &[rbw]).unwrap(), 0);
}

#[test]
fn lease_expiry_is_reported_once() {
    let mut s = must_state();
    let t0 = Instant::now();
    s.create("/f", &opts(CLIENT), t0).unwrap();
    let hard = s.config().lease_hard_limit.get();
    assert!(s.tick(t0 + Duration::from_secs(1)).is_empty());
    s.renew_lease(CLIENT, t0 + Duration::from_secs(10));
    assert!(s.tick(t0 + hard).is_empty());
    let later = t0 + Duration::from_secs(10) + hard;
    // Reported once, and the file (no block) is closed by its recovery at once.
    let actions = s.tick(later);
    assert!(
        matches!(&actions[..], [MonitorAction::LeaseExpired { holder, files }, MonitorAction::FileClosed { .. }] if holder == CLIENT && files.len() == 1),
        "{actions:?}"
    );
    assert!(!s.stat("/f").unwrap().under_construction);
    assert!(s.tick(later + Duration::from_secs(1)).is_empty());
}
