//! Lease recovery with injected time: hard limit, soft limit on `create`, `recover_lease`,
//! block recovery attempts and their reports.

use super::*;
use crate::state::lease::RECOVERY_HOLDER;
use sluice_common::config::HumanDuration;
use sluice_common::rpc::{BlockSync, RecoveringBlock};

const SOFT: u64 = 10;
const HARD: u64 = 60;

fn lease_state() -> (State, Instant) {
    let mut c = cfg();
    c.lease_soft_limit = HumanDuration::secs(SOFT);
    c.lease_hard_limit = HumanDuration::secs(HARD);
    c.block_recovery_timeout = HumanDuration::secs(20);
    c.stale_interval = HumanDuration::secs(5);
    c.dead_interval = HumanDuration::secs(2000);
    let mut s = open(&c, Arc::new(MemStore::new()));
    let t0 = Instant::now();
    for i in 0..4 {
        s.register(&dn(&format!("dn{i}"), "/r"), t0);
    }
    (s, t0)
}

fn at(t0: Instant, secs: u64) -> Instant {
    t0 + Duration::from_secs(secs)
}

/// A file with one complete block of 100 bytes and an open last block hflushed at 40 bytes
/// whose pipeline DataNodes reported it (Rbw), written by `CLIENT` at `t0`.
fn abandoned(s: &mut State, t0: Instant) -> (ExtendedBlock, LocatedBlock) {
    s.create("/f", &opts(CLIENT), t0).unwrap();
    let lb1 = s.add_block("/f", CLIENT, None, &[]).unwrap();
    let b1 = finalize(s, &lb1, 100);
    let lb2 = s.add_block("/f", CLIENT, Some(b1), &[]).unwrap();
    s.fsync("/f", CLIENT, 40).unwrap();
    report_rbw(s, &lb1, &lb2);
    (b1, lb2)
}

/// Full reports of `lb2`'s pipeline: `lb2` being written (40 bytes), `lb1` finalized.
fn report_rbw(s: &mut State, lb1: &LocatedBlock, lb2: &LocatedBlock) {
    for d in &lb2.locations {
        let mut reports = vec![ReplicaReport {
            block: ExtendedBlock::new(lb2.block.id, lb2.block.gen_stamp, 40),
            state: ReplicaState::Rbw,
        }];
        if lb1.locations.contains(d) {
            reports.push(ReplicaReport {
                block: ExtendedBlock::new(lb1.block.id, lb1.block.gen_stamp, 100),
                state: ReplicaState::Finalized,
            });
        }
        s.block_report(&d.node_id, &reports).unwrap();
    }
}

fn recovery_cmd(s: &mut State, node: &NodeId, t: Instant) -> Option<RecoveringBlock> {
    flushed_heartbeat(s, &hb(&node.0), t)
        .commands
        .into_iter()
        .find_map(|c| match c {
            DatanodeCommand::RecoverBlock(r) => Some(r),
            _ => None,
        })
}

fn started(actions: &[MonitorAction]) -> Option<(NodeId, GenerationStamp)> {
    actions.iter().find_map(|a| match a {
        MonitorAction::BlockRecoveryStarted {
            primary,
            recovery_id,
            ..
        } => Some((primary.clone(), *recovery_id)),
        _ => None,
    })
}

fn sync_of(cmd: &RecoveringBlock, len: u64, targets: &[NodeId]) -> BlockSync {
    BlockSync {
        block: cmd.block,
        new_gen_stamp: cmd.recovery_id,
        new_length: len,
        close_file: true,
        delete_block: false,
        new_targets: targets.to_vec(),
    }
}

#[test]
fn a_recovery_id_leaves_only_once_durable() {
    let (mut s, t0) = lease_state();
    abandoned(&mut s, t0);
    let (primary, recovery_id) = started(&s.tick(at(t0, HARD))).expect("recovery started");
    let before_flush = s.heartbeat(&hb(&primary.0), at(t0, HARD)).commands;
    assert!(
        !before_flush
            .iter()
            .any(|c| matches!(c, DatanodeCommand::RecoverBlock(_))),
        "{before_flush:?}"
    );
    let cmd = recovery_cmd(&mut s, &primary, at(t0, HARD)).expect("sent after the flush");
    assert_eq!(cmd.recovery_id, recovery_id);
}

