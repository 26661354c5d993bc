//! The answer door of `ask` (`docs/kernel-tools.md`, "ask"): a person answers a call of `ask`
//! that waits `awaiting_input`. Both the HTTP door and the gRPC twin `AnswerTask` call this.

use serde_json::Value;

use nexus_kernel_tools::ask::Ask;
use nexus_proto::{ErrorCode, ExecutionId, Refusal, RunStatus, TaskStatus};

use super::{Api, Caller, Need, task_view};
use crate::actors::execution::approval::Adjudicator;
use crate::declaration::known_fields;

impl Api {
    /// `POST /agent_api/v1/executions/{execution_id}/tasks/{task_key}/answer` with body
    /// `{"answer": ...}` (gRPC `AnswerTask`): the call of `ask` settles `completed` with the
    /// answer as its result, and the model reads it. With options and `multi` false the answer is
    /// exactly one option (a string); with `multi` true, one option or a non-empty list of
    /// distinct options; without options, any non-empty text of at most 64 KiB. Answers the task
    /// as the execution shows it, its `result.structured_content` `{answer, answered_by,
    /// answered_at, origin}`.
    ///
    /// # Errors
    /// 400 `parameter_invalid` for a body that is not an object or names another field, 400
    /// `parameter_missing` without `answer`; 404 `not_found` for an unknown execution or task, and
    /// for another Agent's execution; 403 `not_authorized` for a Human who is not a steward of the
    /// Agent (a viewer reads, never answers) or a suspended member; 409 `not_awaiting_input` when
    /// the task does not wait for an answer (answered, expired, canceled, or no call of `ask`),
    /// `not_adjudicable` when the execution is not running (paused: resume it first); 422
    /// `validation_failed` for an answer the call does not take. A refused answer changes nothing.
    pub async fn answer_task(
        &self,
        caller: &Caller,
        id: ExecutionId,
        task_key: &str,
        body: &Value,
    ) -> Result<Value, Refusal> {
        known_fields(body, &["answer"])?;
        let Some(given) = body.get("answer").filter(|answer| !answer.is_null()) else {
            return Err(Refusal::new(
                ErrorCode::ParameterMissing,
                "answer is required: send {\"answer\": \"...\"} (or a list of options for a multi question)",
            ));
        };
        let (row, task) = self.task_for(caller, id, task_key, Need::Act).await?;
        // Answering lets the execution go on: a suspended member may not.
        caller.require_active("answer questions")?;
        if task.status != TaskStatus::AwaitingInput {
            return Err(Refusal::new(
                ErrorCode::NotAwaitingInput,
                format!(
                    "task {task_key} is {}, not awaiting_input; only a question waiting for its answer takes one",
                    task.status
                ),
            ));
        }
        if row.status != RunStatus::Running {
            return Err(Refusal::new(
                ErrorCode::NotAdjudicable,
                format!("execution {id} is {}; only a running execution takes answers (resume it first)", row.status),
            ));
        }
        let ask = Ask::parse(&task.tool_input).map_err(|refusal| {
            Refusal::new(ErrorCode::Internal, format!("the held call of ask does not parse ({refusal}); read the task"))
        })?;
        let answer = ask
            .accept(given)
            .map_err(|message| Refusal::new(ErrorCode::ValidationFailed, format!("answer: {message}")))?;
        let by = Adjudicator::new(caller.member.public_id, caller.member.kind);
        let answered = self.root.execution(id).answer(task.task_key, answer, by).await?;
        Ok(task_view(&answered))
    }
}
