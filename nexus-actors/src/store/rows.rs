//! The rows the store reads and writes.

use serde_json::Value;

use nexus_proto::{
    AssignmentScope, AttentionReason, ConversationId, ExecutionId, ExecutorKind, ExecutorStatus, InputId, MemberId,
    MemberKind, MemberStatus, RunStatus, RunnerId, TaskKey, TaskKind, TaskStatus,
};

use super::event::Event;

/// A member row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberRow {
    /// The member's id.
    pub public_id: MemberId,
    /// An Agent or a Human.
    pub kind: MemberKind,
    /// Unique handle.
    pub handle: String,
    /// Display name.
    pub display_name: String,
    /// `active`, or `suspended`: a suspended Agent keeps its credentials but is not eligible to
    /// declare (403 `not_authorized`).
    pub status: MemberStatus,
}

/// A presence change of a runner stream (display only, never a gate).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PresenceEvent {
    /// A stream said Hello: `connected_at` and `last_seen_at` become now.
    Attached,
    /// The stream is alive: `last_seen_at` becomes now.
    Seen,
    /// The stream ended: `connected_at` clears, `last_seen_at` becomes now.
    Detached,
}

/// An executor (runner) row.
#[derive(Clone, Debug, PartialEq)]
pub struct ExecutorRow {
    /// The executor's id (`runner_executor_public_id`).
    pub public_id: RunnerId,
    /// `runner`.
    pub kind: ExecutorKind,
    /// Display name.
    pub display_name: String,
    /// `active | revoked`.
    pub status: ExecutorStatus,
    /// `account_wide | user_private`.
    pub assignment_scope: AssignmentScope,
    /// Bumped on re-pairing; fences old streams and tokens.
    pub credential_epoch: i64,
    /// The canonical announcement `{tools, environment, documents}`.
    pub announcement: Value,
    /// When the last announcement was stored, if ever.
    pub announced_at: Option<i64>,
    /// When the current stream said Hello; `None` while no stream is attached.
    pub connected_at: Option<i64>,
    /// When a frame last arrived.
    pub last_seen_at: Option<i64>,
}

/// The stored profile of an Agent member.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct ProfileRow {
    /// The canonical configuration, `None` until declared.
    pub configuration: Option<Value>,
    /// `{content, role}` or `None`.
    pub system_prompt: Option<Value>,
    /// Advances on every successful rewrite of the slot.
    pub system_prompt_version: i64,
    /// `{content, role}` or `None`.
    pub summarizer: Option<Value>,
    /// Advances on every successful rewrite of the slot.
    pub summarizer_version: i64,
    /// When the profile was last declared.
    pub declared_at: Option<i64>,
}

/// A named definition (`docs/declaration.md`, "Named definitions").
#[derive(Clone, Debug, PartialEq)]
pub struct NamedDefinitionRow {
    /// `[a-z0-9][a-z0-9_-]{1,31}`.
    pub name: String,
    /// `<caller agent_identifier>/<name>`, at most 128 characters.
    pub identifier: String,
    /// `instance | steward`.
    pub scope: String,
    /// One printable line of at most 1024 characters.
    pub description: String,
    /// The canonical configuration.
    pub configuration: Value,
    /// Optional display name.
    pub display_name: Option<String>,
    /// `{content, role}` or `None`.
    pub system_prompt: Option<Value>,
    /// Creation time.
    pub created_at: i64,
    /// Last replacement.
    pub updated_at: i64,
}

/// An input row (admitted intent).
#[derive(Clone, Debug, PartialEq)]
pub struct InputRow {
    /// The input's id.
    pub public_id: InputId,
    /// Its conversation.
    pub conversation_public_id: ConversationId,
    /// The member whose profile answers.
    pub member_public_id: MemberId,
    /// The user's text.
    pub text: String,
    /// The authored inline `execution_declaration`, if any.
    pub execution_declaration: Option<Value>,
    /// The selected Runner, if named.
    pub runner_executor_public_id: Option<RunnerId>,
    /// The `tool_names` subset, if given.
    pub tool_names: Option<Value>,
    /// The template variables the input sets (`{name: text}`), if any (`docs/prompt.md`,
    /// "Macros").
    pub variables: Option<Value>,
    /// The input's own `budget`, if any (`docs/executions.md`, "Budgets").
    pub budget: Option<crate::budget::BudgetLimits>,
    /// The Human who posted it for the Agent ([`InputRow::member_public_id`]), or `None` when the
    /// Agent posted it itself.
    pub posted_by_public_id: Option<MemberId>,
    /// Its place in the conversation, 1-based, in the order of admission; assigned by
    /// [`crate::store::Store::admit_input`] (0 until then). A scheduled input takes the
    /// conversation's next turn again when it is delivered.
    pub turn: i64,
    /// When a scheduled input is delivered, in Unix milliseconds (`docs/executions.md`, "Scheduled
    /// inputs"); `None` for an input delivered at once. Admitted with it set, the input is held
    /// out of its conversation's line until then ([`crate::store::Store::admit_to_conversation`]).
    /// The stored value stays after delivery.
    pub deliver_at: Option<i64>,
}

impl InputRow {
    /// Who posted the input: the Human steward, or the answering Agent itself.
    #[must_use]
    pub fn poster(&self) -> MemberId {
        self.posted_by_public_id.unwrap_or(self.member_public_id)
    }
}

