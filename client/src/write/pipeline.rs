//! One write pipeline: the DataNodes of a block in order, the connection to the first one, the
//! generation stamp, the bytes sent and acknowledged, and the ack queue. Everything pipeline
//! recovery needs to rebuild it lives in this one struct.

use super::ack::{unknown_node, AckQueue};
use super::packet::OutPacket;
use crate::connection::{send_frame, DnConnection, DnSettings, FrameReader, FrameWriter};
use crate::error::{ClientError, PipelineFailure};
use sluice_common::proto::{BlockStage, Message, Op, WriteBlockOp};
use sluice_common::rpc::LocatedBlock;
use sluice_common::token::BlockToken;
use sluice_common::{DatanodeId, ExtendedBlock, GenerationStamp};
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;

/// A running pipeline.
pub(crate) struct Pipeline {
    /// The block: id, current generation stamp, and bytes acknowledged by every DataNode.
    pub block: ExtendedBlock,
    /// The DataNodes, in pipeline order.
    pub nodes: Vec<DatanodeId>,
    /// Acks from the first DataNode.
    pub reader: FrameReader,
    /// Packets to the first DataNode.
    pub writer: FrameWriter,
    /// Packets sent and not yet acknowledged.
    pub acks: AckQueue,
    /// Seqno of the next packet (0, 1, 2… within this pipeline).
    pub next_seqno: i64,
    /// Block offset just past the last data sent.
    pub bytes_sent: u64,
    /// No data was sent since the last packet with `sync`.
    pub synced: bool,
    /// The block's last packet was sent.
    pub last_sent: bool,
    /// When a packet (or heartbeat) was last sent.
    pub last_send: Instant,
    /// When an ack last arrived (or acks started to be awaited).
    pub last_ack_progress: Instant,
    settings: DnSettings,
}

/// What a pipeline is set up for: the DataNodes in order, the block as they hold it, the stage
/// and the generation stamp the replicas take.
#[derive(Debug, Clone)]
pub(crate) struct Setup<'a> {
    /// The DataNodes, in pipeline order.
    pub nodes: &'a [DatanodeId],
    /// The block as the DataNodes hold it: for `Create` the new generation stamp and 0 bytes;
    /// for recovery the old generation stamp and the bytes acknowledged to the writer.
    pub block: ExtendedBlock,
    /// Why.
    pub stage: BlockStage,
    /// The generation stamp of the replicas once set up.
    pub latest_gen_stamp: GenerationStamp,
    /// The writer's client name.
    pub client_name: &'a str,
    /// Bytes per checksum chunk.
    pub bpc: u32,
    /// The block access token for the set-up.
    pub token: Option<&'a BlockToken>,
}

impl Setup<'_> {
    fn op(&self) -> WriteBlockOp {
        WriteBlockOp {
            block: self.block,
            stage: self.stage,
            targets: self.nodes.get(1..).unwrap_or_default().to_vec(),
            client_name: self.client_name.to_string(),
            bytes_per_checksum: self.bpc,
            latest_gen_stamp: self.latest_gen_stamp,
        }
    }

    /// Connects to the first DataNode, sends the op and waits for the whole pipeline's answer.
    /// A failure ([`PipelineFailure::Setup`]) names the DataNode to blame.
    pub(crate) async fn connect(
        &self,
        settings: DnSettings,
    ) -> Result<DnConnection, PipelineFailure> {
        let Some(first) = self.nodes.first() else {
            return Err(PipelineFailure::Setup {
                node: unknown_node(),
                stage: self.stage,
                error: Box::new(ClientError::protocol(
                    "metadata service",
                    format!("no DataNode to write {} to", self.block.id),
                )),
            });
        };
        set_up(first, self.op(), self.token, self.nodes, settings).await
    }
}

impl Pipeline {
    /// Connects to the first DataNode of `lb` and sets up a `Create` pipeline through all of
    /// its locations. A failure is a [`ClientError::Pipeline`] naming the DataNode to exclude.
    pub(crate) async fn create(
        lb: &LocatedBlock,
        client_name: &str,
        bpc: u32,
        settings: DnSettings,
    ) -> Result<Pipeline, ClientError> {
        let setup = Setup {
            nodes: &lb.locations,
            block: ExtendedBlock::new(lb.block.id, lb.block.gen_stamp, 0),
            stage: BlockStage::Create,
            latest_gen_stamp: lb.block.gen_stamp,
            client_name,
            bpc,
            token: lb.token.as_ref(),
        };
        Pipeline::open(&setup, settings)
            .await
            .map_err(|failure| ClientError::Pipeline {
                block: lb.block.id,
                failure: Box::new(failure),
            })
    }

    /// Sets up a pipeline that takes packets (`Create` or `StreamingRecovery`); its block is
    /// `setup.block` under the latest generation stamp, acknowledged up to `setup.block`'s
    /// length.
    pub(crate) async fn open(
        setup: &Setup<'_>,
        settings: DnSettings,
    ) -> Result<Pipeline, PipelineFailure> {
        let conn = setup.connect(settings).await?;
        let (reader, writer) = conn.split();
        let now = Instant::now();
        let acked = setup.block.num_bytes;
        Ok(Pipeline {
            block: ExtendedBlock::new(setup.block.id, setup.latest_gen_stamp, acked),
            nodes: setup.nodes.to_vec(),
            reader,
            writer,
            acks: AckQueue::new(acked),
            next_seqno: 0,
            bytes_sent: acked,
            synced: true,
            last_sent: false,
            last_send: now,
            last_ack_progress: now,
            settings,
        })
    }

