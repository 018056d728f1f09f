//! [`MemStore`]: a [`MetaStore`] in memory that keeps what a flush made durable apart from what
//! was only applied, so that a test can lose the unflushed writes as a crash would
//! ([`MemStore::crashed`]), hold flushes ([`MemStore::hold_flushes`]), make them fail
//! ([`MemStore::fail_flushes`]), count them, and make batches wait for a running flush as
//! sled's do ([`MemStore::serialize_with_flush`]).

use super::{FlushFuture, KvPairs, MetaStore, StoreError, WriteBatch};
use crate::commit::CommitClock;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use tokio::sync::Semaphore;

type Map = BTreeMap<Vec<u8>, Vec<u8>>;

#[derive(Debug, Default)]
struct Tables {
    /// Everything applied (what reads see).
    live: Map,
    /// What the last successful flush covered.
    durable: Map,
    /// Batches applied and not yet durable, with their numbers.
    pending: Vec<(u64, WriteBatch)>,
    closed: bool,
}

/// An in-memory store with crash, hold and failure controls (see the module docs).
#[derive(Debug, Default)]
pub struct MemStore {
    tables: Mutex<Tables>,
    clock: Arc<CommitClock>,
    /// While set, flushes wait for a permit.
    gate: Mutex<Option<Arc<Semaphore>>>,
    fail: AtomicBool,
    /// While set, `apply` waits for a running flush.
    serialize: AtomicBool,
    /// Flushes running, for `serialize`.
    flush_running: Mutex<u32>,
    flush_done: Condvar,
    started: AtomicU64,
    completed: AtomicU64,
}

fn apply_to(map: &mut Map, batch: &WriteBatch) {
    for (k, v) in &batch.ops {
        match v {
            Some(v) => map.insert(k.clone(), v.clone()),
            None => map.remove(k),
        };
    }
}

impl MemStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn tables(&self) -> MutexGuard<'_, Tables> {
        self.tables.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new store holding only what was durable here: the store after a power cut.
    pub fn crashed(&self) -> MemStore {
        let durable = self.tables().durable.clone();
        MemStore {
            tables: Mutex::new(Tables {
                live: durable.clone(),
                durable,
                ..Tables::default()
            }),
            ..MemStore::default()
        }
    }

    /// Makes every later flush wait until [`MemStore::release_flushes`].
    pub fn hold_flushes(&self) {
        *self.gate.lock().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(Semaphore::new(0)));
    }

    /// Lets held and later flushes run.
    pub fn release_flushes(&self) {
        if let Some(gate) = self.gate.lock().unwrap_or_else(|e| e.into_inner()).take() {
            gate.close();
        }
    }

    /// Makes every later flush fail (`true`) or succeed again.
    pub fn fail_flushes(&self, fail: bool) {
        self.fail.store(fail, Ordering::SeqCst);
    }

    /// Makes `apply` wait while a flush runs (`true`), as batches of [`super::SledStore`] do
    /// (sled 0.34 cannot let a batch and a flush overlap).
    pub fn serialize_with_flush(&self, on: bool) {
        self.serialize.store(on, Ordering::SeqCst);
    }

    fn set_flush_running(&self, running: bool) {
        let mut n = self.flush_running.lock().unwrap_or_else(|e| e.into_inner());
        if running {
            *n += 1;
        } else {
            *n = n.saturating_sub(1);
        }
        self.flush_done.notify_all();
    }

    fn wait_for_flush(&self) {
        let mut running = self.flush_running.lock().unwrap_or_else(|e| e.into_inner());
        while *running > 0 {
            running = self
                .flush_done
                .wait(running)
                .unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Flushes started (a held one counts).
    pub fn flushes_started(&self) -> u64 {
        self.started.load(Ordering::SeqCst)
    }

    /// Flushes that made something durable.
    pub fn flushes_completed(&self) -> u64 {
        self.completed.load(Ordering::SeqCst)
    }

    fn check_open(t: &Tables) -> Result<(), StoreError> {
        if t.closed {
            Err(StoreError::Closed)
        } else {
            Ok(())
        }
    }

    /// Moves every batch up to `target` to the durable table.
    fn make_durable(&self, target: u64) -> Result<(), StoreError> {
        let mut t = self.tables();
        Self::check_open(&t)?;
        let pending = std::mem::take(&mut t.pending);
        let (done, rest): (Vec<_>, Vec<_>) = pending.into_iter().partition(|(s, _)| *s <= target);
        for (_, batch) in &done {
            apply_to(&mut t.durable, batch);
        }
        t.pending = rest;
        self.completed.fetch_add(1, Ordering::SeqCst);
        self.clock.mark_durable(target);
        Ok(())
    }
}

impl MetaStore for MemStore {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        let t = self.tables();
        Self::check_open(&t)?;
        Ok(t.live.get(key).cloned())
    }

    fn scan_prefix(&self, prefix: &[u8]) -> Result<KvPairs, StoreError> {
        let t = self.tables();
        Self::check_open(&t)?;
        Ok(t.live
            .range(prefix.to_vec()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }

    fn apply(&self, batch: WriteBatch) -> Result<(), StoreError> {
        if self.serialize.load(Ordering::SeqCst) {
            self.wait_for_flush();
        }
        let mut t = self.tables();
        Self::check_open(&t)?;
        apply_to(&mut t.live, &batch);
        let seq = self.clock.next();
        t.pending.push((seq, batch));
        Ok(())
    }

    fn flush(&self) -> FlushFuture<'_> {
        Box::pin(async move {
            let target = self.clock.applied();
            self.set_flush_running(true);
            self.started.fetch_add(1, Ordering::SeqCst);
            let gate = self.gate.lock().unwrap_or_else(|e| e.into_inner()).clone();
            if let Some(gate) = gate {
                // Closed on release: the error is the signal to go on.
                let _ = gate.acquire().await;
            }
            let res = if self.fail.load(Ordering::SeqCst) {
                Err(StoreError::Backend("injected flush failure".into()))
            } else {
                self.make_durable(target)
            };
            self.set_flush_running(false);
            res
        })
    }

    fn clock(&self) -> &Arc<CommitClock> {
        &self.clock
    }

    fn close(&self) -> Result<(), StoreError> {
        self.tables().closed = true;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(store: &MemStore, k: &str, v: &str) {
        let mut b = WriteBatch::new();
        b.put(k.as_bytes().to_vec(), v.as_bytes().to_vec());
        store.apply(b).unwrap();
    }

    #[test]
    fn a_crash_loses_what_was_not_flushed() {
        let store = MemStore::new();
        put(&store, "a", "1");
        futures::executor::block_on(store.flush()).unwrap();
        put(&store, "b", "2");
        assert_eq!(store.clock().applied(), 2);
        assert_eq!(store.clock().durable(), 1);
        let after = store.crashed();
        assert_eq!(after.get(b"a").unwrap(), Some(b"1".to_vec()));
        assert_eq!(after.get(b"b").unwrap(), None);
        store.fail_flushes(true);
        assert!(futures::executor::block_on(store.flush()).is_err());
        assert_eq!(store.crashed().get(b"b").unwrap(), None);
    }
}
