//! The approval stage of an execution (`docs/executions.md`, "Approval").
//!
//! Every tool call passes the stage once its concrete target is resolved and before it runs
//! (`docs/executions.md`, "Round driver": the target is persisted before scheduling or approval).
//! The rules are evaluated on the resolved served tool name (after alias and route resolution) and
//! the resolved input, under the mode frozen on the execution, by
//! [`crate::declaration::approval::decide`]: deny wins over ask, ask over allow. The stage grants
//! (the call is routed at once: dispatched to its frozen runner, or run in-process), parks
//! (`needs_approval`, with a hold of [`APPROVAL_HOLD_MS`](crate::config::APPROVAL_HOLD_MS) unless
//! `[execution] approval_hold_ms` says otherwise) or denies (failed `approval_denied`).
//!
//! A parked task belongs to its ExecutionActor alone: no runner inbox lists it (inboxes list
//! `dispatched` and `running` rows). The actor keeps one timer per hold; the hold's deadline is the
//! task's durable `deadline_at`, so a restart re-arms it. A person decides at the approve and deny
//! doors ([`Adjudication`]); an expired hold settles the task `timed_out` with `approval_expired`.
//! The run stays `running` through a park and emits `approval_required` (`docs/executions.md`, "Approval").
//!
//! The same hold machinery (one timer per held task, armed from its durable `deadline_at`) holds
//! the calls of `ask` that wait `awaiting_input` for an answer ([`super::ask`]).
//!
//! Kernel-authored rows (hooks, the summarizer) enter the same stage through [`admit`] with
//! [`CallOrigin::Kernel`]: they are pre-approved unless a rule naming their origin denies them or
//! says ask.

use ractor::{ActorProcessingErr, ActorRef};
use serde_json::{Value, json};
use tracing::Instrument;

use nexus_proto::{ErrorCode, InboxKind, MemberId, MemberKind, Refusal, RunStatus, TaskKey, TaskStatus};

use crate::clock::{deadline_after, is_frozen};
use crate::declaration::FrozenDeclaration;
use crate::declaration::approval::{
    ApprovalMode, CallOrigin, Decision, RuleMatch, Verdict, cut_reason, decide, evaluate,
};
use crate::store::event::ApprovalRequired;
use crate::store::{Event, TaskRow};

use super::{ExecutionMsg, ExecutionState, advance, ask, emit, kernel, narrate, offer, save};

/// What the approval stage said about one call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Staged {
    /// Run it. The word is the approval fact's origin: `mode`, `rule`, `author` or `kernel`.
    Granted(&'static str),
    /// Park it in `needs_approval` until a person decides or the hold expires.
    Parked,
    /// Fail it with `approval_denied`.
    Denied {
        /// The approval fact's origin: `rule` for a deny rule, `mode` for an unmatched call under
        /// `rules`.
        origin: &'static str,
        /// The deny rule's reason (at most 256 bytes), or `no approval rule allows NAME`.
        reason: Option<String>,
    },
}

/// A person's decision on a parked task, taken at the approve or deny door.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Adjudication {
    /// Run it (or park it again when its runner's effect profile changed under the park).
    Approve,
    /// Fail it with `approval_denied`; the reason's first 256 bytes become `error.detail`.
    Deny {
        /// Why, as the person wrote it.
        reason: Option<String>,
    },
}

/// Who decided at a door: the member and the approval fact's origin word for its kind.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Adjudicator {
    /// The deciding member (`decided_by`).
    pub member_public_id: MemberId,
    /// `human` or `agent`.
    pub origin: MemberKind,
}

impl Adjudicator {
    /// The adjudicator for a member of `kind`: the fact's origin is the member's kind.
    pub fn new(member_public_id: MemberId, kind: MemberKind) -> Adjudicator {
        Adjudicator { member_public_id, origin: kind }
    }
}

