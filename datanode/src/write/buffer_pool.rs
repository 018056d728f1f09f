//! The resources of write-memory batching (HDFS-17973) that one DataNode's buffered writers
//! share: the memory cap (one permit per buffer), the pool of buffers, and the per-volume
//! flush gates.
//!
//! - **Memory cap.** `write.memory.buffer.max.capacity.mb` ÷ the buffer size (floored at
//!   1 MiB) permits, in a tokio semaphore; -1 means no cap. A writer takes its permit
//!   ([`WriteBuffers::lease`]) *before* a buffer is allocated, so writers wait instead of
//!   overshooting the cap. A buffer is allocated only when the pool has none idle, and only by
//!   a permit holder, so buffers allocated (in use plus idle in the pool) never outnumber the
//!   permits: the memory held never passes the cap.
//! - **Pool.** A [`PooledBuffer`] goes back to the pool when dropped, then its permit is
//!   released — on every exit path, failures included, because both are plain drops. The pool
//!   keeps at most [`MAX_IDLE_BUFFERS`] idle buffers; more are freed.
//! - **Flush gates.** `concurrent.flush.mb.per.volume` ÷ the buffer size (at least 1) flushes
//!   run at once on one volume; 0 means unbounded. Flushes run on blocking threads, so the
//!   gate is a blocking counting semaphore ([`FlushGate`]). A flush takes the gate while its
//!   writer holds its state (monitor before permit, the lock order upstream settled on).
//!
//! Buffers are aligned to [`DIRECT_IO_ALIGN`] so that the O_DIRECT flushes of
//! `write.o.direct.enabled` can write straight from them.

use crate::metrics::Metrics;
use sluice_common::config::DatanodeConfig;
use sluice_common::proto::BlockStage;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

pub use crate::sys::{AlignedBuf, DIRECT_IO_ALIGN};

/// Idle buffers the pool keeps at most; buffers returned beyond this are freed.
pub const MAX_IDLE_BUFFERS: usize = 16;

/// The batching settings of one DataNode, from `[datanode]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BufferSettings {
    /// `write.memory.buffer.enabled`.
    pub enabled: bool,
    /// `write.memory.buffer.last-replica-only`.
    pub last_replica_only: bool,
    /// `write.memory.buffer.min.volumes`: batching only with more volumes than this.
    pub min_volumes: u32,
    /// One replica's buffer in bytes (`write.buffer.size.bytes`, floored at 1 MiB).
    pub buffer_size: usize,
    /// `write.buffer.idle.flush.timeout.ms`; zero turns the idle flush off.
    pub idle_flush: Duration,
    /// Buffers the memory cap allows (`None`: no cap).
    pub permits: Option<usize>,
    /// Flushes at once per volume (`None`: unbounded).
    pub flushes_per_volume: Option<usize>,
    /// `write.o.direct.enabled`.
    pub o_direct: bool,
    /// `write.buffer.drop.behind`.
    pub drop_behind: bool,
}

impl BufferSettings {
    /// The settings `cfg` asks for.
    pub fn from_config(cfg: &DatanodeConfig) -> BufferSettings {
        let size = cfg.effective_write_buffer_size();
        let flushes = match cfg.concurrent_flush_mb_per_volume {
            0 => None,
            mb => Some((mb.saturating_mul(1024 * 1024) / size).max(1) as usize),
        };
        BufferSettings {
            enabled: cfg.write_buffer_enabled,
            last_replica_only: cfg.write_buffer_last_replica_only,
            min_volumes: cfg.write_buffer_min_volumes,
            buffer_size: usize::try_from(size).unwrap_or(usize::MAX),
            idle_flush: cfg.write_buffer_idle_flush_timeout.get(),
            permits: cfg
                .write_buffer_permits()
                .map(|p| usize::try_from(p).unwrap_or(usize::MAX)),
            flushes_per_volume: flushes,
            o_direct: cfg.write_o_direct,
            drop_behind: cfg.write_buffer_drop_behind,
        }
    }

    /// Whether a replica written for `stage`, on the last DataNode of its pipeline or not, on
    /// a DataNode with `volumes` volumes, is buffered: only brand-new replicas (`Create`; never
    /// recovery or transfer), only on the last DataNode unless `last-replica-only` is off, and
    /// only with more volumes than `min.volumes`.
    pub fn applies(&self, stage: BlockStage, last_in_pipeline: bool, volumes: usize) -> bool {
        self.enabled
            && stage == BlockStage::Create
            && (last_in_pipeline || !self.last_replica_only)
            && volumes > self.min_volumes as usize
    }
}

