//! Unit tests of the service logic, on a temporary sled store, without a runtime.

use super::*;
use crate::store::SledStore;
use sluice_common::proto::ReplicaState;
use sluice_common::rpc::LocatedBlock;
use sluice_common::rpc::{
    AdditionalDatanodes, BadReplica, CreateOptions, DatanodeCommand, DatanodeRegistration,
    FileKind, Health, Heartbeat, ReplicaEvent, ReplicaReport,
};
use sluice_common::{BlockId, ExtendedBlock, GenerationStamp};
use std::time::Duration;

const CLIENT: &str = "client-1";

fn cfg() -> MetadataConfig {
    MetadataConfig {
        default_replication: 3,
        min_replication: 1,
        ..MetadataConfig::default()
    }
}

fn open(cfg: &MetadataConfig, store: Arc<dyn MetaStore>) -> State {
    State::open(cfg, store, Instant::now()).unwrap()
}

fn must_state() -> State {
    open(&cfg(), Arc::new(SledStore::temporary().unwrap()))
}

fn dn(n: &str, rack: &str) -> DatanodeRegistration {
    DatanodeRegistration {
        id: DatanodeId {
            node_id: NodeId(n.into()),
            data_addr: format!("{n}:9866"),
            http_addr: format!("{n}:9864"),
            rack: rack.into(),
        },
        capacity: 1 << 40,
        used: 0,
        remaining: 1 << 40,
    }
}

fn node(n: &str) -> NodeId {
    NodeId(n.into())
}

fn with_nodes(s: &mut State, n: usize) {
    for i in 0..n {
        s.register(&dn(&format!("dn{i}"), "/default-rack"), Instant::now());
    }
}

fn opts(client: &str) -> CreateOptions {
    CreateOptions {
        client_name: client.into(),
        overwrite: false,
        create_parent: false,
        replication: 0,
        block_size: 0,
    }
}

fn hb(n: &str) -> Heartbeat {
    Heartbeat {
        node: node(n),
        capacity: 1 << 40,
        used: 0,
        remaining: 1 << 40,
        active_transfers: 0,
    }
}

/// Every DataNode of the pipeline reports the block finalized at `len`.
fn finalize(s: &mut State, lb: &LocatedBlock, len: u64) -> ExtendedBlock {
    let b = ExtendedBlock::new(lb.block.id, lb.block.gen_stamp, len);
    for d in &lb.locations {
        s.block_received(&d.node_id, &[ReplicaEvent::Received(b)])
            .unwrap();
    }
    b
}

/// Creates `path` with blocks of the given lengths, closed.
fn must_write(s: &mut State, path: &str, lens: &[u64]) -> Vec<ExtendedBlock> {
    s.create(path, &opts(CLIENT), Instant::now()).unwrap();
    let mut prev = None;
    let mut out = vec![];
    for &len in lens {
        let lb = s.add_block(path, CLIENT, prev, &[]).unwrap();
        let b = finalize(s, &lb, len);
        out.push(b);
        prev = Some(b);
    }
    assert!(s.complete(path, CLIENT, prev).unwrap());
    out
}

#[test]
fn mkdirs_create_list_stat() {
    let mut s = must_state();
    s.mkdirs("/a/b", true).unwrap();
    s.mkdirs("/a/b", false).unwrap();
    assert!(matches!(
        s.mkdirs("/x/y", false),
        Err(MetaError::NotFound { .. })
    ));
    s.create("/a/f", &opts(CLIENT), Instant::now()).unwrap();
    assert!(matches!(
        s.mkdirs("/a/f", true),
        Err(MetaError::AlreadyExists { .. })
    ));
    assert!(matches!(
        s.mkdirs("/a/f/g", true),
        Err(MetaError::NotADirectory { .. })
    ));
    let names: Vec<String> = s.list("/a").unwrap().into_iter().map(|f| f.path).collect();
    assert_eq!(names, ["/a/b", "/a/f"]);
    let f = s.stat("/a/f").unwrap();
    assert_eq!(
        (f.kind, f.replication, f.under_construction),
        (FileKind::File, 3, true)
    );
    assert_eq!(f.block_size, 128 << 20);
    assert_eq!(s.list("/a/f").unwrap(), vec![f]);
    assert_eq!(s.stat("/a").unwrap().kind, FileKind::Directory);
    assert!(matches!(s.stat("/nope"), Err(MetaError::NotFound { .. })));
    assert!(matches!(s.stat("a"), Err(MetaError::InvalidPath { .. })));
    assert!(matches!(
        s.list("/a/../b"),
        Err(MetaError::InvalidPath { .. })
    ));
}