/// Runs the stage for one call of `tool_name` (the resolved served name) with `input` (the
/// resolved input) from `origin`, under the mode and rules frozen in `declaration`. A declaration
/// without a mode (nothing needed approval when it was declared) behaves as `bypass`.
pub fn stage(declaration: &FrozenDeclaration, tool_name: &str, input: &Value, origin: CallOrigin) -> Staged {
    let mode = declaration.approval_mode.as_deref().and_then(ApprovalMode::parse).unwrap_or(ApprovalMode::Bypass);
    match decide(mode, &declaration.approval_rules, tool_name, input, origin) {
        Decision::Grant(grant) => Staged::Granted(grant.as_str()),
        Decision::Park => Staged::Parked,
        Decision::Deny { reason } => {
            let by_rule = matches!(
                evaluate(&declaration.approval_rules, tool_name, input, origin),
                Some(RuleMatch { verdict: Verdict::Deny, .. })
            );
            Staged::Denied { origin: if by_rule { "rule" } else { "mode" }, reason }
        }
    }
}

/// The `approval` fact: `{origin, decided_by?, decided_at}` (`docs/executions.md`, "Approval"),
/// `decided_at` in Unix milliseconds.
pub fn fact(origin: &str, decided_by: Option<MemberId>, decided_at: i64) -> Value {
    let mut fact = json!({"origin": origin, "decided_at": decided_at});
    if let Some(member) = decided_by {
        fact["decided_by"] = json!(member);
    }
    fact
}

/// The tool result a model reads for a denied call (`docs/executions.md`, "Approval").
pub fn denial_text(reason: Option<&str>) -> String {
    match reason.filter(|r| !r.is_empty()) {
        Some(reason) => {
            format!(
                "<tool_use_error>This tool call was declined by the approver (approval_denied) {reason}</tool_use_error>"
            )
        }
        None => "<tool_use_error>This tool call was declined by the approver (approval_denied)</tool_use_error>".into(),
    }
}

/// The tool result a model reads for a call whose hold expired undecided.
pub fn expiry_text() -> String {
    "<tool_use_error>This tool call was not approved before its approval hold expired (approval_expired)</tool_use_error>"
        .into()
}

/// Passes a new task row through the stage and leaves it as the stage decided: granted and
/// routed ([`route`]), parked (`needs_approval`, its `deadline_at` the end of a hold of `hold_ms`
/// from `now`), or failed `approval_denied`. The row's target must already be resolved: a runner
/// row carries its `target_executor_public_id`; a row without one runs in-process.
///
/// Model calls enter with [`CallOrigin::Model`]; kernel-authored rows (hooks, the summarizer) with
/// [`CallOrigin::Kernel`]. A parked row must then be announced with `announce_parks` once it is
/// in the actor's pending set.
pub fn admit(
    declaration: &FrozenDeclaration,
    task: &mut TaskRow,
    origin: CallOrigin,
    now: i64,
    hold_ms: i64,
) -> Staged {
    let staged = stage(declaration, &task.tool_name, &task.tool_input, origin);
    match &staged {
        Staged::Granted(by) => {
            task.approval = Some(fact(by, None, now));
            route(declaration, task, now);
        }
        Staged::Parked => park(task, now, hold_ms),
        Staged::Denied { origin, reason } => deny(task, fact(origin, None, now), reason.as_deref(), now),
    }
    staged
}

/// Routes a granted row: a runner row becomes `dispatched` with its deadline `timeout_ms` from
/// `now`; a call of `ask` parks `awaiting_input` for its hold ([`ask::park`]); any other row runs
/// in-process now (`docs/executions.md`, "Kernel tools") and settles, or fails `tool_not_served`
/// when nothing here runs it.
pub fn route(declaration: &FrozenDeclaration, task: &mut TaskRow, now: i64) {
    task.started_at = now;
    if task.target_executor_public_id.is_some() {
        task.status = TaskStatus::Dispatched;
        task.deadline_at = deadline_after(now, task.timeout_ms);
        task.settled_at = None;
        return;
    }
    if ask::is_call(task) {
        ask::park(task, now);
        return;
    }
    // An I/O kernel tool runs in a task of the actor ([`kernel::launch`]) once this row is saved;
    // so does a delegation call, which may then wait on children ([`super::delegation`]).
    if kernel::runs_io(&task.tool_name) || super::delegation::is_call(task) {
        task.status = TaskStatus::Running;
        task.deadline_at = deadline_after(now, task.timeout_ms);
        task.settled_at = None;
        return;
    }
    task.deadline_at = now;
    kernel::settle(task, kernel::run(declaration, &task.tool_name, &task.tool_input), now);
}

