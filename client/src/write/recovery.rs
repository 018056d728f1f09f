//! Pipeline recovery (HDFS `DataStreamer.setupPipelineForAppendOrRecovery`): rebuilds a failed
//! pipeline of the block being written so that the streamer can re-send what was not
//! acknowledged.
//!
//! One run, given the failed pipeline and the DataNode to blame:
//!
//! 1. take the bad DataNode out (it joins the block's `failed` list and is never picked again
//!    for this block); none left → [`ClientError::AllDatanodesBad`];
//! 2. unless the block is closing, ask the [`ReplaceRule`] whether to add a replacement: pick
//!    one with `get_additional_datanodes` (excluding every failed DataNode) and have a survivor
//!    copy the replica's acknowledged bytes to it (`TransferBlock`, stage `TransferRbw`, skipped
//!    when nothing is acknowledged yet); a failed copy excludes that DataNode and tries another,
//!    up to 3 times; no replacement → [`ClientError::ReplaceDatanode`], or go on with fewer
//!    DataNodes under `best-effort`;
//! 3. get a new generation stamp (`update_block_for_pipeline`);
//! 4. set the pipeline up again: `StreamingRecovery` (the replicas are truncated to the
//!    acknowledged length and take the new generation stamp; packets follow), `CloseRecovery`
//!    when only the block's last packet was unacknowledged (the replicas are finalized during
//!    set-up; no packets follow), or `Create` when nothing was acknowledged yet (every DataNode
//!    starts the replica afresh under the new generation stamp, replacing an older one — a
//!    replacement DataNode has nothing to recover from, since nothing was copied to it);
//!    a DataNode failing the set-up is blamed and the run goes back to step 1;
//! 5. record the new pipeline and generation stamp (`update_pipeline`).
//!
//! The streamer then re-sends every unacknowledged packet, oldest first. The acknowledged
//! length never shrinks: recovery only ever continues from it.

use super::pipeline::{Pipeline, Setup};
use super::replace::ReplaceRule;
use crate::connection::{DnConnection, DnSettings};
use crate::error::{ClientError, CopyFailure, PipelineFailure, ReplaceFailure};
use crate::meta::MetadataClient;
use sluice_common::proto::{BlockStage, Op, TransferBlockOp};
use sluice_common::rpc::{AdditionalDatanodes, LocatedBlock};
use sluice_common::token::BlockToken;
use sluice_common::{DatanodeId, ExtendedBlock, GenerationStamp, MetaError, NodeId};
use tracing::{info, warn};

/// Replacement DataNodes tried per recovery (HDFS tries 3).
const MAX_REPLACEMENT_TRIES: usize = 3;

/// A failed pipeline as recovery takes it over.
#[derive(Debug)]
pub(crate) struct Failed {
    /// The block as the DataNodes hold it: id, generation stamp, bytes acknowledged.
    pub block: ExtendedBlock,
    /// The pipeline's DataNodes, in order.
    pub nodes: Vec<DatanodeId>,
    /// What happened; its DataNode is the one to take out.
    pub failure: PipelineFailure,
    /// Only the block's last packet is unacknowledged: finish the block with the survivors.
    pub closing: bool,
}

/// What a recovery run produced.
pub(crate) enum Recovered {
    /// A pipeline ready for packets (nothing sent on it yet).
    Streaming(Box<Pipeline>),
    /// Close recovery finalized the block on these DataNodes.
    Closed {
        /// The block under its new generation stamp, at its final length.
        block: ExtendedBlock,
        /// The DataNodes holding it.
        nodes: Vec<DatanodeId>,
    },
}

/// The context of one recovery run.
pub(crate) struct Recovery<'a> {
    /// Metadata RPCs and the client name.
    pub meta: &'a MetadataClient,
    /// The file.
    pub path: &'a str,
    /// DataNode socket settings.
    pub settings: DnSettings,
    /// Bytes per checksum chunk (`bytes.per.checksum`).
    pub bpc: u32,
    /// When to replace a failed DataNode.
    pub rule: ReplaceRule,
    /// The file's replication factor.
    pub replication: u16,
    /// The writer has hflushed (or hsynced) the file.
    pub hflushed: bool,
    /// DataNodes taken out of this block's pipelines so far.
    pub failed: &'a mut Vec<DatanodeId>,
}

