//! A cluster of real processes for end-to-end tests: the `sluice-metadata` and
//! `sluice-datanode` binaries, the metadata service and DataNodes killed with SIGKILL and
//! restarted on the same directories and ports, and the `sluice` command line as the client.
//!
//! The commands run from this package's `sluice-proc` binary (`src/bin/sluice-proc.rs`: the
//! same library functions as `sluice-metadata`, `sluice-datanode` and `sluice`), which cargo
//! builds for the tests: a test passes `env!("CARGO_BIN_EXE_sluice-proc")` to [`Binaries::new`],
//! never runs `cargo build` and never runs a stale binary.
//!
//! Every process logs to a file in the cluster's directory (stderr, `RUST_LOG=info`); the bound
//! ports are read from the machine-readable ready line the service prints to stdout
//! ([`sluice_common::ready`]), so every port starts as 0 and a restarted node is given its first
//! port again.

use anyhow::{bail, Context};
use sluice_client::{ClientConfig, FileSystem};
use sluice_common::config::HumanDuration;
use sluice_common::ready::Ready;
use sluice_common::rpc::NodeState;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::process::{Child, Command};
use tokio::time::Instant;

/// How to run each command: `sluice-proc` (this package's binary, `src/bin/sluice-proc.rs`)
/// with the command's name as its first argument.
#[derive(Debug, Clone)]
pub struct Binaries {
    program: PathBuf,
}

impl Binaries {
    /// The multi-call binary at `program`: tests pass `env!("CARGO_BIN_EXE_sluice-proc")`.
    pub fn new(program: impl Into<PathBuf>) -> Binaries {
        Binaries {
            program: program.into(),
        }
    }

    /// The program every command runs as.
    pub fn program(&self) -> &Path {
        &self.program
    }

    /// A command running `name` (`metadata`, `datanode` or `sluice`).
    pub fn command(&self, name: &str) -> Command {
        let mut cmd = Command::new(&self.program);
        cmd.arg(name);
        cmd
    }
}

/// Settings of a [`ProcessCluster`].
#[derive(Debug, Clone)]
pub struct ProcessClusterBuilder {
    bins: Binaries,
    datanodes: usize,
    metadata_env: Vec<(String, String)>,
    datanode_env: Vec<(String, String)>,
    metadata_dir: Option<PathBuf>,
    datanode_dirs: Vec<PathBuf>,
}

impl ProcessClusterBuilder {
    /// The documented defaults, running the commands through `bins`.
    pub fn new(bins: Binaries) -> Self {
        let env = |k: &str, v: &str| (k.to_string(), v.to_string());
        ProcessClusterBuilder {
            bins,
            datanodes: 3,
            metadata_env: vec![
                env("SLUICE_METADATA__DATANODE__STALE__INTERVAL", "3s"),
                env("SLUICE_METADATA__DATANODE__DEAD__INTERVAL", "10s"),
                env("SLUICE_METADATA__MONITOR__INTERVAL", "200ms"),
                env("SLUICE_METADATA__BLOCK__SIZE__MIN", "512"),
                // A copy aimed at a DataNode that was just killed is retried after this.
                env("SLUICE_METADATA__REPLICATION__PENDING__TIMEOUT", "3s"),
            ],
            datanode_env: vec![
                env("SLUICE_DATANODE__HEARTBEAT__INTERVAL", "200ms"),
                env("SLUICE_DATANODE__SOCKET__TIMEOUT", "10s"),
            ],
            metadata_dir: None,
            datanode_dirs: Vec::new(),
        }
    }

