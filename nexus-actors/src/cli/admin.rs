//! `nexus admin`: mint member and runner credentials directly in the store.
//!
//! Each command prints one JSON object. The token appears only in that output; the store keeps
//! its SHA-256 digest.

pub mod grants;

use std::sync::LazyLock;

use regex::Regex;
use serde_json::{Value, json};

pub use nexus_proto::MemberKind;
use nexus_proto::{AssignmentScope, ErrorCode, ExecutorStatus, MemberId, MemberStatus, Refusal, RunnerId};

use crate::auth::{Plane, mint};
pub use crate::store::RunnerAssignment;
use crate::store::{ExecutorRow, MemberRow, Store, StoreError};

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

/// Creates a runner executor with an executor-transport token, serving the Agents `assignment`
/// names (`docs/protocol.md`, "Assignment": `user_private`, "assigned" in nexus) or every Agent
/// (`account_wide`).
///
/// Returns `{"runner_executor_public_id", "name", "token", "assignment_scope",
/// "assigned_agent_public_ids"}` (the list is empty for an account-wide runner).
///
/// # Errors
/// 422 `validation_failed` for an empty or over-long name (1 to 100 characters) or an assigned
/// member that is a Human; 404 `not_found` for an assigned member that does not exist. Nothing is
/// created on a refusal.
pub async fn create_runner(store: &Store, name: &str, assignment: &RunnerAssignment) -> Result<Value, Refusal> {
    if name.trim().is_empty() || name.chars().count() > 100 || name.chars().any(char::is_control) {
        return Err(Refusal::new(ErrorCode::ValidationFailed, "name: must be 1 to 100 printable characters"));
    }
    let assignment = match assignment {
        RunnerAssignment::AccountWide => RunnerAssignment::AccountWide,
        RunnerAssignment::Agents(agents) => {
            let mut distinct: Vec<MemberId> = Vec::new();
            for agent in agents {
                require_agent(store, *agent).await?;
                if !distinct.contains(agent) {
                    distinct.push(*agent);
                }
            }
            RunnerAssignment::Agents(distinct)
        }
    };
    let public_id = RunnerId::new_v4();
    let (token, credential) = mint(Plane::ExecutorTransport, public_id.uuid());
    store.create_executor_for(public_id, name, &credential, &assignment).await.map_err(store_refusal)?;
    let agents = match &assignment {
        RunnerAssignment::AccountWide => Vec::new(),
        RunnerAssignment::Agents(agents) => agents.clone(),
    };
    Ok(json!({
        "runner_executor_public_id": public_id,
        "name": name,
        "token": token,
        "assignment_scope": assignment.scope(),
        "assigned_agent_public_ids": agents,
    }))
}

/// Whom a runner made by `nexus admin runner create` serves, from its flags: `--assign AGENT_ID`
/// (repeatable) or `--account-wide`. Neither is refused: a runner runs commands on its machine,
/// so who may send it work is never left to a default.
///
/// # Errors
/// 400 `parameter_missing` naming both flags when neither is given; `parameter_invalid` when both
/// are.
pub fn assignment_from_flags(assign: Vec<MemberId>, account_wide: bool) -> Result<RunnerAssignment, Refusal> {
    match (assign.is_empty(), account_wide) {
        (false, false) => Ok(RunnerAssignment::Agents(assign)),
        (true, true) => Ok(RunnerAssignment::AccountWide),
        (true, false) => Err(Refusal::new(
            ErrorCode::ParameterMissing,
            "say whom the runner serves: --assign AGENT_ID (repeatable) for the Agents it serves and no one else, \
             or --account-wide for every Agent of this nexus",
        )),
        (false, true) => Err(Refusal::new(
            ErrorCode::ParameterInvalid,
            "--assign and --account-wide exclude each other: an account-wide runner serves every Agent",
        )),
    }
}

