//! The durable event log's vocabulary: one variant per event type, each with its typed data
//! (`docs/executions.md`, "Events"). An execution writes [`Event`]s; the store keeps each as its
//! type word and its data as JSON, and reads them back typed, so no code outside this module's
//! (de)serialization names an event type or a data field as a string.
//!
//! Feeds show each event as `{type, data}` with these exact shapes. Fields marked "absent unless"
//! are left out of the data, not written as `null`.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use nexus_proto::{
    AttentionReason, ExecutionId, InboxKind, InputId, LifecycleEvent, RunnerId, TaskKey, TaskKind, TaskStatus,
};

use crate::declaration::compaction::{CompactionMode, CompactionTrigger};
use crate::model::prompt::{ContextManifest, Macros};
use crate::model::retry::SwitchReason;

nexus_proto::words! {
    /// The type of a durable event: the `type` of a feed item.
    pub enum EventType("event type") {
        /// The execution's status changed.
        TurnStatus => "turn_status",
        /// A task was created or changed status.
        TaskStatus => "task_status",
        /// A claimant moved a task's deadline.
        TaskDeadlineExtended => "task_deadline_extended",
        /// The declaration was frozen and the first request assembled.
        InputMaterialized => "input_materialized",
        /// A model round began.
        RoundStarted => "round_started",
        /// A model round answered.
        RoundResult => "round_result",
        /// A model call's token usage.
        Usage => "usage",
        /// The execution stopped for a person.
        AttentionRequired => "attention_required",
        /// The fallback chain moved to another model.
        ModelChange => "model_change",
        /// A call parked for approval.
        ApprovalRequired => "approval_required",
        /// A call of `ask` waits for a person's answer.
        InputRequired => "input_required",
        /// A compaction replaced part of the transcript.
        ContextCompacted => "context_compacted",
        /// The budget ledger changed, or refused a reservation.
        Budget => "budget",
    }
}

/// One durable event. Serialized as `{"type": <word>, "data": {...}}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", content = "data", rename_all = "snake_case")]
pub enum Event {
    /// `turn_status`.
    TurnStatus(TurnStatus),
    /// `task_status`.
    TaskStatus(Box<TaskNarration>),
    /// `task_deadline_extended`.
    TaskDeadlineExtended(DeadlineExtended),
    /// `input_materialized`.
    InputMaterialized(Box<Materialized>),
    /// `input_materialized` of a `steer` input, applied by a live execution at a boundary
    /// (`{input_public_id, delivery_mode: "steer", round, turn}`): stored and shown under the
    /// `input_materialized` type, told apart by its `delivery_mode` ([`Event::from_parts`]).
    #[serde(rename = "input_steered")]
    InputSteered(Steered),
    /// `round_started`.
    RoundStarted(RoundStarted),
    /// `round_result`.
    RoundResult(Box<RoundResult>),
    /// `usage`.
    Usage(Usage),
    /// `attention_required`.
    AttentionRequired(AttentionRequired),
    /// `model_change`.
    ModelChange(ModelChange),
    /// `approval_required`.
    ApprovalRequired(Box<ApprovalRequired>),
    /// `input_required`.
    InputRequired(Box<InputRequired>),
    /// `context_compacted`.
    ContextCompacted(ContextCompacted),
    /// `budget`.
    Budget(Box<BudgetEvent>),
}

impl Event {
    /// The event's type.
    pub fn event_type(&self) -> EventType {
        match self {
            Event::TurnStatus(_) => EventType::TurnStatus,
            Event::TaskStatus(_) => EventType::TaskStatus,
            Event::TaskDeadlineExtended(_) => EventType::TaskDeadlineExtended,
            Event::InputMaterialized(_) | Event::InputSteered(_) => EventType::InputMaterialized,
            Event::RoundStarted(_) => EventType::RoundStarted,
            Event::RoundResult(_) => EventType::RoundResult,
            Event::Usage(_) => EventType::Usage,
            Event::AttentionRequired(_) => EventType::AttentionRequired,
            Event::ModelChange(_) => EventType::ModelChange,
            Event::ApprovalRequired(_) => EventType::ApprovalRequired,
            Event::InputRequired(_) => EventType::InputRequired,
            Event::ContextCompacted(_) => EventType::ContextCompacted,
            Event::Budget(_) => EventType::Budget,
        }
    }

