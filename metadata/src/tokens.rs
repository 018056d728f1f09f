//! Block access tokens handed out with block locations, new blocks and DataNode commands
//! (HDFS `BlockManager.setBlockToken`): a thin shell over the common
//! [`BlockTokenSecretManager`], off when `block.access-token.enable` is false.

use sluice_common::config::MetadataConfig;
use sluice_common::rpc::{DatanodeCommand, LocatedBlock, LocatedBlocks};
use sluice_common::token::{now_ms, AccessMode, BlockToken, BlockTokenSecretManager, KeySet};
use sluice_common::{BlockId, DatanodeId, ExtendedBlock, GenerationStamp};
use std::collections::HashMap;
use std::sync::Mutex;

/// Blocks whose replacement DataNodes are remembered at most (a client that asks for
/// replacements and never rebuilds its pipeline cannot grow the map without bound).
const MAX_GRANTED: usize = 65_536;

/// The service's token factory (`None` inside: tokens are off).
#[derive(Debug)]
pub struct Tokens {
    manager: Option<Mutex<BlockTokenSecretManager>>,
    /// Replacement DataNodes handed out by `get_additional_datanodes` for a block whose
    /// pipeline is being rebuilt: the write token of `update_block_for_pipeline` names them
    /// too.
    granted: Mutex<HashMap<BlockId, Vec<DatanodeId>>>,
}

impl Tokens {
    /// Tokens as `cfg` sets them up, with a fresh key.
    pub fn new(cfg: &MetadataConfig) -> Tokens {
        let manager = if cfg.block_token_enable {
            Some(Mutex::new(BlockTokenSecretManager::new(
                cfg.block_key_update_interval.get(),
                cfg.block_token_lifetime.get(),
                now_ms(),
            )))
        } else {
            tracing::warn!("block access tokens are off (block.access-token.enable = false): DataNodes serve any op to anyone");
            None
        };
        Tokens {
            manager,
            granted: Mutex::default(),
        }
    }

    /// Remembers replacement DataNodes given out for `block`; returns a copy token naming
    /// them.
    pub fn for_replacements(
        &self,
        block: ExtendedBlock,
        added: &[DatanodeId],
    ) -> Option<BlockToken> {
        self.manager.as_ref()?;
        let mut g = self.granted.lock().unwrap_or_else(|p| p.into_inner());
        if g.len() >= MAX_GRANTED && !g.contains_key(&block.id) {
            g.clear();
        }
        g.entry(block.id).or_default().extend(added.iter().cloned());
        drop(g);
        self.sign(block, block.gen_stamp, &[AccessMode::Copy], added)
    }

    /// The write token of a rebuilt pipeline: through the block's pipeline and the
    /// replacements given out for it.
    pub fn for_rebuilt_pipeline(&self, lb: LocatedBlock) -> LocatedBlock {
        let extra = self
            .granted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&lb.block.id)
            .unwrap_or_default();
        let mut targets = lb.locations.clone();
        targets.extend(extra);
        let mut lb = lb;
        lb.token = self.sign(
            lb.block,
            lb.block.gen_stamp,
            &[AccessMode::Write, AccessMode::Read],
            &targets,
        );
        lb
    }

    /// The keys DataNodes accept (rolled over when due); `None` when tokens are off.
    pub fn keys(&self) -> Option<KeySet> {
        let m = self.manager.as_ref()?;
        let mut m = m.lock().unwrap_or_else(|p| p.into_inner());
        m.roll_if_due(now_ms());
        Some(m.keys())
    }

    /// A token for `block` at `gen_stamp` (`None` when tokens are off).
    pub fn sign(
        &self,
        block: ExtendedBlock,
        gen_stamp: GenerationStamp,
        modes: &[AccessMode],
        targets: &[DatanodeId],
    ) -> Option<BlockToken> {
        let m = self.manager.as_ref()?;
        let mut m = m.lock().unwrap_or_else(|p| p.into_inner());
        match m.generate(block.id, gen_stamp, modes, targets, now_ms()) {
            Ok(t) => Some(t),
            Err(e) => {
                tracing::error!(block = %block.id, "cannot sign a block access token: {e}");
                None
            }
        }
    }

    /// Read tokens on every located block.
    pub fn for_reading(&self, mut lbs: LocatedBlocks) -> LocatedBlocks {
        for lb in &mut lbs.blocks {
            lb.token = self.sign(lb.block, lb.block.gen_stamp, &[AccessMode::Read], &[]);
        }
        lbs
    }

    /// A write token for a new block (or a pipeline being rebuilt) through `lb.locations`.
    pub fn for_writing(&self, mut lb: LocatedBlock) -> LocatedBlock {
        lb.token = self.sign(
            lb.block,
            lb.block.gen_stamp,
            &[AccessMode::Write, AccessMode::Read],
            &lb.locations,
        );
        lb
    }

    /// Copy tokens on `Transfer` commands and recover tokens on `RecoverBlock` commands.
    pub fn for_commands(&self, commands: &mut [DatanodeCommand]) {
        for c in commands {
            match c {
                DatanodeCommand::Transfer {
                    block,
                    targets,
                    token,
                } => *token = self.sign(*block, block.gen_stamp, &[AccessMode::Copy], targets),
                DatanodeCommand::RecoverBlock(rb) => {
                    rb.token = self.sign(rb.block, rb.recovery_id, &[AccessMode::Recover], &[]);
                }
                DatanodeCommand::Delete { .. } | DatanodeCommand::Reregister => {}
            }
        }
    }
}
