//! The client protocol: each call locks the state, runs its logic and, for a change, waits
//! until the store is flushed past it before answering.

use crate::service::Shared;
use sluice_common::rpc::{
    AdditionalDatanodes, AppendResponse, BadReplica, ClientProtocol, ClusterReport, CreateOptions,
    FileStatus, FsckReport, LocatedBlock, LocatedBlocks,
};
use sluice_common::{ExtendedBlock, MetaError, NodeId};
use std::sync::Arc;
use tarpc::context::Context;

/// The tarpc handler of [`ClientProtocol`].
#[derive(Clone)]
pub struct ClientService {
    shared: Arc<Shared>,
}

impl ClientService {
    /// A handler on the shared state.
    pub fn new(shared: Arc<Shared>) -> Self {
        ClientService { shared }
    }
}

impl ClientProtocol for ClientService {
    async fn mkdirs(self, _: Context, path: String, parents: bool) -> Result<(), MetaError> {
        self.shared
            .write("mkdirs", |s, _| s.mkdirs(&path, parents))
            .await
    }

    async fn create(
        self,
        _: Context,
        path: String,
        opts: CreateOptions,
    ) -> Result<FileStatus, MetaError> {
        // A lease conflict may have started lease recovery: `write` makes that durable too.
        self.shared
            .write("create", |s, now| s.create(&path, &opts, now))
            .await
    }

    async fn append(
        self,
        _: Context,
        path: String,
        client: String,
    ) -> Result<AppendResponse, MetaError> {
        // As create: a lease conflict may have started lease recovery.
        self.shared
            .write("append", |s, now| s.append(&path, &client, now))
            .await
    }

    async fn add_block(
        self,
        _: Context,
        path: String,
        client: String,
        previous: Option<ExtendedBlock>,
        exclude: Vec<NodeId>,
    ) -> Result<LocatedBlock, MetaError> {
        let lb = self
            .shared
            .write("add_block", |s, _| {
                s.add_block(&path, &client, previous, &exclude)
            })
            .await?;
        Ok(self.shared.tokens.for_writing(lb))
    }

    async fn abandon_block(
        self,
        _: Context,
        path: String,
        client: String,
        block: ExtendedBlock,
    ) -> Result<(), MetaError> {
        self.shared
            .write("abandon_block", |s, _| {
                s.abandon_block(&path, &client, block)
            })
            .await
    }

    async fn complete(
        self,
        _: Context,
        path: String,
        client: String,
        last: Option<ExtendedBlock>,
    ) -> Result<bool, MetaError> {
        self.shared
            .write("complete", |s, _| s.complete(&path, &client, last))
            .await
    }

    async fn fsync(
        self,
        _: Context,
        path: String,
        client: String,
        last_block_length: u64,
    ) -> Result<(), MetaError> {
        self.shared
            .write("fsync", |s, _| s.fsync(&path, &client, last_block_length))
            .await
    }

    async fn get_block_locations(
        self,
        _: Context,
        path: String,
        offset: u64,
        length: u64,
    ) -> Result<LocatedBlocks, MetaError> {
        let lbs = self.shared.read("get_block_locations", |s, _| {
            s.get_block_locations(&path, offset, length)
        })?;
        Ok(self.shared.tokens.for_reading(lbs))
    }

    async fn list(self, _: Context, path: String) -> Result<Vec<FileStatus>, MetaError> {
        self.shared.read("list", |s, _| s.list(&path))
    }

    async fn stat(self, _: Context, path: String) -> Result<FileStatus, MetaError> {
        self.shared.read("stat", |s, _| s.stat(&path))
    }

    async fn delete(self, _: Context, path: String, recursive: bool) -> Result<bool, MetaError> {
        self.shared
            .write("delete", |s, _| s.delete(&path, recursive))
            .await
    }

    async fn rename(self, _: Context, src: String, dst: String) -> Result<(), MetaError> {
        self.shared
            .write("rename", |s, _| s.rename(&src, &dst))
            .await
    }

    async fn renew_lease(self, _: Context, client: String) -> Result<(), MetaError> {
        self.shared.read("renew_lease", |s, now| {
            s.renew_lease(&client, now);
            Ok(())
        })
    }

    async fn update_block_for_pipeline(
        self,
        _: Context,
        block: ExtendedBlock,
        client: String,
    ) -> Result<LocatedBlock, MetaError> {
        let lb = self
            .shared
            .write("update_block_for_pipeline", |s, _| {
                s.update_block_for_pipeline(block, &client)
            })
            .await?;
        Ok(self.shared.tokens.for_rebuilt_pipeline(lb))
    }

    async fn update_pipeline(
        self,
        _: Context,
        client: String,
        old_block: ExtendedBlock,
        new_block: ExtendedBlock,
        nodes: Vec<NodeId>,
    ) -> Result<(), MetaError> {
        self.shared
            .write("update_pipeline", |s, _| {
                s.update_pipeline(&client, old_block, new_block, &nodes)
            })
            .await
    }

    async fn get_additional_datanodes(
        self,
        _: Context,
        req: AdditionalDatanodes,
    ) -> Result<LocatedBlock, MetaError> {
        let added = self.shared.read("get_additional_datanodes", |s, _| {
            s.get_additional_datanodes(&req)
        })?;
        let token = self.shared.tokens.for_replacements(req.block, &added);
        Ok(LocatedBlock {
            block: req.block,
            offset: 0,
            locations: added,
            corrupt: false,
            token,
        })
    }

    async fn report_bad_blocks(
        self,
        _: Context,
        replicas: Vec<BadReplica>,
    ) -> Result<(), MetaError> {
        for r in &replicas {
            tracing::warn!(block = %r.block, node = %r.node, reason = %r.reason, "bad replica reported");
        }
        self.shared.read("report_bad_blocks", |s, _| {
            s.report_bad_blocks(&replicas);
            Ok(())
        })
    }

    async fn set_replication(
        self,
        _: Context,
        path: String,
        replication: u16,
    ) -> Result<(), MetaError> {
        self.shared
            .write("set_replication", |s, _| {
                s.set_replication(&path, replication)
            })
            .await
    }

    async fn cluster_report(self, _: Context) -> Result<ClusterReport, MetaError> {
        self.shared
            .read("cluster_report", |s, now| Ok(s.cluster_report(now)))
    }

    async fn fsck(self, _: Context, path: String) -> Result<FsckReport, MetaError> {
        self.shared.read("fsck", |s, _| s.fsck(&path))
    }

    async fn recover_lease(
        self,
        _: Context,
        path: String,
        client: String,
    ) -> Result<bool, MetaError> {
        self.shared
            .write("recover_lease", |s, now| {
                s.recover_lease(&path, &client, now)
            })
            .await
    }
}
