//! What both services' `/metrics` share, on the Prometheus organisation's client
//! (`prometheus-client`): the latency histogram and its buckets, a timer that observes on drop,
//! `sluice_build_info`, the process metrics (read from `/proc/self` at each scrape: the crate
//! has no process collector) and the text encoding (Prometheus text format 0.0.4).
//!
//! The process metrics keep the names every Prometheus client library uses (`process_*`,
//! without the `sluice_` prefix) so that stock dashboards and alerts work unchanged.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;
use std::time::{Duration, Instant};

pub use prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// Latency buckets in seconds: 100 µs to ~52 s, doubling (20 buckets).
pub fn latency_buckets() -> impl Iterator<Item = f64> {
    exponential_buckets(0.0001, 2.0, 20)
}

/// A latency histogram in seconds, with [`latency_buckets`].
pub fn latency_histogram() -> Histogram {
    Histogram::new(latency_buckets())
}

/// Observes `d` in seconds.
pub fn observe(h: &Histogram, d: Duration) {
    h.observe(d.as_secs_f64());
}

/// Observes the time from its creation to its drop into a histogram.
#[derive(Debug)]
pub struct Timer<'a> {
    histogram: &'a Histogram,
    start: Instant,
}

impl<'a> Timer<'a> {
    /// Starts timing.
    pub fn start(histogram: &'a Histogram) -> Self {
        Timer {
            histogram,
            start: Instant::now(),
        }
    }
}

impl Drop for Timer<'_> {
    fn drop(&mut self) {
        observe(self.histogram, self.start.elapsed());
    }
}

/// Registers `sluice_build_info{version}` (always 1) and the process metrics at the root of
/// `registry` (no prefix).
pub fn register_build_and_process(registry: &mut Registry) {
    registry.register(
        "sluice_build",
        "Build of this Sluice binary (always 1).",
        Info::new(vec![("version", env!("CARGO_PKG_VERSION"))]),
    );
    registry.register_collector(Box::new(ProcessCollector));
}

/// Encodes `registry` in the Prometheus text format (`CONTENT_TYPE`).
pub fn encode(registry: &Registry) -> String {
    let mut out = String::with_capacity(16 * 1024);
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, registry);
    out
}

/// `process_*` from `/proc/self` at each scrape; a value that cannot be read is left out.
#[derive(Debug)]
struct ProcessCollector;

/// What `/proc/self` tells.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct ProcessStats {
    /// Resident set size in bytes.
    pub resident_bytes: u64,
    /// Virtual memory size in bytes.
    pub virtual_bytes: u64,
    /// User plus system CPU time in seconds.
    pub cpu_seconds: f64,
    /// Start time, seconds since the Unix epoch.
    pub start_time_seconds: f64,
    /// Open file descriptors.
    pub open_fds: u64,
    /// The soft limit on open file descriptors.
    pub max_fds: Option<u64>,
    /// Threads.
    pub threads: u64,
}

/// Clock ticks per second of `/proc` times (`sysconf(_SC_CLK_TCK)`, 100 on Linux).
const CLK_TCK: f64 = 100.0;
/// Page size used for the RSS count of `/proc/self/stat` (4 KiB on x86_64 and arm64 Linux).
const PAGE_SIZE: u64 = 4096;

/// Parses `/proc/self/stat` (fields after the `(comm)`), with the boot time from
/// `/proc/stat`'s `btime`; `None` if it does not parse.
pub fn parse_stat(stat: &str, boot_time_secs: u64) -> Option<ProcessStats> {
    // comm may hold spaces and parentheses: the fields start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // f[0] is field 3 (state): field n is f[n - 3].
    let num = |n: usize| f.get(n - 3).and_then(|s| s.parse::<u64>().ok());
    let ticks = num(14)? + num(15)?;
    Some(ProcessStats {
        cpu_seconds: ticks as f64 / CLK_TCK,
        threads: num(20)?,
        start_time_seconds: boot_time_secs as f64 + num(22)? as f64 / CLK_TCK,
        virtual_bytes: num(23)?,
        resident_bytes: num(24)? * PAGE_SIZE,
        ..ProcessStats::default()
    })
}

/// `btime` of `/proc/stat`.
fn boot_time() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    stat.lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

/// The soft `Max open files` of `/proc/self/limits`.
fn max_fds() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

/// This process, now.
pub fn process_stats() -> Option<ProcessStats> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let mut s = parse_stat(&stat, boot_time()?)?;
    s.open_fds = std::fs::read_dir("/proc/self/fd").ok()?.count() as u64;
    s.max_fds = max_fds();
    Some(s)
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(s) = process_stats() else {
            return Ok(());
        };
        let cpu = ConstCounter::new(s.cpu_seconds);
        cpu.encode(encoder.encode_descriptor(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds.",
            None,
            cpu.metric_type(),
        )?)?;
        let mut gauges: Vec<(&str, &str, f64)> = vec![
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes.",
                s.resident_bytes as f64,
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes.",
                s.virtual_bytes as f64,
            ),
            (
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds.",
                s.start_time_seconds,
            ),
            (
                "process_open_fds",
                "Number of open file descriptors.",
                s.open_fds as f64,
            ),
            ("process_threads", "Number of OS threads.", s.threads as f64),
        ];
        if let Some(max) = s.max_fds {
            gauges.push((
                "process_max_fds",
                "Maximum number of open file descriptors.",
                max as f64,
            ));
        }
        for (name, help, value) in gauges {
            let g = ConstGauge::new(value);
            g.encode(encoder.encode_descriptor(name, help, None, g.metric_type())?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_read_after_the_command_name() {
        // pid (comm with ") (" inside) state ppid ... utime=250 stime=50 ... threads=7
        // starttime=1000 vsize=8192 rss=3
        let mut fields = vec!["0"; 50];
        fields[0] = "S";
        fields[14 - 3] = "250";
        fields[15 - 3] = "50";
        fields[20 - 3] = "7";
        fields[22 - 3] = "1000";
        fields[23 - 3] = "8192";
        fields[24 - 3] = "3";
        let stat = format!("42 (a) (b) {}", fields.join(" "));
        let s = parse_stat(&stat, 1_700_000_000).expect("parses");
        assert_eq!(s.cpu_seconds, 3.0);
        assert_eq!(s.threads, 7);
        assert_eq!(s.start_time_seconds, 1_700_000_010.0);
        assert_eq!(s.virtual_bytes, 8192);
        assert_eq!(s.resident_bytes, 3 * PAGE_SIZE);
        assert!(parse_stat("garbage", 0).is_none());
    }

    #[test]
    fn this_process_is_seen_and_encoded() {
        let s = process_stats().expect("/proc/self is readable");
        assert!(s.resident_bytes > 0 && s.open_fds > 0 && s.start_time_seconds > 1e9);
        let mut r = Registry::default();
        register_build_and_process(&mut r);
        let text = encode(&r);
        for name in [
            "process_cpu_seconds_total ",
            "process_resident_memory_bytes ",
            "process_open_fds ",
            "process_start_time_seconds ",
        ] {
            assert!(text.contains(name), "{name} missing from:\n{text}");
        }
        let build = format!(
            "sluice_build_info{{version=\"{}\"}} 1\n",
            env!("CARGO_PKG_VERSION")
        );
        assert!(text.contains(&build), "{text}");
        assert!(
            text.contains("# TYPE process_cpu_seconds_total counter"),
            "{text}"
        );
    }
}
