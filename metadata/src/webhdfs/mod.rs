//! The WebHDFS gateway on the metadata HTTP port (HDFS's NameNode half), under `/webhdfs/v1`:
//! namespace operations answered here ([`namespace`]), and `CREATE`, `APPEND`, `OPEN`,
//! `GETFILECHECKSUM` redirected to a DataNode's HTTP port ([`redirect`]), which does the data
//! half. Every change goes through the same [`ClientService`] calls as the tarpc client protocol,
//! so it is durable before the answer. Errors are `RemoteException` documents; see
//! `docs/webhdfs.md`.

mod namespace;
mod redirect;

use crate::rpc::ClientService;
use crate::service::Shared;
use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use serde_json::Value;
use sluice_common::webhdfs::params::{path_of, Op, Params};
use sluice_common::webhdfs::RemoteError;

/// Mounts the gateway under `/webhdfs/v1`.
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/webhdfs/v1{tail:.*}", web::route().to(dispatch));
}

/// One parsed request.
struct Request {
    path: String,
    params: Params,
    op: Op,
}

async fn dispatch(req: HttpRequest, shared: web::Data<Shared>) -> HttpResponse {
    let parsed = parse(&req);
    let res = match parsed {
        Ok(r) => handle(&r, shared.into_inner()).await,
        Err(e) => Err(e),
    };
    res.unwrap_or_else(|e| error_response(&e))
}

fn parse(req: &HttpRequest) -> Result<Request, RemoteError> {
    let path = path_of(req.path())?;
    let params = Params::parse(req.query_string())?;
    let op = params.op(req.method().as_str())?;
    Ok(Request { path, params, op })
}

async fn handle(r: &Request, shared: std::sync::Arc<Shared>) -> Result<HttpResponse, RemoteError> {
    let svc = ClientService::new(shared.clone());
    match r.op {
        Op::GetFileStatus => namespace::get_file_status(svc, r).await,
        Op::ListStatus => namespace::list_status(svc, r).await,
        Op::ListStatusBatch => namespace::list_status_batch(svc, r).await,
        Op::GetContentSummary => namespace::content_summary(&shared, r),
        Op::GetHomeDirectory => Ok(ok(sluice_common::webhdfs::json::path(&format!(
            "/user/{}",
            r.params.user()
        )))),
        Op::Mkdirs => namespace::mkdirs(svc, r).await,
        Op::Rename => namespace::rename(svc, r).await,
        Op::Delete => namespace::delete(svc, r).await,
        Op::SetReplication => namespace::set_replication(&shared, svc, r).await,
        Op::Create | Op::Append | Op::Open | Op::GetFileChecksum => {
            redirect::to_datanode(&shared, r)
        }
    }
}

/// A 200 with a JSON body.
fn ok(body: Value) -> HttpResponse {
    HttpResponse::Ok().json(body)
}

/// The `RemoteException` answer of an error.
pub fn error_response(e: &RemoteError) -> HttpResponse {
    let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    HttpResponse::build(status).json(e.to_json())
}
