//! A conversation's inputs at the doors (`docs/executions.md`, "Conversations: one turn at a
//! time"): admission into the conversation's line (a turn that starts now or waits, a steer for
//! the live execution, or `input_queue_full`), the cancel door `POST
//! /agent_api/v1/inputs/{id}/cancel` and its gRPC twin `CancelInput`, and the `queue` view of a
//! waiting execution. The semantics are in [`crate::actors::execution::queue`] and
//! [`crate::actors::execution::steer`].

use serde_json::{Value, json};

use nexus_proto::{DeliveryMode, ErrorCode, InputId, Refusal, RunStatus, SteerOutcome};

use super::{Admitted, Api, Caller, CreateInput, internal};
use crate::actors::execution::queue;
use crate::store::queue::{Admission, INPUT_QUEUE_BOUND};
use crate::store::{ExecutionRow, InputRow};

/// A steer joins the running execution under the declaration it froze: per-turn fields would do
/// nothing there, so they are refused rather than ignored, before anything else is judged
/// (`docs/executions.md`, "Conversations: one turn at a time").
///
/// # Errors
/// 422 `validation_failed` naming the first per-turn field `input` carries.
pub(super) fn steer_carries_text_only(input: &CreateInput) -> Result<(), Refusal> {
    let per_turn = [
        ("execution_declaration", input.execution_declaration.is_some()),
        ("runner_executor_public_id", input.runner_executor_public_id.is_some()),
        ("tool_names", input.tool_names.is_some()),
        ("variables", input.variables.is_some()),
        ("budget", input.budget.is_some()),
    ];
    match per_turn.iter().find(|(_, given)| *given) {
        None => Ok(()),
        Some((field, _)) => Err(Refusal::new(
            ErrorCode::ValidationFailed,
            format!(
                "{field}: a steer joins the running execution under its frozen declaration; \
                 post it with delivery_mode queue to give a turn its own {field}"
            ),
        )),
    }
}

impl Api {
    /// Admits `row` into its conversation delivered as `mode`: a turn that starts now (its
    /// execution is loaded and materializes), a turn that waits behind the conversation's live
    /// execution (`pending`, not loaded: the hand-off wakes it), or a steer recorded for the live
    /// execution to apply.
    ///
    /// # Errors
    /// 422 `validation_failed` for a steer that names `execution_declaration`,
    /// `runner_executor_public_id`, `tool_names` or `variables`; 409 `input_queue_full` when the conversation
    /// already holds [`INPUT_QUEUE_BOUND`] waiting inputs (nothing is written); `internal` on a
    /// store failure.
    pub(super) async fn admit(
        &self,
        caller: &Caller,
        row: &InputRow,
        new_conversation: bool,
        mode: DeliveryMode,
    ) -> Result<Admitted, Refusal> {
        if mode == DeliveryMode::Steer {
            steer_carries_text_only(&CreateInput {
                execution_declaration: row.execution_declaration.clone(),
                runner_executor_public_id: row.runner_executor_public_id,
                tool_names: row.tool_names.clone(),
                variables: row.variables.clone(),
                budget: row.budget.map(|_| Value::Null),
                ..CreateInput::default()
            })?;
        }
        let execution = nexus_proto::ExecutionId::new_v4();
        let store = &self.fabric.store;
        let admission = store.admit_to_conversation(row, new_conversation, mode, execution).await.map_err(internal)?;
        let admitted = |execution_public_id, turn, status, queue_position, waits_for_execution_public_id| Admitted {
            conversation_public_id: row.conversation_public_id,
            input_public_id: row.public_id,
            execution_public_id,
            turn,
            delivery_mode: mode,
            status,
            queue_position,
            waits_for_execution_public_id,
            deliver_at: row.deliver_at,
        };
        match admission {
            Admission::Full { waiting } => Err(Refusal::new(
                ErrorCode::InputQueueFull,
                format!(
                    "conversation {} already holds {waiting} waiting inputs (at most {INPUT_QUEUE_BOUND}); \
                     post again once a turn has ended, or cancel a queued input",
                    row.conversation_public_id
                ),
            )),
            Admission::Scheduled { execution, turn, deliver_at } => {
                tracing::info!(execution_id = %execution, member = %row.member_public_id, posted_by = %caller.member.public_id, deliver_at, "input admitted for a later delivery");
                // Held in the store: were the timer not armed now, recovery arms it.
                if let Err(error) = self.root.schedule_delivery(row.public_id, deliver_at) {
                    tracing::warn!(execution_id = %execution, %error, "cannot arm the delivery timer now");
                }
                Ok(admitted(execution, turn, RunStatus::Pending, 0, None))
            }
            Admission::Steer { turn, into } => {
                tracing::info!(execution_id = %into.public_id, input = %row.public_id, member = %row.member_public_id, posted_by = %caller.member.public_id, "steer admitted");
                // The execution's next boundary reads it; were the notice lost, the steer
                // becomes a turn of its own at the hand-off.
                if let Err(error) = self.root.execution(into.public_id).steer_posted() {
                    tracing::warn!(execution_id = %into.public_id, %error, "cannot tell the execution of its steer now");
                }
                Ok(admitted(into.public_id, turn, into.status, 0, None))
            }
            Admission::Turn { execution, turn, ahead } => {
                tracing::info!(execution_id = %execution, member = %row.member_public_id, posted_by = %caller.member.public_id, ahead = ahead.len(), "input admitted");
                if ahead.is_empty() {
                    // The actor materializes and runs as soon as it starts.
                    self.root.execution(execution).load().await?;
                }
                Ok(admitted(execution, turn, RunStatus::Pending, ahead.len(), ahead.last().map(|e| e.public_id)))
            }
        }
    }

