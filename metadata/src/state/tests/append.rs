//! Append: a closed file reopened under a new lease, its partial last block under
//! construction again on the DataNodes holding it, or a new block after a full one.

use super::*;

#[test]
fn append_reopens_the_partial_last_block_and_records_the_new_stamp() {
    let mut s = must_state();
    with_nodes(&mut s, 3);
    let bs = cfg().default_block_size.bytes();
    let blocks = must_write(&mut s, "/f", &[bs, 100]);
    let last = blocks[1];
    let a = s.append("/f", "app", Instant::now()).unwrap();
    assert!(a.status.under_construction);
    assert_eq!(a.status.length, bs + 100);
    assert_eq!(a.previous, None);
    let lb = a.last_block.unwrap();
    assert_eq!((lb.block, lb.offset, lb.locations.len()), (last, bs, 3));
    // The lease: another appender, or the holder again, is refused; the old writer too.
    for who in ["other", "app"] {
        assert!(matches!(
            s.append("/f", who, Instant::now()),
            Err(MetaError::LeaseConflict { .. })
        ));
    }
    assert!(matches!(
        s.update_block_for_pipeline(last, CLIENT),
        Err(MetaError::NotLeaseHolder { .. })
    ));
    // The writer's set-up: a new stamp, the pipeline recorded, bytes appended, complete.
    let gs = s
        .update_block_for_pipeline(last, "app")
        .unwrap()
        .block
        .gen_stamp;
    assert!(gs > last.gen_stamp);
    let nodes: Vec<NodeId> = lb.locations.iter().map(|d| d.node_id.clone()).collect();
    let reopened = ExtendedBlock::new(last.id, gs, 100);
    s.update_pipeline("app", last, reopened, &nodes).unwrap();
    let done = ExtendedBlock::new(last.id, gs, 250);
    assert!(
        !s.complete("/f", "app", Some(done)).unwrap(),
        "no replica reported yet"
    );
    let grown = LocatedBlock {
        block: done,
        ..lb.clone()
    };
    finalize(&mut s, &grown, 250);
    assert!(s.complete("/f", "app", Some(done)).unwrap());
    let st = s.stat("/f").unwrap();
    assert_eq!((st.length, st.under_construction), (bs + 250, false));
    let located = s.get_block_locations("/f", 0, u64::MAX).unwrap();
    assert_eq!(located.blocks[1].block, done);
    assert_eq!(located.blocks[1].locations.len(), 3);
    assert_eq!(s.open_files(), 0);
}

#[test]
fn append_after_a_full_block_or_to_an_empty_file_starts_a_new_block() {
    let mut s = must_state();
    with_nodes(&mut s, 3);
    let bs = cfg().default_block_size.bytes();
    let blocks = must_write(&mut s, "/full", &[bs]);
    let a = s.append("/full", "app", Instant::now()).unwrap();
    assert_eq!((a.last_block, a.previous), (None, Some(blocks[0])));
    let lb = s.add_block("/full", "app", a.previous, &[]).unwrap();
    assert_eq!(lb.offset, bs);
    let b = finalize(&mut s, &lb, 5);
    assert!(s.complete("/full", "app", Some(b)).unwrap());
    assert_eq!(s.stat("/full").unwrap().length, bs + 5);

    must_write(&mut s, "/empty", &[]);
    let a = s.append("/empty", "app", Instant::now()).unwrap();
    assert_eq!((a.last_block, a.previous), (None, None));
    assert!(s.complete("/empty", "app", None).unwrap());
    // Missing paths and directories.
    assert!(matches!(
        s.append("/none", "app", Instant::now()),
        Err(MetaError::NotFound { .. })
    ));
    s.mkdirs("/d", false).unwrap();
    assert!(matches!(
        s.append("/d", "app", Instant::now()),
        Err(MetaError::IsADirectory { .. })
    ));
}

#[test]
fn an_appended_block_is_under_construction_again_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let c = cfg();
    let last = {
        let store = Arc::new(SledStore::open(dir.path()).unwrap());
        let mut s = open(&c, store.clone());
        with_nodes(&mut s, 3);
        let b = must_write(&mut s, "/f", &[10]);
        s.append("/f", "app", Instant::now()).unwrap();
        drop(s);
        store.close().unwrap();
        b[0]
    };
    let store = Arc::new(SledStore::open(dir.path()).unwrap());
    let mut s = open(&c, store);
    with_nodes(&mut s, 3);
    let st = s.stat("/f").unwrap();
    assert_eq!((st.length, st.under_construction), (10, true));
    let gs = s
        .update_block_for_pipeline(last, "app")
        .unwrap()
        .block
        .gen_stamp;
    assert!(gs > last.gen_stamp);
}
