//! The DataNode protocol. Registrations, heartbeats and reports change nothing persisted (the
//! registry and replica locations are rebuilt from registrations and reports after a restart),
//! so they do not flush the store; `commit_block_synchronization` closes a file and does.

use crate::service::Shared;
use sluice_common::rpc::{
    BlockSync, DatanodeProtocol, DatanodeRegistration, Heartbeat, HeartbeatResponse,
    RegisterResponse, ReplicaEvent, ReplicaReport,
};
use sluice_common::{MetaError, NodeId};
use std::sync::Arc;
use tarpc::context::Context;
use tracing::Instrument;

/// The tarpc handler of [`DatanodeProtocol`].
#[derive(Clone)]
pub struct DatanodeService {
    shared: Arc<Shared>,
}

impl DatanodeService {
    /// A handler on the shared state.
    pub fn new(shared: Arc<Shared>) -> Self {
        DatanodeService { shared }
    }
}

impl DatanodeProtocol for DatanodeService {
    async fn register(
        self,
        _: Context,
        reg: DatanodeRegistration,
    ) -> Result<RegisterResponse, MetaError> {
        let span = tracing::info_span!("register", node = %reg.id.node_id);
        async move {
            tracing::info!(data = %reg.id.data_addr, rack = %reg.id.rack, "DataNode registered");
            let mut resp = self
                .shared
                .read("register", |s, now| Ok(s.register(&reg, now)))?;
            resp.block_keys = self.shared.tokens.keys();
            Ok(resp)
        }
        .instrument(span)
        .await
    }

    async fn heartbeat(self, _: Context, hb: Heartbeat) -> Result<HeartbeatResponse, MetaError> {
        let mut resp = self
            .shared
            .read("heartbeat", |s, now| Ok(s.heartbeat(&hb, now)))?;
        self.shared.tokens.for_commands(&mut resp.commands);
        resp.block_keys = self.shared.tokens.keys();
        if !resp.commands.is_empty() {
            tracing::debug!(node = %hb.node, commands = ?resp.commands, "heartbeat commands");
        }
        Ok(resp)
    }

    async fn block_received(
        self,
        _: Context,
        node: NodeId,
        events: Vec<ReplicaEvent>,
    ) -> Result<(), MetaError> {
        for e in &events {
            let (kind, block) = match e {
                ReplicaEvent::Received(b) => ("received", b),
                ReplicaEvent::Deleted(b) => ("deleted", b),
                ReplicaEvent::Corrupt(b) => ("corrupt", b),
            };
            tracing::debug!(node = %node, block = %block, kind, "replica event");
        }
        self.shared
            .read("block_received", |s, _| s.block_received(&node, &events))
    }

    async fn block_report(
        self,
        _: Context,
        node: NodeId,
        replicas: Vec<ReplicaReport>,
    ) -> Result<u64, MetaError> {
        let n = replicas.len();
        let scheduled = self
            .shared
            .read("block_report", |s, _| s.block_report(&node, &replicas))?;
        tracing::info!(node = %node, replicas = n, scheduled_deletions = scheduled, "block report");
        Ok(scheduled)
    }

    async fn commit_block_synchronization(
        self,
        _: Context,
        sync: BlockSync,
    ) -> Result<(), MetaError> {
        let span = tracing::info_span!("commit_block_synchronization", block = %sync.block.id);
        async move {
            tracing::info!(
                new_gen_stamp = %sync.new_gen_stamp,
                new_length = sync.new_length,
                delete = sync.delete_block,
                targets = ?sync.new_targets,
                "block recovery reported"
            );
            // The file may be closed: a namespace change, durable before the answer.
            self.shared
                .write("commit_block_synchronization", |s, now| {
                    s.commit_block_synchronization(&sync, now)
                })
                .await
        }
        .instrument(span)
        .await
    }
}
