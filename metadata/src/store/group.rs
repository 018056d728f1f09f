//! [`GroupCommit`]: group commit over any [`MetaStore`] (HDFS's `FSEditLog.logSync` batching).
//!
//! `apply` writes nothing to the store underneath: the batch is queued (moved, not copied). A
//! `flush` takes the flush lock; the caller that gets it drains every batch queued so far — its
//! own and those of every change that arrived meanwhile — applies them to the store underneath
//! as one atomic batch and flushes it once; the callers behind it find their batches already
//! durable and return at once. So a change under the state lock costs a push onto a queue,
//! never I/O, and N concurrent changes cost about one fsync per fsync-time instead of N.
//!
//! Reads (rare: the namespace serves lookups from memory and reads the store when it opens)
//! look at the queue first, newest batch first, then at the store underneath. A drain holds the
//! drain lock from taking the queue until the store underneath has applied it, and a read holds
//! it too, so a read sees every batch either in the queue or underneath, never in neither.

use super::{FlushFuture, KvPairs, MetaStore, StoreError, WriteBatch};
use crate::commit::CommitClock;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

/// Group commit over `inner` (see the module docs).
pub struct GroupCommit {
    inner: Arc<dyn MetaStore>,
    /// Batches applied here and not yet drained, in order, with their numbers.
    queue: Mutex<Vec<(u64, WriteBatch)>>,
    /// Held by a drain from taking the queue to the end of its write underneath, and by reads.
    draining: Mutex<()>,
    clock: Arc<CommitClock>,
    /// Held by the caller whose flush runs.
    flushing: tokio::sync::Mutex<()>,
    /// Woken when a flush ends: the callers waiting for it check whether it covered them.
    flushed: tokio::sync::Notify,
}

fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl GroupCommit {
    /// Group commit over `inner`, which must not be written to by anyone else.
    pub fn new(inner: Arc<dyn MetaStore>) -> Self {
        GroupCommit {
            inner,
            queue: Mutex::default(),
            draining: Mutex::new(()),
            clock: Arc::default(),
            flushing: tokio::sync::Mutex::new(()),
            flushed: tokio::sync::Notify::new(),
        }
    }

    /// Applies every queued batch to the store underneath (one batch). Returns the last batch
    /// number applied (0 if none was queued).
    fn drain(&self) -> Result<u64, StoreError> {
        let _drain = locked(&self.draining);
        let queue = std::mem::take(&mut *locked(&self.queue));
        let Some(last) = queue.last().map(|(seq, _)| *seq) else {
            return Ok(0);
        };
        let mut merged = WriteBatch::new();
        merged.ops.reserve(queue.iter().map(|(_, b)| b.len()).sum());
        for (_, b) in queue {
            merged.ops.extend(b.ops);
        }
        self.inner.apply(merged)?;
        Ok(last)
    }

    /// Drains the queue into the store underneath and flushes it (the caller holds the flush
    /// lock).
    async fn flush_queued(&self, target: u64) -> Result<(), StoreError> {
        let covered = self.drain()?;
        self.inner.flush().await?;
        self.clock.mark_durable(covered.max(target));
        Ok(())
    }
}

/// The flush lock while one caller flushes: dropping it (the flush ended, or its caller was
/// cancelled) releases the lock, then wakes every caller waiting for a flush to end.
struct Turn<'a> {
    lock: Option<tokio::sync::MutexGuard<'a, ()>>,
    flushed: &'a tokio::sync::Notify,
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        drop(self.lock.take());
        self.flushed.notify_waiters();
    }
}