#[test]
fn create_rules() {
    let mut s = must_state();
    let now = Instant::now();
    assert!(matches!(
        s.create("/d/f", &opts(CLIENT), now),
        Err(MetaError::NotFound { .. })
    ));
    let mut o = opts(CLIENT);
    o.create_parent = true;
    s.create("/d/f", &o, now).unwrap();
    assert!(matches!(
        s.create("/d/f", &opts("other"), now),
        Err(MetaError::LeaseConflict { holder, .. }) if holder == CLIENT
    ));
    assert!(matches!(
        s.create("/d/f", &opts(CLIENT), now),
        Err(MetaError::AlreadyExists { .. })
    ));
    assert!(matches!(
        s.create("/d", &opts(CLIENT), now),
        Err(MetaError::IsADirectory { .. })
    ));
    assert!(matches!(
        s.create("/d/f/g", &o, now),
        Err(MetaError::NotADirectory { .. })
    ));
    let mut bad = opts(CLIENT);
    bad.replication = 17;
    assert!(matches!(
        s.create("/r", &bad, now),
        Err(MetaError::InvalidArgument { .. })
    ));
    bad.replication = 2;
    bad.block_size = 1000;
    assert!(matches!(
        s.create("/r", &bad, now),
        Err(MetaError::InvalidArgument { .. })
    ));
    bad.block_size = 32 * 1024;
    assert!(matches!(
        s.create("/r", &bad, now),
        Err(MetaError::InvalidArgument { .. })
    ));
    bad.block_size = 1 << 20;
    let st = s.create("/r", &bad, now).unwrap();
    assert_eq!((st.replication, st.block_size), (2, 1 << 20));
}

#[test]
fn overwrite_drops_old_blocks() {
    let mut s = must_state();
    with_nodes(&mut s, 3);
    let old = must_write(&mut s, "/f", &[10]);
    let mut o = opts("other");
    o.overwrite = true;
    let st = s.create("/f", &o, Instant::now()).unwrap();
    assert_eq!((st.length, st.block_count), (0, 0));
    for i in 0..3 {
        let r = s.heartbeat(&hb(&format!("dn{i}")), Instant::now());
        assert_eq!(
            r.commands,
            vec![DatanodeCommand::Delete {
                blocks: old.clone()
            }]
        );
    }
}

#[test]
fn delete_and_rename() {
    let mut s = must_state();
    s.mkdirs("/a/b/c", true).unwrap();
    s.create("/a/b/c/f", &opts(CLIENT), Instant::now()).unwrap();
    assert!(!s.delete("/zz", false).unwrap());
    assert!(matches!(
        s.delete("/a", false),
        Err(MetaError::DirectoryNotEmpty { .. })
    ));
    assert!(matches!(
        s.rename("/a", "/a/b/x"),
        Err(MetaError::InvalidArgument { .. })
    ));
    assert!(matches!(
        s.rename("/a/b", "/a"),
        Err(MetaError::AlreadyExists { .. })
    ));
    assert!(matches!(
        s.rename("/nope", "/x"),
        Err(MetaError::NotFound { .. })
    ));
    assert!(matches!(
        s.rename("/a", "/q/x"),
        Err(MetaError::NotFound { .. })
    ));
    s.rename("/a/b", "/moved").unwrap();
    assert_eq!(s.stat("/moved/c/f").unwrap().path, "/moved/c/f");
    assert!(matches!(s.stat("/a/b"), Err(MetaError::NotFound { .. })));
    assert!(matches!(
        s.rename("/moved", "/moved/c/f/x"),
        Err(MetaError::InvalidArgument { .. })
    ));
    assert!(matches!(
        s.rename("/a", "/moved/c/f/x"),
        Err(MetaError::NotADirectory { .. })
    ));
    assert_eq!(s.open_files(), 1);
    assert!(s.delete("/moved", true).unwrap());
    assert_eq!(s.open_files(), 0);
    assert!(s.delete("/", true).unwrap());
    assert!(s.list("/").unwrap().is_empty());
    assert!(!s.delete("/", false).unwrap());
    let report = s.cluster_report(Instant::now());
    assert_eq!((report.files, report.directories), (0, 1));
}

