//! Whose runner is whose (`docs/protocol.md`, "Assignment"): the one eligibility rule, and the
//! reads every place that selects or lists a runner makes to apply it.
//!
//! A runner is eligible for an Agent when it is `active` and either `account_wide` or assigned
//! to that Agent (`user_private`: in nexus, "assigned"; `nexus admin runner create --assign`).
//! Presence (connected or not) never enters the rule. The places that apply it: the profile and
//! named-definition PUTs ([`refuse_foreign_runners`]), input admission for the input's own
//! `runner_executor_public_id` ([`refuse_ineligible_selection`]), materialization and the
//! assembly preview ([`runner_facts`], judged by the assembly), discovery ([`eligible_runners`]),
//! and an assigned runner's inbox at dispatch and claim (`actors::executor::eligibility`).
//!
//! Owns no state: assignments live in the store (`runner_assignments`, migration 0011).

use std::collections::HashSet;

use serde_json::Value;

use nexus_proto::{AssignmentScope, ErrorCode, ExecutorStatus, MemberId, MemberKind, Refusal, RunnerId};

use crate::declaration::{Eligibility, RunnerFacts};
use crate::store::{ExecutorRow, MemberRow, Store, StoreError};

/// Who asks about a runner.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Principal {
    /// An Agent: the runners account-wide or assigned to it.
    Agent(MemberId),
    /// A Human member: the runners account-wide or assigned to an Agent it stewards or views
    /// (`docs/executions.md`, "People in the loop"). A Human never selects a runner itself; this
    /// is what its discovery lists.
    Human(MemberId),
}

impl Principal {
    /// The principal a member credential speaks for.
    pub fn of(member: &MemberRow) -> Principal {
        match member.kind {
            MemberKind::Agent => Principal::Agent(member.public_id),
            MemberKind::Human => Principal::Human(member.public_id),
        }
    }

    /// Whether `runner` is assigned to this principal (one store read for an Agent; for a Human,
    /// one for its grants and one per Agent they name).
    async fn assigned(self, store: &Store, runner: RunnerId) -> Result<bool, StoreError> {
        match self {
            Principal::Agent(agent) => store.runner_assigned(runner, agent).await,
            Principal::Human(human) => {
                for grant in store.grants_of(human).await? {
                    if store.runner_assigned(runner, grant.agent_public_id).await? {
                        return Ok(true);
                    }
                }
                Ok(false)
            }
        }
    }

    /// Every runner assigned to this principal (one store read for an Agent; for a Human, the
    /// union over the Agents it stewards or views).
    async fn assigned_runners(self, store: &Store) -> Result<HashSet<RunnerId>, StoreError> {
        match self {
            Principal::Agent(agent) => store.runners_assigned_to(agent).await,
            Principal::Human(human) => {
                let mut runners = HashSet::new();
                for grant in store.grants_of(human).await? {
                    runners.extend(store.runners_assigned_to(grant.agent_public_id).await?);
                }
                Ok(runners)
            }
        }
    }
}

/// The rule: `row` judged for a principal it is (`assigned`) or is not assigned to.
pub fn judge(row: &ExecutorRow, assigned: bool) -> Eligibility {
    let serves = row.assignment_scope == AssignmentScope::AccountWide || assigned;
    match (serves, row.status) {
        (false, _) => Eligibility::NotAssigned,
        (true, ExecutorStatus::Active) => Eligibility::Eligible,
        (true, _) => Eligibility::Revoked,
    }
}

/// `row` judged for `principal`; an account-wide runner costs no read.
///
/// # Errors
/// [`StoreError`] on a database failure.
pub async fn eligibility(store: &Store, row: &ExecutorRow, principal: Principal) -> Result<Eligibility, StoreError> {
    let assigned = match row.assignment_scope {
        AssignmentScope::AccountWide => false,
        AssignmentScope::UserPrivate => principal.assigned(store, row.public_id).await?,
    };
    Ok(judge(row, assigned))
}

