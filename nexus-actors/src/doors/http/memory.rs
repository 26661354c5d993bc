//! The memory doors on HTTP (`docs/kernel-tools.md`, "memory"), the twins of gRPC `GetMemory`,
//! `PutMemory`, `DeleteMemory` and `ListMemory` ([`crate::doors::api::memory`] says what each
//! answers and refuses):
//!
//! - `GET /agent_api/v1/memory/{binding}/{path}?conversation=&agent_public_id=` → the document;
//!   `&revisions=true` → its history.
//! - `PUT …/{binding}/{path}` `{content, expected_revision}` → `{binding, path, revision, bytes,
//!   created}` (201 when created).
//! - `DELETE …/{binding}/{path}` → `{binding, path, deleted: true, revision}`.
//! - `GET /agent_api/v1/memory?binding=&prefix=&conversation=&agent_public_id=` → the listing.

use std::sync::Arc;

use axum::Router;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::routing::get;
use serde_json::Value;

use super::{ExecutionDoor, HttpRefusal, HttpResult, Peer, caller, empty_body, json_body, query_of};
use crate::doors::api::Api;
use crate::doors::api::memory::MemoryQuery;

/// The memory doors, merged into [`super::router`].
pub fn routes() -> Router<Arc<Api>> {
    Router::new()
        .route("/agent_api/v1/memory", get(list))
        .route("/agent_api/v1/memory/{binding}/{*path}", get(read).put(write).delete(delete))
}

async fn list(
    State(api): State<Arc<Api>>,
    Peer(peer): Peer,
    headers: axum::http::HeaderMap,
    query: Result<Query<MemoryQuery>, QueryRejection>,
) -> HttpResult {
    let query = query_of(query)?;
    let caller = caller(&api, &headers, peer).await?;
    Ok(axum::Json(api.list_memory(&caller, &query).await?))
}

async fn read(query: Result<Query<MemoryQuery>, QueryRejection>, door: ExecutionDoor<(String, String)>) -> HttpResult {
    let query = query_of(query)?;
    empty_body(door.body)?;
    let (binding, path) = &door.path;
    Ok(axum::Json(door.api.get_memory(&door.caller, binding, path, &query).await?))
}

async fn write(
    query: Result<Query<MemoryQuery>, QueryRejection>,
    door: ExecutionDoor<(String, String)>,
) -> Result<(StatusCode, axum::Json<Value>), HttpRefusal> {
    let query = query_of(query)?;
    let body = json_body(door.body)?;
    let (binding, path) = &door.path;
    let written = door.api.put_memory(&door.caller, binding, path, &query, &body).await?;
    let status = if written["created"] == true { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, axum::Json(written)))
}

async fn delete(
    query: Result<Query<MemoryQuery>, QueryRejection>,
    door: ExecutionDoor<(String, String)>,
) -> HttpResult {
    let query = query_of(query)?;
    empty_body(door.body)?;
    let (binding, path) = &door.path;
    Ok(axum::Json(door.api.delete_memory(&door.caller, binding, path, &query).await?))
}
