//! `nexus admin member grant|revoke`: make a Human the steward or viewer of an Agent, or take it
//! back (`docs/executions.md`, "People in the loop"). Each prints one JSON object.

use serde_json::{Value, json};

use nexus_proto::{ErrorCode, GrantRole, MemberId, MemberKind, Refusal};

use super::store_refusal;
use crate::store::Store;

/// The member `id`, which must be of `kind`; `flag` names the command's option in the refusal.
async fn member_of_kind(store: &Store, id: MemberId, kind: MemberKind, flag: &str) -> Result<(), Refusal> {
    let member = store
        .member(id)
        .await
        .map_err(store_refusal)?
        .ok_or_else(|| Refusal::new(ErrorCode::NotFound, format!("{flag}: no member {id}")))?;
    if member.kind != kind {
        return Err(Refusal::new(
            ErrorCode::ValidationFailed,
            format!(
                "{flag}: member {id} ({}) is {}, not {kind}; give {flag} the id of {} {kind} member",
                member.handle,
                member.kind,
                if kind == MemberKind::Agent { "an" } else { "a" }
            ),
        ));
    }
    Ok(())
}

/// Grants the Human `human` the `role` on the Agent `agent`; a repeat replaces the role. Takes
/// effect on the next request either member's credential makes.
///
/// Returns `{"agent_public_id", "human_public_id", "role", "previous_role"}` (`previous_role`
/// null when the Human held no grant on the Agent).
///
/// # Errors
/// 404 `not_found` for an unknown member; 422 `validation_failed` when `agent` is not an Agent or
/// `human` is not a Human.
pub async fn grant(store: &Store, human: MemberId, agent: MemberId, role: GrantRole) -> Result<Value, Refusal> {
    member_of_kind(store, agent, MemberKind::Agent, "--agent").await?;
    member_of_kind(store, human, MemberKind::Human, "--human").await?;
    let previous = store.grant_role(agent, human).await.map_err(store_refusal)?;
    store.put_grant(agent, human, role).await.map_err(store_refusal)?;
    Ok(json!({"agent_public_id": agent, "human_public_id": human, "role": role, "previous_role": previous}))
}

/// Revokes the grant the Human `human` holds on the Agent `agent`. Takes effect on the next
/// request: the Human's doors on the Agent's executions answer 403 `not_authorized`.
///
/// Returns `{"agent_public_id", "human_public_id", "revoked_role"}`.
///
/// # Errors
/// 404 `not_found` for an unknown member, or when the Human holds no grant on the Agent; 422
/// `validation_failed` when `agent` is not an Agent or `human` is not a Human.
pub async fn revoke(store: &Store, human: MemberId, agent: MemberId) -> Result<Value, Refusal> {
    member_of_kind(store, agent, MemberKind::Agent, "--agent").await?;
    member_of_kind(store, human, MemberKind::Human, "--human").await?;
    let revoked = store.delete_grant(agent, human).await.map_err(store_refusal)?.ok_or_else(|| {
        Refusal::new(
            ErrorCode::NotFound,
            format!("the Human {human} holds no grant on the Agent {agent}; nothing to revoke"),
        )
    })?;
    Ok(json!({"agent_public_id": agent, "human_public_id": human, "revoked_role": revoked}))
}
