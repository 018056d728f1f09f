//! Fuzz target bodies for the decoders this crate owns (cargo feature `fuzzing`; see
//! `docs/security.md`, "Fuzzing"): the data-transfer frame decoder ([`frame`]) and the block
//! access token parser ([`token`]). The harness in `fuzz/` calls them with the fuzzer's inputs;
//! the unit tests below replay every input kept in `fuzz/regressions/<target>/` and the
//! starting inputs ([`seeds`]), so an input that once found a bug is checked by plain
//! `cargo test`.
//!
//! Each body panics when an invariant breaks, which is what the fuzzer reports as a crash.

use crate::frame::{decode_header, Frame, FrameCodec, DEFAULT_MAX_FRAME, GROW_STEP};
use crate::proto::Message;
use crate::token::{AccessMode, BlockKey, BlockToken, KeySet, TokenCheck, TokenError};
use crate::FrameError;
use bytes::BytesMut;
use tokio_util::codec::{Decoder, Encoder};

mod seeds;
pub use seeds::seeds;

/// What decoding a byte stream gave: its frames, then how it stopped.
#[derive(Debug, PartialEq)]
struct Decoded {
    frames: Vec<Frame<Message>>,
    /// The error that stopped decoding (its `Display`), if any.
    error: Option<String>,
    /// Bytes left over (an incomplete frame) when no error stopped it.
    rest: usize,
}

/// Feeds `data` to one [`FrameCodec`] in pieces of `piece` bytes, decoding after each piece,
/// and checks that the decoder never holds much more memory than the bytes that arrived.
fn decode_in_pieces(data: &[u8], piece: usize) -> Decoded {
    let mut codec = FrameCodec::<Message>::new(DEFAULT_MAX_FRAME);
    let mut src = BytesMut::new();
    let mut frames = Vec::new();
    for chunk in data.chunks(piece.max(1)) {
        src.extend_from_slice(chunk);
        loop {
            match codec.decode(&mut src) {
                Ok(Some(f)) => frames.push(f),
                Ok(None) => break,
                Err(e) => {
                    return Decoded {
                        frames,
                        error: Some(e.to_string()),
                        rest: 0,
                    }
                }
            }
        }
        // Waiting for more, the buffer has grown with the bytes that arrived, never with what
        // a prefix announced (BytesMut may double what it holds, hence the factor).
        assert!(
            src.capacity() <= 2 * (src.len() + piece + GROW_STEP),
            "decoder holds {} bytes for {} buffered",
            src.capacity(),
            src.len()
        );
    }
    Decoded {
        frames,
        error: None,
        rest: src.len(),
    }
}

/// The frame decoder on `data` as a peer's byte stream: never panics, decodes the same frames
/// and stops at the same error whether the bytes arrive at once or in pieces (the first byte
/// picks the piece size), never reserves what a prefix merely announces, and every frame it
/// decodes encodes back to a frame that decodes to itself.
pub fn frame(data: &[u8]) {
    let Some((&first, _)) = data.split_first() else {
        return;
    };
    let whole = decode_in_pieces(data, data.len());
    let pieces = decode_in_pieces(data, usize::from(first % 97) + 1);
    assert_eq!(whole, pieces, "decoding depends on how the bytes arrive");
    let mut codec = FrameCodec::<Message>::new(DEFAULT_MAX_FRAME);
    for f in whole.frames {
        let mut wire = BytesMut::new();
        codec
            .encode(f.clone(), &mut wire)
            .expect("a decoded frame encodes");
        let again = codec.decode(&mut wire).expect("re-decodes");
        assert_eq!(again.as_ref(), Some(&f), "round trip changed the frame");
        assert!(wire.is_empty(), "round trip left bytes");
    }
}

/// The key the token target checks against.
fn fuzz_key() -> BlockKey {
    BlockKey {
        id: 7,
        secret: [0x5a; crate::token::KEY_LEN],
    }
}