fn park(task: &mut TaskRow, now: i64, hold_ms: i64) {
    task.status = TaskStatus::NeedsApproval;
    task.approval = None;
    task.started_at = now;
    task.deadline_at = deadline_after(now, hold_ms);
    task.result = None;
    task.error_key = None;
    task.settled_at = None;
}

fn deny(task: &mut TaskRow, fact: Value, reason: Option<&str>, now: i64) {
    let key = ErrorCode::ApprovalDenied.as_str();
    task.status = TaskStatus::Failed;
    task.error_key = Some(key.into());
    task.approval = Some(fact);
    task.settled_at = Some(now);
    task.result = Some(json!({
        "content": denial_text(reason),
        "is_error": true,
        "outcome": "failed",
        "error": {"key": key, "detail": reason},
    }));
}

/// The hold of the execution's configuration, in milliseconds.
pub(super) fn hold_ms(state: &ExecutionState) -> i64 {
    i64::try_from(state.fabric.config.execution.approval_hold_ms).unwrap_or(i64::MAX)
}

/// `approval_required`'s data: the parked call as the approver sees it, with the frozen effect
/// profile and the end of the hold (`hold_until`, Unix milliseconds).
fn approval_required(task: &TaskRow, reparked: bool) -> Event {
    Event::ApprovalRequired(Box::new(ApprovalRequired {
        task_key: task.task_key,
        kind: InboxKind::Approval,
        tool_name: task.callable_name.clone(),
        served_name: task.tool_name.clone(),
        tool_call_id: task.tool_call_id.clone(),
        tool_input: task.tool_input.clone(),
        runner_executor_public_id: task.target_executor_public_id,
        effect_profile: task.effect_profile.clone(),
        hold_until: task.deadline_at,
        reparked,
    }))
}

/// Emits `approval_required` for every parked row of `tasks` (`input_required` for a call of
/// `ask` awaiting its answer) and arms its hold. Call it once the rows are in the actor's pending
/// set, before the `save` that writes them.
pub(super) fn announce_parks(myself: &ActorRef<ExecutionMsg>, state: &mut ExecutionState, tasks: &[TaskRow]) {
    for task in tasks.iter().filter(|t| is_held(t.status)) {
        if task.status == TaskStatus::AwaitingInput {
            ask::announce(state, task);
        } else {
            emit(state, approval_required(task, false));
            tracing::info!(execution_id = %state.row.public_id, task_key = %task.task_key, tool = %task.tool_name, "call parked for approval");
        }
        arm(myself, state, task.task_key, task.deadline_at);
    }
}

/// Whether a task in `status` is held here under a hold: parked for approval, or a call of `ask`
/// awaiting its answer.
pub(super) fn is_held(status: TaskStatus) -> bool {
    matches!(status, TaskStatus::NeedsApproval | TaskStatus::AwaitingInput)
}

/// Re-arms the hold of every held task (parked for approval, or awaiting an answer) after a
/// restart: the deadline is durable, so a hold that ran out while nexus was down expires at once.
pub(super) fn rearm(myself: &ActorRef<ExecutionMsg>, state: &mut ExecutionState) {
    let parked: Vec<(TaskKey, i64)> =
        state.pending.values().filter(|t| is_held(t.status)).map(|t| (t.task_key, t.deadline_at)).collect();
    for (task_key, deadline_at) in parked {
        arm(myself, state, task_key, deadline_at);
    }
}

fn arm(myself: &ActorRef<ExecutionMsg>, state: &mut ExecutionState, task_key: TaskKey, deadline_at: i64) {
    let actor = myself.clone();
    let clock = state.fabric.clock.clone();
    let span = tracing::debug_span!("hold", execution_id = %state.row.public_id, %task_key);
    let timer = tokio::spawn(
        async move {
            if is_frozen(deadline_at) {
                return;
            }
            clock.sleep_until(deadline_at).await;
            let _ = actor.cast(ExecutionMsg::HoldExpired { task_key, deadline_at });
        }
        .instrument(span),
    );
    if let Some(old) = state.holds.insert(task_key, timer) {
        old.abort();
    }
}

