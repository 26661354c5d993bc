//! Steering (`docs/executions.md`, "Conversations: one turn at a time"): a `steer` input posted
//! while its conversation has a live execution is applied by that execution at its next safe
//! boundary, after a round's calls have settled (their results are in the transcript) and before
//! the next model call. Applying appends the steer's text as a user message, so it stays in the
//! execution's history exactly where it was applied, and narrates `input_materialized
//! {input_public_id, delivery_mode: "steer", round, turn}`. The message, the event and the
//! steer's `applied` mark are written by one save ([`crate::store::Store::save_execution_applying`]):
//! a crash before it leaves the steer waiting, to be applied at the boundary again.
//!
//! A steer the execution never reaches a boundary for (its final answer came first, or it was
//! stopped) becomes a turn of its own at the hand-off ([`super::queue::hand_off`]).

use ractor::ActorProcessingErr;

use nexus_proto::DeliveryMode;

use crate::model::ChatMessage;
use crate::store::Event;
use crate::store::event::Steered;

use super::{ExecutionState, emit};

/// Applies the conversation's waiting steers at the boundary after the current round, in turn
/// order. Answers how many it applied. Reads the store only when a steer may wait
/// ([`super::queue::QueueState`]): after a load, or after the steer door told the actor of one.
///
/// # Errors
/// A store failure.
pub(super) async fn apply(state: &mut ExecutionState) -> Result<usize, ActorProcessingErr> {
    // Read only when one may wait: the steer door says so, and so does a fresh load.
    if !state.queue.steer_may_wait {
        return Ok(0);
    }
    state.queue.steer_may_wait = false;
    let steers = state.fabric.store.waiting_steers(state.row.conversation_public_id).await?;
    // Applied but not saved yet: never applied twice.
    let steers: Vec<_> =
        steers.into_iter().filter(|s| !state.queue.applying.iter().any(|(id, _)| *id == s.input_public_id)).collect();
    let round = state.row.round + 1;
    for steer in &steers {
        state.transcript.push(ChatMessage::User { content: steer.text.clone() });
        emit(
            state,
            Event::InputSteered(Steered {
                input_public_id: steer.input_public_id,
                delivery_mode: DeliveryMode::Steer,
                round,
                turn: steer.turn,
            }),
        );
        state.queue.applying.push((steer.input_public_id, round));
        tracing::info!(execution_id = %state.row.public_id, input = %steer.input_public_id, round, "steer applied");
    }
    Ok(steers.len())
}
