//! Block access token checks on every op (HDFS `DataXceiver.checkAccess`).
//!
//! The [`Gate`] follows the metadata service: unknown until the first registration, then off
//! (the service hands out no keys) or on with the keys from the latest register or heartbeat
//! reply. An op arriving before the first registration waits for it (at most the socket
//! timeout) and is refused if it does not come: a DataNode that cannot reach the metadata
//! service does not know whether to demand tokens, so it demands them.

use crate::context::NodeContext;
use sluice_common::proto::Op;
use sluice_common::token::{now_ms, AccessMode, BlockToken, KeySet, TokenCheck, TokenError};

/// Whether this DataNode demands tokens, and with which keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Gate {
    /// Not registered yet.
    Unknown,
    /// The metadata service signs no tokens: every op is served.
    Off,
    /// Tokens signed by one of these keys are demanded.
    On(KeySet),
}

impl Gate {
    /// The gate a register or heartbeat reply's keys imply.
    pub(crate) fn from_keys(keys: Option<KeySet>) -> Gate {
        keys.map_or(Gate::Off, Gate::On)
    }
}

/// What `op` needs of its token: block, generation stamp, mode and the DataNodes it forwards to.
pub(crate) fn needs(op: &Op) -> TokenCheck<'_> {
    let (block, gen_stamp, mode, targets) = match op {
        Op::WriteBlock(w) if w.stage.is_transfer() => (
            w.block.id,
            w.block.gen_stamp,
            AccessMode::Copy,
            &w.targets[..],
        ),
        // Create and pipeline recovery: the token names the stamp the replica ends up with.
        Op::WriteBlock(w) => (
            w.block.id,
            w.latest_gen_stamp,
            AccessMode::Write,
            &w.targets[..],
        ),
        Op::ReadBlock(r) => (r.block.id, r.block.gen_stamp, AccessMode::Read, &[][..]),
        Op::ReadChunk(r) => (r.block.id, r.block.gen_stamp, AccessMode::Read, &[][..]),
        Op::ReplicaInfo(r) => (r.block.id, r.block.gen_stamp, AccessMode::Read, &[][..]),
        Op::TransferBlock(t) => (
            t.block.id,
            t.block.gen_stamp,
            AccessMode::Copy,
            &t.targets[..],
        ),
        // Recovery: the token names the recovery id, which only the metadata service hands out.
        Op::InitReplicaRecovery(o) => (o.block.id, o.recovery_id, AccessMode::Recover, &[][..]),
        Op::UpdateReplicaUnderRecovery(o) => {
            (o.block.id, o.recovery_id, AccessMode::Recover, &[][..])
        }
    };
    TokenCheck {
        block,
        gen_stamp,
        // The copy a source sends carries its replica's stamp, which a pipeline recovery may
        // have raised since the client's copy token was signed.
        older_ok: matches!(op, Op::WriteBlock(w) if w.stage.is_transfer()),
        mode,
        targets,
    }
}

/// Checks `op`'s token, waiting for the first registration when it has not happened yet.
pub(crate) async fn check(
    ctx: &NodeContext,
    op: &Op,
    token: Option<&BlockToken>,
) -> Result<(), TokenError> {
    let mut rx = ctx.gate.subscribe();
    let waited =
        tokio::time::timeout(ctx.socket_timeout(), rx.wait_for(|g| *g != Gate::Unknown)).await;
    let gate = match waited {
        Ok(Ok(g)) => g.clone(),
        Ok(Err(_)) | Err(_) => Gate::Unknown,
    };
    match gate {
        Gate::Off => Ok(()),
        Gate::Unknown => Err(TokenError::NoKeys),
        Gate::On(keys) => keys.check(token, &needs(op), now_ms()),
    }
}
