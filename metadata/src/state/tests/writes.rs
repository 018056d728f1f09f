//! The write path: add_block, complete, fsync, abandon, pipeline recovery, locations.

use super::*;
use crate::events::EventKind;

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
    s.create("/f", &opts(CLIENT), Instant::now()).unwrap();
    // No DataNode at all; then fewer than the replication factor but at least
    // replication.min: the block starts on the ones there are (HDFS chooseTarget4NewBlock).
    assert_eq!(
        s.add_block("/f", CLIENT, None, &[]),
        Err(MetaError::NotEnoughDatanodes {
            needed: 3,
            available: 0
        })
    );
    with_nodes(&mut s, 2);
    let two = s.add_block("/f", CLIENT, None, &[]).unwrap();
    assert_eq!(two.locations.len(), 2);
    s.abandon_block("/f", CLIENT, two.block).unwrap();
    // Above replication.min only: with min 3, two DataNodes are not enough.
    let strict_cfg = MetadataConfig {
        min_replication: 3,
        ..cfg()
    };
    let mut strict = open(&strict_cfg, Arc::new(MemStore::new()));
    with_nodes(&mut strict, 2);
    strict.create("/f", &opts(CLIENT), Instant::now()).unwrap();
    assert_eq!(
        strict.add_block("/f", CLIENT, None, &[]),
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
        let r = flushed_heartbeat(&mut s, &hb(&d.node_id.0), Instant::now());
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
    assert!(s.events().is_empty(), "refused updates are no recovery");
    s.update_pipeline(CLIENT, lb.block, new_block, &nodes)
        .unwrap();
    let kinds: Vec<EventKind> = s.events().into_iter().map(|e| e.kind).collect();
    assert_eq!(
        kinds,
        vec![EventKind::PipelineRecovered {
            block: new_block,
            nodes: nodes.clone()
        }]
    );
    assert_eq!(s.repair_report().counters.pipeline_recoveries, 1);
    let lbs = s.get_block_locations("/f", 0, u64::MAX).unwrap();
    assert_eq!(lbs.blocks[0].block, new_block);
    let got: Vec<NodeId> = lbs.blocks[0]
        .locations
        .iter()
        .map(|d| d.node_id.clone())
        .collect();
    assert_eq!(got, nodes);
    // The DataNode taken out of the pipeline is asked at once to delete its replica under the
    // old stamp: it does not report replicas being written, so no report would tell.
    let dropped = &lb.locations[2].node_id;
    let r = flushed_heartbeat(&mut s, &hb(&dropped.0), Instant::now());
    assert_eq!(
        r.commands,
        vec![DatanodeCommand::Delete {
            blocks: vec![ExtendedBlock::new(lb.block.id, lb.block.gen_stamp, 0)]
        }]
    );
    // A replica left with the old stamp is deleted when reported.
    s.block_received(
        dropped,
        &[ReplicaEvent::Received(ExtendedBlock {
            num_bytes: 10,
            ..lb.block
        })],
    )
    .unwrap();
    let r = flushed_heartbeat(&mut s, &hb(&dropped.0), Instant::now());
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

fn invalid(res: Result<impl std::fmt::Debug, MetaError>, arg: &str, value: u64) {
    match res {
        Err(MetaError::InvalidArgument { name, reason }) => {
            assert_eq!(name, arg);
            assert!(reason.contains(&value.to_string()), "{reason}");
        }
        other => panic!("expected InvalidArgument({arg}), got {other:?}"),
    }
}

#[test]
fn lengths_above_the_block_size_are_refused() {
    let mut s = must_state();
    with_nodes(&mut s, 3);
    let o = CreateOptions {
        block_size: 1 << 20,
        ..opts(CLIENT)
    };
    s.create("/f", &o, Instant::now()).unwrap();
    let lb = s.add_block("/f", CLIENT, None, &[]).unwrap();
    let too_long = (1 << 20) + 1;
    let prev = ExtendedBlock::new(lb.block.id, lb.block.gen_stamp, too_long);
    invalid(
        s.add_block("/f", CLIENT, Some(prev), &[]),
        "previous",
        too_long,
    );
    invalid(s.complete("/f", CLIENT, Some(prev)), "last", too_long);
    invalid(
        s.fsync("/f", CLIENT, too_long),
        "last_block_length",
        too_long,
    );
    invalid(
        s.fsync("/f", CLIENT, u64::MAX),
        "last_block_length",
        u64::MAX,
    );
    // Nothing was recorded; the block size itself is fine.
    assert_eq!(s.stat("/f").unwrap().length, 0);
    let full = ExtendedBlock::new(lb.block.id, lb.block.gen_stamp, 1 << 20);
    finalize(&mut s, &lb, 1 << 20);
    assert!(s.complete("/f", CLIENT, Some(full)).unwrap());
}

#[test]
fn a_file_length_that_overflows_is_refused() {
    let mut s = must_state();
    for i in 0..3 {
        let mut d = dn(&format!("dn{i}"), "/default-rack");
        (d.capacity, d.remaining) = (u64::MAX, u64::MAX);
        s.register(&d, Instant::now());
    }
    let huge = u64::MAX / 512 * 512;
    let o = CreateOptions {
        block_size: huge,
        ..opts(CLIENT)
    };
    s.create("/f", &o, Instant::now()).unwrap();
    let lb1 = s.add_block("/f", CLIENT, None, &[]).unwrap();
    let b1 = finalize(&mut s, &lb1, huge);
    let lb2 = s.add_block("/f", CLIENT, Some(b1), &[]).unwrap();
    invalid(s.fsync("/f", CLIENT, huge), "last_block_length", huge);
    let last = ExtendedBlock::new(lb2.block.id, lb2.block.gen_stamp, huge);
    invalid(s.complete("/f", CLIENT, Some(last)), "last", huge);
    invalid(s.add_block("/f", CLIENT, Some(last), &[]), "previous", huge);
    assert_eq!(s.stat("/f").unwrap().length, huge);
}
