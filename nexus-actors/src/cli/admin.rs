//! `nexus admin`: mint member and runner credentials directly in the store.
//!
//! Each command prints one JSON object. The token appears only in that output; the store keeps
//! its SHA-256 digest.

pub mod grants;

use std::sync::LazyLock;

use regex::Regex;
use serde_json::{Value, json};

pub use nexus_proto::MemberKind;
use nexus_proto::{ErrorCode, MemberId, MemberStatus, Refusal, RunnerId};

use crate::auth::{Plane, mint};
use crate::store::{MemberRow, Store, StoreError};

static HANDLE: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"^[a-z0-9][a-z0-9_-]{1,31}$").expect("static regex"));

fn store_refusal(e: StoreError) -> Refusal {
    match e {
        StoreError::Conflict(message) => Refusal::new(ErrorCode::ValidationFailed, message),
        other => Refusal::new(ErrorCode::Internal, other.to_string()),
    }
}

/// Creates a member with a member-plane bearer token.
///
/// Returns `{"public_id", "kind", "handle", "token"}`.
///
/// # Errors
/// 422 `validation_failed` when the handle does not match `[a-z0-9][a-z0-9_-]{1,31}` or is taken.
pub async fn create_member(store: &Store, kind: MemberKind, handle: &str) -> Result<Value, Refusal> {
    if !HANDLE.is_match(handle) {
        return Err(Refusal::new(ErrorCode::ValidationFailed, "handle: must match [a-z0-9][a-z0-9_-]{1,31}"));
    }
    let member = MemberRow {
        public_id: MemberId::new_v4(),
        kind,
        handle: handle.to_owned(),
        display_name: handle.to_owned(),
        status: MemberStatus::Active,
    };
    let (token, credential) = mint(Plane::Member, member.public_id.uuid());
    store.create_member(&member, &credential).await.map_err(store_refusal)?;
    Ok(json!({"public_id": member.public_id, "kind": member.kind, "handle": member.handle, "token": token}))
}

/// Suspends or reinstates a member. A suspended Agent keeps its credentials but its declaration
/// doors answer 403 `not_authorized`.
///
/// Returns `{"public_id", "status"}`.
///
/// # Errors
/// 404 `not_found` for an unknown member.
pub async fn set_member_status(store: &Store, member: MemberId, status: MemberStatus) -> Result<Value, Refusal> {
    if !store.set_member_status(member, status).await.map_err(store_refusal)? {
        return Err(Refusal::new(ErrorCode::NotFound, format!("no member {member}")));
    }
    Ok(json!({"public_id": member, "status": status}))
}

/// Pairs a runner again (`docs/protocol.md`, "Credential epoch": re-pairing keeps the runner's id
/// and bumps its `credential_epoch`): mints a new transport token under the next epoch. Streams,
/// tokens and claims of older epochs are fenced; a live old stream is closed within one ping
/// interval.
///
/// A revoked runner is refused: revocation is final (a new runner gets a new id), so a token minted
/// for it could never say Hello.
///
/// Returns `{"runner_executor_public_id", "credential_epoch", "token"}`.
///
/// # Errors
/// 404 `not_found` for an unknown runner; 409 `not_eligible` for a revoked one.
pub async fn repair_runner(store: &Store, runner: RunnerId) -> Result<Value, Refusal> {
    let (token, credential) = mint(Plane::ExecutorTransport, runner.uuid());
    // The store bumps only an active row, so a revocation racing this one cannot be undone.
    if let Some(epoch) = store.repair_executor(runner, &credential).await.map_err(store_refusal)? {
        return Ok(json!({"runner_executor_public_id": runner, "credential_epoch": epoch, "token": token}));
    }
    // Only `active` and `revoked` exist, and an active row was just bumped above.
    match store.executor(runner).await.map_err(store_refusal)? {
        Some(_) => Err(Refusal::new(
            ErrorCode::NotEligible,
            format!(
                "runner {runner} is revoked; revocation is final — create a new runner with `nexus admin runner create`"
            ),
        )),
        None => Err(Refusal::new(ErrorCode::NotFound, format!("no runner {runner}"))),
    }
}

/// Revokes a runner: it stays in the store, but is no longer eligible for claims or new work.
///
/// Returns `{"runner_executor_public_id", "status": "revoked"}`.
///
/// # Errors
/// 404 `not_found` for an unknown runner.
pub async fn revoke_runner(store: &Store, runner: RunnerId) -> Result<Value, Refusal> {
    if !store.revoke_executor(runner).await.map_err(store_refusal)? {
        return Err(Refusal::new(ErrorCode::NotFound, format!("no runner {runner}")));
    }
    Ok(json!({"runner_executor_public_id": runner, "status": "revoked"}))
}

/// Creates a runner executor with an executor-transport token.
///
/// Returns `{"runner_executor_public_id", "name", "token"}`.
///
/// # Errors
/// 422 `validation_failed` for an empty or over-long name (1 to 100 characters).
pub async fn create_runner(store: &Store, name: &str) -> Result<Value, Refusal> {
    if name.trim().is_empty() || name.chars().count() > 100 || name.chars().any(char::is_control) {
        return Err(Refusal::new(ErrorCode::ValidationFailed, "name: must be 1 to 100 printable characters"));
    }
    let public_id = RunnerId::new_v4();
    let (token, credential) = mint(Plane::ExecutorTransport, public_id.uuid());
    store.create_executor(public_id, name, &credential).await.map_err(store_refusal)?;
    Ok(json!({"runner_executor_public_id": public_id, "name": name, "token": token}))
}
