//! `CREATE` (step 2): the request body is written through the normal replicated pipeline. The
//! body travels to the writer task through a bounded channel, so an upload holds a few HTTP
//! chunks plus the writer's packet window, whatever its size. The file is completed only after
//! the body's last byte and an explicit end marker: a body cut short (the HTTP client gone, the
//! handler dropped) or a failed write deletes the new file, so half a file is never marked
//! complete. A DataNode failing mid-upload is the writer's pipeline recovery, as for any write.
//!
//! `APPEND` (step 2, POST) takes the same road through an append writer (`FileSystem::append`:
//! each request is one whole append, new generation stamp and pipeline, as HDFS). Its file
//! existed before, so a body cut short or a failed write is not undone: the writer is closed
//! with what the pipeline acknowledged (as HDFS's DataNode closes its `DFSOutputStream`), and
//! the answer is the error.

use super::{to_remote, Gateway};
use actix_web::{web, HttpResponse};
use bytes::Bytes;
use futures::StreamExt;
use sluice_client::{ClientError, FileSystem, WriteOptions};
use sluice_common::webhdfs::params::Params;
use sluice_common::webhdfs::RemoteError;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

/// HTTP chunks queued between the request and the writer.
const QUEUE: usize = 8;

/// One item from the request to the writer task.
enum Piece {
    Data(Bytes),
    /// The body ended normally: complete the file.
    End,
}

/// How an upload task ended.
enum Failure {
    /// Before the file was opened for writing: nothing to clean up.
    Create(ClientError),
    /// After: a new file is deleted; an appended one keeps what was acknowledged.
    Write(RemoteError),
}

/// What an upload writes.
#[derive(Clone)]
enum Mode {
    /// A new file (`CREATE`).
    Create(WriteOptions),
    /// The end of an existing file (`APPEND`).
    Append,
}

pub(super) async fn create(
    gw: &Gateway,
    path: String,
    params: &Params,
    payload: web::Payload,
) -> Result<HttpResponse, RemoteError> {
    let opts = WriteOptions {
        overwrite: params.flag("overwrite", false),
        create_parent: params.flag("createparent", true),
        replication: params
            .number("replication")
            .and_then(|r| u16::try_from(r).ok()),
        block_size: params.number("blocksize"),
    };
    upload(gw, path, Mode::Create(opts), payload).await
}

/// `APPEND`: the body is appended to the file; the answer is `200 OK` without a body.
pub(super) async fn append(
    gw: &Gateway,
    path: String,
    payload: web::Payload,
) -> Result<HttpResponse, RemoteError> {
    upload(gw, path, Mode::Append, payload).await
}

async fn upload(
    gw: &Gateway,
    path: String,
    mode: Mode,
    mut payload: web::Payload,
) -> Result<HttpResponse, RemoteError> {
    let fs = gw.fs().await?;
    let (tx, rx) = mpsc::channel(QUEUE);
    let task = gw
        .ctx
        .io
        .spawn(write_file(fs.clone(), path.clone(), mode.clone(), rx));
    let mut body_error = None;
    while let Some(chunk) = payload.next().await {
        match chunk {
            Ok(b) => {
                if tx.send(Piece::Data(b)).await.is_err() {
                    break; // the writer failed; its error is the answer
                }
            }
            Err(e) => {
                body_error = Some(e.to_string());
                break;
            }
        }
    }
    if body_error.is_none() {
        let _ = tx.send(Piece::End).await;
    }
    drop(tx);
    let ended = task
        .await
        .map_err(|e| RemoteError::io(format!("upload task failed: {e}")))?;
    match ended {
        Ok(_) if matches!(mode, Mode::Append) => Ok(HttpResponse::Ok().finish()),
        Ok(_) => Ok(HttpResponse::Created()
            .insert_header((
                "Location",
                format!("hdfs://{}{path}", gw.ctx.cfg.metadata_address),
            ))
            .finish()),
        Err(Failure::Create(e)) => Err(to_remote(&e)),
        Err(Failure::Write(e)) => {
            let why = body_error.map_or(e, |b| RemoteError::io(format!("request body: {b}")));
            if matches!(mode, Mode::Create(_)) {
                discard(gw, fs, path).await;
            } else {
                tracing::warn!(%path, error = %why, "WebHDFS append failed; the file keeps what was acknowledged");
            }
            Err(why)
        }
    }
}

/// Creates (or reopens for append) the file and writes what arrives; a new file is closed
/// only after [`Piece::End`], an appended one in any case.
async fn write_file(
    fs: FileSystem,
    path: String,
    mode: Mode,
    mut rx: mpsc::Receiver<Piece>,
) -> Result<u64, Failure> {
    let append = matches!(mode, Mode::Append);
    let mut w = match mode {
        Mode::Create(opts) => fs.create(&path, opts).await,
        Mode::Append => fs.append(&path).await,
    }
    .map_err(Failure::Create)?;
    let fail = |e: ClientError| Failure::Write(to_remote(&e));
    let mut failure = None;
    loop {
        match rx.recv().await {
            Some(Piece::Data(b)) => {
                if let Err(e) = w.write_all(&b).await {
                    failure = Some(RemoteError::io(format!("writing {path}: {e}")));
                    break;
                }
            }
            Some(Piece::End) => break,
            None => {
                failure = Some(RemoteError::io("the request body ended before its end"));
                break;
            }
        }
    }
    if let Some(f) = failure {
        if append {
            let _ = w.close().await;
        }
        return Err(Failure::Write(f));
    }
    w.close().await.map_err(fail)?;
    Ok(w.bytes_written())
}

/// Deletes a file whose upload failed (its writer has stopped).
async fn discard(gw: &Gateway, fs: FileSystem, path: String) {
    let p = path.clone();
    let res = gw
        .run(async move { fs.delete(&p, false).await.map_err(|e| to_remote(&e)) })
        .await;
    match res {
        Ok(_) => tracing::warn!(%path, "WebHDFS upload failed; the partial file was deleted"),
        Err(e) => {
            tracing::error!(%path, error = %e, "WebHDFS upload failed and deleting it failed")
        }
    }
}
