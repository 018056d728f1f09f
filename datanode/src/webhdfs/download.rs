//! `OPEN` (step 2) and `GETFILECHECKSUM`: the file is read through the normal reader (checksums
//! verified, failover to another replica on a bad or dead one). `OPEN` streams the range
//! `[offset, offset + length)` (to the end without `length`) through a bounded channel with a
//! `Content-Length`; a read failure mid-stream cuts the body short, which the HTTP client sees.
//! The checksum is the client's [`sluice_client::FileSystem::file_checksum`]
//! (`COMPOSITE-CRC32C`: equal for equal contents whatever the block size).

use super::{to_remote, Gateway};
use actix_web::HttpResponse;
use bytes::Bytes;
use sluice_client::FileReader;
use sluice_common::webhdfs::params::Params;
use sluice_common::webhdfs::{json, RemoteError};
use std::io::SeekFrom;
use tokio::io::AsyncSeekExt;
use tokio::sync::mpsc;

/// Bytes per piece sent to the HTTP response.
const PIECE: usize = 64 * 1024;
/// Pieces queued between the reader and the response.
const QUEUE: usize = 4;

pub(super) async fn open(
    gw: &Gateway,
    path: String,
    params: &Params,
) -> Result<HttpResponse, RemoteError> {
    let fs = gw.fs().await?;
    let offset = params.number("offset").unwrap_or(0);
    let (reader, len) = gw
        .run(async move {
            let mut r = fs.open(&path).await.map_err(|e| to_remote(&e))?;
            let len = r.len();
            if offset > len {
                return Err(RemoteError::io(format!(
                    "Offset={offset} out of the range [0, {len}] of {path}"
                )));
            }
            r.seek(SeekFrom::Start(offset))
                .await
                .map_err(|e| RemoteError::io(e.to_string()))?;
            Ok((r, len))
        })
        .await?;
    let n = params
        .number("length")
        .unwrap_or(u64::MAX)
        .min(len - offset);
    let (tx, rx) = mpsc::channel(QUEUE);
    gw.ctx.io.spawn(pump(reader, n, tx));
    let body = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|piece| (piece, rx))
    });
    Ok(HttpResponse::Ok()
        .content_type("application/octet-stream")
        .no_chunking(n)
        .streaming(body))
}

/// Sends `n` bytes of `reader` in pieces until done, failed, or the response is gone. The
/// pieces are the reader's own received buffers (`read_bytes`: no copy on the way).
async fn pump(mut reader: FileReader, n: u64, tx: mpsc::Sender<std::io::Result<Bytes>>) {
    let mut left = n;
    while left > 0 {
        let max = usize::try_from(left).unwrap_or(usize::MAX).min(PIECE);
        match reader.read_bytes(max).await {
            Ok(b) if b.is_empty() => return,
            Ok(b) => {
                left -= b.len() as u64;
                if tx.send(Ok(b)).await.is_err() {
                    return;
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "WebHDFS OPEN failed mid-stream");
                let _ = tx.send(Err(e.into())).await;
                return;
            }
        }
    }
}

pub(super) async fn checksum(gw: &Gateway, path: String) -> Result<HttpResponse, RemoteError> {
    let fs = gw.fs().await?;
    let sum = gw
        .run(async move { fs.file_checksum(&path).await.map_err(|e| to_remote(&e)) })
        .await?;
    Ok(HttpResponse::Ok().json(json::file_checksum(sum.algorithm(), &sum.bytes())))
}