/// A blocking counting semaphore bounding the flushes that run at once on one volume.
#[derive(Debug)]
pub struct FlushGate {
    limit: usize,
    running: Mutex<usize>,
    freed: Condvar,
}

/// A flush running under a [`FlushGate`]; leaving the gate when dropped.
#[derive(Debug)]
pub struct FlushPermit<'a> {
    gate: &'a FlushGate,
}

impl FlushGate {
    /// A gate letting `limit` flushes (at least 1) through at once.
    pub fn new(limit: usize) -> FlushGate {
        FlushGate {
            limit: limit.max(1),
            running: Mutex::new(0),
            freed: Condvar::new(),
        }
    }

    /// Flushes allowed at once.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Waits (blocking the thread) until a flush may start; returns whether it had to wait.
    pub fn enter(&self) -> (FlushPermit<'_>, bool) {
        let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        let waited = *running >= self.limit;
        while *running >= self.limit {
            running = self.freed.wait(running).unwrap_or_else(|p| p.into_inner());
        }
        *running += 1;
        (FlushPermit { gate: self }, waited)
    }

    /// Flushes running now.
    pub fn running(&self) -> usize {
        *self.running.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for FlushPermit<'_> {
    fn drop(&mut self) {
        let mut running = self.gate.running.lock().unwrap_or_else(|p| p.into_inner());
        *running = running.saturating_sub(1);
        self.gate.freed.notify_one();
    }
}

/// Write-memory batching resources of one DataNode.
#[derive(Debug)]
pub struct WriteBuffers {
    settings: BufferSettings,
    volumes: usize,
    memory: Option<Arc<Semaphore>>,
    idle: Mutex<Vec<AlignedBuf>>,
    gates: Vec<Option<FlushGate>>,
    metrics: Arc<Metrics>,
}

impl WriteBuffers {
    /// The resources for a DataNode with `volumes` volumes.
    pub fn new(settings: BufferSettings, volumes: usize, metrics: Arc<Metrics>) -> WriteBuffers {
        let memory = settings
            .permits
            .map(|p| Arc::new(Semaphore::new(p.min(Semaphore::MAX_PERMITS))));
        let gates = (0..volumes)
            .map(|_| settings.flushes_per_volume.map(FlushGate::new))
            .collect();
        WriteBuffers {
            settings,
            volumes,
            memory,
            idle: Mutex::new(Vec::new()),
            gates,
            metrics,
        }
    }

    /// The settings.
    pub fn settings(&self) -> &BufferSettings {
        &self.settings
    }

    /// Whether a replica of `stage` is buffered here (see [`BufferSettings::applies`]).
    pub fn applies(&self, stage: BlockStage, last_in_pipeline: bool) -> bool {
        self.settings.applies(stage, last_in_pipeline, self.volumes)
    }

    /// Memory permits free now (`None`: no cap).
    pub fn available_permits(&self) -> Option<usize> {
        self.memory.as_ref().map(|s| s.available_permits())
    }

    /// Idle buffers in the pool.
    pub fn idle_buffers(&self) -> usize {
        self.idle.lock().map(|v| v.len()).unwrap_or(0)
    }

    /// The flush gate of volume `index` (`None`: unbounded).
    pub fn flush_gate(&self, index: usize) -> Option<&FlushGate> {
        self.gates.get(index).and_then(Option::as_ref)
    }

    /// Takes a memory permit, waiting at most `limit` for one. `None` if none came in time:
    /// the caller writes directly instead (no buffer, so the cap still holds).
    pub async fn lease(self: &Arc<Self>, limit: Duration) -> Option<BufferLease> {
        let Some(sem) = &self.memory else {
            return Some(BufferLease {
                owner: self.clone(),
                permit: None,
            });
        };
        let permit = match sem.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                self.metrics.write_buffer_permit_waits.inc();
                tracing::info!(
                    "write-buffer memory cap reached (write.memory.buffer.max.capacity.mb): waiting for a buffer"
                );
                match tokio::time::timeout(limit, sem.clone().acquire_owned()).await {
                    Ok(Ok(p)) => p,
                    _ => {
                        self.metrics.write_buffer_permit_timeouts.inc();
                        return None;
                    }
                }
            }
        };
        Some(BufferLease {
            owner: self.clone(),
            permit: Some(permit),
        })
    }

    /// A pooled buffer for a lease holder, allocated if the pool has none idle.
    fn take(&self) -> Option<AlignedBuf> {
        if let Some(b) = self.idle.lock().ok().and_then(|mut v| v.pop()) {
            return Some(b);
        }
        let b = AlignedBuf::zeroed(self.settings.buffer_size)?;
        let m = &self.metrics;
        m.write_buffer_bytes.add(b.len() as i64);
        m.write_buffer_bytes_peak
            .raise_to(m.write_buffer_bytes.get());
        Some(b)
    }

    /// Puts a buffer back (or frees it when the pool is full).
    fn give_back(&self, b: AlignedBuf) {
        let len = b.len() as i64;
        if let Ok(mut idle) = self.idle.lock() {
            if idle.len() < MAX_IDLE_BUFFERS {
                idle.push(b);
                return;
            }
        }
        drop(b);
        self.metrics.write_buffer_bytes.add(-len);
    }
}

