//! The read benchmark's results: samples, min/median/max, the stream/chunk and
//! prefetch on/off ratios, printed as a table or as JSON.

use super::cache::Machine;
use crate::bench::floor::{FloorSample, VsFloor};
use serde::Serialize;

/// One timed run.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Sample {
    /// Wall time in seconds.
    pub secs: f64,
    /// Bytes read per second, in MB/s (10^6 bytes, as upstream reports).
    pub mb_per_s: f64,
    /// The fraction of the replica files' pages in the page cache when the run started
    /// (`mincore`); `None` where the files cannot be looked at (an existing cluster).
    pub resident: Option<f64>,
    /// Process CPU seconds (user + system: client and embedded cluster) per GiB read.
    pub cpu_secs_per_gib: f64,
}

impl Sample {
    /// `bytes` in `secs`.
    pub fn new(bytes: u64, secs: f64) -> Sample {
        Sample {
            secs,
            mb_per_s: bytes as f64 / secs.max(1e-9) / 1e6,
            resident: None,
            cpu_secs_per_gib: 0.0,
        }
    }

    /// `bytes` in `secs` using `cpu` CPU seconds.
    pub fn with_cpu(bytes: u64, secs: f64, cpu: f64) -> Sample {
        Sample {
            cpu_secs_per_gib: cpu / (bytes.max(1) as f64 / (1u64 << 30) as f64),
            ..Sample::new(bytes, secs)
        }
    }
}

/// Minimum, median and maximum.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Spread {
    /// Smallest.
    pub min: f64,
    /// Median (the mean of the middle two for an even count).
    pub median: f64,
    /// Largest.
    pub max: f64,
}

impl Spread {
    /// The spread of `values` (all zero when empty).
    pub fn of(values: impl Iterator<Item = f64>) -> Spread {
        let mut v: Vec<f64> = values.collect();
        if v.is_empty() {
            return Spread {
                min: 0.0,
                median: 0.0,
                max: 0.0,
            };
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Spread {
            min: v[0],
            median,
            max: v[n - 1],
        }
    }
}

/// One configuration's runs.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// Reader threads, each on its own file.
    pub threads: usize,
    /// `stream` or `chunk`.
    pub mode: &'static str,
    /// `warm` (every replica file in the page cache), `cold` (evicted) or `as-is`.
    pub cache: &'static str,
    /// The DataNodes' `read.prefetch.bytes`, as text (`off` for 0).
    pub prefetch: String,
    /// Each run.
    pub runs: Vec<Sample>,
    /// Seconds per run.
    pub secs: Spread,
    /// Aggregate MB/s per run.
    pub mb_per_s: Spread,
    /// Process CPU seconds per GiB read, per run.
    pub cpu_secs_per_gib: Spread,
    /// The largest resident fraction any run started with; `None` when not measured.
    pub resident_max: Option<f64>,
    /// The same bytes without Sluice in the same runs (one file read and one loopback copy
    /// per reader), per run.
    pub floor_runs: Vec<FloorSample>,
    /// Medians against the floor's (flattened: `mb_s`, `floor_mb_s`, ...).
    #[serde(flatten)]
    pub vs_floor: VsFloor,
    /// A plain loopback copy of as many bytes, sent from one 1 MiB buffer, run just before
    /// each run (one warm stream only): the ceiling in the same moment as the run, paired
    /// with it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub loopback_runs: Vec<Sample>,
    /// The median over runs of (the run's MB/s / its paired loopback copy's MB/s).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mb_s_vs_loopback: Option<f64>,
    /// The same copy of the file's own bytes: sent from a mapping of the (warm) replica files
    /// instead of one buffer, run just before each run, after the copy above (one warm stream
    /// of the benchmark's own cluster only).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub loopback_file_runs: Vec<Sample>,
    /// The median over runs of (the run's MB/s / its paired copy of the file's bytes' MB/s).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mb_s_vs_loopback_file: Option<f64>,
}