    /// The event's data as feeds show it.
    ///
    /// # Panics
    /// Never: every variant serializes to an object (checked by the tests).
    pub fn data(&self) -> Value {
        match serde_json::to_value(self) {
            Ok(Value::Object(mut item)) => item.remove("data").unwrap_or(Value::Null),
            _ => unreachable!("an event serializes to {{type, data}}"),
        }
    }

    /// Reads an event back from its type word and data.
    ///
    /// # Errors
    /// When the word is no event type or the data does not have that type's shape.
    pub fn from_parts(event_type: &str, data: Value) -> Result<Event, serde_json::Error> {
        let steered = event_type == EventType::InputMaterialized.as_str()
            && data.get("delivery_mode").and_then(Value::as_str) == Some(nexus_proto::DeliveryMode::Steer.as_str());
        let event_type = if steered { "input_steered" } else { event_type };
        serde_json::from_value(serde_json::json!({"type": event_type, "data": data}))
    }

    /// The narrated task, for a `task_status` event.
    pub fn as_task_status(&self) -> Option<&TaskNarration> {
        match self {
            Event::TaskStatus(narration) => Some(narration),
            _ => None,
        }
    }

    /// The status, for a `turn_status` event.
    pub fn as_turn_status(&self) -> Option<&TurnStatus> {
        match self {
            Event::TurnStatus(status) => Some(status),
            _ => None,
        }
    }
}

/// `turn_status`: the execution's status, tagged by `status`, with what each status reports.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum TurnStatus {
    /// A regeneration was created from `regenerated_from`.
    Pending {
        /// The execution it regenerates.
        regenerated_from: ExecutionId,
        /// `reused` or `replaced`: where its declaration came from.
        declaration: String,
        /// The frozen declaration's digest.
        declaration_digest: Option<String>,
    },
    /// Materialized, or resumed.
    Running {
        /// `true` after a resume; absent unless resumed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        resumed: Option<bool>,
        /// How long it was paused, in milliseconds; absent unless resumed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        paused_ms: Option<i64>,
    },
    /// Paused by a person.
    Paused {
        /// A forced pause aborted the model call in flight.
        force: bool,
        /// When, Unix milliseconds.
        paused_at: i64,
        /// The round whose model call a forced pause aborted.
        aborted_round: Option<i64>,
    },
    /// The turn failed: at materialization, or halted.
    Failed {
        /// The failure's key.
        error_key: String,
        /// What happened; absent when the key says it all.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        message: Option<String>,
    },
    /// Ended with a final answer.
    Completed {},
    /// Held until a person acts.
    NeedsAttention {
        /// Why.
        attention_reason: AttentionReason,
        /// The failure's key.
        error_key: String,
    },
    /// A stop is draining.
    Canceling {
        /// A forced stop (open work is canceled) or a graceful one.
        force: bool,
        /// The runner tasks it waits for.
        draining: Vec<TaskKey>,
    },
    /// Ended by a stop.
    Canceled {
        /// `run_canceled`.
        error_key: String,
        /// Whether the stop was forced (`null` when a restart lost it).
        force: Option<bool>,
        /// The tasks still open when the drain bound ended the stop; absent unless it did.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        unsettled: Option<Vec<TaskKey>>,
        /// `true` when its input was canceled before it started (a queued turn, or a steer not
        /// yet applied): it never materialized. Absent otherwise.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        queued: Option<bool>,
    },
}

