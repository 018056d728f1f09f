//! The namespace operations of the gateway: status, listings, content summary, mkdirs, rename,
//! delete, set replication. Changes call the tarpc handlers ([`ClientService`]); the content summary walks the
//! tree under one lock (a consistent snapshot).

use super::{ok, Request};
use crate::rpc::ClientService;
use crate::service::Shared;
use actix_web::HttpResponse;
use sluice_common::rpc::{ClientProtocol, FileKind, FileStatus};
use sluice_common::webhdfs::json::{self, ContentSummary};
use sluice_common::webhdfs::params::normalize;
use sluice_common::webhdfs::RemoteError;
use sluice_common::MetaError;
use tarpc::context;

/// Entries per `LISTSTATUS_BATCH` answer (HDFS `dfs.ls.limit`).
const LIST_BATCH: usize = 1000;

pub(super) async fn get_file_status(
    svc: ClientService,
    r: &Request,
) -> Result<HttpResponse, RemoteError> {
    let st = svc.stat(context::current(), r.path.clone()).await?;
    Ok(ok(json::file_status_doc(&st)))
}

pub(super) async fn list_status(
    svc: ClientService,
    r: &Request,
) -> Result<HttpResponse, RemoteError> {
    let entries = svc.list(context::current(), r.path.clone()).await?;
    Ok(ok(json::file_statuses(&r.path, &entries)))
}

/// One batch of entries whose names sort after `startAfter`.
pub(super) async fn list_status_batch(
    svc: ClientService,
    r: &Request,
) -> Result<HttpResponse, RemoteError> {
    let entries = svc.list(context::current(), r.path.clone()).await?;
    let after = r.params.get("startafter").unwrap_or("");
    let rest: Vec<FileStatus> = entries
        .into_iter()
        .filter(|e| e.path == r.path || json::name_of(&e.path) > after)
        .collect();
    let n = rest.len().min(LIST_BATCH);
    Ok(ok(json::directory_listing(
        &r.path,
        &rest[..n],
        rest.len() - n,
    )))
}

pub(super) fn content_summary(shared: &Shared, r: &Request) -> Result<HttpResponse, RemoteError> {
    let sum = shared.read("content_summary", |s, _| {
        let mut sum = ContentSummary::default();
        let mut stack = vec![s.stat(&r.path)?];
        while let Some(st) = stack.pop() {
            match st.kind {
                FileKind::Directory => {
                    sum.directory_count += 1;
                    stack.extend(s.list(&st.path)?);
                }
                FileKind::File => {
                    sum.file_count += 1;
                    sum.length += st.length;
                    sum.space_consumed += st.length * u64::from(st.replication);
                }
            }
        }
        Ok(sum)
    })?;
    Ok(ok(sum.to_json()))
}

pub(super) async fn mkdirs(svc: ClientService, r: &Request) -> Result<HttpResponse, RemoteError> {
    svc.mkdirs(context::current(), r.path.clone(), true).await?;
    Ok(ok(json::boolean(true)))
}

/// HDFS's rename (not rename2): into `destination` when it is a directory; `false` (not an
/// error) when the source is missing, the destination exists or its parent does not.
pub(super) async fn rename(svc: ClientService, r: &Request) -> Result<HttpResponse, RemoteError> {
    let Some(dest) = r.params.get("destination") else {
        return Err(RemoteError::bad_param("destination", "", "missing"));
    };
    let mut dst = normalize(dest)?;
    if !dest.starts_with('/') {
        return Err(RemoteError::bad_param(
            "destination",
            dest,
            "not an absolute path",
        ));
    }
    if let Ok(st) = svc.clone().stat(context::current(), dst.clone()).await {
        if st.kind == FileKind::Directory && dst != r.path {
            dst = format!("{}/{}", dst.trim_end_matches('/'), json::name_of(&r.path));
        }
    }
    match svc.rename(context::current(), r.path.clone(), dst).await {
        Ok(()) => Ok(ok(json::boolean(true))),
        Err(
            MetaError::NotFound { .. }
            | MetaError::AlreadyExists { .. }
            | MetaError::NotADirectory { .. },
        ) => Ok(ok(json::boolean(false))),
        Err(e) => Err(e.into()),
    }
}

pub(super) async fn delete(svc: ClientService, r: &Request) -> Result<HttpResponse, RemoteError> {
    let recursive = r.params.flag("recursive", false);
    let deleted = svc
        .delete(context::current(), r.path.clone(), recursive)
        .await?;
    Ok(ok(json::boolean(deleted)))
}

/// HDFS `setReplication`: `true` for a file (the repair pass then copies or deletes replicas
/// until every block has the new factor), `false` for a directory; without `replication` the
/// cluster's `replication.default`, as HDFS's `ReplicationParam`.
pub(super) async fn set_replication(
    shared: &Shared,
    svc: ClientService,
    r: &Request,
) -> Result<HttpResponse, RemoteError> {
    let replication = match r.params.get("replication") {
        Some(v) => v
            .parse::<u16>()
            .map_err(|_| RemoteError::bad_param("replication", v, "must be a positive short"))?,
        None => shared.read("set_replication", |s, _| Ok(s.default_replication()))?,
    };
    match svc
        .set_replication(context::current(), r.path.clone(), replication)
        .await
    {
        Ok(()) => Ok(ok(json::boolean(true))),
        Err(MetaError::IsADirectory { .. }) => Ok(ok(json::boolean(false))),
        Err(e) => Err(e.into()),
    }
}