#[test]
fn hard_limit_recovers_the_last_block_and_closes_the_file() {
    let (mut s, t0) = lease_state();
    let (_, lb2) = abandoned(&mut s, t0);
    assert!(started(&s.tick(at(t0, HARD - 1))).is_none());
    let actions = s.tick(at(t0, HARD));
    let (primary, recovery_id) = started(&actions).expect("recovery started");
    let pipeline: Vec<NodeId> = lb2.locations.iter().map(|d| d.node_id.clone()).collect();
    assert!(pipeline.contains(&primary));
    assert!(recovery_id > lb2.block.gen_stamp);
    // The old writer lost its lease; another writer is told it is being created.
    assert!(matches!(
        s.complete("/f", CLIENT, None),
        Err(MetaError::NotLeaseHolder { .. })
    ));
    assert!(matches!(
        s.create("/f", &opts("other"), at(t0, HARD)),
        Err(MetaError::LeaseConflict { .. })
    ));
    let cmd = recovery_cmd(&mut s, &primary, at(t0, HARD + 1)).expect("command");
    assert_eq!(cmd.recovery_id, recovery_id);
    assert_eq!(cmd.block.id, lb2.block.id);
    assert_eq!(cmd.locations, lb2.locations);
    assert!(!s.recover_lease("/f", "admin", at(t0, HARD + 1)).unwrap());
    // The primary agreed on 40 bytes with two locations.
    s.commit_block_synchronization(&sync_of(&cmd, 40, &pipeline[..2]), at(t0, HARD + 2))
        .unwrap();
    let st = s.stat("/f").unwrap();
    assert_eq!((st.length, st.under_construction), (140, false));
    assert!(s.recover_lease("/f", "admin", at(t0, HARD + 2)).unwrap());
    let fsck = s.fsck("/f").unwrap();
    let last = &fsck.files[0].blocks[1];
    assert_eq!(
        last.block,
        ExtendedBlock::new(lb2.block.id, recovery_id, 40)
    );
    assert_eq!(last.locations.len(), 2);
    assert_eq!(s.open_files(), 0);
    // The third pipeline replica (never updated) is deleted; a copy is scheduled instead.
    let cmds = flushed_heartbeat(&mut s, &hb(&pipeline[2].0), at(t0, HARD + 3)).commands;
    assert!(
        matches!(&cmds[..], [DatanodeCommand::Delete { blocks }] if blocks[0].id == lb2.block.id)
    );
    let actions = s.tick(at(t0, HARD + 3));
    assert!(actions.iter().any(
        |a| matches!(a, MonitorAction::ReplicationScheduled { block, .. } if *block == lb2.block.id)
    ));
    // A repeated report is harmless; a stale one is refused.
    s.commit_block_synchronization(&sync_of(&cmd, 40, &pipeline[..2]), at(t0, HARD + 4))
        .unwrap();
    assert_eq!(s.repair_report().counters.leases_recovered, 1);
}

#[test]
fn a_silent_primary_is_replaced_and_its_late_report_refused() {
    let (mut s, t0) = lease_state();
    let (_, lb2) = abandoned(&mut s, t0);
    let (p1, id1) = started(&s.tick(at(t0, HARD))).unwrap();
    let cmd1 = recovery_cmd(&mut s, &p1, at(t0, HARD)).unwrap();
    assert!(
        started(&s.tick(at(t0, HARD + 19))).is_none(),
        "still within the timeout"
    );
    let (p2, id2) = started(&s.tick(at(t0, HARD + 20))).expect("retried");
    assert_ne!(p2, p1, "another primary");
    assert!(id2 > id1, "a new recovery id");
    assert_eq!(
        s.commit_block_synchronization(
            &sync_of(&cmd1, 40, std::slice::from_ref(&p1)),
            at(t0, HARD + 21)
        ),
        Err(MetaError::GenerationStampMismatch {
            block: lb2.block.id,
            given: id1,
            current: id2
        })
    );
    let cmd2 = recovery_cmd(&mut s, &p2, at(t0, HARD + 21)).unwrap();
    s.commit_block_synchronization(
        &sync_of(&cmd2, 40, std::slice::from_ref(&p2)),
        at(t0, HARD + 22),
    )
    .unwrap();
    assert!(!s.stat("/f").unwrap().under_construction);
}