#[test]
fn add_block_complete_flow() {
    let mut s = must_state();
    with_nodes(&mut s, 3);
    s.create("/f", &opts(CLIENT), Instant::now()).unwrap();
    assert!(matches!(
        s.add_block("/f", "other", None, &[]),
        Err(MetaError::NotLeaseHolder { .. })
    ));
    let b1 = s.add_block("/f", CLIENT, None, &[]).unwrap();
    assert_eq!(b1.locations.len(), 3);
    assert_eq!(b1.offset, 0);
    assert!(b1.block.id.0 >= 1 << 30 && b1.block.gen_stamp.0 >= 1000);
    // A retried add_block gets the same block.
    assert_eq!(s.add_block("/f", CLIENT, None, &[]).unwrap(), b1);
    let done1 = ExtendedBlock::new(b1.block.id, b1.block.gen_stamp, 100);
    let b2 = s.add_block("/f", CLIENT, Some(done1), &[]).unwrap();
    assert_eq!(b2.offset, 100);
    let done2 = ExtendedBlock::new(b2.block.id, b2.block.gen_stamp, 50);
    // b1 is committed but has no replica: the next block must wait.
    assert_eq!(
        s.add_block("/f", CLIENT, Some(done2), &[]),
        Err(MetaError::NotReplicatedYet { block: b1.block.id })
    );
    assert!(!s.complete("/f", CLIENT, Some(done2)).unwrap());
    finalize(&mut s, &b1, 100);
    assert!(!s.complete("/f", CLIENT, Some(done2)).unwrap());
    assert_eq!(s.stat("/f").unwrap().length, 150);
    // A replica of the wrong length does not count (and is corrupt).
    s.block_received(
        &b2.locations[0].node_id,
        &[ReplicaEvent::Received(ExtendedBlock {
            num_bytes: 49,
            ..done2
        })],
    )
    .unwrap();
    assert!(!s.complete("/f", CLIENT, Some(done2)).unwrap());
    s.block_received(&b2.locations[1].node_id, &[ReplicaEvent::Received(done2)])
        .unwrap();
    assert!(s.complete("/f", CLIENT, Some(done2)).unwrap());
    let st = s.stat("/f").unwrap();
    assert_eq!(
        (st.length, st.block_count, st.under_construction),
        (150, 2, false)
    );
    // Retried complete by the same client: true; others are refused.
    assert!(s.complete("/f", CLIENT, Some(done2)).unwrap());
    assert!(matches!(
        s.complete("/f", "other", Some(done2)),
        Err(MetaError::NotUnderConstruction { .. })
    ));
    assert!(matches!(
        s.add_block("/f", CLIENT, Some(done2), &[]),
        Err(MetaError::NotUnderConstruction { .. })
    ));
    assert_eq!(s.open_files(), 0);
}

#[test]
fn add_block_argument_checks_and_abandon() {
    let mut s = must_state();
    with_nodes(&mut s, 2);
    s.create("/f", &opts(CLIENT), Instant::now()).unwrap();
    assert_eq!(
        s.add_block("/f", CLIENT, None, &[]),
        Err(MetaError::NotEnoughDatanodes {
            needed: 3,
            available: 2
        })
    );
    with_nodes(&mut s, 5);
    let excl = [node("dn0"), node("dn1")];
    let b = s.add_block("/f", CLIENT, None, &excl).unwrap();
    assert!(b.locations.iter().all(|d| !excl.contains(&d.node_id)));
    let wrong_gs = ExtendedBlock::new(b.block.id, GenerationStamp(1), 0);
    assert!(matches!(
        s.add_block("/f", CLIENT, Some(wrong_gs), &[]),
        Err(MetaError::GenerationStampMismatch { .. })
    ));
    let unknown = ExtendedBlock::new(BlockId(5), b.block.gen_stamp, 0);
    assert!(matches!(
        s.add_block("/f", CLIENT, Some(unknown), &[]),
        Err(MetaError::InvalidArgument { .. })
    ));
    s.abandon_block("/f", CLIENT, b.block).unwrap();
    s.abandon_block("/f", CLIENT, b.block).unwrap();
    assert_eq!(s.stat("/f").unwrap().block_count, 0);
    for d in &b.locations {
        let r = s.heartbeat(&hb(&d.node_id.0), Instant::now());
        assert_eq!(
            r.commands,
            vec![DatanodeCommand::Delete {
                blocks: vec![b.block]
            }]
        );
    }
    let b2 = s.add_block("/f", CLIENT, None, &[]).unwrap();
    assert_ne!(b2.block.id, b.block.id);
    // An empty file closes at once.
    s.create("/empty", &opts(CLIENT), Instant::now()).unwrap();
    assert!(s.complete("/empty", CLIENT, None).unwrap());
}

