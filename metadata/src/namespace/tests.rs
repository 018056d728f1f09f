//! The in-memory tree against the store: in step after every change, never read from for a
//! lookup, unchanged by a batch the store refused, rebuilt from the store on reopen.

use super::tree::Tree;
use super::*;
use crate::commit::CommitClock;
use crate::store::{FlushFuture, KvPairs, MemStore};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// A [`MemStore`] that counts reads and can refuse batches.
#[derive(Default)]
struct Watched {
    inner: MemStore,
    reads: AtomicU64,
    refuse: AtomicBool,
    /// Keys of the last batch applied.
    last: std::sync::Mutex<Vec<Vec<u8>>>,
}

impl MetaStore for Watched {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        self.inner.get(key)
    }
    fn scan_prefix(&self, prefix: &[u8]) -> Result<KvPairs, StoreError> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        self.inner.scan_prefix(prefix)
    }
    fn apply(&self, batch: WriteBatch) -> Result<(), StoreError> {
        if self.refuse.load(Ordering::SeqCst) {
            return Err(StoreError::Backend("refused".into()));
        }
        *self.last.lock().unwrap() = batch.ops.iter().map(|(k, _)| k.clone()).collect();
        self.inner.apply(batch)
    }
    fn flush(&self) -> FlushFuture<'_> {
        self.inner.flush()
    }
    fn clock(&self) -> &Arc<CommitClock> {
        self.inner.clock()
    }
    fn close(&self) -> Result<(), StoreError> {
        self.inner.close()
    }
}

/// A change made to a namespace under test.
type Change = Box<dyn Fn(&mut Namespace)>;

fn p(s: &str) -> NsPath {
    NsPath::parse(s).unwrap()
}

fn req(overwrite: bool) -> CreateRequest {
    CreateRequest {
        client: "c1".into(),
        overwrite,
        create_parent: true,
        replication: 3,
        block_size: 1 << 20,
    }
}

fn open(store: &Arc<Watched>) -> Namespace {
    Namespace::open(store.clone()).unwrap().0
}

#[test]
fn memory_is_in_step_with_the_store_after_every_change() {
    let store = Arc::new(Watched::default());
    let mut ns = open(&store);
    let changes: Vec<Change> = vec![
        Box::new(|ns| ns.mkdirs(&p("/a/b/c"), true, 1).unwrap()),
        Box::new(|ns| drop(ns.create(&p("/a/b/f1"), &req(false), 2).unwrap())),
        Box::new(|ns| drop(ns.create(&p("/a/f2"), &req(false), 3).unwrap())),
        Box::new(|ns| drop(ns.create(&p("/a/b/f1"), &req(true), 4).unwrap())),
        Box::new(|ns| drop(ns.create(&p("/n/e/w"), &req(false), 5).unwrap())),
        Box::new(|ns| ns.rename(&p("/a/b"), &p("/x"), 6).unwrap()),
        Box::new(|ns| ns.rename(&p("/x/f1"), &p("/a/g"), 7).unwrap()),
        Box::new(|ns| {
            let mut f = ns.resolve(&p("/a/g")).unwrap().unwrap();
            f.file_mut().unwrap().writer = None;
            ns.update(&f).unwrap();
        }),
        Box::new(|ns| drop(ns.delete(&p("/a"), true, 8).unwrap())),
        Box::new(|ns| drop(ns.delete(&p("/x/c"), false, 9).unwrap())),
        Box::new(|ns| drop(ns.delete(&p("/"), true, 10).unwrap())),
    ];
    for (i, change) in changes.iter().enumerate() {
        change(&mut ns);
        let stored = Tree::load(store.as_ref()).unwrap();
        assert_eq!(ns.tree, stored, "after change {i}");
    }
}

#[test]
fn lookups_never_read_the_store() {
    let store = Arc::new(Watched::default());
    let mut ns = open(&store);
    ns.mkdirs(&p("/d/e"), true, 1).unwrap();
    ns.create(&p("/d/e/f"), &req(false), 2).unwrap();
    ns.rename(&p("/d/e/f"), &p("/d/g"), 3).unwrap();
    store.reads.store(0, Ordering::SeqCst);
    assert_eq!(ns.stat(&p("/d/g")).unwrap().path, "/d/g");
    assert_eq!(ns.list(&p("/d")).unwrap().len(), 2);
    assert!(ns.resolve(&p("/d/e/f")).unwrap().is_none());
    let g = ns.resolve(&p("/d/g")).unwrap().unwrap();
    assert_eq!(ns.path_of(&g).unwrap(), "/d/g");
    assert_eq!(ns.walk(&p("/d/e/x/y")).unwrap().found.len(), 3);
    ns.create(&p("/d/h"), &req(false), 4).unwrap();
    assert_eq!(
        store.reads.load(Ordering::SeqCst),
        0,
        "a lookup read the store"
    );
}

#[test]
fn a_refused_batch_leaves_memory_as_the_store_is() {
    let store = Arc::new(Watched::default());
    let mut ns = open(&store);
    ns.mkdirs(&p("/d"), true, 1).unwrap();
    store.refuse.store(true, Ordering::SeqCst);
    assert!(ns.create(&p("/d/f"), &req(false), 2).is_err());
    assert!(ns.rename(&p("/d"), &p("/e"), 3).is_err());
    store.refuse.store(false, Ordering::SeqCst);
    assert!(ns.resolve(&p("/d/f")).unwrap().is_none());
    assert!(ns.resolve(&p("/d")).unwrap().is_some());
    assert_eq!(ns.tree, Tree::load(store.as_ref()).unwrap());
}

#[test]
fn reopening_rebuilds_memory_from_what_was_durable() {
    let store = Arc::new(MemStore::new());
    let (mut ns, _) = Namespace::open(store.clone()).unwrap();
    ns.create(&p("/kept/f"), &req(false), 1).unwrap();
    futures::executor::block_on(store.flush()).unwrap();
    ns.create(&p("/lost/f"), &req(false), 2).unwrap();
    let (again, files) = Namespace::open(Arc::new(store.crashed())).unwrap();
    assert!(again.resolve(&p("/kept/f")).unwrap().is_some());
    assert!(again.resolve(&p("/lost")).unwrap().is_none());
    assert_eq!(files.len(), 1);
    assert_eq!(again.file_count(), 1);
}

#[test]
fn a_change_writes_only_the_counters_it_moved() {
    let store = Arc::new(Watched::default());
    let mut ns = open(&store);
    let counters = |store: &Watched| -> Vec<Vec<u8>> {
        let last = store.last.lock().unwrap();
        last.iter()
            .filter(|k| k.starts_with(b"m:"))
            .cloned()
            .collect()
    };
    ns.create(&p("/f"), &req(false), 1).unwrap();
    assert_eq!(counters(&store), vec![NEXT_INODE_KEY.to_vec()]);
    ns.alloc_block_id();
    ns.alloc_gen_stamp();
    let mut f = ns.resolve(&p("/f")).unwrap().unwrap();
    f.mtime_ms = 2;
    ns.update(&f).unwrap();
    assert_eq!(
        counters(&store),
        vec![NEXT_BLOCK_KEY.to_vec(), NEXT_GENSTAMP_KEY.to_vec()]
    );
    ns.rename(&p("/f"), &p("/g"), 3).unwrap();
    assert!(counters(&store).is_empty());
    // Reopened, the counters are where they were.
    let (again, _) = Namespace::open(store.clone()).unwrap();
    assert_eq!(
        (again.next_inode, again.next_block, again.next_gen_stamp),
        (ns.next_inode, ns.next_block, ns.next_gen_stamp)
    );
}
