//! One execution at a time per conversation (`docs/executions.md`, "Conversations: one turn at a
//! time").
//!
//! The executions of a conversation that have not ended form its line, in turn order
//! ([`crate::store::queue`]). An admitted input's execution materializes only once every execution
//! before it in the line has ended ([`may_start`], checked by the ExecutionActor before it
//! materializes); until then it is `pending` and froze nothing. When an execution ends, the
//! [`hand_off`] wakes the next one: steers that no live execution can apply any more become turns
//! of their own first. The hand-off reads only the store, so recovery runs the same function for
//! every conversation that may need it: a node that died between an end and the next start loses
//! no turn.

use ractor::{ActorProcessingErr, RpcReplyPort};

use nexus_proto::{ConversationId, ErrorCode, ExecutionId, InputId, Refusal, RunStatus, SteerOutcome};

use crate::actors::fabric::Fabric;
use crate::actors::root::RootHandle;
use crate::store::event::TurnStatus;
use crate::store::queue::Admission;
use crate::store::{Event, EventRow, ExecutionRow, StoreError};

use super::phase::{End, Phase};
use super::{ExecutionHandle, ExecutionMsg, ExecutionState, answer, emit, enter, save};

/// The conversation messages of an ExecutionActor ([`ExecutionMsg::Inputs`]).
pub enum InputMsg {
    /// Cancel the execution's input while it waits its turn: it ends `canceled` without
    /// materializing; 409 `input_not_queued` once it has started.
    CancelQueued {
        /// The execution after the cancel.
        reply: RpcReplyPort<Result<ExecutionRow, Refusal>>,
    },
    /// Cancel a steer of this execution's conversation that is not applied yet. Asked of the
    /// conversation's running execution, which alone applies steers, so a cancel and an
    /// application never cross.
    CancelSteer {
        /// The steer input.
        input: InputId,
        /// The steer's canceled execution.
        reply: RpcReplyPort<Result<ExecutionRow, Refusal>>,
    },
    /// A steer was admitted for this execution's conversation: the next safe boundary reads the
    /// waiting steers ([`super::steer::apply`]).
    SteerPosted,
}

/// What the ExecutionActor keeps for its conversation. In memory only: the store holds the rest.
#[derive(Debug, Default)]
pub struct QueueState {
    /// Steers applied to the transcript since the last save, with the round whose request first
    /// carries each: the next save marks them applied in the same transaction.
    pub(super) applying: Vec<(InputId, i64)>,
    /// The hand-off after the end ran.
    handed_off: bool,
    /// A steer may be waiting: set when the actor loads (steers may have been posted while it was
    /// not live) and when the steer door says one was posted, cleared when a boundary reads them.
    /// A boundary with none reads nothing (issue 10: no store read per round).
    pub(super) steer_may_wait: bool,
}

impl QueueState {
    /// The state of an actor that has just loaded: a steer may be waiting.
    pub(super) fn loaded() -> QueueState {
        QueueState { steer_may_wait: true, ..QueueState::default() }
    }
}

impl ExecutionHandle {
    /// Wakes the execution: it materializes when its turn has come ([`may_start`]). Never waits.
    ///
    /// # Errors
    /// [`crate::actors::handle::ActorError::Stopped`] during shutdown.
    pub fn wake(&self) -> Result<(), crate::actors::handle::ActorError> {
        self.root.to_execution(self.execution, ExecutionMsg::Advance)
    }

    /// Tells the execution that a steer was admitted for its conversation, so its next safe
    /// boundary reads the waiting steers. Never waits.
    ///
    /// # Errors
    /// [`crate::actors::handle::ActorError::Stopped`] during shutdown.
    pub fn steer_posted(&self) -> Result<(), crate::actors::handle::ActorError> {
        self.root.to_execution(self.execution, ExecutionMsg::Inputs(InputMsg::SteerPosted))
    }

    /// Cancels the execution's input while it waits its turn; answers the canceled execution.
    ///
    /// # Errors
    /// 409 `input_not_queued` once it has started; `unavailable` when the actor cannot answer in
    /// time.
    pub async fn cancel_queued(&self) -> Result<ExecutionRow, Refusal> {
        self.root.ask_execution(self.execution, |reply| ExecutionMsg::Inputs(InputMsg::CancelQueued { reply })).await?
    }

    /// Cancels a steer that this (running) execution has not applied; answers the steer's
    /// canceled execution.
    ///
    /// # Errors
    /// 409 `input_not_queued` when it was applied or became a turn meanwhile; `unavailable` when
    /// the actor cannot answer in time.
    pub async fn cancel_steer(&self, input: InputId) -> Result<ExecutionRow, Refusal> {
        self.root
            .ask_execution(self.execution, |reply| ExecutionMsg::Inputs(InputMsg::CancelSteer { input, reply }))
            .await?
    }
}