    /// The first DataNode (the one the client talks to).
    pub(crate) fn first(&self) -> DatanodeId {
        self.nodes.first().cloned().unwrap_or_else(unknown_node)
    }

    /// A failure of the connection to the first DataNode.
    pub(crate) fn connection_failure(&self, error: ClientError) -> PipelineFailure {
        PipelineFailure::Connection {
            node: self.first(),
            error: Box::new(error),
        }
    }

    /// Sends a packet with the next seqno and keeps it in the ack queue. A failed send blames
    /// the first DataNode.
    pub(crate) async fn send(
        &mut self,
        mut packet: OutPacket,
        permit: Option<OwnedSemaphorePermit>,
    ) -> Result<(), PipelineFailure> {
        packet.header.seqno = self.next_seqno;
        self.next_seqno += 1;
        if packet.header.last {
            self.last_sent = true;
        } else {
            self.bytes_sent = self.bytes_sent.max(packet.end_offset());
            self.synced = packet.header.sync;
        }
        let frame = packet.frame();
        if self.acks.expected() == 0 {
            self.last_ack_progress = Instant::now();
        }
        self.acks.push(packet, permit);
        self.write_frame(frame).await
    }

    /// Queues a packet without sending it: when re-sending fails part way, the packets not yet
    /// re-sent stay in the ack queue, in order, for the next recovery.
    pub(crate) fn requeue(&mut self, packet: OutPacket, permit: Option<OwnedSemaphorePermit>) {
        self.acks.push(packet, permit);
    }

    /// Sends a heartbeat packet.
    pub(crate) async fn send_heartbeat(&mut self) -> Result<(), PipelineFailure> {
        if self.acks.expected() == 0 {
            self.last_ack_progress = Instant::now();
        }
        self.acks.push_heartbeat();
        self.write_frame(OutPacket::heartbeat().frame()).await
    }

    async fn write_frame(
        &mut self,
        frame: sluice_common::frame::Frame<Message>,
    ) -> Result<(), PipelineFailure> {
        let node = self.first().to_string();
        let r = send_frame(&mut self.writer, frame, &node, self.settings.timeout).await;
        self.last_send = Instant::now();
        r.map_err(|e| self.connection_failure(e))
    }

    /// When the oldest expected ack is overdue (`None` when no ack is expected): the socket
    /// timeout extended per DataNode of the pipeline, as each DataNode's wait for its downstream.
    pub(crate) fn ack_deadline(&self) -> Option<Instant> {
        let wait = sluice_common::proto::ack_timeout(self.settings.timeout, self.nodes.len());
        (self.acks.expected() > 0).then(|| self.last_ack_progress + wait)
    }

    /// When a heartbeat is due (no packet sent for half the socket timeout).
    pub(crate) fn heartbeat_due(&self) -> Instant {
        self.last_send + self.settings.timeout / 2
    }
}

/// Connects to `first`, sends `op`, and waits for the set-up answer (within the socket timeout
/// extended per DataNode of the pipeline). A failure blames the `first_bad_link` DataNode when
/// it is one of `nodes`, else `first`.
async fn set_up(
    first: &DatanodeId,
    op: WriteBlockOp,
    token: Option<&BlockToken>,
    nodes: &[DatanodeId],
    settings: DnSettings,
) -> Result<DnConnection, PipelineFailure> {
    let block = op.block.id;
    let stage = op.stage;
    // The answer comes only after every DataNode below has connected to its downstream and
    // answered, each within its own extended wait: wait longer than the first DataNode does,
    // so that its answer naming a dead downstream (first_bad_link) arrives before this times
    // out and blames the first DataNode (HDFS: getDatanodeReadTimeout(nodes.length)).
    let settings = DnSettings {
        timeout: sluice_common::proto::ack_timeout(settings.timeout, nodes.len()),
        ..settings
    };
    let blame_first = |error| PipelineFailure::Setup {
        node: first.clone(),
        stage,
        error: Box::new(error),
    };
    let mut conn = DnConnection::connect(first, settings)
        .await
        .map_err(blame_first)?;
    conn.send_op(Op::WriteBlock(op), token)
        .await
        .map_err(blame_first)?;
    let frame = conn
        .recv("the WriteBlock response")
        .await
        .map_err(blame_first)?;
    let resp = match frame.header {
        Message::OpResponse(r) => r,
        other => {
            let reason = format!(
                "expected an OpResponse to WriteBlock, got {}",
                crate::connection::message_name(&other)
            );
            return Err(blame_first(ClientError::protocol(conn.node(), reason)));
        }
    };
    if resp.status.is_success() {
        return Ok(conn);
    }
    let bad = resp
        .first_bad_link
        .as_deref()
        .and_then(|addr| nodes.iter().find(|d| d.data_addr == addr))
        .unwrap_or(first)
        .clone();
    let mut message = resp.message.clone();
    if let Some(link) = &resp.first_bad_link {
        message = format!("{message} (first bad link {link})");
    }
    let error = crate::connection::status_error(conn.node(), block, resp.status, &message);
    Err(PipelineFailure::Setup {
        node: bad,
        stage,
        error: Box::new(error),
    })
}