#[test]
fn a_recovered_length_below_the_hsynced_one_is_refused() {
    let (mut s, t0) = lease_state();
    let (_, lb2) = abandoned(&mut s, t0);
    let (p, _) = started(&s.tick(at(t0, HARD))).unwrap();
    let cmd = recovery_cmd(&mut s, &p, at(t0, HARD)).unwrap();
    assert_eq!(cmd.block.num_bytes, 40, "the primary is told the floor");
    let pipeline: Vec<NodeId> = lb2.locations.iter().map(|d| d.node_id.clone()).collect();
    let err = s
        .commit_block_synchronization(&sync_of(&cmd, 39, &pipeline), at(t0, HARD + 1))
        .unwrap_err();
    assert!(
        matches!(&err, MetaError::InvalidArgument { name, .. } if name == "new_length"),
        "{err}"
    );
    assert!(s.stat("/f").unwrap().under_construction, "nothing applied");
    s.commit_block_synchronization(&sync_of(&cmd, 40, &pipeline), at(t0, HARD + 1))
        .unwrap();
    assert_eq!(s.stat("/f").unwrap().length, 140);
}

#[test]
fn no_data_anywhere_drops_the_last_block() {
    let (mut s, t0) = lease_state();
    let (b1, _) = abandoned(&mut s, t0);
    let (p, _) = started(&s.tick(at(t0, HARD))).unwrap();
    let cmd = recovery_cmd(&mut s, &p, at(t0, HARD)).unwrap();
    let drop = BlockSync {
        delete_block: true,
        ..sync_of(&cmd, 0, &[])
    };
    s.commit_block_synchronization(&drop, at(t0, HARD + 1))
        .unwrap();
    let st = s.stat("/f").unwrap();
    assert_eq!(
        (st.length, st.block_count, st.under_construction),
        (100, 1, false)
    );
    // Every pipeline DataNode is told to delete its replica; a retried report is fine.
    for d in &cmd.locations {
        let cmds = flushed_heartbeat(&mut s, &hb(&d.node_id.0), at(t0, HARD + 2)).commands;
        assert!(
            matches!(&cmds[..], [DatanodeCommand::Delete { blocks }] if blocks[0].id == cmd.block.id && blocks[0].gen_stamp == cmd.recovery_id)
        );
    }
    s.commit_block_synchronization(&drop, at(t0, HARD + 3))
        .unwrap();
    assert_eq!(s.fsck("/f").unwrap().files[0].blocks[0].block, b1);
}

#[test]
fn an_empty_last_block_nobody_holds_is_dropped_at_once() {
    let (mut s, t0) = lease_state();
    s.create("/f", &opts(CLIENT), t0).unwrap();
    let lb = s.add_block("/f", CLIENT, None, &[]).unwrap();
    // Every pipeline DataNode died.
    for i in 0..4 {
        if !lb
            .locations
            .iter()
            .any(|d| d.node_id == node(&format!("dn{i}")))
        {
            flushed_heartbeat(&mut s, &hb(&format!("dn{i}")), at(t0, 2000));
        }
    }
    s.renew_lease(CLIENT, at(t0, 2000));
    s.tick(at(t0, 2001));
    assert!(s.recover_lease("/f", CLIENT, at(t0, 2002)).unwrap());
    let st = s.stat("/f").unwrap();
    assert_eq!((st.block_count, st.under_construction), (0, false));
}

