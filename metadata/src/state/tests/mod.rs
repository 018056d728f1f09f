//! Unit tests of the service logic, on a temporary sled store, without a runtime: helpers and
//! namespace tests here, the write path in `writes`, DataNode reports and liveness in `reports`.

mod append;
mod held;
mod lease;
mod repair;
mod reports;
mod writes;

use super::*;
use crate::store::{MemStore, SledStore};
use sluice_common::proto::ReplicaState;
use sluice_common::rpc::LocatedBlock;
use sluice_common::rpc::{
    AdditionalDatanodes, BadReplica, CreateOptions, DatanodeCommand, DatanodeRegistration,
    FileKind, Health, Heartbeat, HeartbeatResponse, ReplicaEvent, ReplicaReport,
};
use sluice_common::{BlockId, ExtendedBlock, GenerationStamp};
use std::time::Duration;

pub(super) const CLIENT: &str = "client-1";

pub(super) fn cfg() -> MetadataConfig {
    MetadataConfig {
        default_replication: 3,
        min_replication: 1,
        ..MetadataConfig::default()
    }
}

pub(super) fn open(cfg: &MetadataConfig, store: Arc<dyn MetaStore>) -> State {
    State::open(cfg, store, Instant::now()).unwrap()
}

pub(super) fn must_state() -> State {
    open(&cfg(), Arc::new(MemStore::new()))
}

/// A heartbeat after a flush (the state tests model a service whose changes are durable).
pub(super) fn flushed_heartbeat(s: &mut State, hb: &Heartbeat, now: Instant) -> HeartbeatResponse {
    futures::executor::block_on(s.store().flush()).unwrap();
    s.heartbeat(hb, now)
}

pub(super) fn dn(n: &str, rack: &str) -> DatanodeRegistration {
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

pub(super) fn node(n: &str) -> NodeId {
    NodeId(n.into())
}

pub(super) fn with_nodes(s: &mut State, n: usize) {
    for i in 0..n {
        s.register(&dn(&format!("dn{i}"), "/default-rack"), Instant::now());
    }
}

pub(super) fn opts(client: &str) -> CreateOptions {
    CreateOptions {
        client_name: client.into(),
        overwrite: false,
        create_parent: false,
        replication: 0,
        block_size: 0,
    }
}

pub(super) fn hb(n: &str) -> Heartbeat {
    Heartbeat {
        node: node(n),
        capacity: 1 << 40,
        used: 0,
        remaining: 1 << 40,
        active_transfers: 0,
        transfers_in_progress: 0,
        active_pipelines: 0,
        buffered_replicas: 0,
    }
}

/// Every DataNode of the pipeline reports the block finalized at `len`.
pub(super) fn finalize(s: &mut State, lb: &LocatedBlock, len: u64) -> ExtendedBlock {
    let b = ExtendedBlock::new(lb.block.id, lb.block.gen_stamp, len);
    for d in &lb.locations {
        s.block_received(&d.node_id, &[ReplicaEvent::Received(b)])
            .unwrap();
    }
    b
}

/// Creates `path` with blocks of the given lengths, closed.
pub(super) fn must_write(s: &mut State, path: &str, lens: &[u64]) -> Vec<ExtendedBlock> {
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
        let r = flushed_heartbeat(&mut s, &hb(&format!("dn{i}")), Instant::now());
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