/// Handles one [`InputMsg`].
///
/// # Errors
/// A store failure, which stops the actor (it reloads from the store on next use).
pub(super) async fn handle(state: &mut ExecutionState, msg: InputMsg) -> Result<(), ActorProcessingErr> {
    match msg {
        InputMsg::CancelQueued { reply } => {
            let outcome = cancel_queued(state).await;
            answer(reply, outcome, "the cancel", "the execution")
        }
        InputMsg::CancelSteer { input, reply } => {
            let outcome = cancel_steer(&state.fabric, &state.root, input).await.map_err(ActorProcessingErr::from);
            answer(reply, outcome, "the cancel", "the execution")
        }
        InputMsg::SteerPosted => {
            state.queue.steer_may_wait = true;
            Ok(())
        }
    }
}

/// Whether the execution may materialize now: nothing before it in its conversation's line is
/// live, and its input is not held for a later delivery (a held input is out of the line until
/// its time: [`deliver_scheduled`]). A regeneration (created with its declaration) never waits.
///
/// # Errors
/// A store failure.
pub(super) async fn may_start(state: &ExecutionState) -> Result<bool, StoreError> {
    let line = state.fabric.store.conversation_line(state.row.conversation_public_id).await?;
    if !line.iter().any(|e| e.public_id == state.row.public_id) {
        // Out of the line: held, or (as before) no longer live. Only then is the hold read, so
        // an ordinary turn pays no read for it.
        let held = state.fabric.store.held_until(state.row.input_public_id).await?;
        if let Some(deliver_at) = held {
            tracing::debug!(execution_id = %state.row.public_id, deliver_at, "held until its delivery time");
        }
        return Ok(held.is_none());
    }
    let ahead = line.iter().take_while(|e| e.public_id != state.row.public_id).count();
    if ahead > 0 {
        tracing::debug!(execution_id = %state.row.public_id, ahead, "waiting for its turn");
    }
    Ok(ahead == 0)
}

/// Admits `input` to its conversation ([`crate::store::Store::admit_to_conversation`]) and tells
/// whom it concerns, never waiting on an actor: a held input's delivery timer is armed
/// ([`Admission::Scheduled`]: set [`crate::store::InputRow::deliver_at`], resolved by
/// [`crate::schedule::delivery_time`], to schedule it), a steer's execution hears of it, a turn
/// that may start now is woken. The `send` kernel tool and any other in-process admitter call
/// this; the input doors do the same through [`crate::doors::api::Api::create_input`].
///
/// # Errors
/// A store failure; nothing is written then.
pub async fn admit(
    fabric: &Fabric,
    root: &RootHandle,
    input: &crate::store::InputRow,
    new_conversation: bool,
    mode: nexus_proto::DeliveryMode,
    execution: ExecutionId,
) -> Result<Admission, StoreError> {
    let admission = fabric.store.admit_to_conversation(input, new_conversation, mode, execution).await?;
    let told = match &admission {
        Admission::Full { .. } => Ok(()),
        Admission::Scheduled { deliver_at, .. } => root.schedule_delivery(input.public_id, *deliver_at),
        Admission::Steer { into, .. } => root.execution(into.public_id).steer_posted(),
        Admission::Turn { execution, ahead, .. } if ahead.is_empty() => root.execution(*execution).wake(),
        Admission::Turn { .. } => Ok(()),
    };
    if let Err(error) = told {
        // The store holds the admission: the hand-off, or recovery, moves it on.
        tracing::warn!(input = %input.public_id, %error, "cannot tell of an admitted input now");
    }
    Ok(admission)
}

/// Delivers the held input `input` at its time (`docs/executions.md`, "Scheduled inputs"): it
/// joins its conversation's line as the next turn ([`crate::store::Store::deliver_scheduled`])
/// and the line moves on ([`hand_off`]): it starts at once when the conversation is idle, else it
/// waits its turn. Idempotent: an input delivered already, or canceled, is left alone. Root's
/// delivery timer calls it ([`crate::actors::root::RootHandle::schedule_delivery`]).
///
/// # Errors
/// A store failure; the timer tries again.
pub async fn deliver_scheduled(fabric: &Fabric, root: &RootHandle, input: InputId) -> Result<(), StoreError> {
    let Some(conversation) = fabric.store.deliver_scheduled(input).await? else {
        tracing::debug!(%input, "a scheduled input was not held any more at its time");
        return Ok(());
    };
    tracing::info!(%input, %conversation, "a scheduled input was delivered");
    hand_off(fabric, root, conversation).await
}

/// After the save that ended the execution: the hand-off to the next turn, once.
///
/// # Errors
/// A store failure; recovery runs the hand-off again.
pub(super) async fn ended(state: &mut ExecutionState) -> Result<(), StoreError> {
    if state.queue.handed_off {
        return Ok(());
    }
    state.queue.handed_off = true;
    hand_off(&state.fabric, &state.root, state.row.conversation_public_id).await
}