    /// The metadata service's store directory. Default: `metadata` in the cluster's directory.
    pub fn metadata_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.metadata_dir = Some(dir.into());
        self
    }

    /// The data directories of the first DataNodes, in order (DataNode `i` gets `dirs[i]`).
    /// Default: `dn<i>` in the cluster's directory.
    pub fn datanode_dirs(mut self, dirs: impl IntoIterator<Item = PathBuf>) -> Self {
        self.datanode_dirs = dirs.into_iter().collect();
        self
    }

    /// Number of DataNodes. Default 3.
    pub fn datanodes(mut self, n: usize) -> Self {
        self.datanodes = n;
        self
    }

    /// Sets an environment variable of the metadata service (`SLUICE_METADATA__…`). Defaults:
    /// stale 3 s, dead 10 s, monitor 200 ms, minimum block size 512 B, re-replication pending
    /// timeout 3 s.
    pub fn metadata_env(mut self, key: &str, value: &str) -> Self {
        self.metadata_env.push((key.into(), value.into()));
        self
    }

    /// Sets an environment variable of every DataNode (`SLUICE_DATANODE__…`). Defaults:
    /// heartbeat 200 ms, socket timeout 10 s.
    pub fn datanode_env(mut self, key: &str, value: &str) -> Self {
        self.datanode_env.push((key.into(), value.into()));
        self
    }

    /// Starts the metadata service and the DataNodes; waits until every DataNode is live.
    pub async fn start(self) -> anyhow::Result<ProcessCluster> {
        let bins = self.bins;
        anyhow::ensure!(
            bins.program.is_file(),
            "no test binary at {}",
            bins.program.display()
        );
        let dir = tempfile::Builder::new().prefix("sluice-proc-").tempdir()?;
        // A cluster secret, as a deployment has: the metadata service creates the file.
        let secret = dir.path().join("cluster-secret").display().to_string();
        let mut metadata_env = self.metadata_env;
        metadata_env.push((
            "SLUICE_METADATA__CLUSTER__SECRET__FILE".into(),
            secret.clone(),
        ));
        let mut datanode_env = self.datanode_env;
        datanode_env.push(("SLUICE_DATANODE__CLUSTER__SECRET__FILE".into(), secret));
        let metadata_dir = self
            .metadata_dir
            .unwrap_or_else(|| dir.path().join("metadata"));
        let mut cluster = ProcessCluster {
            metadata_dir,
            dir,
            bins,
            metadata: None,
            metadata_addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            metadata_starts: 0,
            metadata_env,
            datanodes: Vec::new(),
            datanode_env,
        };
        cluster.start_metadata().await?;
        for i in 0..self.datanodes {
            cluster.datanodes.push(DnProcess {
                data: self
                    .datanode_dirs
                    .get(i)
                    .cloned()
                    .unwrap_or_else(|| cluster.dir.path().join(format!("dn{i}"))),
                port: 0,
                child: None,
                starts: 0,
            });
            cluster.start_datanode(i).await?;
        }
        cluster.wait_live(self.datanodes).await?;
        Ok(cluster)
    }
}

struct DnProcess {
    data: PathBuf,
    /// The data port (0 before the first start).
    port: u16,
    child: Option<Child>,
    starts: u32,
}

/// A metadata service and DataNodes as child processes (killed when dropped).
pub struct ProcessCluster {
    dir: tempfile::TempDir,
    metadata_dir: PathBuf,
    bins: Binaries,
    metadata: Option<Child>,
    /// Port 0 before the first start.
    metadata_addr: SocketAddr,
    metadata_starts: u32,
    metadata_env: Vec<(String, String)>,
    datanodes: Vec<DnProcess>,
    datanode_env: Vec<(String, String)>,
}

impl ProcessCluster {
    /// A builder with the documented defaults, running the commands through `bins`.
    pub fn builder(bins: Binaries) -> ProcessClusterBuilder {
        ProcessClusterBuilder::new(bins)
    }

    /// The metadata service's RPC address.
    pub fn metadata_addr(&self) -> SocketAddr {
        self.metadata_addr
    }

    /// The binaries in use.
    pub fn binaries(&self) -> &Binaries {
        &self.bins
    }

    /// The cluster's directory (data and logs).
    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    /// Number of DataNodes (running or not).
    pub fn datanode_count(&self) -> usize {
        self.datanodes.len()
    }

    /// True while DataNode `i`'s process runs.
    pub fn datanode_running(&self, i: usize) -> bool {
        self.datanodes.get(i).is_some_and(|d| d.child.is_some())
    }

    /// DataNode `i`'s process id while it runs.
    pub fn datanode_pid(&self, i: usize) -> Option<u32> {
        self.datanodes.get(i)?.child.as_ref()?.id()
    }

    /// The metadata service's process id while it runs.
    pub fn metadata_pid(&self) -> Option<u32> {
        self.metadata.as_ref()?.id()
    }

    /// DataNode `i`'s data port (0 before its first start).
    pub fn datanode_port(&self, i: usize) -> u16 {
        self.datanodes.get(i).map_or(0, |d| d.port)
    }

