//! The disk hddfs charges: a virtual platter (where each file's bytes lie) and one head that
//! serves one request at a time, in elevator order, with a 7,200 rpm disk's service times.
//!
//! [`Head`] and [`Layout`] are plain logic, no FUSE and no clock of their own (`now` is passed
//! in), so they are tested alone; [`Disk`] is the head behind a lock that requests wait on.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The figures of a 7,200 rpm 3.5" SATA disk, datasheet-style (e.g. a 1-4 TB enterprise
/// drive: 8.5 ms average read seek, ~1 ms track to track, 16-18 ms full stroke, 150-200 MB/s
/// sustained on the outer tracks, ~100 on the inner ones).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Geometry {
    /// Addressable bytes (the seek curve's full stroke).
    pub capacity: u64,
    /// Sustained transfer rate, bytes per second (one rate for the whole platter).
    pub rate: u64,
    /// Seek to the next track.
    pub track_to_track: Duration,
    /// Seek across the whole platter.
    pub full_stroke: Duration,
    /// Average rotational latency: half a turn at 7,200 rpm (8.33 ms a turn).
    pub half_rotation: Duration,
    /// Bytes under the head in one turn (rate × 8.33 ms): a forward gap up to this is passed
    /// over by waiting for the platter to turn, not by a seek.
    pub track_bytes: u64,
}

impl Default for Geometry {
    fn default() -> Self {
        Geometry {
            capacity: 1_000_000_000_000,
            rate: 150_000_000,
            track_to_track: Duration::from_micros(1_000),
            full_stroke: Duration::from_micros(16_000),
            half_rotation: Duration::from_micros(4_167),
            track_bytes: 1_250_000,
        }
    }
}

impl Geometry {
    /// Time to move `bytes` under the head.
    pub fn transfer(&self, bytes: u64) -> Duration {
        Duration::from_secs_f64(bytes as f64 / self.rate as f64)
    }

    /// Seek time over `distance` bytes: track to track plus the rest of the full stroke
    /// scaled by the square root of the fraction of the platter crossed (the arm accelerates
    /// then decelerates: time grows with the root of the distance). A random seek (a third of
    /// the platter on average) takes ~9.7 ms by this curve, 8.5-9 ms averaged over distances.
    pub fn seek(&self, distance: u64) -> Duration {
        let frac = (distance as f64 / self.capacity as f64).min(1.0);
        self.track_to_track + (self.full_stroke - self.track_to_track).mul_f64(frac.sqrt())
    }

    /// Service time of `len` bytes at `addr` with the head at `head` (where the previous
    /// request ended), and whether it took a seek. Continuing forward within one track costs
    /// the turn over the gap plus the transfer; anything else costs a seek, half a turn on
    /// average, and the transfer.
    pub fn service(&self, head: u64, addr: u64, len: u64) -> (Duration, bool) {
        if addr >= head && addr - head <= self.track_bytes {
            return (self.transfer(addr - head + len), false);
        }
        let t = self.seek(addr.abs_diff(head)) + self.half_rotation + self.transfer(len);
        (t, true)
    }
}

/// Where files lie on the platter: one after another in creation order, each reserving
/// `max(size, RESERVE)` bytes, so a file's bytes are contiguous from its base, a block replica
/// and its checksum file (created together) are a short seek apart, and two replicas written
/// at the same time are at least a block apart (ext4's allocator keeps files of different
/// directories/groups apart in much the same way). Addresses wrap at the capacity.
#[derive(Debug)]
pub struct Layout {
    next: u64,
    capacity: u64,
}

/// The space reserved for each file: a 128 MiB block and 8 MiB of slack.
pub const RESERVE: u64 = (128 + 8) << 20;

impl Layout {
    /// An empty platter of `capacity` bytes.
    pub fn new(capacity: u64) -> Layout {
        Layout { next: 0, capacity }
    }

    /// The base address of a new file of `size` bytes.
    pub fn place(&mut self, size: u64) -> u64 {
        let base = self.next;
        self.next = (self.next + size.max(RESERVE)) % self.capacity;
        base
    }
}

/// What the disk did, for the stats file.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Stats {
    /// Read requests served.
    pub reads: u64,
    /// Write requests served.
    pub writes: u64,
    /// Fsyncs charged (those with nothing written since the file's last one).
    pub fsyncs_charged: u64,
    /// Fsyncs free (their writes arrived as write requests).
    pub fsyncs_free: u64,
    /// Bytes read.
    pub read_bytes: u64,
    /// Bytes written.
    pub write_bytes: u64,
    /// Requests that took a seek.
    pub seeks: u64,
    /// Seconds the head was busy.
    pub busy_secs: f64,
    /// Seconds of it spent seeking and turning (busy time minus transfers).
    pub positioning_secs: f64,
    /// Most requests waiting for the head at once.
    pub max_queue: u64,
}