impl Row {
    /// A row from its runs.
    pub fn new(
        threads: usize,
        mode: &'static str,
        cache: &'static str,
        prefetch: String,
        runs: Vec<Sample>,
    ) -> Row {
        let mb_per_s = Spread::of(runs.iter().map(|s| s.mb_per_s));
        let cpu_secs_per_gib = Spread::of(runs.iter().map(|s| s.cpu_secs_per_gib));
        Row {
            threads,
            mode,
            cache,
            prefetch,
            secs: Spread::of(runs.iter().map(|s| s.secs)),
            vs_floor: VsFloor::new(mb_per_s.median, cpu_secs_per_gib.median, &[]),
            mb_per_s,
            cpu_secs_per_gib,
            resident_max: runs.iter().filter_map(|s| s.resident).reduce(f64::max),
            floor_runs: Vec::new(),
            runs,
            loopback_runs: Vec::new(),
            mb_s_vs_loopback: None,
            loopback_file_runs: Vec::new(),
            mb_s_vs_loopback_file: None,
        }
    }

    /// The row with the loopback copies paired with each of its runs (run just before it):
    /// from one buffer, and of the file's bytes (either may be empty).
    pub fn with_loopback(mut self, copies: Vec<Sample>, file_copies: Vec<Sample>) -> Row {
        if let Some(ratio) = self.paired_ratio(&copies) {
            self.mb_s_vs_loopback = Some(ratio);
            self.loopback_runs = copies;
        }
        if let Some(ratio) = self.paired_ratio(&file_copies) {
            self.mb_s_vs_loopback_file = Some(ratio);
            self.loopback_file_runs = file_copies;
        }
        self
    }

    /// The median of the per-run ratios against `copies`, one per run.
    fn paired_ratio(&self, copies: &[Sample]) -> Option<f64> {
        if copies.len() != self.runs.len() || copies.is_empty() {
            return None;
        }
        let ratios = self.runs.iter().zip(copies);
        Some(Spread::of(ratios.map(|(r, c)| r.mb_per_s / c.mb_per_s.max(1e-9))).median)
    }

    /// The row with the floor measured in the same runs.
    pub fn with_floor(mut self, floor: Vec<FloorSample>) -> Row {
        self.vs_floor = VsFloor::new(self.mb_per_s.median, self.cpu_secs_per_gib.median, &floor);
        self.floor_runs = floor;
        self
    }
}

/// A ratio of median MB/s between two rows.
#[derive(Debug, Clone, Serialize)]
pub struct Ratio {
    /// What is compared.
    pub what: String,
    /// Numerator's median MB/s divided by the denominator's.
    pub ratio: f64,
}

/// Everything one run of the benchmark measured.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Where.
    pub machine: Machine,
    /// Bytes per file.
    pub file_bytes: u64,
    /// Block size of the files.
    pub block_bytes: u64,
    /// Replicas per block.
    pub replication: u16,
    /// Bytes per `read` call of the application.
    pub read_bytes: u64,
    /// The client's `read.buffer.bytes` and `read.piece.bytes`, and `read.chunk.size`.
    pub client: String,
    /// Aggregate MB/s of writing the files.
    pub write_mb_per_s: f64,
    /// A plain tokio socket copy of `file_bytes` over loopback, per run.
    pub loopback: Row,
    /// Every configuration measured.
    pub rows: Vec<Row>,
    /// stream/chunk and prefetch on/off.
    pub ratios: Vec<Ratio>,
    /// What could not be measured in this run, and why.
    pub notes: Vec<String>,
}

