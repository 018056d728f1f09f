//! `/metrics` of the metadata service, through `prometheus-client` (Prometheus text format):
//!
//! - kept between scrapes: RPC calls, failures and latency per method
//!   (`sluice_metadata_rpc_*{method}`), `sluice_build_info` and the process metrics;
//! - read from the state at each scrape, under the same lock as `/status` and `sluice report`:
//!   namespace totals, blocks needing attention, DataNodes by state, cluster capacity / used /
//!   remaining (over the DataNodes that are not dead), the repair queues and the repair
//!   counters.
//!
//! `docs/metrics.md` lists every family; a test checks the list against a scrape.

use crate::state::RepairReport;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use sluice_common::metrics::{encode, latency_histogram, register_build_and_process};
use sluice_common::rpc::{ClusterReport, NodeState};
use std::time::Duration;

/// The `method` label.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MethodLabel {
    method: &'static str,
}

/// The `state` label of `sluice_metadata_datanodes`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: &'static str,
}

/// The metrics kept between scrapes, and their registry.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    calls: Family<MethodLabel, Counter>,
    errors: Family<MethodLabel, Counter>,
    latency: Family<MethodLabel, Histogram>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        register_build_and_process(&mut registry);
        let calls = Family::<MethodLabel, Counter>::default();
        let errors = Family::<MethodLabel, Counter>::default();
        let latency: Family<MethodLabel, Histogram> =
            Family::new_with_constructor(latency_histogram);
        let meta = registry.sub_registry_with_prefix("sluice_metadata");
        meta.register("rpc_calls", "RPC calls by method.", calls.clone());
        meta.register("rpc_errors", "Failed RPC calls by method.", errors.clone());
        meta.register(
            "rpc_duration_seconds",
            "RPC handling time by method, durable flush included for changes.",
            latency.clone(),
        );
        Metrics {
            registry,
            calls,
            errors,
            latency,
        }
    }
}

impl Metrics {
    /// Counts one call of `method` as it starts (tests watch calls in flight this way). A
    /// method's error series exists (at 0) from its first call, so that error rates are never
    /// absent.
    pub fn call(&self, method: &'static str) {
        let label = MethodLabel { method };
        self.calls.get_or_create(&label).inc();
        drop(self.errors.get_or_create(&label));
    }

    /// Records the end of a call of `method` that took `elapsed`, failed or not.
    pub fn finish(&self, method: &'static str, elapsed: Duration, failed: bool) {
        let label = MethodLabel { method };
        if failed {
            self.errors.get_or_create(&label).inc();
        }
        self.latency
            .get_or_create(&label)
            .observe(elapsed.as_secs_f64());
    }

    /// The whole exposition: the kept metrics, then those read from the state.
    pub fn render(
        &self,
        report: &ClusterReport,
        open_files: usize,
        repair: &RepairReport,
    ) -> String {
        let mut out = encode(&self.registry);
        out.push_str(&encode(&scrape_registry(report, open_files, repair)));
        out
    }
}

fn gauge(r: &mut Registry, name: &str, help: &str, value: u64) {
    r.register(
        name,
        help,
        ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX)),
    );
}

fn counter(r: &mut Registry, name: &str, help: &str, value: u64) {
    r.register(name, help, ConstCounter::new(value));
}

