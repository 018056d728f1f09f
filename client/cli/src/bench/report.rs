//! What the write-path benchmarks (`bench write`, `bench mixed`) measure and how they print
//! it: the machine, process CPU time, latency percentiles, min/median/max over runs, the
//! DataNodes' write counters (scraped from their `/metrics`), and a plain text table.

use serde::Serialize;
use sluice_client::FileSystem;
use sluice_common::rpc::NodeState;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Bytes in a MiB.
pub const MIB: f64 = 1024.0 * 1024.0;

/// What the figures were measured on.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    /// CPUs available to this process (`nproc`).
    pub cpus: usize,
    /// The CPU model.
    pub cpu_model: String,
    /// Total memory in GiB.
    pub memory_gib: f64,
    /// The kernel release.
    pub kernel: String,
    /// `df -T` of the benchmark directory: device, file system type, size.
    pub disk: String,
}

impl Machine {
    /// Describes this machine and the file system holding `dir`.
    pub fn probe(dir: &Path) -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split(':').nth(1))
            .map_or_else(|| "unknown".into(), |s| s.trim().to_string());
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let mem_kib: f64 = meminfo
            .lines()
            .find(|l| l.starts_with("MemTotal:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        let disk = std::process::Command::new("df")
            .arg("-T")
            .arg(dir)
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| {
                s.lines()
                    .nth(1)
                    .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
            })
            .unwrap_or_else(|| "unknown".into());
        Machine {
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            cpu_model,
            memory_gib: mem_kib / (1024.0 * 1024.0),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .map(|s| s.trim().to_string())
                .unwrap_or_default(),
            disk,
        }
    }

    /// One line for the table header.
    pub fn line(&self) -> String {
        format!(
            "{} CPUs ({}), {:.1} GiB memory, kernel {}, disk: {}",
            self.cpus, self.cpu_model, self.memory_gib, self.kernel, self.disk
        )
    }
}

/// CPU seconds (user + system) this process has used: the client and, for an embedded
/// cluster, every DataNode and the metadata service.
#[allow(unsafe_code)] // getrusage: the CPU time the benchmark report shows
pub fn process_cpu_secs() -> f64 {
    // SAFETY: `usage` is a properly sized, writable struct that getrusage fills.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_SELF is a valid `who`.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return 0.0;
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// Latency samples in seconds.
#[derive(Debug, Clone, Default)]
pub struct Latencies(Vec<f64>);

impl Latencies {
    /// Records one.
    pub fn push(&mut self, d: Duration) {
        self.0.push(d.as_secs_f64());
    }

    /// Adds another set.
    pub fn extend(&mut self, other: Latencies) {
        self.0.extend(other.0);
    }

    /// Samples.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// The `p`-th percentile in milliseconds (nearest rank; 0 without samples).
    pub fn percentile_ms(&self, p: f64) -> f64 {
        if self.0.is_empty() {
            return 0.0;
        }
        let mut v = self.0.clone();
        v.sort_by(f64::total_cmp);
        let rank = ((p / 100.0) * v.len() as f64).ceil().max(1.0) as usize;
        v[rank.min(v.len()) - 1] * 1000.0
    }
}

/// Minimum, median and maximum of several runs.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Spread {
    /// Smallest.
    pub min: f64,
    /// Median (mean of the middle two for an even count).
    pub median: f64,
    /// Largest.
    pub max: f64,
}