fn disarm(state: &mut ExecutionState, task_key: TaskKey) {
    if let Some(timer) = state.holds.remove(&task_key) {
        timer.abort();
    }
}

fn not_awaiting(task_key: TaskKey) -> Refusal {
    Refusal::new(
        ErrorCode::NotAwaitingApproval,
        format!("task {task_key} is not parked in needs_approval; read the execution for its status"),
    )
}

/// The effect profile the task's runner announces now for its served tool, when it differs from
/// the one frozen on the task. A runner that no longer announces the tool changes nothing here:
/// the dispatch settles that by the inbox rules.
async fn changed_effect_profile(state: &ExecutionState, task: &TaskRow) -> Result<Option<Value>, ActorProcessingErr> {
    let Some(target) = task.target_executor_public_id else { return Ok(None) };
    let Some(runner) = state.fabric.store.executor(target).await? else { return Ok(None) };
    let announced = runner.announcement["tools"]
        .as_array()
        .and_then(|tools| tools.iter().find(|t| t["name"].as_str() == Some(task.tool_name.as_str())))
        .and_then(|tool| tool.get("effect_profile"))
        .cloned();
    Ok(announced.filter(|profile| Some(profile) != task.effect_profile.as_ref()))
}

/// Applies a person's decision to a parked task: approval routes it (or parks it again with the
/// runner's new effect profile), denial fails it `approval_denied`. The decision is durable before
/// it is answered; a settled task lets the round continue.
///
/// Answers the task as it now stands, or 409 `not_awaiting_approval` (the task is not parked, or
/// was decided elsewhere) or `not_adjudicable` (the execution is not running).
///
/// # Errors
/// A store failure, which stops the actor (it reloads from the store on next use).
pub(super) async fn adjudicate(
    myself: &ActorRef<ExecutionMsg>,
    state: &mut ExecutionState,
    task_key: TaskKey,
    adjudication: Adjudication,
    by: &Adjudicator,
) -> Result<Result<TaskRow, Refusal>, ActorProcessingErr> {
    let Some(mut task) = state.pending.get(&task_key).filter(|t| t.status == TaskStatus::NeedsApproval).cloned() else {
        return Ok(Err(not_awaiting(task_key)));
    };
    let declaration = match &state.declaration {
        Some(declaration) if state.row.status == RunStatus::Running => declaration.clone(),
        _ => {
            return Ok(Err(Refusal::new(
                ErrorCode::NotAdjudicable,
                format!(
                    "execution {} is {}; only a running execution takes decisions",
                    state.row.public_id, state.row.status
                ),
            )));
        }
    };
    let now = state.fabric.clock.now_ms();
    let mut reparked = false;
    match adjudication {
        Adjudication::Approve => match changed_effect_profile(state, &task).await? {
            Some(profile) => {
                task.effect_profile = Some(profile);
                park(&mut task, now, hold_ms(state));
                reparked = true;
            }
            None => {
                task.approval = Some(fact(by.origin.as_str(), Some(by.member_public_id), now));
                route(&declaration, &mut task, now);
            }
        },
        Adjudication::Deny { reason } => {
            let reason = reason.as_deref().map(cut_reason);
            deny(&mut task, fact(by.origin.as_str(), Some(by.member_public_id), now), reason.as_deref(), now);
        }
    }
    if !state.fabric.store.decide_task(&task).await? {
        return Ok(Err(not_awaiting(task_key)));
    }
    tracing::info!(execution_id = %state.row.public_id, %task_key, status = %task.status, by = %by.origin, "approval decided");
    state.pending.insert(task.task_key, task.clone());
    narrate(state, &task);
    if reparked {
        emit(state, approval_required(&task, true));
        arm(myself, state, task_key, task.deadline_at);
    } else if task.status == TaskStatus::AwaitingInput {
        // An approved call of `ask` is asked now: its own hold replaces the approval hold.
        ask::announce(state, &task);
        arm(myself, state, task_key, task.deadline_at);
    } else {
        disarm(state, task_key);
    }
    save(state, &[]).await?;
    if task.status == TaskStatus::Dispatched {
        offer(state, &task);
    }
    kernel::launch(myself, state, std::slice::from_ref(&task));
    if task.is_settled() {
        advance(myself, state).await?;
    }
    Ok(Ok(task))
}