/// The block access token parser on `data`: decoding a token never panics; a decoded token is
/// refused unless its MAC is the key's (the fuzzer does not know the key); re-signed with the
/// key it passes exactly the checks its identifier allows.
pub fn token(data: &[u8]) {
    let Ok(token) = decode_header::<BlockToken>(data) else {
        return;
    };
    let keys = KeySet {
        keys: vec![fuzz_key()],
    };
    let ident = &token.ident;
    let mode = [
        AccessMode::Read,
        AccessMode::Write,
        AccessMode::Copy,
        AccessMode::Replace,
        AccessMode::Recover,
    ]
    .into_iter()
    .find(|m| ident.modes.contains(*m))
    .unwrap_or(AccessMode::Read);
    let want = TokenCheck {
        block: ident.block,
        gen_stamp: ident.gen_stamp,
        older_ok: false,
        mode,
        targets: &ident.targets,
    };
    // As sent: only a MAC under the key passes, and the fuzzer cannot make one.
    let forged = keys.check(Some(&token), &want, 0);
    let signed = (ident.key_id == fuzz_key().id).then(|| fuzz_key().sign(ident.clone()));
    if let Some(Ok(good)) = &signed {
        assert_eq!(
            forged.is_ok(),
            good.mac == token.mac,
            "a MAC other than the key's was accepted"
        );
    } else {
        assert!(forged.is_err(), "a token under an unknown key was accepted");
    }
    // Re-signed: every check its identifier allows passes; anything else is refused.
    let Some(Ok(good)) = signed else { return };
    let ok = keys.check(Some(&good), &want, 0);
    if ident.modes.contains(mode) {
        assert_eq!(ok, Ok(()), "a well-signed token was refused");
    } else {
        assert_eq!(ok, Err(TokenError::WrongMode { mode }));
    }
    if let Some(later) = ident.expiry_ms.checked_add(1) {
        assert!(matches!(
            keys.check(Some(&good), &want, later),
            Err(TokenError::Expired { .. })
        ));
    }
    // Its wire form decodes to itself.
    let bytes = crate::frame::encode_header(&good).expect("encodes");
    let back: Result<BlockToken, FrameError> = decode_header(&bytes);
    assert!(back.ok().as_ref() == Some(&good), "token round trip");
}

/// Replays `target`'s [`seeds`] and the inputs kept under `fuzz/regressions/<target>/` (next
/// to the crate at `manifest_dir`) through `body`: the regression tests of the crates that own
/// the fuzzed code. Returns how many inputs ran.
pub fn replay(manifest_dir: &str, target: &str, body: fn(&[u8])) -> usize {
    let mut inputs: Vec<(String, Vec<u8>)> = seeds()
        .into_iter()
        .filter(|(t, ..)| *t == target)
        .map(|(_, name, bytes)| (format!("seed {name}"), bytes))
        .collect();
    let dir = std::path::Path::new(manifest_dir)
        .join("../fuzz/regressions")
        .join(target);
    for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if let Ok(bytes) = std::fs::read(&path) {
            inputs.push((path.display().to_string(), bytes));
        }
    }
    for (name, bytes) in &inputs {
        let caught = std::panic::catch_unwind(|| body(bytes));
        assert!(caught.is_ok(), "fuzz input {name} fails");
    }
    inputs.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_regressions_pass() {
        assert!(replay(env!("CARGO_MANIFEST_DIR"), "frame", frame) > 0);
    }

    #[test]
    fn token_regressions_pass() {
        assert!(replay(env!("CARGO_MANIFEST_DIR"), "token", token) > 0);
    }

    #[test]
    fn a_prefix_announcing_the_maximum_costs_only_what_arrived() {
        // The decoder bound, as the fuzz body checks it: 16 MiB announced, 20 bytes sent.
        let mut data = (DEFAULT_MAX_FRAME as u32).to_be_bytes().to_vec();
        data.extend_from_slice(&[0u8; 20]);
        frame(&data);
    }
}
