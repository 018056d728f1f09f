//! `[metadata]`: the metadata service.

use super::units::{ByteSize, HumanDuration};
use super::ConfigError;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Settings of the metadata service. Every key is documented in `docs/configuration.md`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetadataConfig {
    /// Address to bind the RPC and HTTP listeners to.
    #[serde(rename = "bind.host")]
    pub bind_host: String,
    /// RPC port (client and DataNode protocols), 0 for any free port. HDFS's 8020.
    #[serde(rename = "rpc.port")]
    pub rpc_port: u16,
    /// HTTP port (status, metrics), 0 for any free port. HDFS's 9870.
    #[serde(rename = "http.port")]
    pub http_port: u16,
    /// The HTTP request head (line and headers) must arrive within this; a slower one is
    /// answered 408 and closed (a slowloris header trickle).
    #[serde(rename = "http.request.timeout")]
    pub http_request_timeout: HumanDuration,
    /// An idle keep-alive HTTP connection is closed after this.
    #[serde(rename = "http.keep-alive.timeout")]
    pub http_keep_alive_timeout: HumanDuration,
    /// Longest gap between two bytes of an HTTP request body (and before the first); past it
    /// the request fails and its connection is closed. The whole body is not bounded.
    #[serde(rename = "http.body.idle.timeout")]
    pub http_body_idle_timeout: HumanDuration,
    /// HTTP connections open at once; more wait in the listen backlog.
    #[serde(rename = "http.connections.max")]
    pub http_connections_max: u32,
    /// HTTP connections one peer address (IP) may hold at once; one more is answered 503 on
    /// its first request and closed.
    #[serde(rename = "http.connections.per-peer.max")]
    pub http_connections_per_peer_max: u32,
    /// Directory of the namespace store.
    #[serde(rename = "data.dir")]
    pub data_dir: PathBuf,
    /// Replication factor of files created without one.
    #[serde(rename = "replication.default")]
    pub default_replication: u16,
    /// Live replicas a block needs before the file can be completed.
    #[serde(rename = "replication.min")]
    pub min_replication: u16,
    /// Largest replication factor a file may ask for.
    #[serde(rename = "replication.max")]
    pub max_replication: u16,
    /// Block size of files created without one.
    #[serde(rename = "block.size.default")]
    pub default_block_size: ByteSize,
    /// Smallest block size a file may ask for.
    #[serde(rename = "block.size.min")]
    pub min_block_size: ByteSize,
    /// A DataNode silent this long is stale: avoided for new pipelines.
    #[serde(rename = "datanode.stale.interval")]
    pub stale_interval: HumanDuration,
    /// A DataNode silent this long is dead: its replicas are re-replicated elsewhere.
    #[serde(rename = "datanode.dead.interval")]
    pub dead_interval: HumanDuration,
    /// How often liveness, leases and replication work are checked.
    #[serde(rename = "monitor.interval")]
    pub monitor_interval: HumanDuration,
    /// After this long without renewal, another client may recover the file's lease.
    #[serde(rename = "lease.soft.limit")]
    pub lease_soft_limit: HumanDuration,
    /// After this long without renewal, the service recovers the file itself.
    #[serde(rename = "lease.hard.limit")]
    pub lease_hard_limit: HumanDuration,
    /// Re-replication copies one DataNode may be asked to send at a time.
    #[serde(rename = "replication.max-streams")]
    pub replication_max_streams: u32,
    /// Re-replication work scheduled per monitor pass, per live DataNode.
    #[serde(rename = "replication.work-multiplier")]
    pub replication_work_multiplier: u32,
    /// A scheduled re-replication copy that has not arrived after this long is scheduled again
    /// (HDFS's `dfs.namenode.reconstruction.pending.timeout-sec`).
    #[serde(rename = "replication.pending.timeout")]
    pub replication_pending_timeout: HumanDuration,
    /// A block recovery (lease recovery of an abandoned file) whose primary DataNode has not
    /// reported after this long is started again with another primary and a new recovery id.
    #[serde(rename = "block.recovery.timeout")]
    pub block_recovery_timeout: HumanDuration,
    /// Requests of each protocol (client, DataNode: separate pools) handled at once, a change
    /// counting until it is durable and answered; more wait for a permit. Also the most
    /// requests one connection may have outstanding (more are answered with an error).
    #[serde(rename = "rpc.inflight.max")]
    pub rpc_inflight_max: u32,
    /// Largest frame (one request) the service reads on a client-protocol connection; a longer
    /// announced length closes the connection before anything is reserved.
    #[serde(rename = "rpc.max.frame.bytes")]
    pub rpc_max_frame: ByteSize,
    /// Largest frame the service reads on a DataNode-protocol connection (a full block report
    /// is one frame); with a cluster secret, only after the DataNode proved it.
    #[serde(rename = "rpc.datanode.max.frame.bytes")]
    pub rpc_datanode_max_frame: ByteSize,
    /// Most RPC connections open at once (both protocols, counted from accept); more are
    /// closed at once.
    #[serde(rename = "rpc.connections.max")]
    pub rpc_connections_max: u32,
    /// Most RPC connections one peer address (IP) may hold at once; more are closed at once,
    /// so that one host cannot take every `rpc.connections.max` slot.
    #[serde(rename = "rpc.connections.per-peer.max")]
    pub rpc_connections_per_peer_max: u32,
    /// An RPC connection that reads and writes nothing for this long, or takes longer than this
    /// to send one frame, is closed (clients dial again on their next call).
    #[serde(rename = "rpc.idle.timeout")]
    pub rpc_idle_timeout: HumanDuration,
    /// Group commit (HDFS `logSync` batching): a change's batches stay in memory until one
    /// flush writes and syncs every change queued so far. Off, each batch is written to the
    /// store under the state lock (waiting for a running flush) and flushes are only
    /// coalesced; kept to measure the difference (`sluice bench meta --group-commit off,on`).
    #[serde(rename = "store.group-commit")]
    pub group_commit: bool,
    /// Sign block access tokens and have DataNodes demand them (HDFS's
    /// `dfs.block.access.token.enable`). Off: any peer may read, write, copy or recover any
    /// replica.
    #[serde(rename = "block.access-token.enable")]
    pub block_token_enable: bool,
    /// How long a block access token is valid (HDFS's `dfs.block.access.token.lifetime`).
    #[serde(rename = "block.access-token.lifetime")]
    pub block_token_lifetime: HumanDuration,
    /// How often the token-signing key rolls over (HDFS's
    /// `dfs.block.access.key.update.interval`); at least the token lifetime.
    #[serde(rename = "block.access-token.key-update-interval")]
    pub block_key_update_interval: HumanDuration,
    /// File holding the cluster secret DataNodes must prove to register and heartbeat; created
    /// with a fresh secret when missing. Empty: the `SLUICE_CLUSTER_SECRET` environment
    /// variable; with neither, a service with `security.enabled` refuses to start.
    #[serde(rename = "cluster.secret.file")]
    pub cluster_secret_file: PathBuf,
    /// Demand the cluster secret of every DataNode-protocol peer (on by default). Off: no
    /// secret is read or demanded, any host may register as a DataNode and learn the block
    /// keys, and a warning is logged at start-up.
    #[serde(rename = "security.enabled")]
    pub security_enabled: bool,
}