/// A memory permit: the right to hold one write buffer.
#[derive(Debug)]
pub struct BufferLease {
    owner: Arc<WriteBuffers>,
    permit: Option<OwnedSemaphorePermit>,
}

impl BufferLease {
    /// The pooled buffer for this permit; `None` if it cannot be allocated (the permit is
    /// released then).
    pub fn into_buffer(self) -> Option<PooledBuffer> {
        let buf = self.owner.take()?;
        Some(PooledBuffer {
            buf: Some(buf),
            owner: self.owner,
            _permit: self.permit,
        })
    }

    /// The resources the permit belongs to.
    pub fn owner(&self) -> &Arc<WriteBuffers> {
        &self.owner
    }
}

/// A buffer from the pool, holding its memory permit. Dropping it returns the buffer to the
/// pool, then releases the permit.
#[derive(Debug)]
pub struct PooledBuffer {
    buf: Option<AlignedBuf>,
    owner: Arc<WriteBuffers>,
    // Released after `Drop::drop` has returned the buffer to the pool.
    _permit: Option<OwnedSemaphorePermit>,
}

impl PooledBuffer {
    /// The bytes.
    pub fn bytes(&self) -> &[u8] {
        self.buf.as_ref().map(AlignedBuf::as_slice).unwrap_or(&[])
    }

    /// The bytes, writable.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        self.buf
            .as_mut()
            .map(AlignedBuf::as_mut_slice)
            .unwrap_or(&mut [])
    }

    /// The resources it came from.
    pub fn owner(&self) -> &Arc<WriteBuffers> {
        &self.owner
    }
}