/// The metrics read from the state at one scrape.
fn scrape_registry(report: &ClusterReport, open_files: usize, repair: &RepairReport) -> Registry {
    let mut r = Registry::with_prefix("sluice_metadata");
    let t = report.totals();
    let gauges: [(&str, &str, u64); 11] = [
        ("files", "Files in the namespace.", report.files),
        (
            "directories",
            "Directories in the namespace.",
            report.directories,
        ),
        ("blocks", "Blocks in the block manager.", report.blocks),
        (
            "files_under_construction",
            "Files open for writing.",
            open_files as u64,
        ),
        (
            "under_replicated_blocks",
            "Blocks with fewer live replicas than their factor.",
            report.under_replicated_blocks,
        ),
        (
            "missing_blocks",
            "Blocks with no live replica.",
            report.missing_blocks,
        ),
        (
            "corrupt_blocks",
            "Blocks with a corrupt replica.",
            report.corrupt_blocks,
        ),
        (
            "capacity_bytes",
            "Configured capacity of the DataNodes that are not dead.",
            t.capacity,
        ),
        (
            "used_bytes",
            "Bytes used by replicas (DFS used), DataNodes not dead.",
            t.used,
        ),
        (
            "remaining_bytes",
            "Bytes free for replicas (DFS remaining), DataNodes not dead.",
            t.remaining,
        ),
        (
            "non_dfs_used_bytes",
            "Bytes of the DataNodes' volumes used by anything but replicas.",
            t.non_dfs_used,
        ),
    ];
    for (name, help, value) in gauges {
        gauge(&mut r, name, help, value);
    }
    let by_state = Family::<StateLabel, Gauge>::default();
    for (state, label) in [
        (NodeState::Live, "live"),
        (NodeState::Stale, "stale"),
        (NodeState::Dead, "dead"),
    ] {
        let n = report.datanodes.iter().filter(|d| d.state == state).count();
        by_state
            .get_or_create(&StateLabel { state: label })
            .set(n as i64);
    }
    r.register("datanodes", "DataNodes by state.", by_state);
    render_repair(&mut r, repair);
    r
}

/// The repair gauges and counters.
fn render_repair(r: &mut Registry, rep: &RepairReport) {
    gauge(
        r,
        "replication_queue",
        "Blocks waiting for re-replication.",
        rep.needed,
    );
    gauge(
        r,
        "replication_pending",
        "Re-replication copies in flight.",
        rep.pending,
    );
    gauge(
        r,
        "block_recoveries_in_progress",
        "Block recoveries in progress.",
        rep.recovering,
    );
    let c = &rep.counters;
    let counters: [(&str, &str, u64); 7] = [
        (
            "replications_scheduled",
            "Re-replication copies scheduled.",
            c.replications_scheduled,
        ),
        (
            "excess_replicas_deleted",
            "Excess replicas scheduled for deletion.",
            c.excess_deleted,
        ),
        (
            "corrupt_replicas_deleted",
            "Corrupt replicas scheduled for deletion.",
            c.corrupt_deleted,
        ),
        (
            "block_recoveries_started",
            "Block recovery attempts started.",
            c.recoveries_started,
        ),
        (
            "block_recoveries_committed",
            "Block recoveries reported by their primary DataNode.",
            c.recoveries_committed,
        ),
        (
            "leases_recovered",
            "Files closed by lease recovery.",
            c.leases_recovered,
        ),
        (
            "pipeline_recoveries",
            "Write pipelines rebuilt by writers (update_pipeline accepted).",
            c.pipeline_recoveries,
        ),
    ];
    for (name, help, value) in counters {
        counter(r, name, help, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rpc_calls_are_counted_and_timed_per_method() {
        let m = Metrics::default();
        m.call("create");
        m.call("create");
        m.call("mkdirs");
        m.finish("create", Duration::from_millis(2), false);
        m.finish("create", Duration::from_millis(4), true);
        let report = ClusterReport {
            datanodes: Vec::new(),
            files: 3,
            directories: 1,
            blocks: 2,
            under_replicated_blocks: 0,
            missing_blocks: 0,
            corrupt_blocks: 0,
        };
        let text = m.render(&report, 1, &RepairReport::default());
        for line in [
            "sluice_metadata_rpc_calls_total{method=\"create\"} 2\n",
            "sluice_metadata_rpc_errors_total{method=\"create\"} 1\n",
            "sluice_metadata_rpc_duration_seconds_count{method=\"create\"} 2\n",
            "sluice_metadata_rpc_calls_total{method=\"mkdirs\"} 1\n",
            "sluice_metadata_rpc_errors_total{method=\"mkdirs\"} 0\n",
            "sluice_metadata_files 3\n",
            "sluice_metadata_datanodes{state=\"dead\"} 0\n",
            "sluice_metadata_leases_recovered_total 0\n",
            "# TYPE sluice_metadata_rpc_duration_seconds histogram\n",
        ] {
            assert!(text.contains(line), "{line:?} missing from:\n{text}");
        }
    }
}