impl Stats {
    /// What happened between `before` and these counters (`max_queue`: these counters').
    pub fn since(&self, before: &Stats) -> Stats {
        Stats {
            reads: self.reads - before.reads.min(self.reads),
            writes: self.writes - before.writes.min(self.writes),
            fsyncs_charged: self.fsyncs_charged - before.fsyncs_charged.min(self.fsyncs_charged),
            fsyncs_free: self.fsyncs_free - before.fsyncs_free.min(self.fsyncs_free),
            read_bytes: self.read_bytes - before.read_bytes.min(self.read_bytes),
            write_bytes: self.write_bytes - before.write_bytes.min(self.write_bytes),
            seeks: self.seeks - before.seeks.min(self.seeks),
            busy_secs: (self.busy_secs - before.busy_secs).max(0.0),
            positioning_secs: (self.positioning_secs - before.positioning_secs).max(0.0),
            max_queue: self.max_queue,
        }
    }

    /// One line: requests, bytes, mean request sizes, seeks, head time.
    pub fn line(&self) -> String {
        let kib = |b: u64, n: u64| b as f64 / n.max(1) as f64 / 1024.0;
        format!(
            "read {:.1} MB in {} requests ({:.0} KiB each), written {:.1} MB in {} requests \
             ({:.0} KiB each), {} seeks, {} fsyncs charged ({} free), head busy {:.1} s ({:.1} s \
             positioning)",
            self.read_bytes as f64 / 1e6,
            self.reads,
            kib(self.read_bytes, self.reads),
            self.write_bytes as f64 / 1e6,
            self.writes,
            kib(self.write_bytes, self.writes),
            self.seeks,
            self.fsyncs_charged,
            self.fsyncs_free,
            self.busy_secs,
            self.positioning_secs,
        )
    }
}

/// A request waiting for the head (its ticket).
pub type Ticket = u64;

/// What a request is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Reads `len` bytes.
    Read,
    /// Writes `len` bytes.
    Write,
    /// A cache flush with nothing to write: half a turn, the head stays.
    Flush,
}

/// The single head and its queue. A request [`Head::arrive`]s, waits until
/// [`Head::next`] is its ticket and the head is free, [`Head::start`]s (which returns when
/// the head will be done: the caller sleeps until then) and [`Head::finish`]es. The queue is
/// served in C-LOOK order (the lowest address at or after the head, else the lowest): what a
/// drive's command queue and the block layer's elevator do together, which requests reaching
/// a FUSE file system bypass.
#[derive(Debug)]
pub struct Head {
    geometry: Geometry,
    pos: u64,
    busy: bool,
    free_at: Option<Instant>,
    waiting: BTreeMap<(u64, Ticket), Instant>,
    tickets: Ticket,
    stats: Stats,
}

impl Head {
    /// An idle head at address 0.
    pub fn new(geometry: Geometry) -> Head {
        Head {
            geometry,
            pos: 0,
            busy: false,
            free_at: None,
            waiting: BTreeMap::new(),
            tickets: 0,
            stats: Stats::default(),
        }
    }

    /// Queues a request at `addr`, arrived at `now`.
    pub fn arrive(&mut self, addr: u64, now: Instant) -> (u64, Ticket) {
        self.tickets += 1;
        let key = (addr, self.tickets);
        self.waiting.insert(key, now);
        self.stats.max_queue = self.stats.max_queue.max(self.waiting.len() as u64);
        key
    }

    /// The request to serve next, if the head is free.
    pub fn next(&self) -> Option<(u64, Ticket)> {
        if self.busy {
            return None;
        }
        let up = self.waiting.range((self.pos, 0)..).next();
        up.or_else(|| self.waiting.iter().next()).map(|(k, _)| *k)
    }

    /// Serves `key` (which [`Head::next`] named): `op` of `len` bytes. Returns the instant
    /// the head is done: the later of the request's arrival and the end of the previous one
    /// (so the sleeps' overshoot does not add up while a queue waits), plus its service time.
    pub fn start(&mut self, key: (u64, Ticket), op: Op, len: u64) -> Instant {
        let arrived = self.waiting.remove(&key).unwrap_or_else(Instant::now);
        let begin = self.free_at.map_or(arrived, |f| f.max(arrived));
        let addr = key.0;
        let (t, seek) = match op {
            Op::Flush => (self.geometry.half_rotation, false),
            Op::Read | Op::Write => self.geometry.service(self.pos, addr, len),
        };
        let s = &mut self.stats;
        match op {
            Op::Read => (s.reads, s.read_bytes) = (s.reads + 1, s.read_bytes + len),
            Op::Write => (s.writes, s.write_bytes) = (s.writes + 1, s.write_bytes + len),
            Op::Flush => s.fsyncs_charged += 1,
        }
        s.seeks += u64::from(seek);
        s.busy_secs += t.as_secs_f64();
        let transfer = match op {
            Op::Flush => Duration::ZERO,
            _ => self.geometry.transfer(len),
        };
        s.positioning_secs += t.saturating_sub(transfer).as_secs_f64();
        if op != Op::Flush {
            self.pos = addr + len;
        }
        self.busy = true;
        let end = begin + t;
        self.free_at = Some(end);
        end
    }

