//! The `ask` kernel tool in an execution (`docs/kernel-tools.md`, "ask").
//!
//! A granted call of `ask` does not settle when it is routed: [`park`] checks its input
//! ([`nexus_kernel_tools::ask::Ask::parse`]; a bad call settles at once with the refusal as its
//! error envelope) and parks it `awaiting_input`, its `deadline_at` the end of a hold of
//! `timeout_ms` from then. The call's `timeout_ms` is the hold, `[execution] ask_hold_ms`
//! ([`budget`]), set when the call becomes a task. The run stays `running`, and emits
//! `input_required {task_key, prompt, options, multi, hold_until}`.
//!
//! The hold is the approval hold's machinery ([`super::approval`]): one timer per held task,
//! armed from the durable `deadline_at` and re-armed after a restart; a pause freezes it and a
//! resume thaws it ([`super::control`]); a stop cancels the task. A person answers at the answer
//! door ([`answer`]): the owner or a steward, while the execution runs. The answer is the call's
//! result, durable before it is answered (a write conditional on `awaiting_input`); the model
//! reads the answer text, or the chosen options as a JSON array. A hold that runs out settles the
//! task `timed_out` with `ask_expired` ([`expire`]), and the model reads why.

use ractor::{ActorProcessingErr, ActorRef, RpcReplyPort};
use serde_json::json;

use nexus_kernel_tools::ask::{Answer, Ask, WIRE_NAME};
use nexus_proto::{ErrorCode, Refusal, RunStatus, TaskKey, TaskStatus};

use crate::clock::deadline_after;
use crate::store::event::InputRequired;
use crate::store::{Event, TaskRow};

use super::approval::Adjudicator;
use super::{ExecutionHandle, ExecutionMsg, ExecutionState, advance, answer as reply_with, emit, narrate, save};

/// The `ask` messages of an ExecutionActor ([`ExecutionMsg::Ask`]).
pub enum AskMsg {
    /// A person answered a task `awaiting_input`. Answers the task as it now stands, or 409
    /// `not_awaiting_input` / `not_adjudicable`.
    Answer {
        /// The held task.
        task_key: TaskKey,
        /// The answer, already judged against the call ([`Ask::accept`]).
        answer: Answer,
        /// Who answered.
        by: Adjudicator,
        /// The task after the answer.
        reply: RpcReplyPort<Result<TaskRow, Refusal>>,
    },
}

impl ExecutionHandle {
    /// Answers a task `awaiting_input` with `answer`; answers the task as it now stands.
    ///
    /// # Errors
    /// 409 `not_awaiting_input` or `not_adjudicable`; `unavailable` when the actor cannot answer
    /// in time.
    pub async fn answer(&self, task_key: TaskKey, answer: Answer, by: Adjudicator) -> Result<TaskRow, Refusal> {
        self.root
            .ask_execution(self.execution, |reply| {
                ExecutionMsg::Ask(AskMsg::Answer { task_key, answer: answer.clone(), by: by.clone(), reply })
            })
            .await?
    }
}

/// Handles one [`AskMsg`].
///
/// # Errors
/// A store failure, which stops the actor (it reloads from the store on next use).
pub(super) async fn handle(
    myself: &ActorRef<ExecutionMsg>,
    state: &mut ExecutionState,
    msg: AskMsg,
) -> Result<(), ActorProcessingErr> {
    match msg {
        AskMsg::Answer { task_key, answer: given, by, reply } => {
            let outcome = answer(myself, state, task_key, given, &by).await;
            reply_with(reply, outcome, "the answer", "the task")
        }
    }
}

/// Whether `task` is a call of the kernel's `ask`: its served name, with no runner target.
pub fn is_call(task: &TaskRow) -> bool {
    task.tool_name == WIRE_NAME && task.target_executor_public_id.is_none()
}

/// The hold of the execution's configuration (`[execution] ask_hold_ms`), in milliseconds.
pub(super) fn hold_ms(state: &ExecutionState) -> i64 {
    i64::try_from(state.fabric.config.execution.ask_hold_ms).unwrap_or(i64::MAX)
}