impl Drop for PooledBuffer {
    fn drop(&mut self) {
        if let Some(b) = self.buf.take() {
            self.owner.give_back(b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(permits: Option<usize>) -> BufferSettings {
        let mut cfg = DatanodeConfig {
            write_buffer_size: sluice_common::config::ByteSize::mib(1),
            ..DatanodeConfig::default()
        };
        cfg.write_buffer_max_capacity_mb = permits.map_or(-1, |p| p as i64);
        BufferSettings::from_config(&cfg)
    }

    #[test]
    fn only_new_replicas_are_buffered_and_by_default_only_on_the_last_node() {
        let s = BufferSettings::from_config(&DatanodeConfig::default());
        assert!(s.applies(BlockStage::Create, true, 1));
        assert!(
            !s.applies(BlockStage::Create, false, 1),
            "not the last node"
        );
        for stage in [
            BlockStage::StreamingRecovery,
            BlockStage::CloseRecovery,
            BlockStage::TransferRbw,
            BlockStage::TransferFinalized,
        ] {
            assert!(!s.applies(stage, true, 1), "{stage:?} writes directly");
        }
        let all = BufferSettings {
            last_replica_only: false,
            ..s.clone()
        };
        assert!(all.applies(BlockStage::Create, false, 1));
        let off = BufferSettings {
            enabled: false,
            ..s.clone()
        };
        assert!(!off.applies(BlockStage::Create, true, 1));
    }

    #[test]
    fn min_volumes_gates_batching_as_upstream() {
        let s = |min| BufferSettings {
            min_volumes: min,
            ..BufferSettings::from_config(&DatanodeConfig::default())
        };
        assert!(s(0).applies(BlockStage::Create, true, 1), "0: always");
        assert!(s(2).applies(BlockStage::Create, true, 3), "3 > 2");
        assert!(!s(2).applies(BlockStage::Create, true, 2), "2 == 2: off");
        assert!(!s(2).applies(BlockStage::Create, true, 1), "1 < 2: off");
        assert!(s(4).applies(BlockStage::Create, true, 5), "5 > 4");
    }

    #[test]
    fn permits_use_the_floored_buffer_size_and_flush_budget_at_least_one() {
        let mut cfg = DatanodeConfig {
            write_buffer_max_capacity_mb: 100,
            write_buffer_size: sluice_common::config::ByteSize::kib(512),
            concurrent_flush_mb_per_volume: 64,
            ..DatanodeConfig::default()
        };
        let s = BufferSettings::from_config(&cfg);
        assert_eq!(
            s.permits,
            Some(100),
            "100 MiB / max(512 KiB, 1 MiB), not 200"
        );
        assert_eq!(s.buffer_size, 1 << 20);
        assert_eq!(s.flushes_per_volume, Some(64));
        cfg.write_buffer_size = sluice_common::config::ByteSize::mib(8);
        assert_eq!(
            BufferSettings::from_config(&cfg).flushes_per_volume,
            Some(8)
        );
        cfg.concurrent_flush_mb_per_volume = 1;
        assert_eq!(
            BufferSettings::from_config(&cfg).flushes_per_volume,
            Some(1)
        );
        cfg.concurrent_flush_mb_per_volume = 0;
        assert_eq!(BufferSettings::from_config(&cfg).flushes_per_volume, None);
    }

    #[test]
    fn buffers_are_aligned_pooled_and_counted() {
        let m = Arc::new(Metrics::default());
        let wb = Arc::new(WriteBuffers::new(settings(Some(2)), 1, m.clone()));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let a = rt
            .block_on(wb.lease(Duration::from_secs(1)))
            .unwrap()
            .into_buffer()
            .unwrap();
        assert_eq!(a.bytes().as_ptr() as usize % DIRECT_IO_ALIGN, 0);
        assert_eq!(a.bytes().len(), 1 << 20);
        assert_eq!(wb.available_permits(), Some(1));
        drop(a);
        assert_eq!((wb.available_permits(), wb.idle_buffers()), (Some(2), 1));
        let b = rt
            .block_on(wb.lease(Duration::from_secs(1)))
            .unwrap()
            .into_buffer()
            .unwrap();
        assert_eq!(wb.idle_buffers(), 0, "reused from the pool");
        assert_eq!(m.write_buffer_bytes.get(), 1 << 20, "allocated once");
        drop(b);
    }

    #[test]
    fn a_lease_times_out_when_the_cap_is_reached_and_a_dropped_lease_returns_its_permit() {
        let m = Arc::new(Metrics::default());
        let wb = Arc::new(WriteBuffers::new(settings(Some(1)), 1, m.clone()));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let held = rt.block_on(wb.lease(Duration::from_secs(1))).unwrap();
        assert!(rt.block_on(wb.lease(Duration::from_millis(20))).is_none());
        assert_eq!(m.write_buffer_permit_waits.get(), 1);
        assert_eq!(m.write_buffer_permit_timeouts.get(), 1);
        drop(held);
        assert_eq!(wb.available_permits(), Some(1));
        let unc = Arc::new(WriteBuffers::new(settings(None), 1, m));
        assert!(rt.block_on(unc.lease(Duration::ZERO)).is_some(), "no cap");
        assert_eq!(unc.available_permits(), None);
    }

    #[test]
    fn sixty_four_writers_never_hold_more_buffers_than_permits() {
        let m = Arc::new(Metrics::default());
        let wb = Arc::new(WriteBuffers::new(settings(Some(4)), 1, m.clone()));
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let tasks: Vec<_> = (0..64)
                .map(|_| {
                    let wb = wb.clone();
                    tokio::spawn(async move {
                        let lease = wb.lease(Duration::from_secs(30)).await.unwrap();
                        let mut buf = lease.into_buffer().unwrap();
                        buf.bytes_mut()[0] = 1;
                        tokio::task::yield_now().await;
                        drop(buf);
                    })
                })
                .collect();
            for t in tasks {
                t.await.unwrap();
            }
        });
        assert!(m.write_buffer_bytes_peak.get() <= 4 << 20);
        assert_eq!(wb.available_permits(), Some(4));
    }

    #[allow(clippy::disallowed_methods)] // a test's own thread, joined by the test
    #[test]
    fn flush_gate_lets_limit_flushes_through() {
        let gate = Arc::new(FlushGate::new(2));
        let peak = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (gate, peak) = (gate.clone(), peak.clone());
                std::thread::spawn(move || {
                    for _ in 0..50 {
                        let (_p, _) = gate.enter();
                        peak.fetch_max(gate.running(), std::sync::atomic::Ordering::SeqCst);
                        std::thread::yield_now();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert!(peak.load(std::sync::atomic::Ordering::SeqCst) <= 2);
        assert_eq!(gate.running(), 0);
        assert_eq!(FlushGate::new(0).limit(), 1, "at least one");
    }
}