#[test]
fn fsync_shows_length() {
    let mut s = must_state();
    with_nodes(&mut s, 3);
    s.create("/f", &opts(CLIENT), Instant::now()).unwrap();
    s.add_block("/f", CLIENT, None, &[]).unwrap();
    s.fsync("/f", CLIENT, 4096).unwrap();
    assert_eq!(s.stat("/f").unwrap().length, 4096);
    assert!(matches!(
        s.fsync("/f", "x", 1),
        Err(MetaError::NotLeaseHolder { .. })
    ));
    let lbs = s.get_block_locations("/f", 0, u64::MAX).unwrap();
    assert!(lbs.under_construction);
    assert_eq!(lbs.file_length, 4096);
    assert_eq!(lbs.blocks[0].locations.len(), 3);
}

#[test]
fn block_locations_ranges_and_corrupt() {
    let mut s = must_state();
    with_nodes(&mut s, 4);
    let blocks = must_write(&mut s, "/f", &[100, 100, 50]);
    let lbs = s.get_block_locations("/f", 150, 60).unwrap();
    assert!(!lbs.under_construction);
    assert_eq!(lbs.file_length, 250);
    let got: Vec<(BlockId, u64)> = lbs.blocks.iter().map(|b| (b.block.id, b.offset)).collect();
    assert_eq!(got, vec![(blocks[1].id, 100), (blocks[2].id, 200)]);
    assert!(s
        .get_block_locations("/f", 250, 10)
        .unwrap()
        .blocks
        .is_empty());
    assert!(matches!(
        s.get_block_locations("/", 0, 1),
        Err(MetaError::IsADirectory { .. })
    ));
    let first = &s.get_block_locations("/f", 0, 1).unwrap().blocks[0];
    assert_eq!(first.locations.len(), 3);
    let bad: Vec<BadReplica> = first
        .locations
        .iter()
        .take(2)
        .map(|d| BadReplica {
            block: blocks[0],
            node: d.node_id.clone(),
            reason: "crc".into(),
        })
        .collect();
    s.report_bad_blocks(&bad);
    let first = s.get_block_locations("/f", 0, 1).unwrap().blocks[0].clone();
    assert_eq!(first.locations.len(), 1);
    assert!(!first.corrupt);
    let fsck = s.fsck("/f").unwrap();
    assert_eq!(fsck.files[0].blocks[0].health, Health::Corrupt);
    assert_eq!(fsck.files[0].blocks[0].corrupt_locations.len(), 2);
    assert_eq!(fsck.health, Health::Corrupt);
    let last = first.locations[0].node_id.clone();
    s.report_bad_blocks(&[BadReplica {
        block: blocks[0],
        node: last,
        reason: "crc".into(),
    }]);
    let first = s.get_block_locations("/f", 0, 1).unwrap().blocks[0].clone();
    assert!(first.corrupt);
    assert_eq!(first.locations.len(), 3);
    assert_eq!(s.fsck("/").unwrap().health, Health::Missing);
}