/// Gives a new call of `ask` its budget: the hold, as its `timeout_ms` (the row's original
/// budget, which never moves). Any other task is left as it is.
pub(super) fn budget(state: &ExecutionState, task: &mut TaskRow) {
    if is_call(task) {
        task.timeout_ms = hold_ms(state);
    }
}

/// Parks a granted call of `ask` at `now` (the `ask` arm of [`super::approval::route`]): a call
/// whose input [`Ask::parse`] refuses settles `completed` with the refusal as its error envelope
/// (the tool ran and refused); any other waits `awaiting_input` until `now + timeout_ms`.
pub fn park(task: &mut TaskRow, now: i64) {
    task.started_at = now;
    if let Err(message) = Ask::parse(&task.tool_input) {
        task.status = TaskStatus::Completed;
        task.deadline_at = now;
        task.settled_at = Some(now);
        task.result = Some(json!({"content": message, "is_error": true, "outcome": "completed"}));
        return;
    }
    task.status = TaskStatus::AwaitingInput;
    task.deadline_at = deadline_after(now, task.timeout_ms);
    task.result = None;
    task.error_key = None;
    task.settled_at = None;
}

/// `input_required`'s data for a held call: what the person answering reads.
pub(super) fn input_required(task: &TaskRow) -> Option<Event> {
    let ask = Ask::parse(&task.tool_input).ok()?;
    Some(Event::InputRequired(Box::new(InputRequired {
        task_key: task.task_key,
        prompt: ask.prompt,
        options: ask.options,
        multi: ask.multi,
        hold_until: task.deadline_at,
    })))
}

/// The tool result a model reads for a call whose hold ran out unanswered.
pub fn expiry_text() -> String {
    "<tool_use_error>Nobody answered this question before its hold expired (ask_expired); go on without the \
     answer, or ask again if it is still needed</tool_use_error>"
        .into()
}

/// Settles a held call whose hold ran out at `now`: `timed_out` with `ask_expired`.
pub(super) fn expire(task: &mut TaskRow, now: i64) {
    let key = ErrorCode::AskExpired.as_str();
    task.status = TaskStatus::TimedOut;
    task.error_key = Some(key.into());
    task.settled_at = Some(now);
    task.result =
        Some(json!({"content": expiry_text(), "is_error": true, "outcome": "timed_out", "error": {"key": key}}));
}

fn not_awaiting(task_key: TaskKey) -> Refusal {
    Refusal::new(
        ErrorCode::NotAwaitingInput,
        format!("task {task_key} is not awaiting_input; read the execution for its status"),
    )
}

/// The task answered at `now` by `by` with `answer`: `completed`, the answer its result. The
/// model reads [`Answer::model_text`]; `structured_content` keeps `{answer, answered_by,
/// answered_at, origin}` (`origin` the answerer's kind, `human` or `agent`).
fn answered(mut task: TaskRow, answer: &Answer, by: &Adjudicator, now: i64) -> TaskRow {
    task.status = TaskStatus::Completed;
    task.error_key = None;
    task.settled_at = Some(now);
    task.result = Some(json!({
        "content": answer.model_text(),
        "structured_content": {
            "answer": answer.to_value(),
            "answered_by": by.member_public_id,
            "answered_at": now,
            "origin": by.origin.as_str(),
        },
        "is_error": false,
        "outcome": "completed",
    }));
    task
}

