//! The first step of `CREATE`, `APPEND`, `OPEN` and `GETFILECHECKSUM`: choose a DataNode and
//! answer `307 Temporary Redirect` to the same request on its HTTP port (or, with
//! `noredirect=true`, `200 {"Location": ...}`). `OPEN` goes to a DataNode holding the block at
//! `offset`; the others to a random live DataNode (which then acts as a client).

use super::{ok, Request};
use crate::service::Shared;
use actix_web::HttpResponse;
use rand::seq::IndexedRandom;
use sluice_common::rpc::{FileKind, NodeState};
use sluice_common::webhdfs::params::{url_path, Op};
use sluice_common::webhdfs::{json, RemoteError};

pub(super) fn to_datanode(shared: &Shared, r: &Request) -> Result<HttpResponse, RemoteError> {
    let http_addr = choose(shared, r)?;
    let mut params = r.params.clone();
    params.set("namenoderpcaddress", shared.rpc_addr.to_string());
    let url = format!(
        "http://{http_addr}{}?{}",
        url_path(&r.path),
        params.to_query(&["noredirect"])
    );
    if r.params.flag("noredirect", false) {
        return Ok(ok(json::location(&url)));
    }
    Ok(HttpResponse::TemporaryRedirect()
        .insert_header(("Location", url))
        .content_type("application/octet-stream")
        .finish())
}

/// The HTTP address of the DataNode to send the request to.
fn choose(shared: &Shared, r: &Request) -> Result<String, RemoteError> {
    shared
        .read("webhdfs_redirect", |s, now| {
            if matches!(r.op, Op::Open | Op::Append | Op::GetFileChecksum) {
                let st = s.stat(&r.path)?;
                if st.kind == FileKind::Directory {
                    return Err(sluice_common::MetaError::IsADirectory {
                        path: r.path.clone(),
                    });
                }
            }
            if r.op == Op::Open {
                let offset = r.params.number("offset").unwrap_or(0);
                let located = s.get_block_locations(&r.path, offset, 1)?;
                if let Some(dn) = located
                    .blocks
                    .first()
                    .and_then(|b| b.locations.choose(&mut rand::rng()))
                {
                    return Ok(Some(dn.http_addr.clone()));
                }
            }
            let report = s.cluster_report(now);
            let live: Vec<_> = report
                .datanodes
                .iter()
                .filter(|d| d.state == NodeState::Live)
                .collect();
            Ok(live
                .choose(&mut rand::rng())
                .map(|d| d.id.http_addr.clone()))
        })?
        .ok_or_else(|| {
            RemoteError::io("Failed to find a live DataNode; check the cluster's health")
        })
}
