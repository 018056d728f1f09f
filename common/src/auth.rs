//! The cluster secret and the challenge that proves it on a DataNode-protocol connection.
//!
//! Only a member of the cluster may register, heartbeat (and so learn the block keys and take
//! commands) or report replicas. When the metadata service has a [`ClusterSecret`], a
//! DataNode-protocol connection runs a mutual HMAC-SHA256 challenge right after its preamble,
//! before any RPC:
//!
//! ```text
//! DataNode                                   metadata service
//!   | "SLD1"                                   |
//!   |----------------------------------------->|
//!   |          "SLA1" + server nonce (32 bytes)|
//!   |<-----------------------------------------|
//!   | client nonce (32) + HMAC(secret, "dn" | sn | cn) (32)
//!   |----------------------------------------->|   wrong proof: connection closed
//!   |   "SLD1" + HMAC(secret, "meta" | sn | cn)|
//!   |<-----------------------------------------|   the DataNode checks it the same way
//! ```
//!
//! A service with security off (`metadata.security.enabled = false`) answers the preamble with
//! the plain echo (`"SLD1"`); a DataNode with security on refuses such a service.
//! The secret never travels, is never logged (`Debug` prints `<redacted>`) and never appears in
//! `/status`.

use hmac::{Hmac, Mac};
use rand::RngCore;
use sha2::Sha256;
use std::fmt;
use std::io;
use std::path::Path;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// What the service sends instead of the echo when it demands the secret.
pub const CHALLENGE_PREAMBLE: [u8; 4] = *b"SLA1";
/// Bytes of a nonce and of a proof.
pub const PROOF_LEN: usize = 32;
/// The environment variable that may hold the secret.
pub const SECRET_ENV: &str = "SLUICE_CLUSTER_SECRET";
/// Shortest secret accepted, in bytes.
pub const MIN_SECRET_LEN: usize = 16;

/// The shared secret of one cluster's members.
#[derive(Clone, PartialEq, Eq)]
pub struct ClusterSecret(Vec<u8>);

impl fmt::Debug for ClusterSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ClusterSecret(<redacted>)")
    }
}

impl ClusterSecret {
    /// A secret from its text (surrounding whitespace ignored); too short is an error.
    pub fn new(text: &str) -> io::Result<ClusterSecret> {
        let t = text.trim();
        if t.len() < MIN_SECRET_LEN {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "the cluster secret must be at least {MIN_SECRET_LEN} bytes (got {})",
                    t.len()
                ),
            ));
        }
        Ok(ClusterSecret(t.as_bytes().to_vec()))
    }

    /// A fresh random secret (64 hex digits).
    pub fn generate() -> ClusterSecret {
        let mut b = [0u8; 32];
        rand::rng().fill_bytes(&mut b);
        ClusterSecret(
            b.iter()
                .map(|x| format!("{x:02x}"))
                .collect::<String>()
                .into_bytes(),
        )
    }

    /// The secret's text, to hand to another member (write it to a file only).
    pub fn expose(&self) -> &str {
        std::str::from_utf8(&self.0).unwrap_or_default()
    }

    /// Reads the secret from `path`.
    pub fn read_file(path: &Path) -> io::Result<ClusterSecret> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("reading the cluster secret {}: {e}", path.display()),
            )
        })?;
        ClusterSecret::new(&text)
    }

    /// Reads the secret from `path`, or generates one and writes it there (mode 0600, fsynced)
    /// when the file does not exist.
    pub fn read_or_create(path: &Path) -> io::Result<ClusterSecret> {
        match ClusterSecret::read_file(path) {
            Ok(s) => Ok(s),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let s = ClusterSecret::generate();
                if let Some(dir) = path.parent() {
                    std::fs::create_dir_all(dir)?;
                }
                let tmp = path.with_extension("tmp");
                {
                    use std::io::Write;
                    let mut opts = std::fs::OpenOptions::new();
                    opts.write(true).create(true).truncate(true);
                    #[cfg(unix)]
                    std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
                    let mut f = opts.open(&tmp)?;
                    f.write_all(s.expose().as_bytes())?;
                    f.sync_all()?;
                }
                std::fs::rename(&tmp, path)?;
                Ok(s)
            }
            Err(e) => Err(e),
        }
    }

    /// The secret from `file` when it is set (missing: an error), else from the
    /// [`SECRET_ENV`] environment variable, else none.
    pub fn resolve(file: &Path) -> io::Result<Option<ClusterSecret>> {
        if !file.as_os_str().is_empty() {
            return ClusterSecret::read_file(file).map(Some);
        }
        match std::env::var(SECRET_ENV) {
            Ok(v) if !v.trim().is_empty() => ClusterSecret::new(&v).map(Some),
            _ => Ok(None),
        }
    }

    /// As [`ClusterSecret::resolve`], but a `file` that does not exist yet is created with a
    /// fresh secret (the metadata service's side: `sluice local` and the compose cluster
    /// generate their secret this way).
    pub fn resolve_or_create(file: &Path) -> io::Result<Option<ClusterSecret>> {
        if !file.as_os_str().is_empty() {
            return ClusterSecret::read_or_create(file).map(Some);
        }
        ClusterSecret::resolve(file)
    }

    fn proof(&self, role: &[u8], server_nonce: &[u8], client_nonce: &[u8]) -> [u8; PROOF_LEN] {
        let mut out = [0u8; PROOF_LEN];
        if let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(&self.0) {
            mac.update(role);
            mac.update(server_nonce);
            mac.update(client_nonce);
            out.copy_from_slice(&mac.finalize().into_bytes());
        }
        out
    }

    fn verify(&self, role: &[u8], sn: &[u8], cn: &[u8], proof: &[u8]) -> bool {
        match Hmac::<Sha256>::new_from_slice(&self.0) {
            Ok(mut mac) => {
                mac.update(role);
                mac.update(sn);
                mac.update(cn);
                mac.verify_slice(proof).is_ok()
            }
            Err(_) => false,
        }
    }
}