impl Recovery<'_> {
    /// Rebuilds the pipeline of `f`, or fails the write with the reason it cannot be.
    pub(crate) async fn run(mut self, f: Failed) -> Result<Recovered, ClientError> {
        let Failed {
            block,
            mut nodes,
            mut failure,
            closing,
        } = f;
        let first_failed = self.failed.len();
        loop {
            self.take_out(block, &mut nodes, failure)?;
            if !closing {
                self.maybe_replace(block, &mut nodes).await?;
            }
            let (new_gs, token) = self.new_gen_stamp(block).await?;
            let stage = if closing {
                BlockStage::CloseRecovery
            } else if block.num_bytes == 0 {
                BlockStage::Create
            } else {
                BlockStage::StreamingRecovery
            };
            let setup = Setup {
                nodes: &nodes,
                block,
                stage,
                latest_gen_stamp: new_gs,
                client_name: self.meta.client_name(),
                bpc: self.bpc,
                token: token.as_ref(),
            };
            let outcome = if closing {
                setup.connect(self.settings).await.map(|_answered| None)
            } else {
                Pipeline::open(&setup, self.settings).await.map(Some)
            };
            match outcome {
                Ok(pipeline) => {
                    let new_block = ExtendedBlock::new(block.id, new_gs, block.num_bytes);
                    self.update_pipeline(block, new_block, &nodes).await?;
                    let failed: Vec<String> = names(&self.failed[first_failed..]);
                    info!(block = %block.id, ?failed, new_pipeline = ?names(&nodes), new_gen_stamp = %new_gs, acked = block.num_bytes, ?stage, "pipeline recovered");
                    return Ok(match pipeline {
                        Some(p) => Recovered::Streaming(Box::new(p)),
                        None => Recovered::Closed {
                            block: new_block,
                            nodes,
                        },
                    });
                }
                Err(f) => {
                    warn!(block = %block.id, node = %f.node(), reason = %f, "pipeline recovery set-up failed");
                    failure = f;
                }
            }
        }
    }

    /// Sets up the pipeline of an append to the partial block `lb` (HDFS
    /// `setupPipelineForAppendOrRecovery` with `PIPELINE_SETUP_APPEND`): a new generation
    /// stamp, an `Append` set-up through the DataNodes holding the block, and the pipeline
    /// recorded. A DataNode that fails the set-up is taken out and the rest are tried again
    /// under another stamp (`PIPELINE_SETUP_APPEND_RECOVERY`; the DataNodes accept a replica
    /// an earlier attempt reopened).
    pub(crate) async fn append(mut self, lb: &LocatedBlock) -> Result<Pipeline, ClientError> {
        let block = lb.block;
        let mut nodes = lb.locations.clone();
        if nodes.is_empty() {
            return Err(ClientError::protocol(
                "metadata service",
                format!("named no DataNode holding the last block {}", block.id),
            ));
        }
        loop {
            let (new_gs, token) = self.new_gen_stamp(block).await?;
            let setup = Setup {
                nodes: &nodes,
                block,
                stage: BlockStage::Append,
                latest_gen_stamp: new_gs,
                client_name: self.meta.client_name(),
                bpc: self.bpc,
                token: token.as_ref(),
            };
            match Pipeline::open(&setup, self.settings).await {
                Ok(p) => {
                    let new_block = ExtendedBlock::new(block.id, new_gs, block.num_bytes);
                    self.update_pipeline(block, new_block, &nodes).await?;
                    info!(block = %block.id, pipeline = ?names(&nodes), new_gen_stamp = %new_gs, length = block.num_bytes, "append pipeline set up");
                    return Ok(p);
                }
                Err(failure) => self.take_out(block, &mut nodes, failure)?,
            }
        }
    }

    /// Takes the DataNode `failure` blames out of `nodes` (the first one when it is not in
    /// the pipeline); fails when none is left.
    fn take_out(
        &mut self,
        block: ExtendedBlock,
        nodes: &mut Vec<DatanodeId>,
        failure: PipelineFailure,
    ) -> Result<(), ClientError> {
        let bad = nodes
            .iter()
            .position(|n| n.node_id == failure.node().node_id)
            .unwrap_or(0);
        if bad < nodes.len() {
            let node = nodes.remove(bad);
            warn!(block = %block.id, node = %node, reason = %failure, "DataNode taken out of the pipeline");
            self.failed.push(node);
        }
        if nodes.is_empty() {
            return Err(ClientError::AllDatanodesBad {
                block: block.id,
                nodes: self.failed.clone(),
                last: Box::new(failure),
            });
        }
        Ok(())
    }

    /// Adds a replacement DataNode when the policy asks for one.
    async fn maybe_replace(
        &mut self,
        block: ExtendedBlock,
        nodes: &mut Vec<DatanodeId>,
    ) -> Result<(), ClientError> {
        if !self
            .rule
            .satisfy(self.replication, nodes.len(), self.hflushed)
        {
            return Ok(());
        }
        match self.add_datanode(block, nodes).await {
            Err(ClientError::ReplaceDatanode { reason, .. }) if self.rule.best_effort => {
                warn!(block = %block.id, survivors = nodes.len(), %reason, "no replacement DataNode; best-effort: going on with fewer");
                Ok(())
            }
            r => r,
        }
    }

    /// Picks a new DataNode and copies the acknowledged bytes to it (HDFS
    /// `addDatanode2ExistingPipeline`). No replacement to be had: [`ClientError::ReplaceDatanode`]
    /// with the [`ReplaceFailure`]; a metadata RPC that fails otherwise is its own error.
    async fn add_datanode(
        &mut self,
        block: ExtendedBlock,
        nodes: &mut Vec<DatanodeId>,
    ) -> Result<(), ClientError> {
        let sources = nodes.clone();
        let mut exclude: Vec<NodeId> = self.failed.iter().map(|d| d.node_id.clone()).collect();
        let mut copies = Vec::new();
        let no_replacement = |reason| ClientError::ReplaceDatanode {
            block: block.id,
            policy: self.rule.policy_name().to_string(),
            survivors: sources.len(),
            reason: Box::new(reason),
        };
        for attempt in 0..MAX_REPLACEMENT_TRIES {
            let picked = match self.additional(block, nodes, &exclude).await {
                Ok(p) => p,
                Err(ClientError::Meta(error @ MetaError::NotEnoughDatanodes { .. })) => {
                    return Err(no_replacement(ReplaceFailure::NoMoreDatanodes {
                        error,
                        copies,
                    }));
                }
                Err(e) => return Err(e),
            };
            let token = picked.token;
            let Some(new) = picked.locations.into_iter().next() else {
                return Err(no_replacement(ReplaceFailure::NoneOffered { copies }));
            };
            if block.num_bytes == 0 {
                info!(block = %block.id, new = %new, "replacement DataNode added (nothing acknowledged to copy)");
                nodes.push(new);
                return Ok(());
            }
            let src = &sources[attempt % sources.len()];
            match self.transfer(src, &new, block, token.as_ref()).await {
                Ok(()) => {
                    info!(block = %block.id, from = %src, to = %new, bytes = block.num_bytes, "replica copied to a replacement DataNode");
                    nodes.push(new);
                    return Ok(());
                }
                Err(e) => {
                    warn!(block = %block.id, from = %src, to = %new, error = %e, "copying the replica to a replacement failed");
                    exclude.push(new.node_id.clone());
                    copies.push(CopyFailure {
                        from: src.clone(),
                        to: new,
                        error: Box::new(e),
                    });
                }
            }
        }
        Err(no_replacement(ReplaceFailure::CopiesFailed { copies }))
    }

    async fn additional(
        &self,
        block: ExtendedBlock,
        nodes: &[DatanodeId],
        exclude: &[NodeId],
    ) -> Result<LocatedBlock, ClientError> {
        let req = AdditionalDatanodes {
            path: self.path.to_string(),
            client: self.meta.client_name().to_string(),
            block,
            existing: nodes.iter().map(|d| d.node_id.clone()).collect(),
            exclude: exclude.to_vec(),
            count: 1,
        };
        self.meta.get_additional_datanodes(&req).await
    }

    /// Has `src` copy `block.num_bytes` bytes of its replica to `target` (`TransferRbw`).
    async fn transfer(
        &self,
        src: &DatanodeId,
        target: &DatanodeId,
        block: ExtendedBlock,
        token: Option<&BlockToken>,
    ) -> Result<(), ClientError> {
        // The answer comes once the whole copy is acknowledged: allow for it.
        let settings = DnSettings {
            timeout: self.settings.timeout * 2,
            ..self.settings
        };
        let mut conn = DnConnection::connect(src, settings).await?;
        let op = TransferBlockOp {
            block,
            targets: vec![target.clone()],
            stage: BlockStage::TransferRbw,
            client_name: self.meta.client_name().to_string(),
        };
        conn.send_op(Op::TransferBlock(op), token).await?;
        conn.recv_op_response(block.id).await?;
        Ok(())
    }

    /// A new generation stamp for `block` and the write token for it.
    async fn new_gen_stamp(
        &self,
        block: ExtendedBlock,
    ) -> Result<(GenerationStamp, Option<BlockToken>), ClientError> {
        let lb = self.meta.update_block_for_pipeline(block).await?;
        if lb.block.id != block.id || lb.block.gen_stamp <= block.gen_stamp {
            return Err(ClientError::protocol(
                "metadata service",
                format!(
                    "update_block_for_pipeline for {block} returned {}",
                    lb.block
                ),
            ));
        }
        Ok((lb.block.gen_stamp, lb.token))
    }

    async fn update_pipeline(
        &self,
        old: ExtendedBlock,
        new: ExtendedBlock,
        nodes: &[DatanodeId],
    ) -> Result<(), ClientError> {
        let ids: Vec<NodeId> = nodes.iter().map(|d| d.node_id.clone()).collect();
        self.meta.update_pipeline(old, new, &ids).await
    }
}

fn names(nodes: &[DatanodeId]) -> Vec<String> {
    nodes.iter().map(|d| d.to_string()).collect()
}