    /// The head is free again.
    pub fn finish(&mut self) {
        self.busy = false;
    }

    /// Counts an fsync that cost nothing.
    pub fn free_fsync(&mut self) {
        self.stats.fsyncs_free += 1;
    }

    /// What the head did so far.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }
}

/// The head and the condition its waiters wait on.
#[derive(Debug)]
pub struct Disk {
    /// The head, its queue and its counters.
    pub head: Mutex<Head>,
    turn: Condvar,
}

impl Disk {
    /// A disk with `head`.
    pub fn new(head: Head) -> Disk {
        Disk {
            head: Mutex::new(head),
            turn: Condvar::new(),
        }
    }

    /// Locks the head (a panicked holder left it consistent: every change is one call).
    pub fn lock(&self) -> MutexGuard<'_, Head> {
        self.head.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits for the head, then for the service time of `op` on `len` bytes at `addr`, for
    /// a request that `arrived` (before this process did its real IO, which so overlaps the
    /// modelled time instead of adding to it).
    pub fn charge(&self, addr: u64, op: Op, len: u64, arrived: Instant) {
        let mut h = self.lock();
        let key = h.arrive(addr, arrived);
        while h.next() != Some(key) {
            h = self.turn.wait(h).unwrap_or_else(|e| e.into_inner());
        }
        let end = h.start(key, op, len);
        drop(h);
        let now = Instant::now();
        if end > now {
            std::thread::sleep(end - now);
        }
        self.lock().finish();
        self.turn.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequential_costs_transfer_only_and_random_costs_a_seek_and_a_turn() {
        let g = Geometry::default();
        let (t, seek) = g.service(1 << 20, 1 << 20, 1 << 20);
        assert!(!seek);
        assert_eq!(t, g.transfer(1 << 20));
        // 1 MiB at 150 MB/s: 6.99 ms.
        assert!((t.as_secs_f64() - 0.00699).abs() < 0.0001, "{t:?}");
        // A third of the platter away, 4 KiB: ~9.7 ms seek + 4.17 ms turn.
        let (t, seek) = g.service(0, g.capacity / 3, 4096);
        assert!(seek);
        let ms = t.as_secs_f64() * 1e3;
        assert!((13.0..14.5).contains(&ms), "{ms}");
        // Backwards, even a little, is a seek.
        assert!(g.service(1 << 20, 0, 4096).1);
        // A forward gap within one turn waits for the platter only.
        let (t, seek) = g.service(0, 100_000, 4096);
        assert!(!seek);
        assert_eq!(t, g.transfer(104_096));
    }

    #[test]
    fn the_seek_curve_runs_from_track_to_track_to_full_stroke() {
        let g = Geometry::default();
        assert_eq!(g.seek(0), g.track_to_track);
        assert_eq!(g.seek(g.capacity), g.full_stroke);
        assert_eq!(g.seek(u64::MAX), g.full_stroke);
    }

    #[test]
    fn files_are_laid_out_a_reservation_apart() {
        let mut l = Layout::new(10 * RESERVE);
        assert_eq!(l.place(0), 0);
        assert_eq!(l.place(1), RESERVE);
        assert_eq!(l.place(3 * RESERVE), 2 * RESERVE);
        assert_eq!(l.place(0), 5 * RESERVE);
        for _ in 0..4 {
            l.place(0);
        }
        assert_eq!(l.place(0), 0, "wraps at the capacity");
    }

    #[test]
    fn the_queue_is_served_in_c_look_order_back_to_back() {
        let mut h = Head::new(Geometry::default());
        let t0 = Instant::now();
        let first = h.arrive(5 << 30, t0);
        assert_eq!(h.next(), Some(first));
        let end1 = h.start(first, Op::Write, 1 << 20);
        let low = h.arrive(1 << 30, t0);
        let high = h.arrive(9 << 30, t0);
        let mid = h.arrive(6 << 30, t0);
        assert_eq!(h.next(), None, "busy");
        h.finish();
        let mut order = Vec::new();
        let mut end = end1;
        while let Some(k) = h.next() {
            let e = h.start(k, Op::Read, 4096);
            assert!(e > end, "starts where the previous ended");
            end = e;
            h.finish();
            order.push(k);
        }
        assert_eq!(order, vec![mid, high, low]);
        let s = h.stats();
        assert_eq!((s.reads, s.writes, s.seeks), (3, 1, 4));
        assert_eq!(s.read_bytes, 3 * 4096);
        assert!((s.busy_secs - (end - t0).as_secs_f64()).abs() < 1e-6);
    }
}