/// Moves `conversation` on when none of its executions has started: its waiting steers become
/// turns of their own (in turn order), then the first execution of the line is woken. Does
/// nothing while an execution runs, is paused, needs attention or drains. Idempotent, and reads
/// only the store, so recovery calls it too.
///
/// # Errors
/// A store failure.
pub async fn hand_off(fabric: &Fabric, root: &RootHandle, conversation: ConversationId) -> Result<(), StoreError> {
    let mut line = fabric.store.conversation_line(conversation).await?;
    if line.iter().any(|e| e.is_started()) {
        return Ok(());
    }
    let steers = fabric.store.waiting_steers(conversation).await?;
    for steer in &steers {
        let Some(input) = fabric.store.input(steer.input_public_id).await? else { continue };
        let execution = steer_execution(fabric, &input, RunStatus::Pending);
        if fabric.store.dispose_steer(SteerOutcome::Turn, &execution, &[]).await? {
            tracing::info!(execution_id = %execution.public_id, input = %input.public_id, "a steer that missed its boundary became a turn");
        }
    }
    if !steers.is_empty() {
        line = fabric.store.conversation_line(conversation).await?;
    }
    if let Some(next) = line.first() {
        tracing::debug!(execution_id = %next.public_id, %conversation, "the conversation's next turn");
        if let Err(error) = root.execution(next.public_id).wake() {
            tracing::warn!(execution_id = %next.public_id, %error, "cannot wake the next turn now; recovery does");
        }
    }
    Ok(())
}

/// The execution row a disposed steer gets: `status` (pending for a turn, canceled for a cancel).
fn steer_execution(fabric: &Fabric, input: &crate::store::InputRow, status: RunStatus) -> ExecutionRow {
    let now = fabric.clock.now_ms();
    ExecutionRow {
        public_id: ExecutionId::new_v4(),
        conversation_public_id: input.conversation_public_id,
        input_public_id: input.public_id,
        member_public_id: input.member_public_id,
        status,
        attention_reason: None,
        declaration: None,
        transcript: serde_json::json!([]),
        transcript_stored: 0,
        round: 0,
        final_text: None,
        error_key: None,
        event_seq: 0,
        budget: None,
        created_at: now,
        updated_at: now,
        parent_execution_public_id: None,
    }
}

/// The `turn_status` of an input canceled before it started.
fn canceled_before_start() -> Event {
    Event::TurnStatus(TurnStatus::Canceled {
        error_key: "run_canceled".into(),
        force: None,
        unsettled: None,
        queued: Some(true),
    })
}

fn not_queued(what: String) -> Refusal {
    Refusal::new(ErrorCode::InputNotQueued, what)
}

/// Cancels a steer that no execution has applied: it gets an execution that ended `canceled`
/// without materializing, narrated by `turn_status canceled {queued: true}`. Called by the
/// conversation's running execution, or by the door when none runs.
///
/// # Errors
/// 409 `input_not_queued` when the steer was applied or became a turn first (`Ok(Err)`); a
/// store failure.
pub async fn cancel_steer(
    fabric: &Fabric,
    root: &RootHandle,
    input: InputId,
) -> Result<Result<ExecutionRow, Refusal>, StoreError> {
    let Some(row) = fabric.store.input(input).await? else {
        return Ok(Err(Refusal::new(ErrorCode::NotFound, format!("no input {input}"))));
    };
    let mut execution = steer_execution(fabric, &row, RunStatus::Canceled);
    execution.error_key = Some("run_canceled".into());
    execution.event_seq = 1;
    let event = EventRow { seq: 1, event: canceled_before_start(), at: execution.created_at };
    if !fabric.store.dispose_steer(SteerOutcome::Canceled, &execution, &[event]).await? {
        return Ok(Err(not_queued(format!(
            "input {input} was applied or became a turn of its own before the cancel; stop its execution instead"
        ))));
    }
    tracing::info!(execution_id = %execution.public_id, %input, "a waiting steer was canceled");
    // The conversation may have been waiting only for this steer's disposal.
    hand_off(fabric, root, row.conversation_public_id).await?;
    Ok(Ok(execution))
}

/// Cancels this execution's input while it waits its turn.
async fn cancel_queued(state: &mut ExecutionState) -> Result<Result<ExecutionRow, Refusal>, ActorProcessingErr> {
    let id = state.row.public_id;
    // Canceled before it started (by this door or a stop): answered as it is.
    if state.row.status == RunStatus::Canceled
        && state.declaration.is_none()
        && state.row.error_key.as_deref() == Some("run_canceled")
    {
        return Ok(Ok(state.row.clone()));
    }
    // A regeneration is created frozen and never waits: it is stopped, not canceled.
    if state.phase != Phase::Materializing || state.declaration.is_some() {
        let next = if state.row.status.is_terminal() {
            "it has ended; post a new input, or regenerate the turn"
        } else {
            "stop the execution instead"
        };
        return Ok(Err(not_queued(format!(
            "execution {id} is {}: its input is no longer queued; {next}",
            state.row.status
        ))));
    }
    enter(state, Phase::Done(End::Canceled));
    state.row.error_key = Some("run_canceled".into());
    emit(state, canceled_before_start());
    save(state, &[]).await?;
    tracing::info!(execution_id = %id, "a queued input was canceled");
    Ok(Ok(state.row.clone()))
}