impl MetaStore for GroupCommit {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        let _drain = locked(&self.draining);
        let queued = locked(&self.queue)
            .iter()
            .rev()
            .flat_map(|(_, b)| b.ops.iter().rev())
            .find(|(k, _)| k.as_slice() == key)
            .map(|(_, v)| v.clone());
        match queued {
            Some(v) => Ok(v),
            None => self.inner.get(key),
        }
    }

    fn scan_prefix(&self, prefix: &[u8]) -> Result<KvPairs, StoreError> {
        let _drain = locked(&self.draining);
        let queued: Vec<(Vec<u8>, Option<Vec<u8>>)> = locked(&self.queue)
            .iter()
            .flat_map(|(_, b)| b.ops.iter())
            .filter(|(k, _)| k.starts_with(prefix))
            .cloned()
            .collect();
        let mut rows: BTreeMap<Vec<u8>, Vec<u8>> =
            self.inner.scan_prefix(prefix)?.into_iter().collect();
        for (k, v) in queued {
            match v {
                Some(v) => rows.insert(k, v),
                None => rows.remove(&k),
            };
        }
        Ok(rows.into_iter().collect())
    }

    fn apply(&self, batch: WriteBatch) -> Result<(), StoreError> {
        let mut q = locked(&self.queue);
        let seq = self.clock.next();
        q.push((seq, batch));
        Ok(())
    }

    fn flush(&self) -> FlushFuture<'_> {
        Box::pin(async move {
            let target = self.clock.applied();
            loop {
                if self.clock.durable() >= target {
                    // A flush that ran while this caller waited covered it.
                    return Ok(());
                }
                if self.clock.failed() {
                    return Err(StoreError::Backend("an earlier flush failed".into()));
                }
                // Registered before the flush lock is tried: a flush that ends after the try
                // wakes this caller (each waiter wakes once per flush, not in a chain).
                let ended = self.flushed.notified();
                let mut ended = std::pin::pin!(ended);
                ended.as_mut().enable();
                let Ok(lock) = self.flushing.try_lock() else {
                    ended.await;
                    continue;
                };
                // Released, and every waiter woken, also when this caller is cancelled
                // mid-flush (a request dropped at its deadline): a waiter must never sleep
                // on a flush that nobody runs any more.
                let _turn = Turn {
                    lock: Some(lock),
                    flushed: &self.flushed,
                };
                // Every batch up to `target` is queued (drained now) or was drained by an
                // earlier flush (in the store underneath): this flush covers both.
                return self.flush_queued(target).await;
            }
        })
    }

    fn clock(&self) -> &Arc<CommitClock> {
        &self.clock
    }

    fn close(&self) -> Result<(), StoreError> {
        self.drain()?;
        self.inner.close()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemStore;

    fn batch(puts: &[(&str, &str)], dels: &[&str]) -> WriteBatch {
        let mut b = WriteBatch::new();
        for (k, v) in puts {
            b.put(k.as_bytes().to_vec(), v.as_bytes().to_vec());
        }
        for k in dels {
            b.delete(k.as_bytes().to_vec());
        }
        b
    }

    #[test]
    fn reads_see_queued_batches_and_one_flush_writes_them_all() {
        let inner = Arc::new(MemStore::new());
        let gc = GroupCommit::new(inner.clone());
        gc.apply(batch(&[("k/a", "1"), ("k/b", "2")], &[])).unwrap();
        futures::executor::block_on(gc.flush()).unwrap();
        gc.apply(batch(&[("k/c", "3")], &["k/a"])).unwrap();
        gc.apply(batch(&[("k/b", "22")], &[])).unwrap();
        assert_eq!(gc.get(b"k/a").unwrap(), None);
        assert_eq!(gc.get(b"k/b").unwrap(), Some(b"22".to_vec()));
        let keys: Vec<_> = gc.scan_prefix(b"k/").unwrap();
        assert_eq!(
            keys,
            vec![
                (b"k/b".to_vec(), b"22".to_vec()),
                (b"k/c".to_vec(), b"3".to_vec())
            ]
        );
        // Nothing reached the store underneath yet.
        assert_eq!(inner.get(b"k/c").unwrap(), None);
        assert_eq!((gc.clock().applied(), gc.clock().durable()), (3, 1));
        let flushes = inner.flushes_completed();
        futures::executor::block_on(gc.flush()).unwrap();
        assert_eq!(inner.flushes_completed(), flushes + 1);
        assert_eq!(gc.clock().durable(), 3);
        let after = inner.crashed();
        assert_eq!(after.get(b"k/a").unwrap(), None);
        assert_eq!(after.get(b"k/b").unwrap(), Some(b"22".to_vec()));
        assert_eq!(after.get(b"k/c").unwrap(), Some(b"3".to_vec()));
        // A flush with nothing new does not reach the store underneath.
        futures::executor::block_on(gc.flush()).unwrap();
        assert_eq!(inner.flushes_completed(), flushes + 1);
    }

    /// A caller cancelled while its flush runs (a request dropped at its deadline) still
    /// wakes the callers waiting for that flush; one of them then flushes. Before, the
    /// waiters slept until some later flush, which under a quiet load never came.
    #[tokio::test]
    async fn a_flush_cancelled_midway_wakes_its_waiters() {
        let inner = Arc::new(MemStore::new());
        let gc = Arc::new(GroupCommit::new(inner.clone()));
        gc.apply(batch(&[("k/a", "1")], &[])).unwrap();
        inner.hold_flushes();
        let first = tokio::spawn({
            let gc = gc.clone();
            async move { gc.flush().await }
        });
        while inner.flushes_started() == 0 {
            tokio::task::yield_now().await;
        }
        gc.apply(batch(&[("k/b", "2")], &[])).unwrap();
        let second = tokio::spawn({
            let gc = gc.clone();
            async move { gc.flush().await }
        });
        // Let the second caller find the flush lock taken and wait.
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        first.abort();
        let _ = first.await;
        inner.release_flushes();
        let done = tokio::time::timeout(std::time::Duration::from_secs(10), second).await;
        assert!(
            matches!(done, Ok(Ok(Ok(())))),
            "the waiter of a cancelled flush was never woken: {done:?}"
        );
        assert_eq!(gc.clock().durable(), 2);
        assert_eq!(inner.crashed().get(b"k/b").unwrap(), Some(b"2".to_vec()));
    }
}
