//! Block access tokens (HDFS `BlockTokenIdentifier` / `BlockTokenSecretManager`).
//!
//! The metadata service signs, with HMAC-SHA256 under a [`BlockKey`], a [`TokenIdentifier`]
//! naming one block, its generation stamp, the [`AccessMode`]s allowed, the DataNodes a write or
//! copy may be forwarded to, an expiry and the key's id. Tokens travel with block locations and
//! new blocks; the client (and a DataNode acting for the metadata service) puts one on every
//! data-transfer op. DataNodes learn the keys from the register and heartbeat replies and check
//! every op with [`KeySet::check`]; an op whose token is missing, expired, signed by an unknown
//! key, for another block, stamp or mode, or forwarding to a DataNode the token does not name
//! is refused with [`crate::Status::ErrorAccessToken`].
//!
//! Keys roll over every key-update interval ([`BlockTokenSecretManager::roll_if_due`]). As in
//! HDFS the service holds three keys and hands all of them out: the previous one (a token
//! signed just before a roll stays valid for its whole lifetime, which the configuration keeps
//! at most one interval), the current one (signs), and the next one (DataNodes have it a whole
//! interval before it signs anything, so a DataNode whose heartbeat is late still knows it).

use crate::ids::{BlockId, DatanodeId, GenerationStamp};
use hmac::{Hmac, Mac};
use rand::{Rng, RngCore};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use thiserror::Error;

type HmacSha256 = Hmac<Sha256>;

/// Bytes of a block key's secret and of a token's MAC.
pub const KEY_LEN: usize = 32;

/// What a token allows (HDFS `BlockTokenIdentifier.AccessMode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum AccessMode {
    /// Read the replica (`ReadBlock`, `ReadChunk`, `ReplicaInfo`).
    Read,
    /// Write it through a pipeline (`WriteBlock` create and pipeline recovery).
    Write,
    /// Copy it to other DataNodes (`TransferBlock` and the `WriteBlock` transfer stages).
    Copy,
    /// Replace a replica on a DataNode (balancer moves; reserved).
    Replace,
    /// Recover it (`InitReplicaRecovery`, `UpdateReplicaUnderRecovery`).
    Recover,
}

impl AccessMode {
    fn bit(self) -> u8 {
        match self {
            AccessMode::Read => 1,
            AccessMode::Write => 2,
            AccessMode::Copy => 4,
            AccessMode::Replace => 8,
            AccessMode::Recover => 16,
        }
    }
}

/// A set of [`AccessMode`]s.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccessModes(u8);

impl AccessModes {
    /// The set of `modes`.
    pub fn of(modes: &[AccessMode]) -> Self {
        AccessModes(modes.iter().fold(0, |m, a| m | a.bit()))
    }

    /// True when `mode` is in the set.
    pub fn contains(self, mode: AccessMode) -> bool {
        self.0 & mode.bit() != 0
    }
}

/// What a token says; the signed part.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenIdentifier {
    /// The [`BlockKey`] that signed it.
    pub key_id: u32,
    /// Expiry, milliseconds since the Unix epoch.
    pub expiry_ms: u64,
    /// The block.
    pub block: BlockId,
    /// The generation stamp the op must carry (for a pipeline set-up: the stamp the replica
    /// gets; for recovery: the recovery id).
    pub gen_stamp: GenerationStamp,
    /// What is allowed.
    pub modes: AccessModes,
    /// The DataNodes a write or copy may be forwarded to (empty: none).
    pub targets: Vec<DatanodeId>,
}

/// A signed [`TokenIdentifier`].
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockToken {
    /// What it allows.
    pub ident: TokenIdentifier,
    /// HMAC-SHA256 of the bincode-encoded identifier under the key `ident.key_id`.
    pub mac: [u8; KEY_LEN],
}

impl fmt::Debug for BlockToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BlockToken")
            .field("ident", &self.ident)
            .finish_non_exhaustive()
    }
}

/// A key that signs tokens (HDFS `BlockKey`). Its secret never appears in `Debug` output.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockKey {
    /// Its id, named by the tokens it signs.
    pub id: u32,
    /// The HMAC key.
    pub secret: [u8; KEY_LEN],
}

impl fmt::Debug for BlockKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BlockKey")
            .field("id", &self.id)
            .field("secret", &"<redacted>")
            .finish()
    }
}