impl Default for MetadataConfig {
    fn default() -> Self {
        Self {
            bind_host: "0.0.0.0".into(),
            rpc_port: 8020,
            http_port: 9870,
            http_request_timeout: HumanDuration::secs(5),
            http_keep_alive_timeout: HumanDuration::secs(5),
            http_body_idle_timeout: HumanDuration::secs(60),
            http_connections_max: 1024,
            http_connections_per_peer_max: 256,
            data_dir: PathBuf::from("./sluice-data/metadata"),
            default_replication: 3,
            min_replication: 1,
            max_replication: 16,
            default_block_size: ByteSize::mib(128),
            min_block_size: ByteSize::kib(64),
            stale_interval: HumanDuration::secs(30),
            dead_interval: HumanDuration::secs(630),
            monitor_interval: HumanDuration::secs(1),
            lease_soft_limit: HumanDuration::secs(60),
            lease_hard_limit: HumanDuration::secs(1200),
            replication_max_streams: 2,
            replication_work_multiplier: 2,
            replication_pending_timeout: HumanDuration::secs(300),
            block_recovery_timeout: HumanDuration::secs(180),
            rpc_inflight_max: 1024,
            rpc_max_frame: ByteSize::mib(4),
            rpc_datanode_max_frame: ByteSize::mib(256),
            rpc_connections_max: 4096,
            rpc_connections_per_peer_max: 1024,
            rpc_idle_timeout: HumanDuration::secs(60),
            group_commit: true,
            block_token_enable: true,
            block_token_lifetime: HumanDuration::secs(3600),
            block_key_update_interval: HumanDuration::secs(3600),
            cluster_secret_file: PathBuf::new(),
            security_enabled: true,
        }
    }
}

