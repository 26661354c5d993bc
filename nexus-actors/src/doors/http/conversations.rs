//! The history doors on HTTP (`docs/executions.md`, "History"), the twins of gRPC
//! `ListConversations`, `GetConversation` and `ListExecutions`
//! ([`crate::doors::api::conversations`] says what each answers):
//!
//! - `GET /agent_api/v1/conversations?after=&limit=` → `{conversations:[…], next_cursor}`.
//! - `GET /agent_api/v1/conversations/{id}?turns_after=` → `{…, turns:[…], turns_next}`.
//! - `GET /agent_api/v1/executions?conversation=&status=&after=&limit=` → `{executions:[…],
//!   next_cursor}`.

use std::sync::Arc;

use axum::Router;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::routing::get;

use nexus_proto::{ConversationId, ErrorCode, Refusal};

use super::{HttpResult, Peer, caller, query_of};
use crate::doors::api::Api;
use crate::doors::api::conversations::listing_limit_text;

/// The history doors, merged into [`super::router`].
pub fn routes() -> Router<Arc<Api>> {
    Router::new()
        .route("/agent_api/v1/conversations", get(get_conversations))
        .route("/agent_api/v1/conversations/{id}", get(get_conversation))
        .route("/agent_api/v1/executions", get(get_executions))
}

#[derive(Debug, serde::Deserialize)]
struct ListingQuery {
    after: Option<String>,
    limit: Option<String>,
    conversation: Option<String>,
    status: Option<String>,
}

#[derive(Debug, serde::Deserialize)]
struct TurnsQuery {
    turns_after: Option<String>,
}

async fn get_conversations(
    State(api): State<Arc<Api>>,
    Peer(peer): Peer,
    headers: HeaderMap,
    query: Result<Query<ListingQuery>, QueryRejection>,
) -> HttpResult {
    let query = query_of(query)?;
    let caller = caller(&api, &headers, peer).await?;
    let limit = listing_limit_text(query.limit.as_deref())?;
    Ok(axum::Json(api.list_conversations(&caller, query.after.as_deref(), limit).await?))
}

async fn get_conversation(
    State(api): State<Arc<Api>>,
    Path(id): Path<String>,
    Peer(peer): Peer,
    headers: HeaderMap,
    query: Result<Query<TurnsQuery>, QueryRejection>,
) -> HttpResult {
    let query = query_of(query)?;
    let caller = caller(&api, &headers, peer).await?;
    let id: ConversationId = id
        .parse()
        .map_err(|_| Refusal::new(ErrorCode::ParameterInvalid, "id must be a UUID (lower-case, hyphenated)"))?;
    let turns_after = match query.turns_after.as_deref() {
        None => 0,
        Some(text) => text.parse::<u32>().map(i64::from).map_err(|_| {
            Refusal::new(
                ErrorCode::ParameterInvalid,
                "turns_after must be a turn number (the turns_next of an earlier page)",
            )
        })?,
    };
    Ok(axum::Json(api.conversation(&caller, id, turns_after).await?))
}

async fn get_executions(
    State(api): State<Arc<Api>>,
    Peer(peer): Peer,
    headers: HeaderMap,
    query: Result<Query<ListingQuery>, QueryRejection>,
) -> HttpResult {
    let query = query_of(query)?;
    let caller = caller(&api, &headers, peer).await?;
    let limit = listing_limit_text(query.limit.as_deref())?;
    let listed = api
        .list_executions(&caller, query.conversation.as_deref(), query.status.as_deref(), query.after.as_deref(), limit)
        .await?;
    Ok(axum::Json(listed))
}