/// `task_status`: a task as it now stands.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TaskNarration {
    /// The task.
    pub task_key: TaskKey,
    /// `tool_task` or `model_task`.
    pub kind: TaskKind,
    /// Its status.
    pub status: TaskStatus,
    /// The name the model called (an alias or a collision name).
    pub tool_name: String,
    /// The name the serving side runs.
    pub served_name: String,
    /// The provider's call id.
    pub tool_call_id: String,
    /// The runner it is addressed to.
    pub runner_executor_public_id: Option<RunnerId>,
    /// The failure's key.
    pub error_key: Option<String>,
    /// The approval fact.
    pub approval: Option<Value>,
    /// The hook's event; absent unless a hook task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hook: Option<LifecycleEvent>,
    /// The text the model reads; absent until settled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// Whether the result is an error; absent until settled with a result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub is_error: Option<bool>,
    /// The compaction a summary task serves; absent unless a summary task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compaction: Option<CompactionFact>,
    /// A hook's decision (its `structured_content`); absent unless a judged hook task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<Value>,
    /// `retried` or `abandoned`: a person's repair; absent unless repaired.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_resolution: Option<String>,
    /// The new generation's key of a retried hook; absent unless retried.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retried_as: Option<TaskKey>,
}

/// The `compaction` fact on a summary task's `task_status`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CompactionFact {
    /// The compacted model round, as its step key `r{n}`.
    pub task_key: String,
    /// What made it run.
    pub trigger: CompactionTrigger,
    /// How the summary is made.
    pub mode: CompactionMode,
    /// Bytes over the bound; absent unless known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overshoot_bytes: Option<u64>,
    /// Tokens over the window; absent unless known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overshoot_tokens: Option<u64>,
    /// `delegate`, when a delegate's failure fell back to the kernel; absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback_from: Option<CompactionMode>,
    /// Why it fell back; absent unless it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback_reason: Option<String>,
}

/// `task_deadline_extended`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeadlineExtended {
    /// The task.
    pub task_key: TaskKey,
    /// The new deadline, Unix milliseconds.
    pub deadline_at: i64,
    /// How far it moved, in milliseconds.
    pub by: i64,
    /// The extension asked for, in milliseconds.
    pub timeout_ms: i64,
}

/// `input_materialized`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Materialized {
    /// The input.
    pub input_public_id: InputId,
    /// SHA-256 of the frozen declaration.
    pub declaration_digest: String,
    /// The model the first round runs.
    pub default_model: Option<String>,
    /// The selected runner.
    pub default_runner_executor_public_id: Option<RunnerId>,
    /// The frozen tools: `{name, route}` each.
    pub tools: Vec<MaterializedTool>,
    /// The runner candidates in declaration order.
    pub runner_candidates: Value,
    /// The prompt macros' values, taken once here (`docs/prompt.md`, "Macros"); absent on
    /// executions materialized before they were recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub macros: Option<Macros>,
}

/// `input_materialized` of a steer: a `steer` input applied by a live execution at the boundary
/// after a round's calls settled, as a user message of its transcript (`docs/executions.md`,
/// "Conversations: one turn at a time").
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Steered {
    /// The steer input.
    pub input_public_id: InputId,
    /// Always `steer`.
    pub delivery_mode: nexus_proto::DeliveryMode,
    /// The round whose model request first carries it (the one after the boundary).
    pub round: i64,
    /// The steer's own turn in the conversation.
    pub turn: i64,
}

/// One frozen tool in `input_materialized`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MaterializedTool {
    /// The callable name.
    pub name: String,
    /// `{runner_executor_public_id, ...}` for a runner tool, `null` for a kernel tool.
    pub route: Value,
}

/// `round_started`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RoundStarted {
    /// The round.
    pub round: i64,
    /// The model reference asked.
    pub model: String,
    /// The request's context manifest (`docs/prompt.md`, "Context manifest"); absent on
    /// rounds started before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<ContextManifest>,
}

/// `round_result`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RoundResult {
    /// The round.
    pub round: i64,
    /// The model reference that answered.
    pub model: String,
    /// The answer's text.
    pub text: Option<String>,
    /// The provider's finish reason.
    pub finish_reason: String,
    /// The calls it asked for, as tasks.
    pub tool_calls: Vec<RoundCall>,
}

/// One call of a `round_result`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RoundCall {
    /// Its task.
    pub task_key: TaskKey,
    /// The callable name.
    pub name: String,
    /// The provider's call id.
    pub tool_call_id: String,
    /// The input.
    pub input: Value,
    /// The runner it is addressed to.
    pub runner_executor_public_id: Option<RunnerId>,
}