#[test]
fn create_after_the_soft_limit_recovers_the_lease() {
    let (mut s, t0) = lease_state();
    let (_, lb2) = abandoned(&mut s, t0);
    // Before the soft limit: conflict, no recovery.
    assert_eq!(
        s.create("/f", &opts("other"), at(t0, SOFT - 1)),
        Err(MetaError::LeaseConflict {
            path: "/f".into(),
            holder: CLIENT.into()
        })
    );
    assert_eq!(s.repair_report().recovering, 0);
    // After it: still a conflict, but recovery is under way.
    assert!(matches!(
        s.create("/f", &opts("other"), at(t0, SOFT)),
        Err(MetaError::LeaseConflict { .. })
    ));
    assert_eq!(s.repair_report().recovering, 1);
    assert!(matches!(
        s.add_block("/f", CLIENT, None, &[]),
        Err(MetaError::NotLeaseHolder { .. })
    ));
    let primary = lb2.locations[0].node_id.clone();
    let cmd = (0..4)
        .find_map(|i| recovery_cmd(&mut s, &node(&format!("dn{i}")), at(t0, SOFT + 1)))
        .unwrap();
    s.commit_block_synchronization(&sync_of(&cmd, 40, &[primary]), at(t0, SOFT + 2))
        .unwrap();
    // Closed: the other writer may now replace it.
    assert!(matches!(
        s.create("/f", &opts("other"), at(t0, SOFT + 3)),
        Err(MetaError::AlreadyExists { .. })
    ));
    let mut o = opts("other");
    o.overwrite = true;
    s.create("/f", &o, at(t0, SOFT + 3)).unwrap();
}

#[test]
fn committed_blocks_wait_for_their_replicas() {
    let (mut s, t0) = lease_state();
    s.create("/f", &opts(CLIENT), t0).unwrap();
    let lb = s.add_block("/f", CLIENT, None, &[]).unwrap();
    let b = ExtendedBlock::new(lb.block.id, lb.block.gen_stamp, 70);
    assert!(
        !s.complete("/f", CLIENT, Some(b)).unwrap(),
        "committed, no replica yet"
    );
    s.tick(at(t0, HARD));
    assert!(!s.recover_lease("/f", "admin", at(t0, HARD)).unwrap());
    assert_eq!(
        s.repair_report().recovering,
        0,
        "no block recovery for a committed block"
    );
    s.block_received(&lb.locations[0].node_id, &[ReplicaEvent::Received(b)])
        .unwrap();
    let actions = s.tick(at(t0, HARD + 1));
    assert!(
        actions
            .iter()
            .any(|a| matches!(a, MonitorAction::FileClosed { .. })),
        "{actions:?}"
    );
    assert_eq!(s.stat("/f").unwrap().length, 70);
}

#[test]
fn recovery_survives_a_restart_of_the_service() {
    let (mut s, t0) = lease_state();
    s.create("/f", &opts(CLIENT), t0).unwrap();
    let lb1 = s.add_block("/f", CLIENT, None, &[]).unwrap();
    let b1 = finalize(&mut s, &lb1, 100);
    let lb2 = s.add_block("/f", CLIENT, Some(b1), &[]).unwrap();
    report_rbw(&mut s, &lb1, &lb2);
    started(&s.tick(at(t0, HARD))).unwrap();
    let store = s.store();
    let c = s.config().clone();
    drop(s);
    let mut s = State::open(&c, store, at(t0, HARD + 1)).unwrap();
    for i in 0..4 {
        s.register(&dn(&format!("dn{i}"), "/r"), at(t0, HARD + 1));
    }
    // Nothing reported yet: no location is known and no byte was recorded, but the block is
    // not dropped while the DataNodes may still report (the stale interval after start).
    let grace = s.config().stale_interval.get().as_secs();
    assert!(s.tick(at(t0, HARD + 2)).is_empty());
    assert!(!s.recover_lease("/f", "admin", at(t0, HARD + 2)).unwrap());
    report_rbw(&mut s, &lb1, &lb2);
    // The lease is the recovery holder's: another writer's create starts recovery again.
    let after = at(t0, HARD + 1 + grace);
    assert!(matches!(
        s.create("/f", &opts("other"), after),
        Err(MetaError::LeaseConflict { holder, .. }) if holder == RECOVERY_HOLDER
    ));
    assert_eq!(s.repair_report().recovering, 1);
    assert!(!s.recover_lease("/f", "admin", after).unwrap());
}
