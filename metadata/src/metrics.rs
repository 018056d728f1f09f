//! RPC call counters and the Prometheus text rendering of `/metrics`.

use crate::state::RepairReport;
use dashmap::DashMap;
use sluice_common::rpc::{ClusterReport, NodeState};
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

/// Calls per RPC method, and failed calls.
#[derive(Debug, Default)]
pub struct RpcMetrics {
    calls: DashMap<&'static str, AtomicU64>,
    errors: DashMap<&'static str, AtomicU64>,
}

impl RpcMetrics {
    /// Counts one call of `method`.
    pub fn call(&self, method: &'static str) {
        self.calls
            .entry(method)
            .or_default()
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one failed call of `method`.
    pub fn error(&self, method: &'static str) {
        self.errors
            .entry(method)
            .or_default()
            .fetch_add(1, Ordering::Relaxed);
    }

    fn sorted(map: &DashMap<&'static str, AtomicU64>) -> Vec<(&'static str, u64)> {
        let mut v: Vec<_> = map
            .iter()
            .map(|e| (*e.key(), e.value().load(Ordering::Relaxed)))
            .collect();
        v.sort();
        v
    }
}

fn gauge(out: &mut String, name: &str, help: &str, value: u64) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}"
    );
}

fn counter(out: &mut String, name: &str, help: &str, value: u64) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}"
    );
}

/// Renders the repair gauges and counters.
fn render_repair(out: &mut String, r: &RepairReport) {
    let gauges: [(&str, &str, u64); 3] = [
        (
            "replication_queue",
            "Blocks waiting for re-replication.",
            r.needed,
        ),
        (
            "replication_pending",
            "Re-replication copies in flight.",
            r.pending,
        ),
        (
            "block_recoveries_in_progress",
            "Block recoveries in progress.",
            r.recovering,
        ),
    ];
    for (name, help, value) in gauges {
        gauge(out, &format!("sluice_metadata_{name}"), help, value);
    }
    let c = &r.counters;
    let counters: [(&str, &str, u64); 6] = [
        (
            "replications_scheduled_total",
            "Re-replication copies scheduled.",
            c.replications_scheduled,
        ),
        (
            "excess_replicas_deleted_total",
            "Excess replicas scheduled for deletion.",
            c.excess_deleted,
        ),
        (
            "corrupt_replicas_deleted_total",
            "Corrupt replicas scheduled for deletion.",
            c.corrupt_deleted,
        ),
        (
            "block_recoveries_started_total",
            "Block recovery attempts started.",
            c.recoveries_started,
        ),
        (
            "block_recoveries_committed_total",
            "Block recoveries reported by their primary DataNode.",
            c.recoveries_committed,
        ),
        (
            "leases_recovered_total",
            "Files closed by lease recovery.",
            c.leases_recovered,
        ),
    ];
    for (name, help, value) in counters {
        counter(out, &format!("sluice_metadata_{name}"), help, value);
    }
}

/// Renders the Prometheus text exposition.
pub fn render(
    report: &ClusterReport,
    open_files: usize,
    repair: &RepairReport,
    rpc: &RpcMetrics,
) -> String {
    let mut out = String::new();
    let gauges: [(&str, &str, u64); 7] = [
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
    ];
    for (name, help, value) in gauges {
        gauge(&mut out, &format!("sluice_metadata_{name}"), help, value);
    }
    let _ = writeln!(
        out,
        "# HELP sluice_metadata_datanodes DataNodes by state.\n# TYPE sluice_metadata_datanodes gauge"
    );
    for (state, label) in [
        (NodeState::Live, "live"),
        (NodeState::Stale, "stale"),
        (NodeState::Dead, "dead"),
    ] {
        let n = report.datanodes.iter().filter(|d| d.state == state).count();
        let _ = writeln!(out, "sluice_metadata_datanodes{{state=\"{label}\"}} {n}");
    }
    render_repair(&mut out, repair);
    render_rpc(&mut out, rpc);
    out
}

/// Renders the RPC counters.
fn render_rpc(out: &mut String, rpc: &RpcMetrics) {
    for (name, help, map) in [
        (
            "sluice_metadata_rpc_calls_total",
            "RPC calls by method.",
            &rpc.calls,
        ),
        (
            "sluice_metadata_rpc_errors_total",
            "Failed RPC calls by method.",
            &rpc.errors,
        ),
    ] {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
        for (method, n) in RpcMetrics::sorted(map) {
            let _ = writeln!(out, "{name}{{method=\"{method}\"}} {n}");
        }
    }
}