nexus_proto::words! {
    /// What a `budget` event is for (`docs/executions.md`, "Budgets").
    pub enum BudgetFor("budget purpose") {
        /// A model call was reserved, or its usage replaced its reservation.
        ModelCall => "model_call",
        /// A tool call was reserved.
        ToolCall => "tool_call",
        /// A child's allocation was reserved, or its usage replaced it.
        Child => "child",
        /// A reservation did not fit: nothing was dispatched.
        Refused => "refused",
    }
}

/// `budget`: the ledger after a reservation, a settlement or a refusal.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BudgetEvent {
    /// What it was for.
    #[serde(rename = "for")]
    pub purpose: BudgetFor,
    /// The round it belongs to.
    pub round: i64,
    /// The frozen limits.
    pub limits: crate::budget::BudgetLimits,
    /// Held for work that is out.
    pub reserved: crate::budget::BudgetUsage,
    /// Known usage, plus whole reservations of work whose outcome is unknown.
    pub used: crate::budget::BudgetUsage,
    /// What is left in each limited dimension.
    pub remaining: crate::budget::BudgetRemaining,
    /// The refusal's message; absent unless `for` is `refused`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// `usage`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    /// The round (for a summary, the compacted round).
    pub round: Option<i64>,
    /// The model reference.
    pub model: String,
    /// The summary task whose call this was; absent for a round's model call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary_task_key: Option<TaskKey>,
    /// Input tokens.
    pub input_tokens: u64,
    /// Output tokens.
    pub output_tokens: u64,
}

/// `attention_required`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AttentionRequired {
    /// Why.
    pub reason: AttentionReason,
    /// The failure's key.
    pub error_key: String,
    /// What happened.
    pub message: String,
    /// The task that holds the execution; absent unless a task does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_key: Option<TaskKey>,
    /// The hook's event; absent unless a hook holds it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hook: Option<LifecycleEvent>,
    /// The tasks holding it; absent unless a task does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocked_task_keys: Option<Vec<TaskKey>>,
}

/// `model_change`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelChange {
    /// The round asked again.
    pub round: i64,
    /// The route that failed.
    pub from: String,
    /// The route asked next.
    pub to: String,
    /// Why the chain advanced.
    pub reason: SwitchReason,
    /// The failure's key.
    pub error_key: String,
    /// The refusal's category; absent unless the provider gave one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub category: Option<String>,
}

/// `approval_required`: the parked call as an approver sees it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ApprovalRequired {
    /// The task.
    pub task_key: TaskKey,
    /// `approval`.
    pub kind: InboxKind,
    /// The name the model called.
    pub tool_name: String,
    /// The name the serving side runs.
    pub served_name: String,
    /// The provider's call id.
    pub tool_call_id: String,
    /// The call's input.
    pub tool_input: Value,
    /// The runner it is addressed to.
    pub runner_executor_public_id: Option<RunnerId>,
    /// The frozen effect profile.
    pub effect_profile: Option<Value>,
    /// The hold's end, Unix milliseconds.
    pub hold_until: i64,
    /// Parked again after a restart or a change.
    pub reparked: bool,
}

/// `input_required`: a call of `ask` parked `awaiting_input`, as the person who answers it sees
/// it (`docs/kernel-tools.md`, "ask").
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct InputRequired {
    /// The task; the answer door takes its key.
    pub task_key: TaskKey,
    /// The question.
    pub prompt: String,
    /// The answers to choose from; empty for a free-text question.
    pub options: Vec<String>,
    /// Whether several options may be chosen together.
    pub multi: bool,
    /// The hold's end, Unix milliseconds.
    pub hold_until: i64,
}