impl Report {
    /// Fills `ratios`: stream/chunk for each (threads, cache, prefetch) measured in both
    /// modes, and prefetch on/off for stream mode.
    pub fn compute_ratios(&mut self) {
        let mut out = Vec::new();
        for s in self.rows.iter().filter(|r| r.mode == "stream") {
            if let Some(ratio) = s.mb_s_vs_loopback {
                out.push(Ratio {
                    what: format!(
                        "stream/loopback copy (paired runs), {} thread(s), {}, prefetch {}",
                        s.threads, s.cache, s.prefetch
                    ),
                    ratio,
                });
            }
            if let Some(ratio) = s.mb_s_vs_loopback_file {
                out.push(Ratio {
                    what: format!(
                        "stream/loopback copy of the file's bytes (paired runs), {} thread(s), \
                         {}, prefetch {}",
                        s.threads, s.cache, s.prefetch
                    ),
                    ratio,
                });
            }
            let same = |r: &&Row| r.threads == s.threads && r.cache == s.cache;
            if let Some(c) = self
                .rows
                .iter()
                .filter(same)
                .find(|r| r.mode == "chunk" && r.prefetch == s.prefetch)
            {
                out.push(Ratio {
                    what: format!(
                        "stream/chunk, {} thread(s), {}, prefetch {}",
                        s.threads, s.cache, s.prefetch
                    ),
                    ratio: s.mb_per_s.median / c.mb_per_s.median.max(1e-9),
                });
            }
            if s.prefetch == "off" {
                continue;
            }
            if let Some(off) = self
                .rows
                .iter()
                .filter(same)
                .find(|r| r.mode == "stream" && r.prefetch == "off")
            {
                out.push(Ratio {
                    what: format!(
                        "stream prefetch {}/off, {} thread(s), {}",
                        s.prefetch, s.threads, s.cache
                    ),
                    ratio: s.mb_per_s.median / off.mb_per_s.median.max(1e-9),
                });
            }
        }
        self.ratios = out;
    }

    /// Names every cold row whose runs did not all start cold (more than 5% of the replica
    /// pages resident when the clock started).
    pub fn check_cold(&mut self) {
        for r in &self.rows {
            if let Some(f) = r.resident_max.filter(|f| r.cache == "cold" && *f > 0.05) {
                self.notes.push(format!(
                    "{} thread(s) {} (prefetch {}): a cold run started with {:.1}% of the \
                     replica pages resident; eviction did not take",
                    r.threads,
                    r.mode,
                    r.prefetch,
                    f * 100.0
                ));
            }
        }
    }

    /// The human-readable table.
    pub fn print_table(&self) {
        let m = &self.machine;
        let disk = match m.rotational {
            Some(true) => "rotational",
            Some(false) => "non-rotational",
            None => "unknown kind",
        };
        let ra = m
            .read_ahead_kb
            .map_or("unknown".to_string(), |kb| format!("{kb} KiB"));
        println!(
            "machine: {} CPUs ({}), {:.1} GiB RAM, kernel {}, disk {} ({disk}, read-ahead {ra})",
            m.cpus, m.cpu_model, m.memory_gib, m.kernel, m.disk
        );
        println!(
            "files: {} each, blocks of {}, replication {}; reads of {}; client {}",
            human(self.file_bytes),
            human(self.block_bytes),
            self.replication,
            human(self.read_bytes),
            self.client
        );
        println!("write: {:.0} MB/s", self.write_mb_per_s);
        println!(
            "loopback TCP copy of {}: {:.0} / {:.0} / {:.0} MB/s (min / median / max)",
            human(self.file_bytes),
            self.loopback.mb_per_s.min,
            self.loopback.mb_per_s.median,
            self.loopback.mb_per_s.max
        );
        println!();
        println!(
            "{:>7}  {:<6}  {:<6}  {:<12}  {:>22}  {:>22}  {:>9}  {:>9}  {:>10}  {:>7}  {:>9}  {:>7}",
            "threads",
            "mode",
            "cache",
            "prefetch",
            "seconds min/med/max",
            "MB/s min/med/max",
            "resident",
            "CPU s/GiB",
            "floor MB/s",
            "x floor",
            "floor CPU",
            "x floor"
        );
        for r in &self.rows {
            let [floor_mb, mb_x, floor_cpu, cpu_x] = r.vs_floor.cells();
            println!(
                "{:>7}  {:<6}  {:<6}  {:<12}  {:>22}  {:>22}  {:>9}  {:>9.2}  {:>10}  {:>7}  {:>9}  {:>7}",
                r.threads,
                r.mode,
                r.cache,
                r.prefetch,
                format!("{:.2}/{:.2}/{:.2}", r.secs.min, r.secs.median, r.secs.max),
                format!(
                    "{:.0}/{:.0}/{:.0}",
                    r.mb_per_s.min, r.mb_per_s.median, r.mb_per_s.max
                ),
                r.resident_max
                    .map_or("-".into(), |f| format!("{:.1}%", f * 100.0)),
                r.cpu_secs_per_gib.median,
                floor_mb,
                mb_x,
                floor_cpu,
                cpu_x,
            );
        }
        println!();
        println!(
            "CPU: the whole process (client and embedded cluster) per GiB read, median. floor: \
             the same bytes without Sluice in the same runs (each reader's share of the replica \
             files, in the same page-cache state, read in pieces by one thread and copied over \
             loopback TCP to another; medians); x floor: Sluice / floor."
        );
        println!(
            "Paired with each warm single stream: the loopback copy (1 MiB sends of one buffer, \
             which stays in the CPU caches) and the loopback copy of the file's bytes (the same \
             sends from a mapping of the warm replica files: each byte read from memory once)."
        );
        for r in &self.ratios {
            println!("{:<60} {:.2}x", r.what, r.ratio);
        }
        for n in &self.notes {
            println!("note: {n}");
        }
    }
}