impl MetadataConfig {
    /// Checks ranges and relations between keys.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (key, value) in [
            ("metadata.http.request.timeout", self.http_request_timeout),
            (
                "metadata.http.keep-alive.timeout",
                self.http_keep_alive_timeout,
            ),
            (
                "metadata.http.body.idle.timeout",
                self.http_body_idle_timeout,
            ),
        ] {
            if value.get().is_zero() {
                return Err(ConfigError::invalid(key, value, "must be positive"));
            }
        }
        if self.http_connections_max == 0 {
            return Err(ConfigError::invalid(
                "metadata.http.connections.max",
                0,
                "must be at least 1",
            ));
        }
        if self.http_connections_per_peer_max == 0 {
            return Err(ConfigError::invalid(
                "metadata.http.connections.per-peer.max",
                0,
                "must be at least 1",
            ));
        }
        if self.default_replication == 0 {
            return Err(ConfigError::invalid(
                "metadata.replication.default",
                0,
                "must be at least 1",
            ));
        }
        if self.min_replication == 0 || self.min_replication > self.default_replication {
            return Err(ConfigError::invalid(
                "metadata.replication.min",
                self.min_replication,
                "must be between 1 and replication.default",
            ));
        }
        if self.max_replication < self.default_replication {
            return Err(ConfigError::invalid(
                "metadata.replication.max",
                self.max_replication,
                "must be at least replication.default",
            ));
        }
        if self.min_block_size.bytes() == 0 || !self.min_block_size.bytes().is_multiple_of(512) {
            return Err(ConfigError::invalid(
                "metadata.block.size.min",
                self.min_block_size,
                "must be a positive multiple of 512 bytes",
            ));
        }
        if self.default_block_size < self.min_block_size
            || !self.default_block_size.bytes().is_multiple_of(512)
        {
            return Err(ConfigError::invalid(
                "metadata.block.size.default",
                self.default_block_size,
                "must be a multiple of 512 bytes and at least block.size.min",
            ));
        }
        if self.dead_interval <= self.stale_interval {
            return Err(ConfigError::invalid(
                "metadata.datanode.dead.interval",
                self.dead_interval,
                "must be longer than datanode.stale.interval",
            ));
        }
        if self.monitor_interval.get().is_zero() {
            return Err(ConfigError::invalid(
                "metadata.monitor.interval",
                self.monitor_interval,
                "must be positive",
            ));
        }
        if self.lease_hard_limit < self.lease_soft_limit {
            return Err(ConfigError::invalid(
                "metadata.lease.hard.limit",
                self.lease_hard_limit,
                "must be at least lease.soft.limit",
            ));
        }
        for (key, value) in [
            (
                "metadata.replication.pending.timeout",
                self.replication_pending_timeout,
            ),
            (
                "metadata.block.recovery.timeout",
                self.block_recovery_timeout,
            ),
        ] {
            if value.get().is_zero() {
                return Err(ConfigError::invalid(key, value, "must be positive"));
            }
        }
        if self.rpc_inflight_max == 0 {
            return Err(ConfigError::invalid(
                "metadata.rpc.inflight.max",
                0,
                "must be at least 1",
            ));
        }
        for (key, value) in [
            ("metadata.rpc.max.frame.bytes", self.rpc_max_frame),
            (
                "metadata.rpc.datanode.max.frame.bytes",
                self.rpc_datanode_max_frame,
            ),
        ] {
            if value.bytes() < 64 * 1024 || value.as_usize() > crate::rpc::MAX_RPC_FRAME {
                return Err(ConfigError::invalid(
                    key,
                    value,
                    "must be between 64KiB and 256MiB",
                ));
            }
        }
        if self.rpc_connections_per_peer_max == 0 {
            return Err(ConfigError::invalid(
                "metadata.rpc.connections.per-peer.max",
                0,
                "must be at least 1",
            ));
        }
        if self.rpc_connections_max == 0 {
            return Err(ConfigError::invalid(
                "metadata.rpc.connections.max",
                0,
                "must be at least 1",
            ));
        }
        if self.rpc_idle_timeout.get().is_zero() {
            return Err(ConfigError::invalid(
                "metadata.rpc.idle.timeout",
                self.rpc_idle_timeout,
                "must be positive",
            ));
        }
        if self.block_token_lifetime.get().is_zero() {
            return Err(ConfigError::invalid(
                "metadata.block.access-token.lifetime",
                self.block_token_lifetime,
                "must be positive",
            ));
        }
        if self.block_key_update_interval < self.block_token_lifetime {
            return Err(ConfigError::invalid(
                "metadata.block.access-token.key-update-interval",
                self.block_key_update_interval,
                "must be at least block.access-token.lifetime (a token outlives one roll-over, not two)",
            ));
        }
        if self.replication_max_streams == 0 {
            return Err(ConfigError::invalid(
                "metadata.replication.max-streams",
                0,
                "must be at least 1",
            ));
        }
        Ok(())
    }
}