/// Settles a held task whose hold ran out: `timed_out` with `approval_expired` (parked
/// undecided) or `ask_expired` (a call of `ask` never answered, [`ask::expire`]). A stale timer
/// (the task was decided or answered, or parked again with a new deadline) does nothing.
///
/// # Errors
/// A store failure, which stops the actor (it reloads from the store on next use).
pub(super) async fn expire(
    myself: &ActorRef<ExecutionMsg>,
    state: &mut ExecutionState,
    task_key: TaskKey,
    deadline_at: i64,
) -> Result<(), ActorProcessingErr> {
    let Some(mut task) =
        state.pending.get(&task_key).filter(|t| is_held(t.status) && t.deadline_at == deadline_at).cloned()
    else {
        return Ok(());
    };
    state.holds.remove(&task_key);
    let held = task.status;
    let now = state.fabric.clock.now_ms();
    if held == TaskStatus::AwaitingInput {
        ask::expire(&mut task, now);
    } else {
        let key = ErrorCode::ApprovalExpired.as_str();
        task.status = TaskStatus::TimedOut;
        task.error_key = Some(key.into());
        task.settled_at = Some(now);
        task.result =
            Some(json!({"content": expiry_text(), "is_error": true, "outcome": "timed_out", "error": {"key": key}}));
    }
    if !state.fabric.store.decide_task_from(&task, held).await? {
        return Ok(());
    }
    tracing::info!(execution_id = %state.row.public_id, %task_key, status = %held, "hold expired");
    state.pending.insert(task.task_key, task.clone());
    narrate(state, &task);
    save(state, &[]).await?;
    advance(myself, state).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn declaration(mode: Option<&str>, rules: Value) -> FrozenDeclaration {
        let configuration = json!({"approval_mode": mode, "approval_rules": rules});
        let selection = crate::declaration::tools::RunnerSelection::NoRunner;
        crate::declaration::freeze(&configuration, None, selection, &[], None).expect("frozen")
    }

    fn row(tool: &str, input: Value, target: Option<nexus_proto::RunnerId>) -> TaskRow {
        TaskRow {
            run_public_id: nexus_proto::ExecutionId::from_uuid(uuid::Uuid::nil()),
            task_key: TaskKey::Call { round: 1, index: 0 },
            kind: nexus_proto::TaskKind::ToolTask,
            round: 1,
            callable_name: tool.into(),
            tool_name: tool.into(),
            tool_input: input,
            tool_call_id: "c".into(),
            target_executor_public_id: target,
            effect_profile: None,
            timeout_ms: 1_000,
            status: TaskStatus::Failed,
            claimed: false,
            claim_token_digest: None,
            started_at: 0,
            deadline_at: 0,
            result: None,
            error_key: None,
            settled_at: Some(0),
            approval: None,
        }
    }

    #[test]
    fn r67_the_stage_follows_the_mode_table_and_names_who_decided() {
        let rules = json!([
            {"tool": "bash", "path": "command", "match": "*rm -rf /*", "verdict": "deny", "reason": "not that"},
            {"tool": "read_*", "verdict": "allow"},
            {"tool": "bash", "verdict": "ask"},
        ]);
        let call = |mode: Option<&str>, tool: &str, command: &str| {
            stage(&declaration(mode, rules.clone()), tool, &json!({"command": command}), CallOrigin::Model)
        };
        let denied = Staged::Denied { origin: "rule", reason: Some("not that".into()) };
        let rows = [
            (None, "bash", "ls", Staged::Granted("mode")),
            (Some("bypass"), "bash", "rm -rf /", denied.clone()),
            (Some("bypass"), "other", "ls", Staged::Granted("mode")),
            (Some("ask"), "read_file", "ls", Staged::Granted("rule")),
            (Some("ask"), "bash", "ls", Staged::Parked),
            (Some("ask"), "other", "ls", Staged::Parked),
            (Some("ask"), "bash", "sudo rm -rf / now", denied.clone()),
            (Some("rules"), "read_file", "ls", Staged::Granted("rule")),
            (Some("rules"), "bash", "ls", Staged::Parked),
            (Some("rules"), "bash", "rm -rf /", denied),
            (
                Some("rules"),
                "other",
                "ls",
                Staged::Denied { origin: "mode", reason: Some("no approval rule allows other".into()) },
            ),
        ];
        for (mode, tool, command, expected) in rows {
            assert_eq!(call(mode, tool, command), expected, "{mode:?} {tool} {command}");
        }
    }

    #[test]
    fn r69_kernel_rows_are_pre_approved_unless_a_rule_names_their_origin() {
        let rules = json!([{"tool": "*", "verdict": "deny"}, {"tool": "review", "verdict": "ask", "origin": "kernel"}]);
        let frozen = declaration(Some("rules"), rules);
        assert_eq!(stage(&frozen, "format", &json!({}), CallOrigin::Kernel), Staged::Granted("kernel"));
        assert_eq!(stage(&frozen, "review", &json!({}), CallOrigin::Kernel), Staged::Parked);
        assert_eq!(
            stage(&frozen, "format", &json!({}), CallOrigin::Model),
            Staged::Denied { origin: "rule", reason: None }
        );
    }

    #[test]
    fn admission_parks_routes_and_denies_the_row() {
        let runner = nexus_proto::RunnerId::new_v4();
        let frozen = declaration(
            Some("ask"),
            json!([{"tool": "go", "verdict": "allow"}, {"tool": "no", "verdict": "deny", "reason": "never"}]),
        );

        let mut parked = row("bash", json!({}), Some(runner));
        assert_eq!(admit(&frozen, &mut parked, CallOrigin::Model, 1_000, 50), Staged::Parked);
        assert_eq!((parked.status, parked.deadline_at, parked.settled_at), (TaskStatus::NeedsApproval, 1_050, None));
        assert_eq!(parked.approval, None);

        let mut granted = row("go", json!({}), Some(runner));
        assert_eq!(admit(&frozen, &mut granted, CallOrigin::Model, 1_000, 50), Staged::Granted("rule"));
        assert_eq!((granted.status, granted.deadline_at), (TaskStatus::Dispatched, 2_000));
        assert_eq!(granted.approval, Some(json!({"origin": "rule", "decided_at": 1_000})));

        let mut denied = row("no", json!({}), Some(runner));
        admit(&frozen, &mut denied, CallOrigin::Model, 1_000, 50);
        assert_eq!((denied.status, denied.error_key.as_deref()), (TaskStatus::Failed, Some("approval_denied")));
        let result = denied.result.expect("a result the model reads");
        assert_eq!(
            result["content"],
            "<tool_use_error>This tool call was declined by the approver (approval_denied) never</tool_use_error>"
        );
        assert_eq!(result["error"], json!({"key": "approval_denied", "detail": "never"}));

        // A granted row without a runner runs in-process; nothing here serves `go`.
        let mut local = row("go", json!({}), None);
        admit(&frozen, &mut local, CallOrigin::Model, 1_000, 50);
        assert_eq!((local.status, local.error_key.as_deref()), (TaskStatus::Failed, Some("tool_not_served")));
    }

    #[test]
    fn the_fact_and_the_texts() {
        let member = MemberId::new_v4();
        assert_eq!(fact("human", Some(member), 7), json!({"origin": "human", "decided_by": member, "decided_at": 7}));
        assert_eq!(fact("mode", None, 7), json!({"origin": "mode", "decided_at": 7}));
        assert_eq!(
            denial_text(None),
            "<tool_use_error>This tool call was declined by the approver (approval_denied)</tool_use_error>"
        );
        assert_eq!(Adjudicator::new(member, MemberKind::Human).origin.as_str(), "human");
        assert_eq!(Adjudicator::new(member, MemberKind::Agent).origin.as_str(), "agent");
        assert!(expiry_text().contains("(approval_expired)"));
    }
}
