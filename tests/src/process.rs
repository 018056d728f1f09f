//! A cluster of real processes for end-to-end tests: the `sluice-metadata` and
//! `sluice-datanode` binaries, DataNodes killed with SIGKILL and restarted on the same
//! directories and ports, and the `sluice` command line as the client.
//!
//! The binaries are taken from the target directory of the running test
//! (`target/<profile>/`). `cargo test --workspace` builds them; when one is missing (e.g.
//! `cargo test -p sluice-tests`), [`Binaries::locate`] runs `cargo build --bins` for the three
//! packages first. Binaries that exist are used as they are: after changing the services, run
//! `cargo build --bins` (or the workspace tests) so that they are not stale.
//!
//! Every process logs to a file in the cluster's directory (`RUST_LOG=info`); the bound ports
//! are read from the first log lines (`sluice-metadata listening rpc=…`, `serving … data=…`),
//! so every port starts as 0 and a restarted DataNode is given its first port again.

use anyhow::{bail, Context};
use sluice_client::{ClientConfig, FileSystem};
use sluice_common::config::HumanDuration;
use sluice_common::rpc::NodeState;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::process::{Child, Command};
use tokio::time::Instant;

/// Paths of the service binaries and of the command line.
#[derive(Debug, Clone)]
pub struct Binaries {
    /// `sluice-metadata`.
    pub metadata: PathBuf,
    /// `sluice-datanode`.
    pub datanode: PathBuf,
    /// `sluice`.
    pub sluice: PathBuf,
}

impl Binaries {
    /// Finds the binaries next to the test executable (`target/<profile>/`), building them
    /// with `cargo build --bins` when one is missing.
    pub async fn locate() -> anyhow::Result<Binaries> {
        let exe = std::env::current_exe().context("locating the test executable")?;
        // target/<profile>/deps/<test>-<hash>
        let profile_dir = exe
            .parent()
            .and_then(Path::parent)
            .context("the test executable is not in target/<profile>/deps")?
            .to_path_buf();
        let bins = Binaries {
            metadata: profile_dir.join("sluice-metadata"),
            datanode: profile_dir.join("sluice-datanode"),
            sluice: profile_dir.join("sluice"),
        };
        if !bins.all_exist() {
            let dir = profile_dir.clone();
            tokio::task::spawn_blocking(move || build(&dir))
                .await
                .context("the build task")??;
        }
        anyhow::ensure!(
            bins.all_exist(),
            "binaries missing in {} after building",
            profile_dir.display()
        );
        Ok(bins)
    }

    fn all_exist(&self) -> bool {
        [&self.metadata, &self.datanode, &self.sluice]
            .iter()
            .all(|p| p.is_file())
    }
}

/// `cargo build --bins` of the three packages into `profile_dir`'s target directory.
fn build(profile_dir: &Path) -> anyhow::Result<()> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let target_dir = profile_dir.parent().context("no target directory")?;
    let profile = profile_dir
        .file_name()
        .and_then(|n| n.to_str())
        .context("profile directory name")?;
    let mut cmd = std::process::Command::new(cargo);
    cmd.args(["build", "--bins"])
        .args([
            "-p",
            "sluice-metadata",
            "-p",
            "sluice-datanode",
            "-p",
            "sluice-client",
        ])
        .arg("--target-dir")
        .arg(target_dir)
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    match profile {
        "debug" => {}
        "release" => {
            cmd.arg("--release");
        }
        other => {
            cmd.args(["--profile", other]);
        }
    }
    tracing::warn!(?cmd, "building the service binaries for a process test");
    let status = cmd.status().context("running cargo build")?;
    anyhow::ensure!(status.success(), "cargo build --bins failed: {status}");
    Ok(())
}

/// Settings of a [`ProcessCluster`].
#[derive(Debug, Clone)]
pub struct ProcessClusterBuilder {
    datanodes: usize,
    metadata_env: Vec<(String, String)>,
    datanode_env: Vec<(String, String)>,
}

impl Default for ProcessClusterBuilder {
    fn default() -> Self {
        let env = |k: &str, v: &str| (k.to_string(), v.to_string());
        ProcessClusterBuilder {
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
        }
    }
}