impl Spread {
    /// The spread of `values` (zeros when empty).
    pub fn of(values: impl IntoIterator<Item = f64>) -> Spread {
        let mut v: Vec<f64> = values.into_iter().collect();
        if v.is_empty() {
            return Spread::default();
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

    /// `median` with the range when there was more than one run.
    pub fn show(&self, decimals: usize) -> String {
        if (self.max - self.min).abs() < f64::EPSILON {
            format!("{:.*}", decimals, self.median)
        } else {
            format!(
                "{:.*} ({:.*}-{:.*})",
                decimals, self.median, decimals, self.min, decimals, self.max
            )
        }
    }
}

/// The DataNodes' write counters, summed over the cluster.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct WriteCounters {
    /// write/pwrite calls on block files.
    pub block_file_writes: u64,
    /// ... of which on buffered replicas.
    pub buffered_block_file_writes: u64,
    /// Data bytes written to block files.
    pub bytes_written: u64,
    /// ... of which to buffered replicas.
    pub buffered_bytes_written: u64,
    /// Buffer flushes.
    pub buffer_flushes: u64,
    /// fdatasync calls.
    pub fsyncs: u64,
    /// Replicas written through a buffer.
    pub buffered_replicas_created: u64,
    /// Bytes sent to readers.
    pub bytes_read: u64,
    /// Bytes of flushed block files dropped from the page cache.
    pub write_dropbehind_bytes: u64,
}

impl WriteCounters {
    /// What happened between `before` and `self`.
    pub fn since(&self, before: &WriteCounters) -> WriteCounters {
        WriteCounters {
            block_file_writes: self.block_file_writes
                - before.block_file_writes.min(self.block_file_writes),
            buffered_block_file_writes: self.buffered_block_file_writes
                - before
                    .buffered_block_file_writes
                    .min(self.buffered_block_file_writes),
            bytes_written: self.bytes_written - before.bytes_written.min(self.bytes_written),
            buffered_bytes_written: self.buffered_bytes_written
                - before
                    .buffered_bytes_written
                    .min(self.buffered_bytes_written),
            buffer_flushes: self.buffer_flushes - before.buffer_flushes.min(self.buffer_flushes),
            fsyncs: self.fsyncs - before.fsyncs.min(self.fsyncs),
            buffered_replicas_created: self.buffered_replicas_created
                - before
                    .buffered_replicas_created
                    .min(self.buffered_replicas_created),
            bytes_read: self.bytes_read - before.bytes_read.min(self.bytes_read),
            write_dropbehind_bytes: self.write_dropbehind_bytes
                - before
                    .write_dropbehind_bytes
                    .min(self.write_dropbehind_bytes),
        }
    }

    /// Block-file write calls per MiB written on buffered replicas (`None`: none written).
    pub fn buffered_calls_per_mib(&self) -> Option<f64> {
        per_mib(self.buffered_block_file_writes, self.buffered_bytes_written)
    }

    /// Block-file write calls per MiB written on unbuffered (direct) replicas.
    pub fn direct_calls_per_mib(&self) -> Option<f64> {
        per_mib(
            self.block_file_writes - self.buffered_block_file_writes.min(self.block_file_writes),
            self.bytes_written - self.buffered_bytes_written.min(self.bytes_written),
        )
    }

    fn add(&mut self, m: &BTreeMap<String, u64>) {
        let get = |k: &str| m.get(k).copied().unwrap_or(0);
        self.block_file_writes += get("block_file_writes_total");
        self.buffered_block_file_writes += get("buffered_block_file_writes_total");
        self.bytes_written += get("written_bytes_total");
        self.buffered_bytes_written += get("buffered_written_bytes_total");
        self.buffer_flushes += get("buffer_flushes_total");
        self.fsyncs += get("fsyncs_total");
        self.buffered_replicas_created += get("buffered_replicas_created_total");
        self.bytes_read += get("read_bytes_total");
        self.write_dropbehind_bytes += get("write_dropbehind_bytes_total");
    }
}

fn per_mib(calls: u64, bytes: u64) -> Option<f64> {
    (bytes > 0).then(|| calls as f64 / (bytes as f64 / MIB))
}

/// Sums the write counters of every live DataNode, read from their HTTP `/metrics`.
pub async fn scrape(fs: &FileSystem) -> anyhow::Result<WriteCounters> {
    let mut total = WriteCounters::default();
    for m in live_metrics(fs).await? {
        total.add(&m);
    }
    Ok(total)
}

/// Replicas finalized and replicas deleted so far, summed over the live DataNodes (their
/// `replicas_finalized` and `replicas_deleted` counters).
pub async fn replica_counts(fs: &FileSystem) -> anyhow::Result<(u64, u64)> {
    let (mut finalized, mut deleted) = (0, 0);
    for m in live_metrics(fs).await? {
        let get = |n: &str| m.get(n).or_else(|| m.get(&format!("{n}_total"))).copied();
        finalized += get("replicas_finalized").unwrap_or(0);
        deleted += get("replicas_deleted").unwrap_or(0);
    }
    Ok((finalized, deleted))
}

/// The `/metrics` of every live DataNode, parsed.
async fn live_metrics(fs: &FileSystem) -> anyhow::Result<Vec<BTreeMap<String, u64>>> {
    let report = fs.cluster_report().await?;
    let mut all = Vec::new();
    for dn in report
        .datanodes
        .iter()
        .filter(|d| d.state == NodeState::Live)
    {
        all.push(parse_metrics(
            &http_get(&dn.id.http_addr, "/metrics").await?,
        ));
    }
    Ok(all)
}

/// `sluice_datanode_<name> <value>` lines.
fn parse_metrics(text: &str) -> BTreeMap<String, u64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (name, value) = l.split_once(' ')?;
            let name = name.strip_prefix("sluice_datanode_")?;
            Some((
                name.to_string(),
                value.trim().parse::<i64>().ok()?.max(0) as u64,
            ))
        })
        .collect()
}