/// The runners eligible for `principal`, oldest first (discovery, `GET /agent_api/v1/executors`).
///
/// # Errors
/// [`StoreError`] on a database failure.
pub async fn eligible_runners(store: &Store, principal: Principal) -> Result<Vec<ExecutorRow>, StoreError> {
    let assigned = principal.assigned_runners(store).await?;
    let rows = store.executors().await?;
    Ok(rows.into_iter().filter(|row| judge(row, assigned.contains(&row.public_id)) == Eligibility::Eligible).collect())
}

/// The runners a configuration names, in order: its `runner_executor_public_ids`, then the
/// targets of its explicit routes, each once.
pub fn named_runners(configuration: &Value) -> Vec<RunnerId> {
    let mut ids: Vec<RunnerId> = Vec::new();
    let candidates = configuration["runner_executor_public_ids"].as_array().into_iter().flatten();
    let routes = configuration["tool_definitions"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|entry| &entry["route"]["runner_executor_public_id"]);
    for id in candidates.chain(routes).filter_map(|v| v.as_str().and_then(|s| RunnerId::parse_any_case(s).ok())) {
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
    ids
}

/// The facts of every runner a configuration names ([`named_runners`]) that exists, each judged
/// for the answering `agent`: what materialization and the assembly preview assemble against.
///
/// # Errors
/// `internal` on a store failure.
pub async fn runner_facts(store: &Store, configuration: &Value, agent: MemberId) -> Result<Vec<RunnerFacts>, Refusal> {
    let mut runners = Vec::new();
    for id in named_runners(configuration) {
        let Some(row) = store.executor(id).await.map_err(internal)? else { continue };
        let eligibility = eligibility(store, &row, Principal::Agent(agent)).await.map_err(internal)?;
        runners.push(RunnerFacts {
            public_id: id,
            display_name: row.display_name,
            eligibility,
            announcement: row.announcement,
        });
    }
    Ok(runners)
}

/// The declaration doors' check (`PUT /agent_api/v1/profile/configuration`, named definitions):
/// a runner the configuration names that exists and is not eligible for `agent` (assigned to
/// other Agents, or revoked) is refused. A runner that does not exist yet is accepted, as the
/// spec's conformance asks (REFERENCE 19 R29: "the configuration itself can be declared before
/// the target serves it"); materialization judges it.
///
/// # Errors
/// 422 `runner_not_eligible` naming the field and the runner; `internal` on a store failure.
pub async fn refuse_foreign_runners(store: &Store, configuration: &Value, agent: MemberId) -> Result<(), Refusal> {
    for facts in runner_facts(store, configuration, agent).await? {
        if let Some(refusal) = not_eligible(facts.public_id, Some(facts.eligibility)) {
            return Err(Refusal::new(refusal.code, format!("configuration: {}", refusal.message)));
        }
    }
    Ok(())
}

/// Input admission's check of the input's own `runner_executor_public_id`: it must exist and be
/// eligible for `agent` now (materialization judges it again).
///
/// # Errors
/// 422 `runner_not_eligible`; `internal` on a store failure.
pub async fn refuse_ineligible_selection(store: &Store, runner: RunnerId, agent: MemberId) -> Result<(), Refusal> {
    let judged = match store.executor(runner).await.map_err(internal)? {
        Some(row) => Some(eligibility(store, &row, Principal::Agent(agent)).await.map_err(internal)?),
        None => None,
    };
    not_eligible(runner, judged).map_or(Ok(()), Err)
}

/// The `runner_not_eligible` refusal for `runner` judged `eligibility` (`None`: no such runner),
/// or `None` when it is eligible. An unknown runner and one assigned to other Agents get the same
/// message, so neither's existence nor display name leaks.
pub fn not_eligible(runner: RunnerId, eligibility: Option<Eligibility>) -> Option<Refusal> {
    let message = match eligibility {
        Some(Eligibility::Eligible) => return None,
        Some(Eligibility::Revoked) => format!(
            "runner {runner} is revoked and serves no one again; create a new runner with `nexus admin runner create`"
        ),
        Some(Eligibility::NotAssigned) | None => unassigned(runner),
    };
    Some(Refusal::new(ErrorCode::RunnerNotEligible, message))
}

/// The message for a runner that is unknown or assigned to other Agents.
pub fn unassigned(runner: RunnerId) -> String {
    format!(
        "runner {runner} is not eligible for this Agent: no runner with this id is account-wide or assigned to it; \
         an operator assigns one with `nexus admin runner assign --runner {runner} --agent <agent id>`"
    )
}

fn internal(e: impl std::fmt::Display) -> Refusal {
    Refusal::new(ErrorCode::Internal, format!("the store failed: {e}"))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn row(scope: AssignmentScope, status: ExecutorStatus) -> ExecutorRow {
        ExecutorRow {
            public_id: RunnerId::new_v4(),
            kind: nexus_proto::ExecutorKind::Runner,
            display_name: "worker".into(),
            status,
            assignment_scope: scope,
            credential_epoch: 0,
            announcement: json!({"tools": [], "environment": {}, "documents": []}),
            announced_at: None,
            connected_at: None,
            last_seen_at: None,
        }
    }

    #[test]
    fn a_runner_is_eligible_when_active_and_account_wide_or_assigned() {
        use AssignmentScope::{AccountWide, UserPrivate};
        use ExecutorStatus::{Active, Revoked};
        // (scope, status, assigned to the principal, judged)
        let rows = [
            (AccountWide, Active, false, Eligibility::Eligible),
            (AccountWide, Active, true, Eligibility::Eligible),
            (AccountWide, Revoked, false, Eligibility::Revoked),
            (UserPrivate, Active, true, Eligibility::Eligible),
            (UserPrivate, Active, false, Eligibility::NotAssigned),
            (UserPrivate, Revoked, true, Eligibility::Revoked),
            (UserPrivate, Revoked, false, Eligibility::NotAssigned),
        ];
        for (scope, status, assigned, judged) in rows {
            assert_eq!(judge(&row(scope, status), assigned), judged, "{scope} {status} assigned={assigned}");
        }
    }

    #[test]
    fn unknown_and_foreign_runners_read_alike_and_revoked_says_so() {
        let id = RunnerId::new_v4();
        assert!(not_eligible(id, Some(Eligibility::Eligible)).is_none());
        let unknown = not_eligible(id, None).expect("refused");
        let foreign = not_eligible(id, Some(Eligibility::NotAssigned)).expect("refused");
        assert_eq!((unknown.code, &unknown.message), (ErrorCode::RunnerNotEligible, &foreign.message));
        assert!(unknown.message.contains(&id.to_string()), "{}", unknown.message);
        let revoked = not_eligible(id, Some(Eligibility::Revoked)).expect("refused");
        assert_eq!(revoked.code, ErrorCode::RunnerNotEligible);
        assert!(revoked.message.contains("revoked"), "{}", revoked.message);
    }

    #[test]
    fn a_configuration_names_its_candidates_then_its_route_targets_once() {
        let (a, b) = (RunnerId::new_v4(), RunnerId::new_v4());
        let configuration = json!({
            "runner_executor_public_ids": [a.to_string().to_uppercase(), "not-a-uuid"],
            "tool_definitions": [
                {"type": "function", "name": "x", "route": {"kind": "runner", "runner_executor_public_id": b, "tool_name": "x"}},
                {"type": "function", "name": "y", "route": {"kind": "runner", "runner_executor_public_id": a, "tool_name": "y"}},
                {"type": "function", "name": "z"},
            ],
        });
        assert_eq!(named_runners(&configuration), vec![a, b]);
        assert!(named_runners(&json!({})).is_empty());
    }
}