    /// DataNode `i`'s data address while it runs.
    pub fn datanode_data_addr(&self, i: usize) -> Option<SocketAddr> {
        self.datanode_running(i)
            .then(|| SocketAddr::from(([127, 0, 0, 1], self.datanode_port(i))))
    }

    /// Index of the DataNode whose data address is `addr` (as registered, `host:port`).
    pub fn datanode_index_by_addr(&self, addr: &str) -> Option<usize> {
        let port = addr.rsplit_once(':')?.1.parse::<u16>().ok()?;
        self.datanodes.iter().position(|d| d.port == port)
    }

    /// Starts DataNode `i` (again) on its directory and, after the first start, its port.
    pub async fn start_datanode(&mut self, i: usize) -> anyhow::Result<()> {
        let meta = self.metadata_addr.to_string();
        let root = self.dir.path().to_path_buf();
        let env = self.datanode_env.clone();
        let bins = self.bins.clone();
        let dn = self
            .datanodes
            .get_mut(i)
            .with_context(|| format!("no DataNode {i}"))?;
        anyhow::ensure!(dn.child.is_none(), "DataNode {i} is running");
        // After a SIGKILL the port is free at once; retry briefly all the same.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            dn.starts += 1;
            let log = root.join(format!("dn{i}.{}.log", dn.starts));
            let ready = root.join(format!("dn{i}.{}.ready", dn.starts));
            let mut cmd = bins.command("datanode");
            cmd.args([
                "--metadata",
                &meta,
                "--bind",
                "127.0.0.1",
                "--http-port",
                "0",
            ])
            .args(["--port", &dn.port.to_string()])
            .arg("--data")
            .arg(&dn.data)
            .envs(env.iter().cloned());
            let mut child = spawn_logged(cmd, &log, &ready)?;
            match wait_ready(&ready, &log, "datanode", "data").await {
                Ok(addr) => {
                    dn.port = addr.port();
                    dn.child = Some(child);
                    return Ok(());
                }
                Err(e) if Instant::now() < deadline && dn.port != 0 => {
                    tracing::debug!("DataNode {i} restart failed ({e:#}); retrying");
                    let _ = child.start_kill();
                    let _ = child.wait().await;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => {
                    let _ = child.start_kill();
                    return Err(e.context(format!("starting DataNode {i}")));
                }
            }
        }
    }

    /// Starts the metadata service (again) on its directory and, after the first start, its
    /// RPC port.
    pub async fn start_metadata(&mut self) -> anyhow::Result<()> {
        anyhow::ensure!(self.metadata.is_none(), "the metadata service is running");
        let meta_dir = self.metadata_dir.clone();
        let port = self.metadata_addr.port();
        // After a SIGKILL the port is free at once; retry briefly all the same.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            self.metadata_starts += 1;
            let log = self
                .dir
                .path()
                .join(format!("metadata.{}.log", self.metadata_starts));
            let ready = log.with_extension("ready");
            let mut cmd = self.bins.command("metadata");
            cmd.args(["--port", &port.to_string(), "--http-port", "0"])
                .args(["--bind", "127.0.0.1"])
                .arg("--data")
                .arg(&meta_dir)
                .envs(self.metadata_env.iter().cloned());
            let mut child = spawn_logged(cmd, &log, &ready)?;
            match wait_ready(&ready, &log, "metadata", "rpc").await {
                Ok(addr) => {
                    self.metadata_addr = addr;
                    self.metadata = Some(child);
                    return Ok(());
                }
                Err(e) if Instant::now() < deadline && port != 0 => {
                    tracing::debug!("metadata restart failed ({e:#}); retrying");
                    let _ = child.start_kill();
                    let _ = child.wait().await;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => {
                    let _ = child.start_kill();
                    return Err(e.context("starting the metadata service"));
                }
            }
        }
    }

    /// Kills the metadata service with SIGKILL and waits for the process to be gone.
    pub async fn kill_metadata(&mut self) -> anyhow::Result<()> {
        let Some(mut child) = self.metadata.take() else {
            return Ok(());
        };
        child.start_kill().context("SIGKILL")?;
        child
            .wait()
            .await
            .context("waiting for the killed metadata service")?;
        Ok(())
    }