impl BlockKey {
    fn mac(&self, ident: &TokenIdentifier) -> Result<HmacSha256, TokenError> {
        let bytes = crate::frame::encode_header(ident).map_err(|_| TokenError::Malformed)?;
        let mut mac =
            HmacSha256::new_from_slice(&self.secret).map_err(|_| TokenError::Malformed)?;
        mac.update(&bytes);
        Ok(mac)
    }

    /// Signs `ident` (whose `key_id` must be this key's).
    pub fn sign(&self, ident: TokenIdentifier) -> Result<BlockToken, TokenError> {
        let mac = self.mac(&ident)?.finalize().into_bytes();
        let mut out = [0u8; KEY_LEN];
        out.copy_from_slice(&mac);
        Ok(BlockToken { ident, mac: out })
    }
}

/// The keys a DataNode accepts: previous, current and next.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeySet {
    /// Accepted keys, newest first.
    pub keys: Vec<BlockKey>,
}

/// What an op asks of its token.
#[derive(Debug, Clone, Copy)]
pub struct TokenCheck<'a> {
    /// The block of the op.
    pub block: BlockId,
    /// The generation stamp the token must name.
    pub gen_stamp: GenerationStamp,
    /// Also accept a token naming an older stamp (a copy of a replica whose stamp a pipeline
    /// recovery raised after the token was signed).
    pub older_ok: bool,
    /// The mode the op needs.
    pub mode: AccessMode,
    /// The DataNodes the op would forward to; each must be named by the token.
    pub targets: &'a [DatanodeId],
}

/// Why a token was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum TokenError {
    /// The op carried no token.
    #[error("no block access token")]
    Missing,
    /// The DataNode has no keys yet (not registered with the metadata service).
    #[error("no block keys yet: the DataNode has not registered with the metadata service")]
    NoKeys,
    /// Past its expiry.
    #[error("block access token expired at {expiry_ms} ms (now {now_ms} ms)")]
    Expired {
        /// The token's expiry.
        expiry_ms: u64,
        /// The DataNode's clock.
        now_ms: u64,
    },
    /// Signed by a key this DataNode does not hold (rolled out, or never issued).
    #[error("block access token signed by unknown key {key_id}")]
    UnknownKey {
        /// The token's key id.
        key_id: u32,
    },
    /// The MAC does not match.
    #[error("block access token signature does not match")]
    BadSignature,
    /// For another block.
    #[error("block access token is for block {token}, not {asked}")]
    WrongBlock {
        /// What the token names.
        token: BlockId,
        /// What the op names.
        asked: BlockId,
    },
    /// For another generation stamp.
    #[error("block access token is for generation stamp {token}, not {asked}")]
    WrongStamp {
        /// What the token names.
        token: GenerationStamp,
        /// What the op names.
        asked: GenerationStamp,
    },
    /// The mode is not allowed.
    #[error("block access token does not allow {mode:?}")]
    WrongMode {
        /// The mode the op needs.
        mode: AccessMode,
    },
    /// A DataNode the op would forward to is not named by the token.
    #[error("block access token does not allow forwarding to {target}")]
    TargetNotAllowed {
        /// The target refused.
        target: String,
    },
    /// The identifier could not be encoded.
    #[error("malformed block access token")]
    Malformed,
}

/// Milliseconds since the Unix epoch by the system clock (token expiry is wall-clock time,
/// compared across machines).
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

impl KeySet {
    /// Checks `token` against `want` at `now_ms`.
    pub fn check(
        &self,
        token: Option<&BlockToken>,
        want: &TokenCheck<'_>,
        now_ms: u64,
    ) -> Result<(), TokenError> {
        let token = token.ok_or(TokenError::Missing)?;
        if self.keys.is_empty() {
            return Err(TokenError::NoKeys);
        }
        let id = &token.ident;
        let key = self
            .keys
            .iter()
            .find(|k| k.id == id.key_id)
            .ok_or(TokenError::UnknownKey { key_id: id.key_id })?;
        key.mac(id)?
            .verify_slice(&token.mac)
            .map_err(|_| TokenError::BadSignature)?;
        if now_ms > id.expiry_ms {
            return Err(TokenError::Expired {
                expiry_ms: id.expiry_ms,
                now_ms,
            });
        }
        if id.block != want.block {
            return Err(TokenError::WrongBlock {
                token: id.block,
                asked: want.block,
            });
        }
        let stamp_ok =
            id.gen_stamp == want.gen_stamp || (want.older_ok && id.gen_stamp < want.gen_stamp);
        if !stamp_ok {
            return Err(TokenError::WrongStamp {
                token: id.gen_stamp,
                asked: want.gen_stamp,
            });
        }
        if !id.modes.contains(want.mode) {
            return Err(TokenError::WrongMode { mode: want.mode });
        }
        for t in want.targets {
            let named = id
                .targets
                .iter()
                .any(|n| n.node_id == t.node_id && n.data_addr == t.data_addr);
            if !named {
                return Err(TokenError::TargetNotAllowed {
                    target: t.to_string(),
                });
            }
        }
        Ok(())
    }
}