/// True when a secret is configured for a DataNode: a `file` (which may appear later), or a
/// non-empty [`SECRET_ENV`].
pub fn secret_configured(file: &Path) -> bool {
    !file.as_os_str().is_empty() || std::env::var(SECRET_ENV).is_ok_and(|v| !v.trim().is_empty())
}

/// Why a service with security on (`<section>.security.enabled`, the default) cannot start:
/// the message names every way of setting the secret and the switch that turns security off.
pub fn missing_secret(section: &str) -> String {
    format!(
        "security is on ({section}.security.enabled = true, the default) and no cluster secret \
         is set: set {section}.cluster.secret.file (a file of at least {MIN_SECRET_LEN} bytes) \
         or the {SECRET_ENV} environment variable, or run without member authentication with \
         {section}.security.enabled = false"
    )
}

/// The warning every service logs at start-up when `<section>.security.enabled = false`.
pub fn security_off_warning(section: &str) -> String {
    format!(
        "security is off ({section}.security.enabled = false): no cluster secret is proven or \
         demanded; any host may register as a DataNode, learn the block keys and sign block \
         access tokens"
    )
}

fn nonce() -> [u8; PROOF_LEN] {
    let mut n = [0u8; PROOF_LEN];
    rand::rng().fill_bytes(&mut n);
    n
}

fn denied(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::PermissionDenied, msg.to_string())
}

/// The service's side, after it read a DataNode preamble: challenges the peer and proves
/// itself. An error means the peer is not a member (the caller closes the connection).
pub async fn challenge<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    secret: &ClusterSecret,
    preamble: [u8; 4],
) -> io::Result<()> {
    let sn = nonce();
    let mut hello = CHALLENGE_PREAMBLE.to_vec();
    hello.extend_from_slice(&sn);
    stream.write_all(&hello).await?;
    let mut answer = [0u8; 2 * PROOF_LEN];
    stream.read_exact(&mut answer).await?;
    let (cn, proof) = answer.split_at(PROOF_LEN);
    if !secret.verify(b"dn", &sn, cn, proof) {
        return Err(denied("wrong cluster-secret proof"));
    }
    let mut ok = preamble.to_vec();
    ok.extend_from_slice(&secret.proof(b"meta", &sn, cn));
    stream.write_all(&ok).await
}