    /// Kills DataNode `i` with SIGKILL and waits for the process to be gone.
    pub async fn kill_datanode(&mut self, i: usize) -> anyhow::Result<()> {
        let Some(mut child) = self.datanodes.get_mut(i).and_then(|d| d.child.take()) else {
            return Ok(());
        };
        child.start_kill().context("SIGKILL")?;
        child
            .wait()
            .await
            .context("waiting for the killed DataNode")?;
        Ok(())
    }

    /// A client configuration for this cluster: its metadata address, 10 s timeouts.
    pub fn client_config(&self) -> ClientConfig {
        ClientConfig {
            metadata_address: self.metadata_addr.to_string(),
            socket_timeout: HumanDuration::secs(10),
            rpc_timeout: HumanDuration::secs(10),
            ..ClientConfig::default()
        }
    }

    /// A connected client (in this process).
    pub async fn client(&self) -> anyhow::Result<FileSystem> {
        Ok(FileSystem::connect(self.client_config()).await?)
    }

    /// The `sluice` command line aimed at this cluster (10 s socket timeout).
    pub fn sluice(&self) -> Command {
        let mut cmd = self.bins.command("sluice");
        cmd.arg("--metadata")
            .arg(self.metadata_addr.to_string())
            .env("SLUICE_CLIENT__SOCKET__TIMEOUT", "10s")
            .env("SLUICE_CLIENT__RPC__TIMEOUT", "10s")
            .env("NO_COLOR", "1")
            .kill_on_drop(true);
        cmd
    }

    /// Waits until the metadata service reports at least `n` live DataNodes.
    pub async fn wait_live(&self, n: usize) -> anyhow::Result<()> {
        let fs = self.client().await?;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let report = fs.cluster_report().await?;
            let live = report
                .datanodes
                .iter()
                .filter(|d| d.state == NodeState::Live)
                .count();
            if live >= n {
                return Ok(());
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "only {live} of {n} DataNodes live after 30 s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for ProcessCluster {
    fn drop(&mut self) {
        for dn in &mut self.datanodes {
            if let Some(c) = dn.child.as_mut() {
                let _ = c.start_kill();
            }
        }
        if let Some(c) = self.metadata.as_mut() {
            let _ = c.start_kill();
        }
    }
}

/// A process's memory, from `/proc/<pid>/status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Memory {
    /// Resident set now (`VmRSS`), bytes.
    pub rss: u64,
    /// Peak resident set since the process started (`VmHWM`), bytes.
    pub peak: u64,
}

/// The memory of process `pid` (a node of a [`ProcessCluster`]: its RSS is the node's own).
pub fn memory(pid: u32) -> anyhow::Result<Memory> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    let field = |name: &str| -> anyhow::Result<u64> {
        let line = status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .with_context(|| format!("no {name} in /proc/{pid}/status"))?;
        let kib = line.trim().trim_end_matches("kB").trim().parse::<u64>()?;
        Ok(kib * 1024)
    };
    Ok(Memory {
        rss: field("VmRSS:")?,
        peak: field("VmHWM:")?,
    })
}

/// Spawns `cmd` with its stderr (the log) in `log` and its stdout (where the ready line goes) in
/// `ready`; killed if the handle is dropped.
fn spawn_logged(mut cmd: Command, log: &Path, ready: &Path) -> anyhow::Result<Child> {
    let err = std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
    let out =
        std::fs::File::create(ready).with_context(|| format!("creating {}", ready.display()))?;
    cmd.env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .kill_on_drop(true);
    cmd.spawn()
        .with_context(|| format!("spawning {:?}", cmd.as_std().get_program()))
}

/// Waits (up to 20 s) for the `service`'s ready line ([`Ready`]) in `ready`, then returns its
/// address `name`. Gives up early, with the log, when the log shows the command failed.
async fn wait_ready(
    ready: &Path,
    log: &Path,
    service: &str,
    name: &str,
) -> anyhow::Result<SocketAddr> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = std::fs::read_to_string(ready).unwrap_or_default();
        if let Some(line) = text.lines().find_map(Ready::parse) {
            anyhow::ensure!(
                line.ready == service,
                "expected a {service} ready line, got {line:?}"
            );
            return line
                .addresses
                .get(name)
                .copied()
                .with_context(|| format!("no {name} address in {line:?}"));
        }
        let logged = std::fs::read_to_string(log).unwrap_or_default();
        if logged.contains("Error:") || Instant::now() >= deadline {
            bail!(
                "no {service} ready line in {} within 20 s; log {}:\n{logged}",
                ready.display(),
                log.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