/// `context_compacted`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ContextCompacted {
    /// The execution.
    pub run_public_id: ExecutionId,
    /// The compacted model round, as its step key `r{n}`.
    pub task_key: String,
    /// The summary task.
    pub summary_task_key: TaskKey,
    /// How the summary was made.
    pub mode: CompactionMode,
    /// What made it run.
    pub trigger: CompactionTrigger,
    /// Messages replaced by the summary.
    pub replaced_messages: usize,
    /// Messages kept.
    pub retained_messages: usize,
    /// `delegate`, when a delegate's failure fell back to the kernel; absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback_from: Option<CompactionMode>,
    /// Why it fell back; absent unless it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback_reason: Option<String>,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn events_keep_their_feed_shapes_and_read_back() {
        let run = ExecutionId::new_v4();
        let input = InputId::new_v4();
        let rows: Vec<(Event, Value)> = vec![
            (Event::TurnStatus(TurnStatus::Running { resumed: None, paused_ms: None }), json!({"status": "running"})),
            (
                Event::TurnStatus(TurnStatus::Running { resumed: Some(true), paused_ms: Some(3) }),
                json!({"status": "running", "resumed": true, "paused_ms": 3}),
            ),
            (Event::TurnStatus(TurnStatus::Completed {}), json!({"status": "completed"})),
            (
                Event::TurnStatus(TurnStatus::Failed { error_key: "k".into(), message: None }),
                json!({"status": "failed", "error_key": "k"}),
            ),
            (
                Event::TurnStatus(TurnStatus::Pending {
                    regenerated_from: run,
                    declaration: "reused".into(),
                    declaration_digest: None,
                }),
                json!({"status": "pending", "regenerated_from": run, "declaration": "reused", "declaration_digest": null}),
            ),
            (
                Event::TurnStatus(TurnStatus::Canceled {
                    error_key: "run_canceled".into(),
                    force: Some(true),
                    unsettled: None,
                    queued: None,
                }),
                json!({"status": "canceled", "error_key": "run_canceled", "force": true}),
            ),
            (
                Event::TurnStatus(TurnStatus::Canceled {
                    error_key: "run_canceled".into(),
                    force: None,
                    unsettled: None,
                    queued: Some(true),
                }),
                json!({"status": "canceled", "error_key": "run_canceled", "force": null, "queued": true}),
            ),
            (
                Event::InputSteered(Steered {
                    input_public_id: input,
                    delivery_mode: nexus_proto::DeliveryMode::Steer,
                    round: 2,
                    turn: 3,
                }),
                json!({"input_public_id": input, "delivery_mode": "steer", "round": 2, "turn": 3}),
            ),
            (
                Event::Usage(Usage {
                    round: Some(2),
                    model: "m".into(),
                    summary_task_key: None,
                    input_tokens: 5,
                    output_tokens: 6,
                }),
                json!({"round": 2, "model": "m", "input_tokens": 5, "output_tokens": 6}),
            ),
            (
                Event::ModelChange(ModelChange {
                    round: 1,
                    from: "a/b".into(),
                    to: "c/d".into(),
                    reason: SwitchReason::ModelRefused,
                    error_key: "model_refused".into(),
                    category: None,
                }),
                json!({"round": 1, "from": "a/b", "to": "c/d", "reason": "model_refused", "error_key": "model_refused"}),
            ),
            (
                Event::InputRequired(Box::new(InputRequired {
                    task_key: TaskKey::Call { round: 1, index: 0 },
                    prompt: "Which?".into(),
                    options: vec!["a".into()],
                    multi: false,
                    hold_until: 9,
                })),
                json!({"task_key": "r1t0", "prompt": "Which?", "options": ["a"], "multi": false, "hold_until": 9}),
            ),
        ];
        for (event, data) in rows {
            assert_eq!(event.data(), data, "{:?}", event.event_type());
            let back = Event::from_parts(event.event_type().as_str(), data).expect("reads back");
            assert_eq!(back, event);
        }
        assert!(Event::from_parts("turn_status", json!({"status": "archived"})).is_err());
        assert!(Event::from_parts("lunch", json!({})).is_err());
        for event_type in EventType::ALL {
            let event = Event::from_parts(event_type.as_str(), json!({}));
            assert!(event.is_err() || event.is_ok_and(|e| e.event_type() == *event_type));
        }
    }
}
