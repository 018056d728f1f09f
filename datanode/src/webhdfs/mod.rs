//! The data half of WebHDFS on the DataNode HTTP port (HDFS's DataNode `WebHdfsHandler`): the
//! metadata service redirects `CREATE`, `APPEND`, `OPEN` and `GETFILECHECKSUM` here, and this
//! DataNode serves them as a client of its own cluster through `sluice-client` (as HDFS's
//! DataNode uses a DFSClient): uploads go through the normal replicated write pipeline
//! ([`upload`]), downloads through the normal reader with its replica failover ([`download`]).
//! Bodies stream through bounded channels; the client's work runs on the node's multi-thread
//! runtime, not on the HTTP worker. See `docs/webhdfs.md`.

mod download;
mod upload;

use crate::context::Ctx;
use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use sluice_client::{ClientConfig, ClientError, FileSystem};
use sluice_common::webhdfs::params::{path_of, Op, Params};
use sluice_common::webhdfs::RemoteError;
use std::future::Future;
use tokio::sync::OnceCell;

/// The gateway's state: the node and its client (connected on first use).
pub(crate) struct Gateway {
    ctx: Ctx,
    fs: OnceCell<FileSystem>,
}

impl Gateway {
    /// A gateway for the node; nothing connects until the first request.
    pub fn new(ctx: Ctx) -> Self {
        Gateway {
            ctx,
            fs: OnceCell::new(),
        }
    }

    /// Runs `fut` on the node's runtime (where the client's tasks live) and waits for it.
    async fn run<T: Send + 'static>(
        &self,
        fut: impl Future<Output = Result<T, RemoteError>> + Send + 'static,
    ) -> Result<T, RemoteError> {
        self.ctx
            .io
            .spawn(fut)
            .await
            .map_err(|e| RemoteError::io(format!("gateway task failed: {e}")))?
    }

    /// The client, connected to the metadata service the node reports to.
    async fn fs(&self) -> Result<FileSystem, RemoteError> {
        let cfg = ClientConfig {
            metadata_address: self.ctx.cfg.metadata_address.clone(),
            socket_timeout: self.ctx.cfg.socket_timeout,
            ..ClientConfig::default()
        };
        let fs = self
            .fs
            .get_or_try_init(|| {
                self.run(async move { FileSystem::connect(cfg).await.map_err(|e| to_remote(&e)) })
            })
            .await?;
        Ok(fs.clone())
    }
}

/// Mounts the gateway under `/webhdfs/v1`.
pub(crate) fn configure(cfg: &mut web::ServiceConfig, gateway: web::Data<Gateway>) {
    cfg.app_data(gateway)
        .route("/webhdfs/v1{tail:.*}", web::route().to(dispatch));
}

async fn dispatch(req: HttpRequest, payload: web::Payload, gw: web::Data<Gateway>) -> HttpResponse {
    let res = match parse(&req) {
        Ok((path, params, op)) => match op {
            Op::Create => upload::create(&gw, path, &params, payload).await,
            Op::Append => upload::append(&gw, path, payload).await,
            Op::Open => download::open(&gw, path, &params).await,
            Op::GetFileChecksum => download::checksum(&gw, path).await,
            _ => Err(RemoteError::unsupported(
                "this operation is served by the metadata service's HTTP port, not a DataNode's",
            )),
        },
        Err(e) => Err(e),
    };
    res.unwrap_or_else(|e| error_response(&e))
}

fn parse(req: &HttpRequest) -> Result<(String, Params, Op), RemoteError> {
    let path = path_of(req.path())?;
    let params = Params::parse(req.query_string())?;
    let op = params.op(req.method().as_str())?;
    Ok((path, params, op))
}

/// The `RemoteException` answer of an error.
fn error_response(e: &RemoteError) -> HttpResponse {
    let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    HttpResponse::build(status).json(e.to_json())
}

/// A client error as a WebHDFS client sees it.
fn to_remote(e: &ClientError) -> RemoteError {
    match e {
        ClientError::Meta(m) => m.into(),
        ClientError::InvalidArgument { .. } => {
            RemoteError::new(400, "IllegalArgumentException", e.to_string())
        }
        _ => RemoteError::io(e.to_string()),
    }
}
