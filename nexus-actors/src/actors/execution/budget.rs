//! The execution's budget, reserved before dispatch (`docs/executions.md`, "Budgets"; R75).
//!
//! The ledger ([`BudgetLedger`]) lives on the execution row and is written with every save. At
//! materialization the input's budget and its inline declaration's are frozen onto it
//! ([`adopt`]). Before each model call its worst case is reserved ([`reserve_model_call`]),
//! before each tool call one call ([`reserve_tool_call`]), before each child its allocation
//! ([`reserve_child`]); a reservation that does not fit is refused with `budget_exhausted` and
//! nothing is dispatched. Every change is narrated as a durable `budget` event.

pub use crate::budget::{BudgetLedger, BudgetLimits, BudgetUsage};

use nexus_proto::Refusal;

use crate::budget::{ASSUMED_OUTPUT_TOKENS, ModelAsk};
use crate::model::ResolvedModel;
use crate::store::InputRow;
use crate::store::event::{BudgetEvent, BudgetFor, Event};

use super::{ExecutionState, emit};

/// Freezes the budget at materialization: the input's own `budget` and its inline declaration's
/// `budget`, the smaller of each limit when both are given, further intersected with the
/// allocation a child's row was created with. The deadline's clock starts now unless a child's
/// allocation started it. An execution with no limit keeps no ledger.
pub(super) fn adopt(state: &mut ExecutionState, input: &InputRow) {
    let inline = input
        .execution_declaration
        .as_ref()
        .and_then(|d| d.get("budget"))
        .filter(|b| !b.is_null())
        // Validated at admission; a stored object that no longer reads is no budget.
        .and_then(|b| BudgetLimits::parse(b, "execution_declaration.budget").ok());
    let asked = match (input.budget, inline) {
        (Some(own), Some(inline)) => Some(own.intersect(inline)),
        (own, inline) => own.or(inline),
    };
    let now = state.fabric.clock.now_ms();
    let ledger = match (state.row.budget.take(), asked) {
        (Some(mut ledger), asked) => {
            if let Some(asked) = asked {
                ledger.limits = ledger.limits.intersect(asked);
            }
            Some(ledger)
        }
        (None, Some(asked)) if !asked.is_unlimited() => Some(BudgetLedger::new(asked)),
        (None, _) => None,
    };
    state.row.budget = ledger.map(|mut ledger| {
        ledger.started_at.get_or_insert(now);
        ledger
    });
}

/// After a restart: a model call the ledger holds as in flight has an unknown outcome, so its
/// whole reservation counts as used.
pub(super) fn restarted(state: &mut ExecutionState) {
    if let Some(ledger) = &mut state.row.budget {
        ledger.call_outcome_unknown();
    }
}

/// Reserves the worst case of the next model call on `model` (the assembled request's estimate
/// plus the output cap: the adapter's limit, else [`ASSUMED_OUTPUT_TOKENS`], priced) and narrates
/// it. `Ok` without a budget.
///
/// # Errors
/// `budget_exhausted` when it does not fit (narrated as `refused`); nothing is held then.
pub(super) fn reserve_model_call(
    state: &mut ExecutionState,
    model: &ResolvedModel,
    estimated_tokens: u64,
) -> Result<(), Refusal> {
    let now = state.fabric.clock.now_ms();
    let Some(ledger) = &mut state.row.budget else { return Ok(()) };
    let ask = ModelAsk {
        input_tokens: estimated_tokens,
        output_tokens: model.output_cap_tokens.unwrap_or(ASSUMED_OUTPUT_TOKENS),
        prices: model.prices,
    };
    let reserved = ledger.reserve_model_call(&ask, &model.reference, now);
    narrate(state, reserved.as_ref().err(), BudgetFor::ModelCall);
    reserved
}

/// The model call answered: `usage` (input and output tokens) replaces its reservation, priced;
/// `None` (a failure, or an answer without usage) keeps the whole reservation as used.
pub(super) fn settle_model_call(state: &mut ExecutionState, usage: Option<(u64, u64)>) {
    let Some(ledger) = &mut state.row.budget else { return };
    if ledger.model_call.is_none() {
        return;
    }
    ledger.settle_model_call(usage);
    narrate(state, None, BudgetFor::ModelCall);
}

/// Reserves one call of `tool` before its approval stage. `Ok` without a budget.
///
/// # Errors
/// `budget_exhausted` past the deadline or with `max_tool_calls` spent (narrated as `refused`);
/// the call then settles `failed` with that key and the message as its result.
pub(super) fn reserve_tool_call(state: &mut ExecutionState, tool: &str) -> Result<(), Refusal> {
    let now = state.fabric.clock.now_ms();
    let Some(ledger) = &mut state.row.budget else { return Ok(()) };
    let reserved = ledger.reserve_tool_call(tool, now);
    narrate(state, reserved.as_ref().err(), BudgetFor::ToolCall);
    reserved
}

/// For delegation: reserves a child's allocation out of this execution's remaining budget
/// ([`BudgetLedger::reserve_child`]: the `requested` limits when they fit, else a share of the
/// remainder), holds it as reserved and narrates it. Answers `None` when this execution has no
/// budget and nothing was requested (the child runs unbudgeted), `Some(requested)` when it has
/// none but the child asked for limits. Create the child's row with
/// [`BudgetLedger::for_child`] of the allocation, and call [`child_settled`] when it ends.
///
/// # Errors
/// `budget_exhausted` past the deadline, with `max_children` spent, or when a requested limit
/// exceeds the remainder (narrated as `refused`); nothing is held then.
pub(crate) fn reserve_child(
    state: &mut ExecutionState,
    requested: Option<&BudgetLimits>,
) -> Result<Option<BudgetLimits>, Refusal> {
    let now = state.fabric.clock.now_ms();
    let Some(ledger) = &mut state.row.budget else { return Ok(requested.copied()) };
    let reserved = ledger.reserve_child(requested, now);
    narrate(state, reserved.as_ref().err(), BudgetFor::Child);
    reserved.map(Some)
}

/// For delegation: a child ended; what it `used` (its ledger's [`BudgetLedger::spent`]: usage
/// plus what it still held) replaces its `allocation` in this execution's ledger. Nothing without
/// a budget.
pub(crate) fn child_settled(state: &mut ExecutionState, allocation: &BudgetLimits, used: &BudgetUsage) {
    let Some(ledger) = &mut state.row.budget else { return };
    ledger.settle_child(allocation, used);
    narrate(state, None, BudgetFor::Child);
}

/// Queues a `budget` event of the ledger as it now stands: `refused` with the message when
/// `refusal` is given, else `purpose`.
fn narrate(state: &mut ExecutionState, refusal: Option<&Refusal>, purpose: BudgetFor) {
    let Some(ledger) = &state.row.budget else { return };
    let event = BudgetEvent {
        purpose: if refusal.is_some() { BudgetFor::Refused } else { purpose },
        round: state.row.round,
        limits: ledger.limits,
        reserved: ledger.reserved,
        used: ledger.used,
        remaining: ledger.remaining(),
        message: refusal.map(|r| r.message.clone()),
    };
    emit(state, Event::Budget(Box::new(event)));
}