/// Assigns an assigned (`user_private`) runner to one more Agent: from now on it may select the
/// runner, see it in discovery and send it work. Assigning it again changes nothing.
///
/// Returns `{"runner_executor_public_id", "assignment_scope", "assigned_agent_public_ids"}`.
///
/// # Errors
/// 404 `not_found` for an unknown runner or member; 409 `not_eligible` for a revoked runner; 422
/// `validation_failed` for an account-wide runner (every Agent may use it already) or a member
/// that is a Human.
pub async fn assign_runner(store: &Store, runner: RunnerId, agent: MemberId) -> Result<Value, Refusal> {
    let row = assignable(store, runner, "assign").await?;
    if row.status == ExecutorStatus::Revoked {
        return Err(Refusal::new(
            ErrorCode::NotEligible,
            format!(
                "runner {runner} is revoked and serves no one again; create a new runner with `nexus admin runner create`"
            ),
        ));
    }
    require_agent(store, agent).await?;
    store.assign_runner(runner, agent).await.map_err(store_refusal)?;
    assignments_json(store, runner).await
}

/// Takes an Agent off an assigned runner: the Agent no longer sees or selects it, new work for
/// the Agent is refused at materialization, and work already addressed to the runner but not yet
/// claimed fails with `not_eligible` when it is dispatched or claimed (`docs/protocol.md`,
/// "Assignment"). A runner with no Agent left serves no one until it is assigned again.
///
/// Returns `{"runner_executor_public_id", "assignment_scope", "assigned_agent_public_ids"}`.
///
/// # Errors
/// 404 `not_found` for an unknown runner, or an Agent the runner is not assigned to; 422
/// `validation_failed` for an account-wide runner.
pub async fn unassign_runner(store: &Store, runner: RunnerId, agent: MemberId) -> Result<Value, Refusal> {
    assignable(store, runner, "unassign").await?;
    if !store.unassign_runner(runner, agent).await.map_err(store_refusal)? {
        return Err(Refusal::new(ErrorCode::NotFound, format!("runner {runner} is not assigned to {agent}")));
    }
    assignments_json(store, runner).await
}

/// The runner of an assign or unassign: it exists and is assigned, not account-wide.
async fn assignable(store: &Store, runner: RunnerId, verb: &str) -> Result<ExecutorRow, Refusal> {
    let row = store
        .executor(runner)
        .await
        .map_err(store_refusal)?
        .ok_or_else(|| Refusal::new(ErrorCode::NotFound, format!("no runner {runner}")))?;
    if row.assignment_scope == AssignmentScope::AccountWide {
        return Err(Refusal::new(
            ErrorCode::ValidationFailed,
            format!(
                "runner {runner} is account-wide: every Agent may use it, so there is nothing to {verb}; \
                 create a runner with `nexus admin runner create --assign AGENT_ID` to serve chosen Agents"
            ),
        ));
    }
    Ok(row)
}

/// Refuses a member that does not exist or is not an Agent: runners are assigned to Agents.
async fn require_agent(store: &Store, member: MemberId) -> Result<(), Refusal> {
    let row = store
        .member(member)
        .await
        .map_err(store_refusal)?
        .ok_or_else(|| Refusal::new(ErrorCode::NotFound, format!("no member {member}")))?;
    if row.kind != MemberKind::Agent {
        return Err(Refusal::new(
            ErrorCode::ValidationFailed,
            format!("member {member} ({}) is a Human; runners are assigned to Agents", row.handle),
        ));
    }
    Ok(())
}

async fn assignments_json(store: &Store, runner: RunnerId) -> Result<Value, Refusal> {
    let agents = store.runner_agents(runner).await.map_err(store_refusal)?;
    Ok(json!({
        "runner_executor_public_id": runner,
        "assignment_scope": AssignmentScope::UserPrivate,
        "assigned_agent_public_ids": agents,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_runner_says_whom_it_serves() {
        let agent = MemberId::new_v4();
        assert_eq!(assignment_from_flags(vec![agent], false).ok(), Some(RunnerAssignment::Agents(vec![agent])));
        assert_eq!(assignment_from_flags(Vec::new(), true).ok(), Some(RunnerAssignment::AccountWide));
        let neither = assignment_from_flags(Vec::new(), false).expect_err("refused");
        assert_eq!(neither.code, ErrorCode::ParameterMissing);
        assert!(neither.message.contains("--assign") && neither.message.contains("--account-wide"));
        assert_eq!(assignment_from_flags(vec![agent], true).expect_err("refused").code, ErrorCode::ParameterInvalid);
    }
}