/// A bare HTTP/1.0 GET; returns the body.
async fn http_get(addr: &str, path: &str) -> anyhow::Result<String> {
    let fut = async {
        let mut s = tokio::net::TcpStream::connect(addr).await?;
        let req = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n");
        s.write_all(req.as_bytes()).await?;
        let mut out = Vec::new();
        s.read_to_end(&mut out).await?;
        anyhow::Ok(String::from_utf8_lossy(&out).into_owned())
    };
    let text = tokio::time::timeout(Duration::from_secs(10), fut)
        .await
        .map_err(|_| anyhow::anyhow!("GET http://{addr}{path} timed out"))??;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .ok_or_else(|| anyhow::anyhow!("GET http://{addr}{path}: no HTTP body"))?;
    Ok(body)
}

/// Prints `rows` under `headers`, columns padded to their widest cell.
pub fn print_table(headers: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(c.chars().count());
            }
        }
    }
    let line = |cells: Vec<String>| {
        let padded: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<w$}", w = widths.get(i).copied().unwrap_or(0)))
            .collect();
        padded.join("  ").trim_end().to_string()
    };
    println!("{}", line(headers.iter().map(|h| h.to_string()).collect()));
    println!("{}", line(widths.iter().map(|w| "-".repeat(*w)).collect()));
    for r in rows {
        println!("{}", line(r.clone()));
    }
}

/// `Some(x)` with `decimals`, or "-".
pub fn opt(v: Option<f64>, decimals: usize) -> String {
    v.map_or_else(|| "-".into(), |x| format!("{x:.decimals$}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let mut l = Latencies::default();
        for ms in 1..=100u64 {
            l.push(Duration::from_millis(ms));
        }
        assert!((l.percentile_ms(50.0) - 50.0).abs() < 1e-6);
        assert!((l.percentile_ms(99.0) - 99.0).abs() < 1e-6);
        assert_eq!(Latencies::default().percentile_ms(99.0), 0.0);
    }

    #[test]
    fn metrics_text_is_parsed_by_name() {
        let m = parse_metrics(
            "# HELP sluice_datanode_fsyncs_total x\n# TYPE sluice_datanode_fsyncs_total counter\n\
             sluice_datanode_fsyncs_total 12\nsluice_datanode_buffered_replicas -1\nother 3\n\
             sluice_datanode_flush_seconds_sum 0.25\n",
        );
        assert_eq!(m.get("fsyncs_total"), Some(&12));
        assert!(!m.contains_key("flush_seconds_sum"), "not a whole number");
        assert_eq!(m.get("buffered_replicas"), Some(&0));
        assert!(!m.contains_key("other"));
        let mut c = WriteCounters::default();
        c.add(&BTreeMap::from([
            ("block_file_writes_total".to_string(), 30),
            ("buffered_block_file_writes_total".to_string(), 2),
            ("written_bytes_total".to_string(), 3 << 20),
            ("buffered_written_bytes_total".to_string(), 1 << 20),
        ]));
        assert_eq!(c.buffered_calls_per_mib(), Some(2.0));
        assert_eq!(c.direct_calls_per_mib(), Some(14.0));
    }
}