    /// `POST /agent_api/v1/inputs/{id}/cancel` (gRPC `CancelInput`): cancels an input that has not
    /// started. A queued turn's execution ends `canceled` without materializing; a steer not yet
    /// applied gets an execution that ended so, and is never applied. Either way `turn_status
    /// canceled {queued: true}` says so, and the conversation's next turn runs when its time
    /// comes. Answers the canceled execution as `GET /agent_api/v1/executions/{id}` shows it; a
    /// repeated cancel answers it again.
    ///
    /// # Errors
    /// 404 `not_found` for an unknown input or one the caller may not cancel (the standing rule: another Agent's input);
    /// 403 `not_authorized` for a Human who does not steward the Agent; 409 `input_not_queued` when the input's
    /// execution has started (or ended), or the steer was applied or became a turn of its own.
    pub async fn cancel_input(&self, caller: &Caller, id: InputId) -> Result<Value, Refusal> {
        let store = &self.fabric.store;
        let missing = || Refusal::new(ErrorCode::NotFound, format!("no input {id}"));
        let input = store.input(id).await.map_err(internal)?.ok_or_else(missing)?;
        // The standing rule of every execution door (`docs/executions.md`, "People in the loop"):
        // another Agent's input is as unknown, a Human needs to steward the Agent.
        self.conversation_for(caller, input.conversation_public_id, super::standing::Need::Act)
            .await
            .map_err(|refusal| if refusal.code == ErrorCode::NotFound { missing() } else { refusal })?;
        // Canceling only takes work away: a suspended member may cancel, as it may stop.
        let delivery = store.delivery(id).await.map_err(internal)?.ok_or_else(missing)?;
        let canceled = match (delivery.mode, delivery.outcome) {
            (DeliveryMode::Steer, None) => self.cancel_waiting_steer(&input).await?,
            (DeliveryMode::Steer, Some(SteerOutcome::Applied)) => {
                return Err(Refusal::new(
                    ErrorCode::InputNotQueued,
                    format!(
                        "input {id} was applied by execution {} before round {}; it is in that execution's history",
                        delivery.applied_execution_public_id.map(|e| e.to_string()).unwrap_or_default(),
                        delivery.applied_round.unwrap_or_default()
                    ),
                ));
            }
            _ => {
                let execution = store.first_execution_of(id).await.map_err(internal)?.ok_or_else(missing)?;
                let canceled = self.root.execution(execution).cancel_queued().await?;
                // A held input's timer would find nothing to deliver; drop it now
                // (`docs/executions.md`, "Scheduled inputs").
                if input.deliver_at.is_some()
                    && let Err(error) = self.root.unschedule_delivery(id)
                {
                    tracing::debug!(%error, "cannot drop the delivery timer of a canceled input");
                }
                canceled
            }
        };
        self.execution(caller, canceled.public_id).await
    }

    /// Cancels a steer nobody applied yet, through the conversation's started execution when one
    /// is live (it alone applies steers), else at once.
    async fn cancel_waiting_steer(&self, input: &InputRow) -> Result<ExecutionRow, Refusal> {
        let line = self.fabric.store.conversation_line(input.conversation_public_id).await.map_err(internal)?;
        match line.iter().find(|e| e.is_started()) {
            Some(running) => self.root.execution(running.public_id).cancel_steer(input.public_id).await,
            None => queue::cancel_steer(&self.fabric, &self.root, input.public_id).await.map_err(internal)?,
        }
    }

    /// The `queue` field of an execution's view: `{position, waits_for_execution_public_id}`
    /// while it waits its turn (`pending`, admitted, something live before it), else null.
    ///
    /// # Errors
    /// `internal` on a store failure.
    pub(super) async fn queue_view(&self, row: &ExecutionRow) -> Result<Value, Refusal> {
        if row.status != RunStatus::Pending || row.event_seq != 0 {
            return Ok(Value::Null);
        }
        let line = self.fabric.store.conversation_line(row.conversation_public_id).await.map_err(internal)?;
        // Out of the line (held for a later delivery): it waits for its time, not its turn.
        if !line.iter().any(|e| e.public_id == row.public_id) {
            return Ok(Value::Null);
        }
        let ahead: Vec<_> = line.iter().take_while(|e| e.public_id != row.public_id).collect();
        Ok(match ahead.last() {
            Some(before) => json!({"position": ahead.len(), "waits_for_execution_public_id": before.public_id}),
            None => Value::Null,
        })
    }
}