/// The metadata service's keys and token factory (plain logic: every call takes `now_ms`).
#[derive(Debug)]
pub struct BlockTokenSecretManager {
    interval_ms: u64,
    lifetime_ms: u64,
    current: BlockKey,
    next: BlockKey,
    previous: Option<BlockKey>,
    next_roll_ms: u64,
}

fn random_key(id: u32) -> BlockKey {
    let mut secret = [0u8; KEY_LEN];
    rand::rng().fill_bytes(&mut secret);
    BlockKey { id, secret }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl BlockTokenSecretManager {
    /// A manager with a fresh random key (its id random too, so that a restarted service
    /// does not reuse the ids of its previous keys).
    pub fn new(key_update_interval: Duration, token_lifetime: Duration, now_ms: u64) -> Self {
        let interval_ms = millis(key_update_interval).max(1);
        let first: u32 = rand::rng().random();
        BlockTokenSecretManager {
            interval_ms,
            lifetime_ms: millis(token_lifetime),
            current: random_key(first),
            next: random_key(first.wrapping_add(1)),
            previous: None,
            next_roll_ms: now_ms.saturating_add(interval_ms),
        }
    }

    /// Rolls the keys over when the interval has passed; true when it did.
    pub fn roll_if_due(&mut self, now_ms: u64) -> bool {
        if now_ms < self.next_roll_ms {
            return false;
        }
        let after = random_key(self.next.id.wrapping_add(1));
        let current = std::mem::replace(&mut self.next, after);
        self.previous = Some(std::mem::replace(&mut self.current, current));
        self.next_roll_ms = now_ms.saturating_add(self.interval_ms);
        true
    }

    /// The keys DataNodes must accept: current, next, then the previous one.
    pub fn keys(&self) -> KeySet {
        let mut keys = vec![self.current.clone(), self.next.clone()];
        keys.extend(self.previous.clone());
        KeySet { keys }
    }

    /// A token for `block` at `gen_stamp` allowing `modes` and forwarding to `targets`.
    pub fn generate(
        &mut self,
        block: BlockId,
        gen_stamp: GenerationStamp,
        modes: &[AccessMode],
        targets: &[DatanodeId],
        now_ms: u64,
    ) -> Result<BlockToken, TokenError> {
        self.roll_if_due(now_ms);
        self.current.sign(TokenIdentifier {
            key_id: self.current.id,
            expiry_ms: now_ms.saturating_add(self.lifetime_ms),
            block,
            gen_stamp,
            modes: AccessModes::of(modes),
            targets: targets.to_vec(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::NodeId;

    fn dn(n: &str) -> DatanodeId {
        DatanodeId {
            node_id: NodeId(n.into()),
            data_addr: format!("{n}:1"),
            http_addr: String::new(),
            rack: "/r".into(),
        }
    }

    fn want<'a>(b: u64, gs: u64, mode: AccessMode, targets: &'a [DatanodeId]) -> TokenCheck<'a> {
        TokenCheck {
            block: BlockId(b),
            gen_stamp: GenerationStamp(gs),
            older_ok: false,
            mode,
            targets,
        }
    }

    #[test]
    fn a_token_is_valid_only_for_its_block_stamp_mode_targets_and_lifetime() {
        let hour = Duration::from_secs(3600);
        let mut m = BlockTokenSecretManager::new(hour, hour, 1000);
        let t = m
            .generate(
                BlockId(7),
                GenerationStamp(3),
                &[AccessMode::Write],
                &[dn("b")],
                1000,
            )
            .unwrap();
        let keys = m.keys();
        let ok = keys.check(Some(&t), &want(7, 3, AccessMode::Write, &[dn("b")]), 2000);
        assert_eq!(ok, Ok(()));
        let e = |w: TokenCheck<'_>, now| keys.check(Some(&t), &w, now).unwrap_err();
        assert!(matches!(
            e(want(8, 3, AccessMode::Write, &[]), 2000),
            TokenError::WrongBlock { .. }
        ));
        assert!(matches!(
            e(want(7, 4, AccessMode::Write, &[]), 2000),
            TokenError::WrongStamp { .. }
        ));
        assert!(matches!(
            e(want(7, 3, AccessMode::Read, &[]), 2000),
            TokenError::WrongMode { .. }
        ));
        assert!(matches!(
            e(want(7, 3, AccessMode::Write, &[dn("evil")]), 2000),
            TokenError::TargetNotAllowed { .. }
        ));
        let mut moved = dn("b");
        moved.data_addr = "10.0.0.66:9866".into();
        assert!(matches!(
            e(want(7, 3, AccessMode::Write, &[moved]), 2000),
            TokenError::TargetNotAllowed { .. }
        ));
        assert!(matches!(
            e(want(7, 3, AccessMode::Write, &[]), 1000 + 3600 * 1000 + 1),
            TokenError::Expired { .. }
        ));
        assert_eq!(
            keys.check(None, &want(7, 3, AccessMode::Write, &[]), 2000),
            Err(TokenError::Missing)
        );
        assert_eq!(
            KeySet::default().check(Some(&t), &want(7, 3, AccessMode::Write, &[]), 2000),
            Err(TokenError::NoKeys)
        );
    }

    #[test]
    fn a_changed_identifier_or_a_foreign_key_is_refused() {
        let hour = Duration::from_secs(3600);
        let mut m = BlockTokenSecretManager::new(hour, hour, 0);
        let t = m
            .generate(BlockId(7), GenerationStamp(3), &[AccessMode::Read], &[], 0)
            .unwrap();
        let mut forged = t.clone();
        forged.ident.gen_stamp = GenerationStamp(u64::MAX);
        let keys = m.keys();
        let w = want(7, u64::MAX, AccessMode::Read, &[]);
        assert_eq!(
            keys.check(Some(&forged), &w, 1),
            Err(TokenError::BadSignature)
        );
        let mut other = BlockTokenSecretManager::new(hour, hour, 0);
        let foreign = other
            .generate(BlockId(7), GenerationStamp(3), &[AccessMode::Read], &[], 0)
            .unwrap();
        let r = keys.check(Some(&foreign), &want(7, 3, AccessMode::Read, &[]), 1);
        assert!(
            matches!(
                r,
                Err(TokenError::UnknownKey { .. }) | Err(TokenError::BadSignature)
            ),
            "{r:?}"
        );
    }

    #[test]
    fn tokens_survive_one_roll_over_and_not_two() {
        let s = Duration::from_secs(10);
        let mut m = BlockTokenSecretManager::new(s, s, 0);
        let t = m
            .generate(BlockId(1), GenerationStamp(1), &[AccessMode::Read], &[], 0)
            .unwrap();
        let w = want(1, 1, AccessMode::Read, &[]);
        let next = m.keys().keys[1].clone();
        assert!(m.roll_if_due(10_000));
        assert_eq!(m.keys().keys.len(), 3);
        assert_eq!(
            m.keys().keys[0],
            next,
            "the next key signs after a roll-over"
        );
        assert_eq!(m.keys().check(Some(&t), &w, 10_000), Ok(()));
        assert!(!m.roll_if_due(15_000));
        assert!(m.roll_if_due(20_000));
        assert!(matches!(
            m.keys().check(Some(&t), &w, 10_000),
            Err(TokenError::UnknownKey { .. })
        ));
    }

    #[test]
    fn secrets_stay_out_of_debug_output() {
        let m = BlockTokenSecretManager::new(Duration::from_secs(1), Duration::from_secs(1), 0);
        let text = format!("{:?} {:?}", m, m.keys());
        let k = &m.keys().keys[0];
        assert!(text.contains("redacted"));
        assert!(!text.contains(&format!("{:?}", k.secret)));
    }
}
