//! Shared helpers of the integration tests: a running server on 127.0.0.1:0 with a client and a
//! DataNode connection, common steps, timeouts and polling.

// Each test file uses a part of the helpers.
#![allow(dead_code, unused_imports)]

pub use sluice_common::config::{HumanDuration, MetadataConfig};
pub use sluice_common::proto::ReplicaState;
pub use sluice_common::rpc::{
    connect_client_protocol, connect_datanode_protocol, context_with_timeout, ClientProtocolClient,
    CreateOptions, DatanodeCommand, DatanodeProtocolClient, DatanodeRegistration, FileKind, Health,
    Heartbeat, ReplicaEvent, ReplicaReport,
};
pub use sluice_common::{DatanodeId, ExtendedBlock, MetaError, NodeId};
pub use sluice_metadata::store::{MemStore, MetaStore};
pub use sluice_metadata::MetadataServer;
pub use std::future::Future;
pub use std::path::Path;
pub use std::time::{Duration, Instant};
pub use tokio::io::{AsyncReadExt, AsyncWriteExt};
pub use tokio_util::sync::CancellationToken;

pub const CLIENT: &str = "it-client";

pub fn ctx() -> tarpc::context::Context {
    context_with_timeout(Duration::from_secs(10))
}

pub fn config(dir: &Path) -> MetadataConfig {
    MetadataConfig {
        bind_host: "127.0.0.1".into(),
        rpc_port: 0,
        http_port: 0,
        data_dir: dir.to_path_buf(),
        // These tests speak the DataNode protocol as any peer; the cluster secret is tested
        // end to end in sluice-tests (security).
        security_enabled: false,
        ..MetadataConfig::default()
    }
}

pub struct Running {
    pub server: MetadataServer,
    pub token: CancellationToken,
    pub client: ClientProtocolClient,
    pub dn: DatanodeProtocolClient,
}

impl Running {
    pub async fn start(cfg: MetadataConfig) -> Running {
        let token = CancellationToken::new();
        let server = MetadataServer::start(cfg, token.clone()).await.unwrap();
        Running::connect(server, token).await
    }

    /// A server on an opened store (e.g. a `MemStore`).
    pub async fn start_on(cfg: MetadataConfig, store: std::sync::Arc<dyn MetaStore>) -> Running {
        let token = CancellationToken::new();
        let server = MetadataServer::start_with_store(cfg, store, token.clone())
            .await
            .unwrap();
        Running::connect(server, token).await
    }

    async fn connect(server: MetadataServer, token: CancellationToken) -> Running {
        let client = connect_client_protocol(server.rpc_addr()).await.unwrap();
        let dn = connect_datanode_protocol(server.rpc_addr()).await.unwrap();
        Running {
            server,
            token,
            client,
            dn,
        }
    }

    pub async fn stop(self) {
        self.token.cancel();
        self.server.wait().await;
    }

    pub async fn register(&self, n: usize) {
        for i in 0..n {
            let reg = DatanodeRegistration {
                id: DatanodeId {
                    node_id: NodeId(format!("dn{i}")),
                    data_addr: format!("127.0.0.1:{}", 20000 + i),
                    http_addr: format!("127.0.0.1:{}", 21000 + i),
                    rack: "/default-rack".into(),
                },
                capacity: 1 << 40,
                used: 0,
                remaining: 1 << 40,
            };
            let resp = self.dn.register(ctx(), reg).await.unwrap().unwrap();
            assert!(resp.heartbeat_interval_ms > 0);
        }
    }

    pub async fn heartbeat(&self, n: &str) -> Vec<DatanodeCommand> {
        let hb = Heartbeat {
            node: NodeId(n.into()),
            capacity: 1 << 40,
            used: 0,
            remaining: 1 << 40,
            active_transfers: 0,
            transfers_in_progress: 0,
            active_pipelines: 0,
            buffered_replicas: 0,
        };
        self.dn
            .heartbeat(ctx(), hb)
            .await
            .unwrap()
            .unwrap()
            .commands
    }

    /// Writes a closed file whose blocks have the given lengths, every pipeline node
    /// reporting each block.
    pub async fn write(&self, path: &str, lens: &[u64]) -> Vec<ExtendedBlock> {
        let c = &self.client;
        c.create(ctx(), path.into(), opts()).await.unwrap().unwrap();
        let mut prev = None;
        let mut out = vec![];
        for &len in lens {
            let lb = c
                .add_block(ctx(), path.into(), CLIENT.into(), prev, vec![])
                .await
                .unwrap()
                .unwrap();
            let b = ExtendedBlock::new(lb.block.id, lb.block.gen_stamp, len);
            for d in &lb.locations {
                let ev = vec![ReplicaEvent::Received(b)];
                self.dn
                    .block_received(ctx(), d.node_id.clone(), ev)
                    .await
                    .unwrap()
                    .unwrap();
            }
            out.push(b);
            prev = Some(b);
        }
        let done = c
            .complete(ctx(), path.into(), CLIENT.into(), prev)
            .await
            .unwrap()
            .unwrap();
        assert!(done);
        out
    }
}

pub fn opts() -> CreateOptions {
    CreateOptions {
        client_name: CLIENT.into(),
        overwrite: false,
        create_parent: true,
        replication: 0,
        block_size: 0,
    }
}

pub use sluice_testkit::{wait_until, within};

pub async fn http_get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    let status = out.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = out.split("\r\n\r\n").nth(1).unwrap_or_default().to_string();
    (status, body)
}