impl ProcessClusterBuilder {
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
        let bins = Binaries::locate().await?;
        let dir = tempfile::Builder::new().prefix("sluice-proc-").tempdir()?;
        let meta_dir = dir.path().join("metadata");
        let log = dir.path().join("metadata.log");
        let mut cmd = Command::new(&bins.metadata);
        cmd.args(["--port", "0", "--http-port", "0", "--bind", "127.0.0.1"])
            .arg("--data")
            .arg(&meta_dir);
        cmd.envs(self.metadata_env.iter().cloned());
        let metadata = spawn_logged(cmd, &log)?;
        let rpc = wait_for_addr(&log, "sluice-metadata listening", "rpc=").await?;
        let mut cluster = ProcessCluster {
            dir,
            bins,
            metadata,
            metadata_addr: rpc,
            datanodes: Vec::new(),
            datanode_env: self.datanode_env,
        };
        for i in 0..self.datanodes {
            cluster.datanodes.push(DnProcess {
                data: cluster.dir.path().join(format!("dn{i}")),
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
    bins: Binaries,
    metadata: Child,
    metadata_addr: SocketAddr,
    datanodes: Vec<DnProcess>,
    datanode_env: Vec<(String, String)>,
}

impl ProcessCluster {
    /// A builder with the documented defaults.
    pub fn builder() -> ProcessClusterBuilder {
        ProcessClusterBuilder::default()
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

    /// DataNode `i`'s data port (0 before its first start).
    pub fn datanode_port(&self, i: usize) -> u16 {
        self.datanodes.get(i).map_or(0, |d| d.port)
    }

    /// Starts DataNode `i` (again) on its directory and, after the first start, its port.
    pub async fn start_datanode(&mut self, i: usize) -> anyhow::Result<()> {
        let meta = self.metadata_addr.to_string();
        let root = self.dir.path().to_path_buf();
        let env = self.datanode_env.clone();
        let bin = self.bins.datanode.clone();
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
            let mut cmd = Command::new(&bin);
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
            let mut child = spawn_logged(cmd, &log)?;
            match wait_for_addr(&log, "serving", "data=").await {
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
        let mut cmd = Command::new(&self.bins.sluice);
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
        let _ = self.metadata.start_kill();
    }
}

/// Spawns `cmd` with stdout and stderr appended to `log`, killed if the handle is dropped.
fn spawn_logged(mut cmd: Command, log: &Path) -> anyhow::Result<Child> {
    let out = std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
    let err = out.try_clone()?;
    cmd.env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .kill_on_drop(true);
    cmd.spawn()
        .with_context(|| format!("spawning {:?}", cmd.as_std().get_program()))
}

/// Waits (up to 20 s) for a log line containing `marker`, then parses the address after `key`.
async fn wait_for_addr(log: &Path, marker: &str, key: &str) -> anyhow::Result<SocketAddr> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if let Some(line) = text.lines().find(|l| l.contains(marker)) {
            return parse_addr(&strip_ansi(line), key)
                .with_context(|| format!("no {key} in {line:?}"));
        }
        if text.contains("Error:") || Instant::now() >= deadline {
            bail!(
                "no {marker:?} line in {} within 20 s; log:\n{text}",
                log.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn parse_addr(line: &str, key: &str) -> Option<SocketAddr> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key))
        .and_then(|a| a.trim_matches(|c| c == ',' || c == '"').parse().ok())
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_addresses_from_log_lines() {
        let line = "2026-12-02T18:00:00Z  INFO sluice_datanode: serving node=dn-1 data=127.0.0.1:4321 http=127.0.0.1:4322";
        assert_eq!(
            parse_addr(line, "data="),
            Some("127.0.0.1:4321".parse().unwrap())
        );
        let colored = "\u{1b}[32m INFO\u{1b}[0m \u{1b}[2mx\u{1b}[0m: listening \u{1b}[3mrpc\u{1b}[0m\u{1b}[2m=\u{1b}[0m127.0.0.1:9";
        assert_eq!(
            parse_addr(&strip_ansi(colored), "rpc="),
            Some("127.0.0.1:9".parse().unwrap())
        );
    }
}
