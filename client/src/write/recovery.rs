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

use super::pipeline::{Pipeline, Setup, SetupFailure};
use super::replace::ReplaceRule;
use crate::connection::{DnConnection, DnSettings};
use crate::error::ClientError;
use crate::filesystem::FsInner;
use sluice_common::proto::{BlockStage, Op, TransferBlockOp};
use sluice_common::rpc::AdditionalDatanodes;
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
    /// Position of the DataNode to blame.
    pub bad_index: usize,
    /// What happened.
    pub reason: String,
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
    pub fs: &'a FsInner,
    /// The file.
    pub path: &'a str,
    /// DataNode socket settings.
    pub settings: DnSettings,
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
            mut bad_index,
            mut reason,
            closing,
        } = f;
        let first_failed = self.failed.len();
        loop {
            self.take_out(block, &mut nodes, bad_index, &reason)?;
            if !closing {
                self.maybe_replace(block, &mut nodes).await?;
            }
            let new_gs = self.new_gen_stamp(block).await?;
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
                client_name: &self.fs.client_name,
                bpc: self.fs.cfg.bytes_per_checksum,
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
                Err(SetupFailure { bad, error }) => {
                    bad_index = bad
                        .and_then(|b| nodes.iter().position(|n| n.node_id == b.node_id))
                        .unwrap_or(0);
                    reason = format!("recovery set-up ({stage:?}) failed: {error}");
                    warn!(block = %block.id, node = %nodes[bad_index.min(nodes.len() - 1)], %reason, "pipeline recovery set-up failed");
                }
            }
        }
    }

    /// Takes the DataNode at `bad` out of `nodes`; fails when none is left.
    fn take_out(
        &mut self,
        block: ExtendedBlock,
        nodes: &mut Vec<DatanodeId>,
        bad: usize,
        reason: &str,
    ) -> Result<(), ClientError> {
        if !nodes.is_empty() {
            let node = nodes.remove(bad.min(nodes.len() - 1));
            warn!(block = %block.id, node = %node, %reason, "DataNode taken out of the pipeline");
            self.failed.push(node);
        }
        if nodes.is_empty() {
            return Err(ClientError::AllDatanodesBad {
                block: block.id,
                nodes: names(self.failed),
                last: reason.to_string(),
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
        let reason = match self.add_datanode(block, nodes).await? {
            Ok(()) => return Ok(()),
            Err(reason) => reason,
        };
        if self.rule.best_effort {
            warn!(block = %block.id, survivors = nodes.len(), %reason, "no replacement DataNode; best-effort: going on with fewer");
            return Ok(());
        }
        Err(ClientError::ReplaceDatanode {
            block: block.id,
            policy: self.rule.policy_name().to_string(),
            survivors: nodes.len(),
            reason,
        })
    }

    /// Picks a new DataNode and copies the acknowledged bytes to it (HDFS
    /// `addDatanode2ExistingPipeline`). `Ok(Err(reason))`: no replacement could be added.
    async fn add_datanode(
        &mut self,
        block: ExtendedBlock,
        nodes: &mut Vec<DatanodeId>,
    ) -> Result<Result<(), String>, ClientError> {
        let sources = nodes.clone();
        let mut exclude: Vec<NodeId> = self.failed.iter().map(|d| d.node_id.clone()).collect();
        let mut copy_failures = Vec::new();
        for attempt in 0..MAX_REPLACEMENT_TRIES {
            let picked = match self.additional(block, nodes, &exclude).await {
                Ok(p) => p,
                Err(ClientError::Meta(e @ MetaError::NotEnoughDatanodes { .. })) => {
                    copy_failures.push(format!("no more good DataNodes available to try ({e})"));
                    return Ok(Err(copy_failures.join("; ")));
                }
                Err(e) => return Err(e),
            };
            let Some(new) = picked.into_iter().next() else {
                copy_failures.push("the metadata service offered no DataNode".into());
                return Ok(Err(copy_failures.join("; ")));
            };
            if block.num_bytes == 0 {
                info!(block = %block.id, new = %new, "replacement DataNode added (nothing acknowledged to copy)");
                nodes.push(new);
                return Ok(Ok(()));
            }
            let src = &sources[attempt % sources.len()];
            match self.transfer(src, &new, block).await {
                Ok(()) => {
                    info!(block = %block.id, from = %src, to = %new, bytes = block.num_bytes, "replica copied to a replacement DataNode");
                    nodes.push(new);
                    return Ok(Ok(()));
                }
                Err(e) => {
                    warn!(block = %block.id, from = %src, to = %new, error = %e, "copying the replica to a replacement failed");
                    copy_failures.push(format!("copy from {src} to {new} failed: {e}"));
                    exclude.push(new.node_id);
                }
            }
        }
        Ok(Err(copy_failures.join("; ")))
    }

    async fn additional(
        &self,
        block: ExtendedBlock,
        nodes: &[DatanodeId],
        exclude: &[NodeId],
    ) -> Result<Vec<DatanodeId>, ClientError> {
        let req = AdditionalDatanodes {
            path: self.path.to_string(),
            client: self.fs.client_name.clone(),
            block,
            existing: nodes.iter().map(|d| d.node_id.clone()).collect(),
            exclude: exclude.to_vec(),
            count: 1,
        };
        self.fs
            .call("get_additional_datanodes", true, |c, ctx| {
                let req = req.clone();
                async move { c.get_additional_datanodes(ctx, req).await }
            })
            .await
    }

    /// Has `src` copy `block.num_bytes` bytes of its replica to `target` (`TransferRbw`).
    async fn transfer(
        &self,
        src: &DatanodeId,
        target: &DatanodeId,
        block: ExtendedBlock,
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
            client_name: self.fs.client_name.clone(),
        };
        conn.send_op(Op::TransferBlock(op)).await?;
        conn.recv_op_response(block.id).await?;
        Ok(())
    }

    async fn new_gen_stamp(&self, block: ExtendedBlock) -> Result<GenerationStamp, ClientError> {
        let client = self.fs.client_name.clone();
        let lb = self
            .fs
            .call("update_block_for_pipeline", true, |c, ctx| {
                let client = client.clone();
                async move { c.update_block_for_pipeline(ctx, block, client).await }
            })
            .await?;
        if lb.block.id != block.id || lb.block.gen_stamp <= block.gen_stamp {
            return Err(ClientError::protocol(
                "metadata service",
                format!(
                    "update_block_for_pipeline for {block} returned {}",
                    lb.block
                ),
            ));
        }
        Ok(lb.block.gen_stamp)
    }

    async fn update_pipeline(
        &self,
        old: ExtendedBlock,
        new: ExtendedBlock,
        nodes: &[DatanodeId],
    ) -> Result<(), ClientError> {
        let client = self.fs.client_name.clone();
        let ids: Vec<NodeId> = nodes.iter().map(|d| d.node_id.clone()).collect();
        self.fs
            .call("update_pipeline", false, |c, ctx| {
                let (client, ids) = (client.clone(), ids.clone());
                async move { c.update_pipeline(ctx, client, old, new, ids).await }
            })
            .await
    }
}

fn names(nodes: &[DatanodeId]) -> Vec<String> {
    nodes.iter().map(|d| d.to_string()).collect()
}