/// Applies a person's answer to a task `awaiting_input`: it settles `completed` with the answer
/// as its result, durably before it is answered, and the round goes on.
///
/// Answers the task as it now stands, or 409 `not_awaiting_input` (the task does not wait for an
/// answer, or another answer or the expiry won) or `not_adjudicable` (the execution is not
/// running).
///
/// # Errors
/// A store failure, which stops the actor (it reloads from the store on next use).
pub(super) async fn answer(
    myself: &ActorRef<ExecutionMsg>,
    state: &mut ExecutionState,
    task_key: TaskKey,
    answer: Answer,
    by: &Adjudicator,
) -> Result<Result<TaskRow, Refusal>, ActorProcessingErr> {
    let Some(task) = state.pending.get(&task_key).filter(|t| t.status == TaskStatus::AwaitingInput).cloned() else {
        return Ok(Err(not_awaiting(task_key)));
    };
    if state.row.status != RunStatus::Running {
        return Ok(Err(Refusal::new(
            ErrorCode::NotAdjudicable,
            format!(
                "execution {} is {}; only a running execution takes answers (resume it first)",
                state.row.public_id, state.row.status
            ),
        )));
    }
    let now = state.fabric.clock.now_ms();
    let task = answered(task, &answer, by, now);
    if !state.fabric.store.decide_task_from(&task, TaskStatus::AwaitingInput).await? {
        return Ok(Err(not_awaiting(task_key)));
    }
    tracing::info!(execution_id = %state.row.public_id, %task_key, by = %by.origin, "ask answered");
    state.pending.insert(task.task_key, task.clone());
    if let Some(timer) = state.holds.remove(&task_key) {
        timer.abort();
    }
    narrate(state, &task);
    save(state, &[]).await?;
    advance(myself, state).await?;
    Ok(Ok(task))
}

/// Emits `input_required` for a call just parked `awaiting_input`.
pub(super) fn announce(state: &mut ExecutionState, task: &TaskRow) {
    if let Some(event) = input_required(task) {
        emit(state, event);
    }
    tracing::info!(execution_id = %state.row.public_id, task_key = %task.task_key, "ask awaiting input");
}

#[cfg(test)]
mod tests {
    use nexus_proto::{ExecutionId, MemberId, MemberKind};
    use serde_json::Value;

    use super::*;

    fn call(input: Value) -> TaskRow {
        TaskRow {
            tool_input: input,
            ..TaskRow::new(ExecutionId::new_v4(), TaskKey::Call { round: 1, index: 0 }, 1, "ask".into(), 5_000, 0)
        }
    }

    #[test]
    fn a_granted_call_parks_for_its_hold_or_settles_with_its_refusal() {
        let mut held = call(json!({"prompt": "Which?", "options": ["a", "b"]}));
        assert!(is_call(&held));
        park(&mut held, 1_000);
        assert_eq!((held.status, held.deadline_at, held.settled_at), (TaskStatus::AwaitingInput, 6_000, None));
        let Some(Event::InputRequired(event)) = input_required(&held) else { panic!("input_required") };
        assert_eq!(
            (event.prompt.as_str(), event.options.len(), event.multi, event.hold_until),
            ("Which?", 2, false, 6_000)
        );

        let mut refused = call(json!({"question": "Which?"}));
        park(&mut refused, 1_000);
        assert_eq!(refused.status, TaskStatus::Completed);
        let result = refused.result.expect("an error envelope");
        assert_eq!(result["is_error"], true);
        assert_eq!(result["content"], "ask takes prompt, not question: pass the question as prompt");

        let mut at_runner = call(json!({}));
        at_runner.target_executor_public_id = Some(nexus_proto::RunnerId::new_v4());
        assert!(!is_call(&at_runner), "a runner's tool is never the kernel's ask");
    }

    #[test]
    fn the_answer_is_the_result_and_says_who_gave_it() {
        let member = MemberId::new_v4();
        let by = Adjudicator::new(member, MemberKind::Human);
        let task = answered(call(json!({"prompt": "?"})), &Answer::Choices(vec!["a".into(), "b".into()]), &by, 9);
        assert_eq!(task.status, TaskStatus::Completed);
        let result = task.result.expect("result");
        assert_eq!(result["content"], r#"["a","b"]"#);
        assert_eq!(result["structured_content"]["answered_by"], json!(member));
        assert_eq!(result["structured_content"]["origin"], "human");
        assert_eq!(result["structured_content"]["answer"], json!(["a", "b"]));

        let mut expired = call(json!({"prompt": "?"}));
        expire(&mut expired, 3);
        assert_eq!((expired.status, expired.error_key.as_deref()), (TaskStatus::TimedOut, Some("ask_expired")));
        assert!(expiry_text().contains("(ask_expired)"));
    }
}