/// `n` bytes in binary units.
pub fn human(n: u64) -> String {
    sluice_common::config::ByteSize(n).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_and_ratios() {
        let s = Spread::of([3.0, 1.0, 2.0].into_iter());
        assert_eq!((s.min, s.median, s.max), (1.0, 2.0, 3.0));
        assert_eq!(Spread::of([1.0, 2.0].into_iter()).median, 1.5);
        let row = |mode, prefetch: &str, mbps| {
            Row::new(
                1,
                mode,
                "cold",
                prefetch.into(),
                vec![Sample::new(mbps, 1.0)],
            )
        };
        let mut r = Report {
            machine: Machine::probe(std::path::Path::new("/")),
            file_bytes: 0,
            block_bytes: 0,
            replication: 1,
            read_bytes: 0,
            client: String::new(),
            write_mb_per_s: 0.0,
            loopback: row("tcp", "-", 1),
            rows: vec![
                row("stream", "8MiB", 300_000_000),
                row("chunk", "8MiB", 200_000_000),
                row("stream", "off", 250_000_000),
            ],
            ratios: Vec::new(),
            notes: Vec::new(),
        };
        r.compute_ratios();
        let got: Vec<(String, f64)> = r.ratios.iter().map(|x| (x.what.clone(), x.ratio)).collect();
        assert_eq!(got.len(), 2, "{got:?}");
        assert!((got[0].1 - 1.5).abs() < 1e-9, "{got:?}");
        assert!((got[1].1 - 1.2).abs() < 1e-9, "{got:?}");
    }

    #[test]
    fn a_paired_loopback_ratio_is_the_median_of_per_run_ratios() {
        let s = |mb: u64| Sample::new(mb * 1_000_000, 1.0);
        // Runs of 2,000 / 3,000 / 2,500 MB/s, each next to its own copy: 0.5×, 1.0×, 0.5×.
        let row = Row::new(
            1,
            "stream",
            "warm",
            "8MiB".into(),
            vec![s(2000), s(3000), s(2500)],
        );
        // The copies of the file's bytes: 1.0×, 1.5×, 1.25×.
        let file = vec![s(2000), s(2000), s(2000)];
        let row = row.with_loopback(vec![s(4000), s(3000), s(5000)], file);
        assert_eq!(row.mb_s_vs_loopback, Some(0.5));
        assert_eq!(row.loopback_runs.len(), 3);
        assert_eq!(row.mb_s_vs_loopback_file, Some(1.25));
        assert_eq!(row.loopback_file_runs.len(), 3);
        // Not paired run for run: no ratio.
        let row = Row::new(1, "stream", "warm", "8MiB".into(), vec![s(2000)]);
        let row = row.with_loopback(vec![s(1), s(2)], Vec::new());
        assert_eq!(
            (row.mb_s_vs_loopback, row.mb_s_vs_loopback_file),
            (None, None)
        );
    }
}