#[test]
fn pipeline_recovery_checks() {
    let mut s = must_state();
    with_nodes(&mut s, 4);
    s.create("/f", &opts(CLIENT), Instant::now()).unwrap();
    let lb = s.add_block("/f", CLIENT, None, &[]).unwrap();
    let unknown = ExtendedBlock::new(BlockId(7), GenerationStamp(1000), 0);
    assert_eq!(
        s.update_block_for_pipeline(unknown, CLIENT),
        Err(MetaError::UnknownBlock { block: BlockId(7) })
    );
    assert!(matches!(
        s.update_block_for_pipeline(lb.block, "other"),
        Err(MetaError::NotLeaseHolder { .. })
    ));
    let fresh = s.update_block_for_pipeline(lb.block, CLIENT).unwrap();
    assert!(fresh.block.gen_stamp > lb.block.gen_stamp);
    assert_eq!(fresh.locations, lb.locations);
    let newer = s.update_block_for_pipeline(lb.block, CLIENT).unwrap();
    assert!(newer.block.gen_stamp > fresh.block.gen_stamp);
    let survivors: Vec<NodeId> = lb.locations[..2]
        .iter()
        .map(|d| d.node_id.clone())
        .collect();
    let extra = s
        .get_additional_datanodes(&AdditionalDatanodes {
            path: "/f".into(),
            client: CLIENT.into(),
            block: lb.block,
            existing: survivors.clone(),
            exclude: vec![lb.locations[2].node_id.clone()],
            count: 1,
        })
        .unwrap();
    assert_eq!(extra.len(), 1);
    assert!(!lb.locations.contains(&extra[0]));
    let mut nodes = survivors.clone();
    nodes.push(extra[0].node_id.clone());
    let new_block = ExtendedBlock::new(lb.block.id, newer.block.gen_stamp, 512);
    // Only the latest stamp handed out is accepted, and the old stamp must be current.
    let stale_new = ExtendedBlock {
        gen_stamp: fresh.block.gen_stamp,
        ..new_block
    };
    assert!(matches!(
        s.update_pipeline(CLIENT, lb.block, stale_new, &nodes),
        Err(MetaError::GenerationStampMismatch { .. })
    ));
    let wrong_old = ExtendedBlock {
        gen_stamp: fresh.block.gen_stamp,
        ..lb.block
    };
    assert!(matches!(
        s.update_pipeline(CLIENT, wrong_old, new_block, &nodes),
        Err(MetaError::GenerationStampMismatch { .. })
    ));
    assert!(matches!(
        s.update_pipeline("other", lb.block, new_block, &nodes),
        Err(MetaError::NotLeaseHolder { .. })
    ));
    assert!(matches!(
        s.update_pipeline(CLIENT, lb.block, new_block, &[node("ghost")]),
        Err(MetaError::UnknownDatanode { .. })
    ));
    s.update_pipeline(CLIENT, lb.block, new_block, &nodes)
        .unwrap();
    let lbs = s.get_block_locations("/f", 0, u64::MAX).unwrap();
    assert_eq!(lbs.blocks[0].block, new_block);
    let got: Vec<NodeId> = lbs.blocks[0]
        .locations
        .iter()
        .map(|d| d.node_id.clone())
        .collect();
    assert_eq!(got, nodes);
    // A replica left with the old stamp is deleted when reported.
    let dropped = &lb.locations[2].node_id;
    s.block_received(
        dropped,
        &[ReplicaEvent::Received(ExtendedBlock {
            num_bytes: 10,
            ..lb.block
        })],
    )
    .unwrap();
    let r = s.heartbeat(&hb(&dropped.0), Instant::now());
    assert_eq!(
        r.commands,
        vec![DatanodeCommand::Delete {
            blocks: vec![ExtendedBlock {
                num_bytes: 10,
                ..lb.block
            }]
        }]
    );
    // Finishing the block with the new stamp closes the file.
    let done = ExtendedBlock {
        num_bytes: 1024,
        ..new_block
    };
    for n in &nodes {
        s.block_received(n, &[ReplicaEvent::Received(done)])
            .unwrap();
    }
    assert!(s.complete("/f", CLIENT, Some(done)).unwrap());
    assert!(matches!(
        s.update_block_for_pipeline(done, CLIENT),
        Err(MetaError::NotUnderConstruction { .. })
    ));
}

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
        s.heartbeat(&hb("dn0"), Instant::now()).commands,
        vec![DatanodeCommand::Delete {
            blocks: vec![unknown.block]
        }]
    );
    assert_eq!(
        s.heartbeat(&hb("dn1"), Instant::now()).commands,
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
        s.heartbeat(&hb("ghost"), Instant::now()).commands,
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
    let r = s.heartbeat(&hb("dn0"), Instant::now());
    let DatanodeCommand::Delete { blocks } = &r.commands[0] else {
        panic!("{r:?}")
    };
    assert_eq!(blocks.len(), 2);
    assert_eq!(s.heartbeat(&hb("dn0"), Instant::now()).commands, vec![]);
    // Bounded per heartbeat.
    let id = blocks[0].id;
    for i in 0..(MAX_DELETES_PER_HEARTBEAT as u64 + 5) {
        s.blocks.schedule_delete(
            &node("dn1"),
            ExtendedBlock::new(BlockId(id.0 + 1000 + i), GenerationStamp(1), 0),
        );
    }
    let r = s.heartbeat(&hb("dn1"), Instant::now());
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
    let mut s = open(&c, Arc::new(SledStore::temporary().unwrap()));
    let t0 = Instant::now();
    for i in 0..3 {
        s.register(&dn(&format!("dn{i}"), "/r"), t0);
    }
    let blocks = must_write(&mut s, "/f", &[10]);
    assert_eq!(s.fsck("/").unwrap().health, Health::Healthy);
    // dn0 and dn1 keep heart-beating; dn2 goes silent.
    let at = |secs| t0 + Duration::from_secs(secs);
    for t in [20, 40, 59] {
        s.heartbeat(&hb("dn0"), at(t));
        s.heartbeat(&hb("dn1"), at(t));
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
    // Placement now avoids the dead node.
    s.create("/g", &opts(CLIENT), at(61)).unwrap();
    assert_eq!(
        s.add_block("/g", CLIENT, None, &[]),
        Err(MetaError::NotEnoughDatanodes {
            needed: 3,
            available: 2
        })
    );
    // A dead node's heartbeat asks it to re-register; after that and a report it counts.
    assert_eq!(
        s.heartbeat(&hb("dn2"), at(62)).commands,
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
    assert!(
        matches!(&s.tick(later)[..], [MonitorAction::LeaseExpired { holder, files }] if holder == CLIENT && files.len() == 1)
    );
    assert!(s.tick(later + Duration::from_secs(1)).is_empty());
}

#[test]
fn state_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let c = cfg();
    let (b1, counters) = {
        let store = Arc::new(SledStore::open(dir.path()).unwrap());
        let mut s = open(&c, store.clone());
        with_nodes(&mut s, 3);
        s.mkdirs("/d/e", true).unwrap();
        let b1 = must_write(&mut s, "/d/closed", &[100, 7]);
        s.create("/d/open", &opts(CLIENT), Instant::now()).unwrap();
        let lb = s.add_block("/d/open", CLIENT, None, &[]).unwrap();
        s.fsync("/d/open", CLIENT, 33).unwrap();
        let gs = s
            .update_block_for_pipeline(lb.block, CLIENT)
            .unwrap()
            .block
            .gen_stamp;
        s.rename("/d/e", "/d/e2").unwrap();
        drop(s);
        store.close().unwrap();
        (b1, (lb.block.id, gs))
    };
    let store = Arc::new(SledStore::open(dir.path()).unwrap());
    let mut s = open(&c, store);
    let names: Vec<String> = s.list("/d").unwrap().into_iter().map(|f| f.path).collect();
    assert_eq!(names, ["/d/closed", "/d/e2", "/d/open"]);
    let closed = s.stat("/d/closed").unwrap();
    assert_eq!(
        (closed.length, closed.block_count, closed.under_construction),
        (107, 2, false)
    );
    let open_f = s.stat("/d/open").unwrap();
    assert_eq!((open_f.length, open_f.under_construction), (33, true));
    let lbs = s.get_block_locations("/d/closed", 0, u64::MAX).unwrap();
    let got: Vec<ExtendedBlock> = lbs.blocks.iter().map(|b| b.block).collect();
    assert_eq!(got, b1);
    assert!(
        lbs.blocks.iter().all(|b| b.locations.is_empty()),
        "locations come from reports"
    );
    // The lease survived: only its holder can go on.
    assert!(matches!(
        s.add_block("/d/open", "other", None, &[]),
        Err(MetaError::NotLeaseHolder { .. })
    ));
    // Counters never go backwards.
    with_nodes(&mut s, 3);
    s.create("/n", &opts(CLIENT), Instant::now()).unwrap();
    let nb = s.add_block("/n", CLIENT, None, &[]).unwrap();
    assert!(nb.block.id > counters.0);
    assert!(nb.block.gen_stamp > counters.1);
    // Reports bring locations back.
    for i in 0..3 {
        let reps: Vec<ReplicaReport> = b1
            .iter()
            .map(|b| ReplicaReport {
                block: *b,
                state: ReplicaState::Finalized,
            })
            .collect();
        s.block_report(&node(&format!("dn{i}")), &reps).unwrap();
    }
    let lbs = s.get_block_locations("/d/closed", 0, u64::MAX).unwrap();
    assert!(lbs.blocks.iter().all(|b| b.locations.len() == 3));
    assert_eq!(s.fsck("/d/closed").unwrap().health, Health::Healthy);
}