/// An execution row.
#[derive(Clone, Debug, PartialEq)]
pub struct ExecutionRow {
    /// The execution's id (`run_public_id`).
    pub public_id: ExecutionId,
    /// Its conversation.
    pub conversation_public_id: ConversationId,
    /// The input it materializes.
    pub input_public_id: InputId,
    /// The answering member.
    pub member_public_id: MemberId,
    /// Its status (`docs/executions.md`, "Statuses").
    pub status: RunStatus,
    /// Why it needs attention, while `needs_attention`.
    pub attention_reason: Option<AttentionReason>,
    /// The frozen declaration, `None` until materialized.
    pub declaration: Option<Value>,
    /// Chat transcript (JSON array). The actor keeps its own typed copy and leaves this `null`.
    pub transcript: Value,
    /// How many of `transcript`'s messages the store holds one per row: all of them, or none for
    /// a transcript written whole before migration 0007, which the next save stores per row
    /// (`docs/architecture.md`, "Transcript storage"). Ignored by the writes.
    pub transcript_stored: usize,
    /// The last round started.
    pub round: i64,
    /// The final answer.
    pub final_text: Option<String>,
    /// The failure key, when it ended on one.
    pub error_key: Option<String>,
    /// The last event sequence number written.
    pub event_seq: i64,
    /// The budget ledger (`docs/executions.md`, "Budgets"), `None` without a budget. Written with
    /// every save; a child's row is created with its allocation
    /// ([`crate::budget::BudgetLedger::for_child`]).
    pub budget: Option<crate::budget::BudgetLedger>,
    /// Creation time.
    pub created_at: i64,
    /// Last update.
    pub updated_at: i64,
    /// The execution that started this one as its child (`delegate_task` or `spawn`,
    /// `docs/delegation.md`), or `None`. Written at creation, never changed.
    pub parent_execution_public_id: Option<ExecutionId>,
}

impl ExecutionRow {
    /// A new `pending` execution of `input` in `conversation` for `member`: no transcript, round 0,
    /// no events, its declaration frozen already when given, no parent and no budget.
    #[must_use]
    pub fn pending(
        public_id: ExecutionId,
        conversation: ConversationId,
        input: InputId,
        member: MemberId,
        declaration: Option<Value>,
        now: i64,
    ) -> ExecutionRow {
        ExecutionRow {
            public_id,
            conversation_public_id: conversation,
            input_public_id: input,
            member_public_id: member,
            status: RunStatus::Pending,
            attention_reason: None,
            declaration,
            transcript: Value::Array(Vec::new()),
            transcript_stored: 0,
            round: 0,
            final_text: None,
            error_key: None,
            event_seq: 0,
            created_at: now,
            updated_at: now,
            parent_execution_public_id: None,
            budget: None,
        }
    }
}

/// A task: one inbox row (`docs/protocol.md`, "Inbox rows").
#[derive(Clone, Debug, PartialEq)]
pub struct TaskRow {
    /// The execution it belongs to.
    pub run_public_id: ExecutionId,
    /// Its key in the execution.
    pub task_key: TaskKey,
    /// `tool_task`, or `model_task` for a kernel summarizer.
    pub kind: TaskKind,
    /// The round that fanned it out.
    pub round: i64,
    /// The callable the model called (may be a qualified collision name).
    pub callable_name: String,
    /// The served name the runner runs.
    pub tool_name: String,
    /// The JSON object input.
    pub tool_input: Value,
    /// The provider's call id.
    pub tool_call_id: String,
    /// The frozen target Runner; `None` for kernel-held tasks.
    pub target_executor_public_id: Option<RunnerId>,
    /// The served tool's effect profile at freezing.
    pub effect_profile: Option<Value>,
    /// The original budget in milliseconds; never moves.
    pub timeout_ms: i64,
    /// Its status (`docs/executions.md`, "Statuses").
    pub status: TaskStatus,
    /// Whether anyone ever claimed it.
    pub claimed: bool,
    /// SHA-256 hex of the current claim token.
    pub claim_token_digest: Option<String>,
    /// When it was dispatched.
    pub started_at: i64,
    /// The park deadline.
    pub deadline_at: i64,
    /// The committed result body.
    pub result: Option<Value>,
    /// The error key of a failed, timed-out or uncertain settle.
    pub error_key: Option<String>,
    /// When it settled.
    pub settled_at: Option<i64>,
    /// The approval fact `{origin, decided_by?, decided_at}` (`docs/executions.md`, "Approval");
    /// `None` while parked or when the call failed before the approval stage.
    pub approval: Option<Value>,
}

impl TaskRow {
    /// A fresh `tool_task` row of `run` in `round`, not yet started anywhere: `waiting`, never
    /// claimed, no target, input `{}`, its `tool_call_id` its key, started (and due) at `now`
    /// (Unix milliseconds) with a budget of `timeout_ms`. The round driver, hooks and compaction
    /// set the rest before the row is written.
    pub fn new(
        run: ExecutionId,
        task_key: TaskKey,
        round: i64,
        tool_name: String,
        timeout_ms: i64,
        now: i64,
    ) -> TaskRow {
        TaskRow {
            run_public_id: run,
            tool_call_id: task_key.to_string(),
            task_key,
            kind: TaskKind::ToolTask,
            round,
            callable_name: tool_name.clone(),
            tool_name,
            tool_input: Value::Object(serde_json::Map::new()),
            target_executor_public_id: None,
            effect_profile: None,
            timeout_ms,
            status: TaskStatus::Waiting,
            claimed: false,
            claim_token_digest: None,
            started_at: now,
            deadline_at: now,
            result: None,
            error_key: None,
            settled_at: None,
            approval: None,
        }
    }

    /// Whether the task reached a terminal status.
    pub fn is_settled(&self) -> bool {
        self.status.is_settled()
    }
}

/// One durable event of an execution's log.
#[derive(Clone, Debug, PartialEq)]
pub struct EventRow {
    /// Sequence within the execution, from 1.
    pub seq: i64,
    /// The event.
    pub event: Event,
    /// Unix milliseconds.
    pub at: i64,
}