/// The DataNode's side, after it sent its preamble: answers the service's challenge and
/// checks the service's proof. With a `secret` (security on) the service must challenge: a
/// plain echo — a service with security off, or one that is not the cluster's — is refused,
/// so that no unauthenticated service can hand this DataNode commands. Without one (security
/// off) only the plain echo is accepted.
pub async fn answer<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    secret: Option<&ClusterSecret>,
    preamble: [u8; 4],
) -> io::Result<()> {
    let mut first = [0u8; 4];
    stream.read_exact(&mut first).await?;
    if first == preamble {
        if secret.is_some() {
            return Err(denied(
                "the metadata service did not ask for the cluster secret: it runs with \
                 metadata.security.enabled = false, or it is not this cluster's service",
            ));
        }
        return Ok(());
    }
    if first != CHALLENGE_PREAMBLE {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("not a Sluice metadata service: it answered {first:?} to the preamble"),
        ));
    }
    let Some(secret) = secret else {
        return Err(denied(
            "the metadata service demands the cluster secret and none is configured",
        ));
    };
    let mut sn = [0u8; PROOF_LEN];
    stream.read_exact(&mut sn).await?;
    let cn = nonce();
    let mut reply = cn.to_vec();
    reply.extend_from_slice(&secret.proof(b"dn", &sn, &cn));
    stream.write_all(&reply).await?;
    let mut ok = [0u8; 4 + PROOF_LEN];
    stream.read_exact(&mut ok).await.map_err(|e| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            denied("the metadata service refused this DataNode's cluster secret")
        } else {
            e
        }
    })?;
    let (echo, proof) = ok.split_at(4);
    if echo != preamble || !secret.verify(b"meta", &sn, &cn, proof) {
        return Err(denied(
            "the metadata service did not prove the cluster secret",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: [u8; 4] = *b"SLD1";

    async fn run(server: &ClusterSecret, client: Option<&ClusterSecret>) -> (bool, bool) {
        let (mut a, mut b) = tokio::io::duplex(1024);
        let s = server.clone();
        let srv = tokio::spawn(async move {
            let r = challenge(&mut b, &s, P).await;
            drop(b);
            r.is_ok()
        });
        let c = answer(&mut a, client, P).await.is_ok();
        drop(a);
        (srv.await.unwrap(), c)
    }

    #[tokio::test]
    async fn members_pass_and_strangers_are_refused() {
        let s = ClusterSecret::generate();
        assert_eq!(run(&s, Some(&s)).await, (true, true));
        let other = ClusterSecret::generate();
        assert_eq!(run(&s, Some(&other)).await, (false, false));
        let (srv, cli) = run(&s, None).await;
        assert!(!cli && !srv);
    }

    /// A service with security off answers the preamble with a plain echo.
    async fn answer_echo(client: Option<&ClusterSecret>) -> io::Result<()> {
        let (mut a, mut b) = tokio::io::duplex(1024);
        tokio::spawn(async move {
            let mut pre = [0u8; 4];
            let _ = b.read_exact(&mut pre).await;
            let _ = b.write_all(&pre).await;
            let mut rest = Vec::new();
            let _ = b.read_to_end(&mut rest).await;
        });
        a.write_all(&P).await?;
        answer(&mut a, client, P).await
    }

    #[tokio::test]
    async fn a_datanode_with_a_secret_refuses_a_service_that_does_not_challenge() {
        let s = ClusterSecret::generate();
        let e = answer_echo(Some(&s)).await.expect_err("refused");
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
        assert!(e.to_string().contains("security.enabled"), "{e}");
        answer_echo(None)
            .await
            .expect("security off: the echo is accepted");
    }

    #[test]
    fn the_start_up_refusal_names_the_keys_the_variable_and_the_switch() {
        let m = missing_secret("datanode");
        for want in [
            "datanode.cluster.secret.file",
            SECRET_ENV,
            "datanode.security.enabled = false",
        ] {
            assert!(m.contains(want), "{m}");
        }
    }

    #[test]
    fn secrets_are_long_enough_hidden_and_kept_in_a_file() {
        assert!(ClusterSecret::new("short").is_err());
        let s = ClusterSecret::new("  a-secret-of-enough-length \n").unwrap();
        assert_eq!(s.expose(), "a-secret-of-enough-length");
        assert!(!format!("{s:?}").contains("enough"));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/cluster-secret");
        let made = ClusterSecret::read_or_create(&path).unwrap();
        assert_eq!(ClusterSecret::read_or_create(&path).unwrap(), made);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o077, 0, "{mode:o}");
        }
    }
}
