//! The application layer behind both edges: the HTTP/JSON doors and the gRPC `AgentService`
//! call the same functions here, so a door's semantics cannot drift between transports.

mod ask;
pub mod children;
mod cluster;
mod compaction;
pub mod conversations;
mod inputs;
pub mod memory;
mod repair;
pub mod standing;
mod watch;

pub use watch::Feed;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use serde_json::{Value, json};

use nexus_proto::{
    ConversationId, ErrorCode, ExecutionId, ExecutorKind, InputId, MemberId, MemberKind, MemberStatus, Refusal,
    RunStatus, RunnerId, TaskStatus,
};

use crate::actors::execution::approval::{Adjudication, Adjudicator};
use crate::actors::execution::{control, resolve};
use crate::actors::fabric::Fabric;
use crate::actors::profile::profile_json;
use crate::actors::root::RootHandle;
use crate::auth::throttle::{CredentialThrottle, Source};
use crate::auth::{Plane, not_accepted};
use crate::declaration::tools::RunnerSelection;
use crate::declaration::{known_fields, prompt_slot, validate_configuration};
use crate::model::DeltaType;
use crate::store::{EventRow, EventType, InputRow, MemberRow, TaskRow};

pub use standing::{Need, Standing, agents_readable_by};

/// The prefix of event cursors (`docs/executions.md`, "Events").
pub const CURSOR_PREFIX: &str = "cvei_";
/// The largest input text, in bytes (1 MiB).
pub const INPUT_TEXT_BOUND: usize = 1_048_576;
/// Events read from the store per page while streaming.
const EVENT_PAGE: i64 = 200;
/// How long a follower waits for a wake-up before it rereads the store anyway.
const FOLLOW_POLL: Duration = Duration::from_secs(5);

/// Per-member request budgets (a GCRA token bucket per member).
pub type DoorLimiter = governor::DefaultKeyedRateLimiter<MemberId>;

/// The shared API: the fabric, the handle to Root and the door budgets.
#[derive(Debug)]
pub struct Api {
    /// Shared context.
    pub fabric: Arc<Fabric>,
    /// Root.
    pub root: RootHandle,
    /// Request budgets per member.
    pub limiter: DoorLimiter,
    /// Failed-credential budgets per source address, shared with the runner stream.
    pub credentials: Arc<CredentialThrottle>,
}

impl Api {
    /// The API over a fabric, with the budgets of its `[doors]` configuration.
    pub fn new(fabric: Arc<Fabric>, root: RootHandle) -> Api {
        let doors = &fabric.config.doors;
        let per_minute = std::num::NonZeroU32::new(doors.requests_per_minute).unwrap_or(std::num::NonZeroU32::MIN);
        let burst = std::num::NonZeroU32::new(doors.burst).unwrap_or(std::num::NonZeroU32::MIN);
        let limiter = governor::RateLimiter::keyed(governor::Quota::per_minute(per_minute).allow_burst(burst));
        let credentials =
            Arc::new(CredentialThrottle::new(doors.credential_failure_burst, doors.credential_failures_per_minute));
        Api { fabric, root, limiter, credentials }
    }
}

/// An authenticated member-plane caller.
#[derive(Clone, Debug)]
pub struct Caller {
    /// The member behind the credential.
    pub member: MemberRow,
}

impl Caller {
    /// Refuses a Human with 403 `not_agent`: `what` completes "only an Agent member ...".
    ///
    /// # Errors
    /// `not_agent` when the caller is not an Agent.
    pub fn require_agent(&self, what: &str) -> Result<(), Refusal> {
        if self.member.kind == MemberKind::Agent {
            return Ok(());
        }
        Err(Refusal::new(ErrorCode::NotAgent, format!("only an Agent member {what}")))
    }

    /// Refuses a suspended member with 403 `not_authorized`: it keeps its credential and may
    /// read, but starts no new work. `what` completes "a suspended member may not ...".
    ///
    /// # Errors
    /// `not_authorized` when the member is not `active`.
    pub fn require_active(&self, what: &str) -> Result<(), Refusal> {
        if self.member.status == MemberStatus::Active {
            return Ok(());
        }
        Err(Refusal::new(
            ErrorCode::NotAuthorized,
            format!("this member is suspended and may not {what}; ask an operator to reinstate it"),
        ))
    }
}

/// `CreateInput`'s fields, already decoded.
#[derive(Clone, Debug, Default)]
pub struct CreateInput {
    /// Continue this conversation; `None` starts a new one.
    pub conversation_public_id: Option<ConversationId>,
    /// The user's text (required, non-empty).
    pub text: String,
    /// Inline `execution_declaration` (`docs/declaration.md`, "Inline declarations"), or `None` for
    /// the standing profile.
    pub execution_declaration: Option<Value>,
    /// The selected Runner among the candidates.
    pub runner_executor_public_id: Option<RunnerId>,
    /// `tool_names` subset (a JSON array of strings).
    pub tool_names: Option<Value>,
    /// The Agent that answers ([`Api::answering_agent`]): required when a Human starts a
    /// conversation; an Agent may name only itself.
    pub agent_public_id: Option<MemberId>,
    /// `delivery_mode`; `None` is `queue` (`docs/executions.md`, "Conversations: one turn at a
    /// time").
    pub delivery_mode: Option<nexus_proto::DeliveryMode>,
    /// `variables` `{name: text}`: the answering template's variables for this turn
    /// ([`crate::declaration::template::input_variables`]).
    pub variables: Option<Value>,
    /// `deliver_at`: an ISO 8601 date-time with its offset; the input is held until then
    /// (`docs/executions.md`, "Scheduled inputs"; [`crate::schedule::delivery_time`]).
    pub deliver_at: Option<String>,
    /// `deliver_in`: `<n>s|m|h|d` from now on the server's clock; as `deliver_at`.
    pub deliver_in: Option<String>,
    /// `budget {deadline_ms?, max_model_tokens?, max_cost_usd?, max_tool_calls?, max_children?}`
    /// for this turn's execution (`docs/executions.md`, "Budgets"), or `None`.
    pub budget: Option<Value>,
}

/// What an admission created, and where the input stands in its conversation
/// (`docs/executions.md`, "Conversations: one turn at a time").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Admitted {
    /// The conversation.
    pub conversation_public_id: ConversationId,
    /// The input.
    pub input_public_id: InputId,
    /// The execution that materializes it; for a steer into a live execution, that execution.
    pub execution_public_id: ExecutionId,
    /// The input's 1-based turn in the conversation.
    pub turn: i64,
    /// How it was delivered.
    pub delivery_mode: nexus_proto::DeliveryMode,
    /// The execution's status at admission (`pending` while it waits its turn).
    pub status: RunStatus,
    /// How many live executions of the conversation come before it (0: it starts now, or it is a
    /// steer).
    pub queue_position: usize,
    /// The execution just before it in the conversation's line, while it waits.
    pub waits_for_execution_public_id: Option<ExecutionId>,
    /// When a scheduled input is delivered, in Unix milliseconds (`docs/executions.md`,
    /// "Scheduled inputs"); `None` for one delivered at once.
    pub deliver_at: Option<i64>,
}

impl Admitted {
    /// The admission as the HTTP door answers it: `{conversation_public_id, input_public_id,
    /// execution_public_id, turn, delivery_mode, status, queue, deliver_at}`, `queue` being
    /// `{position, waits_for_execution_public_id}` while the input waits its turn, else null, and
    /// `deliver_at` the Unix milliseconds a scheduled input is delivered at, else null.
    pub fn json(&self) -> Value {
        let queue = self
            .waits_for_execution_public_id
            .map(|waits_for| json!({"position": self.queue_position, "waits_for_execution_public_id": waits_for}));
        json!({
            "conversation_public_id": self.conversation_public_id,
            "input_public_id": self.input_public_id,
            "execution_public_id": self.execution_public_id,
            "turn": self.turn,
            "delivery_mode": self.delivery_mode,
            "status": self.status,
            "queue": queue,
            "deliver_at": self.deliver_at,
        })
    }
}

/// The type of a feed item: a durable event's, a transcript delta's, or `resync`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FeedType {
    /// A durable event (it has a cursor).
    Durable(EventType),
    /// An ephemeral transcript delta.
    Delta(DeltaType),
    /// `resync`: deltas were dropped because the watcher read too slowly.
    Resync,
    /// `task_progress`: a runner's throttled progress on one task ([`crate::actors::progress`]).
    TaskProgress,
}

impl FeedType {
    /// The item's `type` word.
    pub fn as_str(self) -> &'static str {
        match self {
            FeedType::Durable(event) => event.as_str(),
            FeedType::Delta(delta) => delta.as_str(),
            FeedType::Resync => "resync",
            FeedType::TaskProgress => "task_progress",
        }
    }
}

/// One event as the doors show it.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    /// Resumable cursor (`cvei_<seq>`).
    pub cursor: String,
    /// The item type.
    pub event_type: FeedType,
    /// The item's data.
    pub data: Value,
    /// Unix milliseconds.
    pub at: i64,
}

fn internal(e: impl std::fmt::Display) -> Refusal {
    Refusal::new(ErrorCode::Internal, format!("the store failed: {e}"))
}

/// Parses an event cursor; empty means the beginning.
///
/// # Errors
/// 400 `parameter_invalid` for anything but `cvei_<n>`.
pub fn parse_cursor(cursor: &str) -> Result<i64, Refusal> {
    if cursor.is_empty() {
        return Ok(0);
    }
    cursor
        .strip_prefix(CURSOR_PREFIX)
        .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) && (n.len() == 1 || !n.starts_with('0')))
        .and_then(|n| n.parse::<i64>().ok())
        .ok_or_else(|| {
            Refusal::new(ErrorCode::ParameterInvalid, "after must be a cursor from an earlier event (cvei_<n>)")
        })
}

impl Api {
    /// Authenticates a member-plane bearer from an in-process caller (no source address, so no
    /// failure throttle) and spends one request of the member's budget.
    ///
    /// # Errors
    /// As [`Api::member_from`].
    pub async fn member(&self, token: &str) -> Result<Caller, Refusal> {
        self.member_from(token, None).await
    }

    /// Authenticates a member-plane bearer presented from `source` (the peer address) and spends
    /// one request of the member's budget. A failed credential spends one from the source's
    /// failure budget ([`crate::auth::throttle`]).
    ///
    /// # Errors
    /// 401 `unauthorized` for a token that opens no member door (unknown, expired, of the
    /// transport plane, its member gone: one message for all); 429 `rate_limited` with
    /// `retry_after` when the source's failure budget or the member's request budget is spent.
    pub async fn member_from(&self, token: &str, source: Option<Source>) -> Result<Caller, Refusal> {
        let (subject, _) = self.fabric.store.authenticate_from(token, Plane::Member, &self.credentials, source).await?;
        // A real member: its connection is no longer shed for the cap.
        crate::doors::sockets::authenticated();
        let subject = MemberId::from_uuid(subject);
        if let Err(not_until) = self.limiter.check_key(&subject) {
            let wait = not_until.wait_time_from(governor::clock::Clock::now(&governor::clock::DefaultClock::default()));
            return Err(Refusal::rate_limited(wait.as_secs() + u64::from(wait.subsec_nanos() > 0)));
        }
        let member =
            self.fabric.store.member(subject).await.map_err(internal)?.ok_or_else(|| not_accepted(Plane::Member))?;
        Ok(Caller { member })
    }

    /// `GET /agent_api/v1/profile`.
    ///
    /// # Errors
    /// `internal` on a store failure.
    pub async fn profile(&self, caller: &Caller) -> Result<Value, Refusal> {
        let profile = self.fabric.store.profile(caller.member.public_id).await.map_err(internal)?;
        Ok(profile_json(&caller.member, profile, self.fabric.clock.now_ms()))
    }

    /// `PUT /agent_api/v1/profile/configuration`, serialized on the Agent's ProfileActor.
    ///
    /// # Errors
    /// 403 `not_agent` for a Human; the grammar's refusals (see [`crate::declaration`]).
    pub async fn declare(&self, caller: &Caller, body: Value) -> Result<Value, Refusal> {
        caller.require_agent("has a profile to declare")?;
        self.root.profile(caller.member.public_id).await?.declare(body).await
    }

    /// `GET /agent_api/v1/tools`: the kernel catalog, `{tools:[{canonical_name, name,
    /// effect_profile, definition, template}]}` (`docs/declaration.md`, "Kernel imports").
    pub fn tools(&self, _caller: &Caller) -> Value {
        json!({"tools": nexus_kernel_tools::catalog::catalog_json()})
    }

    /// `GET /agent_api/v1/models`: `{models:[{ref, provider, visible, available,
    /// unavailable_reason}]}`.
    pub fn models(&self, _caller: &Caller) -> Value {
        json!({"models": self.fabric.models.list()})
    }

    /// `GET /agent_api/v1/profile/prompt_documents/{slot}`: `{slot, content, role, version}`.
    ///
    /// # Errors
    /// 403 `not_agent` for a Human; 404 `not_found` for a slot other than `system_prompt` and
    /// `summarizer`.
    pub async fn prompt_document(&self, caller: &Caller, slot: &str) -> Result<Value, Refusal> {
        caller.require_agent("has prompt documents")?;
        let slot = prompt_slot(slot)?;
        let profile = self.fabric.store.profile(caller.member.public_id).await.map_err(internal)?.unwrap_or_default();
        Ok(crate::actors::profile::slot_json(&profile, slot))
    }

    /// `PUT /agent_api/v1/profile/prompt_documents/{slot}` with `{content, role?}` (or null to
    /// clear): serialized with the whole-profile PUT on the Agent; the version advances.
    ///
    /// # Errors
    /// 403 `not_agent`; 404 `not_found`; 400 `parameter_missing`; 422 `prompt_document_invalid`,
    /// `prompt_document_too_large` or `prompt_document_macro_unknown`.
    pub async fn put_prompt_document(&self, caller: &Caller, slot: &str, body: Value) -> Result<Value, Refusal> {
        caller.require_agent("has prompt documents")?;
        let slot = prompt_slot(slot)?;
        self.root.profile(caller.member.public_id).await?.edit_slot(slot, body).await
    }

    /// `GET /agent_api/v1/executors[?kind=runner|tools_provider]` (`docs/protocol.md`,
    /// "Discovery"): the
    /// eligible executors, `{executors:[{public_id, kind, display_name, status, assignment_scope,
    /// served_tools, environment, served_documents, presence, last_seen_at, connected_at}]}`.
    /// Discovery filters by eligibility for the caller ([`crate::eligibility`]: an Agent sees the
    /// account-wide runners and those assigned to it, a Human the account-wide ones), never by
    /// presence.
    ///
    /// # Errors
    /// 400 `parameter_invalid` for another `kind`.
    pub async fn executors(&self, caller: &Caller, kind: Option<&str>) -> Result<Value, Refusal> {
        let kind = match kind {
            None | Some("runner") => ExecutorKind::Runner,
            Some("tools_provider" | "tool_provider") => ExecutorKind::ToolsProvider,
            Some(other) => {
                return Err(Refusal::new(
                    ErrorCode::ParameterInvalid,
                    format!("kind {other} is not listed here; use runner or tools_provider"),
                ));
            }
        };
        let principal = crate::eligibility::Principal::of(&caller.member);
        let rows = crate::eligibility::eligible_runners(&self.fabric.store, principal).await.map_err(internal)?;
        let now = self.fabric.clock.now_ms();
        let listed: Vec<Value> = rows
            .iter()
            .filter(|row| row.kind == kind)
            .map(|row| crate::actors::executor::executor_json(row, now))
            .collect();
        Ok(json!({"executors": listed}))
    }

    /// `GET /agent_api/v1/executors/{id}`: one eligible executor.
    ///
    /// # Errors
    /// 400 `parameter_invalid` for an id that is not a UUID in its one spelling (as on every door
    /// that takes an id); 404 `not_found` for an unknown one or one not eligible for the caller.
    pub async fn executor(&self, caller: &Caller, id: &str) -> Result<Value, Refusal> {
        let missing = || Refusal::new(ErrorCode::NotFound, format!("no eligible executor {id}"));
        let id: RunnerId = id.parse().map_err(|e: nexus_proto::MalformedId| {
            Refusal::new(ErrorCode::ParameterInvalid, format!("the executor id is malformed: {e}"))
        })?;
        let Some(row) = self.fabric.store.executor(id).await.map_err(internal)? else { return Err(missing()) };
        let principal = crate::eligibility::Principal::of(&caller.member);
        let judged = crate::eligibility::eligibility(&self.fabric.store, &row, principal).await.map_err(internal)?;
        if judged != crate::declaration::Eligibility::Eligible {
            return Err(missing());
        }
        Ok(crate::actors::executor::executor_json(&row, self.fabric.clock.now_ms()))
    }

    /// `GET /agent_api/v1/profile/agents`: the Agent's live named definitions.
    ///
    /// # Errors
    /// 403 `not_agent` for a Human.
    pub async fn named_definitions(&self, caller: &Caller) -> Result<Value, Refusal> {
        caller.require_agent("has named definitions")?;
        let rows = self.fabric.store.named_definitions(caller.member.public_id).await.map_err(internal)?;
        Ok(json!({"agents": rows.iter().map(crate::actors::profile::named_definition_json).collect::<Vec<_>>()}))
    }

    /// `PUT /agent_api/v1/profile/agents/{name}`: returns `(minted, definition)`; 201 when minted,
    /// 200 when replaced or restored.
    ///
    /// # Errors
    /// 403 `not_agent`; 404 for a name outside the handle grammar; 400 `parameter_missing`; 422
    /// `validation_failed` naming the field.
    pub async fn put_named_definition(
        &self,
        caller: &Caller,
        name: &str,
        body: Value,
    ) -> Result<(bool, Value), Refusal> {
        caller.require_agent("has named definitions")?;
        self.root.profile(caller.member.public_id).await?.put_agent(name.to_owned(), body).await
    }

    /// `DELETE /agent_api/v1/profile/agents/{name}`.
    ///
    /// # Errors
    /// 403 `not_agent`; 404 `not_found`.
    pub async fn delete_named_definition(&self, caller: &Caller, name: &str) -> Result<(), Refusal> {
        caller.require_agent("has named definitions")?;
        self.root.profile(caller.member.public_id).await?.delete_agent(name.to_owned()).await
    }

    /// `POST /agent_api/v1/tools/assembly`: a read-only projection of what an execution would
    /// freeze. Body: `{default_runner_executor_public_id (required, nullable), configuration?:
    /// {tool_definitions, kernel_tools, runner_executor_public_ids, runner_tool_names}}`. Answers
    /// `{tool_definitions, environment:{default_runner_executor_public_id, executors[],
    /// runner_candidates[]}}`. Writes nothing.
    ///
    /// # Errors
    /// 400 `parameter_missing`; 403 `not_agent`; 413 `content_too_large` for a tool list over its
    /// bound; 422 `runner_not_declared`, `runner_not_eligible`, `tool_not_served` or
    /// `validation_failed`.
    pub async fn assembly_preview(&self, caller: &Caller, body: &Value) -> Result<Value, Refusal> {
        caller.require_agent("assembles tools")?;
        let Some(root) = body.as_object() else {
            return Err(Refusal::new(ErrorCode::ParameterMissing, "the body must be an object"));
        };
        let selected = match root.get("default_runner_executor_public_id") {
            None => {
                return Err(Refusal::new(
                    ErrorCode::ParameterMissing,
                    "default_runner_executor_public_id is required (it may be null)",
                ));
            }
            Some(Value::Null) => None,
            Some(Value::String(id)) => Some(id.parse::<RunnerId>().map_err(|_| {
                Refusal::new(ErrorCode::ValidationFailed, "default_runner_executor_public_id: must be a UUID")
            })?),
            Some(_) => {
                return Err(Refusal::new(
                    ErrorCode::ValidationFailed,
                    "default_runner_executor_public_id: must be a UUID or null",
                ));
            }
        };
        let source = match root.get("configuration") {
            None | Some(Value::Null) => serde_json::Map::new(),
            Some(Value::Object(configuration)) => configuration.clone(),
            Some(_) => return Err(Refusal::new(ErrorCode::ParameterMissing, "configuration must be an object")),
        };
        // Only the four source fields take part; everything else is ignored.
        let mut fields = serde_json::Map::new();
        for key in ["tool_definitions", "kernel_tools", "runner_executor_public_ids", "runner_tool_names"] {
            if let Some(value) = source.get(key) {
                fields.insert(key.to_owned(), value.clone());
            }
        }
        if fields
            .get("tool_definitions")
            .is_some_and(|t| t.to_string().len() > crate::declaration::TOOL_DEFINITIONS_BOUND)
        {
            return Err(Refusal::new(ErrorCode::ContentTooLarge, "tool_definitions is over 1048576 bytes"));
        }
        fields.insert("approval_mode".into(), json!("bypass"));
        let configuration = validate_configuration(&fields, &|_| Ok(()))?;
        let runners = resolve::runner_facts(&self.fabric.store, &configuration, caller.member.public_id).await?;
        let selection = selected.map_or(RunnerSelection::NoRunner, RunnerSelection::Named);
        let frozen = crate::declaration::freeze(&configuration, None, selection, &runners, None)?;
        // Only runners eligible for the caller are shown (`docs/protocol.md`, "Assignment").
        let executors: Vec<Value> = runners
            .iter()
            .filter(|r| r.eligible())
            .map(|r| json!({"runner_executor_public_id": r.public_id, "display_name": r.display_name, "environment": r.announcement["environment"]}))
            .collect();
        Ok(json!({
            "tool_definitions": frozen.tools.iter().map(|t| t.definition.clone()).collect::<Vec<_>>(),
            "environment": {
                "default_runner_executor_public_id": frozen.default_runner_executor_public_id,
                "executors": executors,
                "runner_candidates": frozen.runner_candidates,
            },
        }))
    }

    /// Admits one input and starts its execution, or queues it behind the conversation's live
    /// execution, or records a steer for that execution to apply ([`Api::admit`]). The answering
    /// Agent ([`Api::answering_agent`]) is the caller itself, a continued conversation's owner, or
    /// the Agent a Human steward names in `agent_public_id`; the execution is that Agent's, its
    /// profile answers, and the input records a Human poster in `posted_by_public_id`
    /// (`docs/executions.md`, "People in the loop").
    ///
    /// # Errors
    /// 409 `input_queue_full` when the conversation holds 16 waiting inputs;
    /// 403 `not_authorized` for a suspended caller or Agent, and for a Human who does not steward
    /// the Agent; 400 `parameter_missing` (empty text, or a Human starting a conversation without
    /// `agent_public_id`) or `parameter_invalid` (a scalar `tool_names`, or text holding NUL); 404
    /// `not_found` (an unknown conversation or Agent, or another Agent's); 422
    /// `validation_failed` (an invalid inline declaration, no declaration at all, no model to run,
    /// or an `agent_public_id` that is not the continued conversation's);
    /// 422 `runner_not_declared` or `runner_not_eligible` for a `runner_executor_public_id` that is
    /// not a candidate or not eligible for the Agent (`docs/protocol.md`, "Assignment");
    /// 400 `parameter_invalid` or 422 `variable_undeclared` for `variables` the answering template
    /// does not take; 422 `deliver_at_ambiguous`, `deliver_at_not_steerable`, `deliver_at_in_past`,
    /// `deliver_at_too_far` or `validation_failed` for a `deliver_at` / `deliver_in` that
    /// [`crate::schedule::delivery_time`] refuses.
    pub async fn create_input(&self, caller: &Caller, input: CreateInput) -> Result<Admitted, Refusal> {
        caller.require_active("admit inputs")?;
        if input.text.trim().is_empty() {
            return Err(Refusal::new(ErrorCode::ParameterMissing, "text is required"));
        }
        if input.text.len() > INPUT_TEXT_BOUND {
            return Err(Refusal::new(ErrorCode::ContentTooLarge, "text is over 1048576 bytes"));
        }
        // Neither store holds U+0000 in text (`docs/executions.md`, "Text and NUL").
        if input.text.contains('\0') {
            return Err(Refusal::new(
                ErrorCode::ParameterInvalid,
                "text must not contain NUL (U+0000); remove it and send again",
            ));
        }
        if let Some(names) = &input.tool_names
            && !names.as_array().is_some_and(|a| a.iter().all(Value::is_string))
        {
            return Err(Refusal::new(ErrorCode::ParameterInvalid, "tool_names must be an array of names"));
        }
        if input.delivery_mode == Some(nexus_proto::DeliveryMode::Steer) {
            inputs::steer_carries_text_only(&input)?;
        }
        let mode = input.delivery_mode.unwrap_or(nexus_proto::DeliveryMode::Queue);
        // On the fabric clock, so tests move it (`docs/executions.md`, "Scheduled inputs").
        let deliver_at = crate::schedule::delivery_time(
            self.fabric.clock.now_ms(),
            input.deliver_at.as_deref(),
            input.deliver_in.as_deref(),
            mode,
        )?;
        let store = &self.fabric.store;
        let agent = self.answering_agent(caller, input.conversation_public_id, input.agent_public_id).await?;
        if agent != caller.member.public_id {
            let answering = store.member(agent).await.map_err(internal)?;
            if answering.is_none_or(|member| member.status != MemberStatus::Active) {
                return Err(Refusal::new(
                    ErrorCode::NotAuthorized,
                    format!(
                        "the Agent {agent} is suspended and answers no new inputs; ask an operator to reinstate it"
                    ),
                ));
            }
        }
        let budget = input.budget.as_ref().map(|b| crate::budget::BudgetLimits::parse(b, "budget")).transpose()?;
        let models = &self.fabric.models;
        let check = |reference: &str| models.check(reference);
        let configuration = match &input.execution_declaration {
            Some(inline) => {
                let object = inline.as_object().ok_or_else(|| {
                    Refusal::new(ErrorCode::ValidationFailed, "execution_declaration: must be an object")
                })?;
                crate::declaration::validate_execution_declaration(object, &check)?.configuration
            }
            None => store.profile(agent).await.map_err(internal)?.and_then(|p| p.configuration).ok_or_else(|| {
                Refusal::new(
                    ErrorCode::ValidationFailed,
                    "configuration: the profile has not declared one; PUT /agent_api/v1/profile/configuration first",
                )
            })?,
        };
        if let Some(runner) = input.runner_executor_public_id {
            let candidates = configuration["runner_executor_public_ids"].as_array();
            if !candidates.is_some_and(|ids| {
                ids.iter().any(|id| id.as_str().and_then(|s| RunnerId::parse_any_case(s).ok()) == Some(runner))
            }) {
                return Err(Refusal::new(
                    ErrorCode::RunnerNotDeclared,
                    format!("runner {runner} is not among the declaration's runner_executor_public_ids"),
                ));
            }
            // The input's own selection is judged now as well as at materialization.
            crate::eligibility::refuse_ineligible_selection(store, runner, agent).await?;
        }
        if configuration["default_model"].is_null() {
            return Err(Refusal::new(
                ErrorCode::ValidationFailed,
                "default_model: the declaration names no model to run",
            ));
        }
        if let Some(variables) = &input.variables {
            crate::declaration::template::input_variables(&configuration, variables)?;
        }
        // The conversation's Agent was judged above.
        let (conversation, new_conversation) = match input.conversation_public_id {
            Some(id) => (id, false),
            None => (ConversationId::new_v4(), true),
        };
        let poster = caller.member.public_id;
        let row = InputRow {
            public_id: InputId::new_v4(),
            conversation_public_id: conversation,
            member_public_id: agent,
            text: input.text,
            execution_declaration: input.execution_declaration,
            runner_executor_public_id: input.runner_executor_public_id,
            tool_names: input.tool_names,
            variables: input.variables,
            budget,
            posted_by_public_id: (poster != agent).then_some(poster),
            turn: 0,
            deliver_at,
        };
        self.admit(caller, &row, new_conversation, mode).await
    }

    /// Reads one execution with the first page of its tasks ([`Api::execution_page`]).
    ///
    /// # Errors
    /// 404 `not_found` for an unknown execution or another Agent's; 403 `not_authorized` for a Human
    /// without the standing the door needs ([`standing`]).
    pub async fn execution(&self, caller: &Caller, id: ExecutionId) -> Result<Value, Refusal> {
        self.execution_page(caller, id, None).await
    }

    /// Reads one execution with a page of its tasks (`docs/executions.md`, "Reply bounds"): the
    /// tasks after `tasks_after` (a task key of an earlier page; `None` from the first), in the
    /// execution's task order, as many as fit [`TASK_PAGE_BOUND`] bytes of JSON (at least one),
    /// and `tasks_next`, the key to pass for the next page, or null after the last.
    ///
    /// # Errors
    /// 404 `not_found` for an unknown execution or another Agent's; 403 `not_authorized` for a Human
    /// without the standing the door needs ([`standing`]); 400 `parameter_invalid` when `tasks_after`
    /// names no task of the execution.
    pub async fn execution_page(
        &self,
        caller: &Caller,
        id: ExecutionId,
        tasks_after: Option<&str>,
    ) -> Result<Value, Refusal> {
        let store = &self.fabric.store;
        let row = self.execution_for(caller, id, Need::Read).await?;
        // Who posted the input: a Human steward, or the Agent itself.
        let input = store.input(row.input_public_id).await.map_err(internal)?;
        let poster = input.as_ref().map(InputRow::poster);
        // A scheduled input's delivery time, in Unix ms (`docs/executions.md`, "Scheduled inputs").
        let deliver_at = input.as_ref().and_then(|input| input.deliver_at);
        let tasks = store.tasks_of(id).await.map_err(internal)?;
        // The execution that started this one, when it is a child (`docs/delegation.md`).
        let parent = match row.parent_execution_public_id {
            Some(_) => store.parent_of(id).await.map_err(internal)?.as_ref().map(children::parent_view),
            None => None,
        };
        let start =
            match tasks_after {
                None => 0,
                Some(after) => 1 + tasks.iter().position(|t| t.task_key.to_string() == after).ok_or_else(|| {
                    Refusal::new(
                        ErrorCode::ParameterInvalid,
                        format!(
                            "tasks_after `{after}` is no task of execution {id}; pass the tasks_next of an earlier page"
                        ),
                    )
                })?,
            };
        let (page, tasks_next) = task_page(&tasks[start..]);
        Ok(json!({
            "execution_public_id": row.public_id,
            "conversation_public_id": row.conversation_public_id,
            "input_public_id": row.input_public_id,
            "member_public_id": row.member_public_id,
            "posted_by_public_id": poster,
            "status": row.status,
            "attention_reason": row.attention_reason,
            "round": row.round,
            "final_text": row.final_text,
            "error_key": row.error_key,
            "declaration_digest": row.declaration.as_ref().map(|d| d["digest"].clone()),
            "default_runner_executor_public_id": row.declaration.as_ref().map(|d| d["default_runner_executor_public_id"].clone()),
            "event_cursor": format!("{CURSOR_PREFIX}{}", row.event_seq),
            "queue": self.queue_view(&row).await?,
            "deliver_at": deliver_at,
            "parent": parent,
            // `docs/executions.md`, "Budgets": null for an execution without one.
            "budget": row.budget.as_ref().map(crate::budget::BudgetLedger::view),
            "created_at": row.created_at,
            "updated_at": row.updated_at,
            "tasks": page,
            "tasks_next": tasks_next,
        }))
    }

    /// `POST /agent_api/v1/executions/{execution_id}/tasks/{task_key}/approve` (gRPC
    /// `ApproveTask`): a task parked in `needs_approval` runs on its frozen target, or is parked
    /// again when its runner's effect profile changed under the park (`docs/executions.md`,
    /// "Approval"). Answers
    /// the task as the execution shows it, with its `approval` fact.
    ///
    /// # Errors
    /// 404 `not_found` for an unknown execution or task, and for another Agent's execution; 403
    /// `not_authorized` for a Human without the standing the door needs ([`standing`]); 409
    /// `not_awaiting_approval` when the task is not parked, `not_adjudicable` when the execution is not
    /// running; 403 `not_authorized` for a suspended member.
    pub async fn approve_task(&self, caller: &Caller, id: ExecutionId, task_key: &str) -> Result<Value, Refusal> {
        self.adjudicate(caller, id, task_key, Adjudication::Approve).await
    }

    /// `POST /agent_api/v1/executions/{execution_id}/tasks/{task_key}/deny` with body
    /// `{reason?}` (gRPC `DenyTask`): the parked task fails `approval_denied`, the reason's first
    /// 256 bytes become `error.detail`, and the model reads the origin's tool-use error.
    ///
    /// # Errors
    /// 400 `parameter_invalid` for a body that is not an object, a field other than `reason`, or
    /// a `reason` that is not a string or holds NUL; otherwise as [`Api::approve_task`].
    pub async fn deny_task(
        &self,
        caller: &Caller,
        id: ExecutionId,
        task_key: &str,
        body: &Value,
    ) -> Result<Value, Refusal> {
        known_fields(body, &["reason"])?;
        let reason = match body.get("reason") {
            None | Some(Value::Null) => None,
            Some(Value::String(reason)) if reason.contains('\0') => {
                return Err(Refusal::new(
                    ErrorCode::ParameterInvalid,
                    "reason must not contain NUL (U+0000); remove it and send again",
                ));
            }
            Some(Value::String(reason)) => Some(reason.clone()),
            Some(_) => return Err(Refusal::new(ErrorCode::ParameterInvalid, "reason must be a string")),
        };
        self.adjudicate(caller, id, task_key, Adjudication::Deny { reason }).await
    }

    async fn adjudicate(
        &self,
        caller: &Caller,
        id: ExecutionId,
        task_key: &str,
        adjudication: Adjudication,
    ) -> Result<Value, Refusal> {
        let (row, task) = self.task_for(caller, id, task_key, Need::Act).await?;
        if matches!(adjudication, Adjudication::Approve) {
            // Approving starts work: a suspended member may deny, never approve.
            caller.require_active("approve calls")?;
        }
        if task.status != TaskStatus::NeedsApproval {
            return Err(Refusal::new(
                ErrorCode::NotAwaitingApproval,
                format!("task {task_key} is {}, not needs_approval; only a parked task takes a decision", task.status),
            ));
        }
        if row.status != RunStatus::Running {
            return Err(Refusal::new(
                ErrorCode::NotAdjudicable,
                format!("execution {id} is {}; only a running execution takes decisions", row.status),
            ));
        }
        let by = Adjudicator::new(caller.member.public_id, caller.member.kind);
        let decided = self.root.execution(id).adjudicate(task.task_key, adjudication, by).await?;
        Ok(task_view(&decided))
    }

    /// `POST /agent_api/v1/executions/{id}/stop` `{force?}` (gRPC `StopExecution`), forced unless
    /// `force` is false (`docs/executions.md`, "Control"; [`crate::actors::execution::control`]). A
    /// forced stop answers once the drain through `canceling` has ended (bounded by `[execution]
    /// stop_drain_ms`); a graceful one answers at once, `canceling` while dispatched work
    /// finishes. A finished execution is answered as it is.
    ///
    /// # Errors
    /// 404 `not_found` for an unknown execution or another Agent's; 403 `not_authorized` for a Human
    /// without the standing the door needs ([`standing`]); `unavailable` during shutdown.
    pub async fn stop(&self, caller: &Caller, id: ExecutionId, force: bool) -> Result<Value, Refusal> {
        let owned = self.execution_for(caller, id, Need::Act).await?;
        if owned.status.is_terminal() {
            return self.execution(caller, id).await;
        }
        let stopped = self.root.execution(id).stop(force).await?;
        if force && stopped.status == RunStatus::Canceling {
            // The runners' cancellations settle within moments; the actor ends the drain at its
            // bound at the latest.
            let bound = Duration::from_millis(self.fabric.config.execution.stop_drain_ms.saturating_add(1_000));
            let deadline = tokio::time::Instant::now() + bound;
            while tokio::time::Instant::now() < deadline {
                let status = self.fabric.store.execution(id).await.map_err(internal)?.map(|r| r.status);
                if status != Some(RunStatus::Canceling) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        self.execution(caller, id).await
    }

    /// `POST /agent_api/v1/executions/{id}/pause` `{force?}` (gRPC `PauseExecution`): a running
    /// execution turns `paused` and schedules nothing new; its clocks freeze. `force` also aborts
    /// an in-flight model call, asked again on resume. Answers the execution.
    ///
    /// # Errors
    /// 404 `not_found`; 403 `not_authorized` ([`standing`]); 409 `not_pausable` when the execution is not running.
    pub async fn pause(&self, caller: &Caller, id: ExecutionId, force: bool) -> Result<Value, Refusal> {
        self.execution_for(caller, id, Need::Act).await?;
        self.root.execution(id).pause(force).await?;
        self.execution(caller, id).await
    }

    /// `POST /agent_api/v1/executions/{id}/resume` (gRPC `ResumeExecution`): a paused execution
    /// runs again; every open deadline moves forward by the paused time. Answers the execution.
    ///
    /// # Errors
    /// 404 `not_found`; 403 `not_authorized` ([`standing`], or a suspended member); 409 `not_paused`
    /// when the execution is not paused.
    pub async fn resume(&self, caller: &Caller, id: ExecutionId) -> Result<Value, Refusal> {
        self.execution_for(caller, id, Need::Act).await?;
        caller.require_active("resume executions")?;
        self.root.execution(id).resume().await?;
        self.execution(caller, id).await
    }

    /// `POST /agent_api/v1/executions/{id}/regenerate` `{execution_declaration?}` (gRPC
    /// `RegenerateExecution`): a new execution of the same input, started at once, that reuses the
    /// original's frozen declaration, or freezes the supplied one (validated as on input admission)
    /// (`docs/executions.md`, "Control"). Answers `{execution_public_id, regenerated_from,
    /// declaration: reused|replaced, declaration_digest}`.
    ///
    /// # Errors
    /// 404 `not_found`; 403 `not_authorized` ([`standing`], or a suspended member); 400 `parameter_invalid` for
    /// a body that is not an object or names another field; 409 `not_regenerable` when the
    /// original froze no declaration and none is supplied, or while an execution of its
    /// conversation has not ended; 422 `validation_failed` and the
    /// assembly's words for a supplied declaration.
    pub async fn regenerate(&self, caller: &Caller, id: ExecutionId, body: &Value) -> Result<Value, Refusal> {
        let supplied = resolve::supplied_declaration(body)?;
        let original = self.execution_for(caller, id, Need::Act).await?;
        caller.require_active("start executions")?;
        // One execution at a time per conversation (`docs/executions.md`, "Conversations: one
        // turn at a time"): a turn is answered again only once its conversation is quiet.
        let line = self.fabric.store.conversation_line(original.conversation_public_id).await.map_err(internal)?;
        if let Some(live) = line.first() {
            return Err(Refusal::new(
                ErrorCode::NotRegenerable,
                format!(
                    "conversation {} has a live execution {} ({}, turn {}); a turn is regenerated once every \
                     execution of its conversation has ended: wait for it, or stop it first",
                    original.conversation_public_id, live.public_id, live.status, live.turn
                ),
            ));
        }
        let row = resolve::regenerate(&self.fabric, &original, supplied.as_ref()).await?;
        // The actor adopts the frozen declaration and runs as soon as it starts.
        self.root.execution(row.public_id).load().await?;
        Ok(json!({
            "execution_public_id": row.public_id,
            "regenerated_from": original.public_id,
            "declaration": if supplied.is_some() { "replaced" } else { "reused" },
            "declaration_digest": row.declaration.as_ref().map(|d| d["digest"].clone()),
        }))
    }

    /// `GET|POST /agent_api/v1/executions/{id}/estimate` `{execution_declaration?}` (gRPC
    /// `EstimateContext`): the size of the request the next round would send, in bytes and
    /// estimated tokens ([`resolve::estimate`] says how). Writes nothing.
    ///
    /// # Errors
    /// 404 `not_found`; 403 `not_authorized` ([`standing`]); 400 `parameter_invalid` for a body that is
    /// not an object or names another field; 422 `validation_failed` and the assembly's words for a
    /// supplied declaration.
    pub async fn estimate(&self, caller: &Caller, id: ExecutionId, body: &Value) -> Result<Value, Refusal> {
        let supplied = resolve::supplied_declaration(body)?;
        let row = self.execution_for(caller, id, Need::Act).await?;
        resolve::estimate(&self.fabric, &row, supplied.as_ref()).await
    }

    /// The durable events after `after` (a cursor, or empty for the beginning). With `follow`, the
    /// stream waits for new events and ends once the execution is quiescent (completed, canceled
    /// or needs_attention) and every event has been sent, or, once the server is closing, with a
    /// last item 503 `unavailable` naming the cursor to follow again from (on another node, or on
    /// this one once it is back).
    ///
    /// # Errors
    /// 404 `not_found`; 403 `not_authorized` for a Human without a grant ([`standing`]); 400
    /// `parameter_invalid` for a bad cursor, or one ahead of the execution's last event (it was never
    /// handed out, and a follower would skip every event up to it).
    pub async fn events(
        &self,
        caller: &Caller,
        id: ExecutionId,
        after: &str,
        follow: bool,
    ) -> Result<impl Stream<Item = Result<Event, Refusal>> + Send + 'static + use<>, Refusal> {
        let cursor = parse_cursor(after)?;
        let row = self.execution_for(caller, id, Need::Read).await?;
        // Events are stored before their cursors are handed out, so a cursor past the last
        // stored one came from elsewhere (a typo, another execution).
        if cursor > row.event_seq {
            return Err(Refusal::new(
                ErrorCode::ParameterInvalid,
                format!(
                    "after is ahead of this execution's events (last is {CURSOR_PREFIX}{}); resume from a cursor you received",
                    row.event_seq
                ),
            ));
        }
        // A quiet execution writes no more events: a follower reads to the end and stops.
        let live = !row.status.is_quiescent();
        let wake = (follow && live).then(|| self.fabric.events.subscribe(id));
        let follower = Follower {
            fabric: self.fabric.clone(),
            id,
            cursor,
            follow,
            wake,
            closing: self.fabric.closing.subscribe(),
            buffer: VecDeque::new(),
            done: false,
        };
        Ok(futures::stream::unfold(follower, Follower::next))
    }
}

/// A task as the execution doors show it: `{task_key, tool_name (the callable), served_name,
/// status, claimed, runner_executor_public_id, effect_profile, timeout_ms, deadline_at (for a
/// parked task, the end of its approval hold; for a call of `ask` awaiting its answer, the end of
/// its hold; null while its execution is paused),
/// frozen_remaining_ms (what an open task of a paused execution has left, else null), error_key,
/// error_message, result, approval}`. `error_message` is what the model read for a task settled
/// with an error key (a `timed_out` or `uncertain` task has no result to show), cut to
/// [`ERROR_MESSAGE_BOUND`] bytes, else null.
pub fn task_view(task: &TaskRow) -> Value {
    let error_message = (task.error_key.is_some() && task.is_settled())
        .then(|| preview(&crate::actors::execution::result_text(task), ERROR_MESSAGE_BOUND));
    json!({
        "task_key": task.task_key,
        "tool_name": task.callable_name,
        "served_name": task.tool_name,
        "status": task.status,
        "claimed": task.claimed,
        "runner_executor_public_id": task.target_executor_public_id,
        "effect_profile": task.effect_profile,
        "timeout_ms": task.timeout_ms,
        // While its execution is paused a deadline is frozen: no time, only what is left.
        "deadline_at": (!control::is_frozen(task.deadline_at)).then_some(task.deadline_at),
        // A task that settled while its execution was paused has nothing left to run.
        "frozen_remaining_ms": control::frozen_remaining_ms(task.deadline_at).filter(|_| !task.is_settled()),
        "error_key": task.error_key,
        "error_message": error_message,
        "result": task.result,
        "approval": task.approval,
    })
}

/// The most bytes of task JSON one execution reply carries (2 MiB): with the final text (at most
/// 1 MiB of JSON) and the rest of the row, a reply stays within [`crate::AGENT_REPLY_BOUND`].
pub const TASK_PAGE_BOUND: usize = 2 * 1024 * 1024;

/// The longest `error_message` of a task view, in bytes: a preview; the whole text is the
/// result's `content`, which the view carries once.
pub const ERROR_MESSAGE_BOUND: usize = 512;

/// The views of the leading `tasks` that fit [`TASK_PAGE_BOUND`] (at least one), and the key of
/// the last one when more follow.
fn task_page(tasks: &[TaskRow]) -> (Vec<Value>, Option<String>) {
    let mut page = Vec::new();
    let mut bytes = 0;
    for task in tasks {
        let view = task_view(task);
        let size = view.to_string().len();
        if !page.is_empty() && bytes + size > TASK_PAGE_BOUND {
            let last = tasks[page.len() - 1].task_key.to_string();
            return (page, Some(last));
        }
        bytes += size;
        page.push(view);
    }
    (page, None)
}

/// `text` cut to at most `bytes` bytes at a character boundary, with `…` when cut.
fn preview(text: &str, bytes: usize) -> String {
    if text.len() <= bytes {
        return text.to_owned();
    }
    let mut end = bytes;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// The last item of a follow cut short because this node is stopping: 503 `unavailable`, with
/// the cursor to follow again from.
fn stopping(cursor: i64) -> Refusal {
    Refusal::new(
        ErrorCode::Unavailable,
        format!(
            "this node is stopping: follow again after cursor {CURSOR_PREFIX}{cursor}, on another node or on this one once it is back"
        ),
    )
}

struct Follower {
    fabric: Arc<Fabric>,
    id: ExecutionId,
    cursor: i64,
    follow: bool,
    wake: Option<tokio::sync::watch::Receiver<i64>>,
    /// Turns true when the server is closing: a follower ends then, so that an open watch does
    /// not hold the transport's drain.
    closing: tokio::sync::watch::Receiver<bool>,
    buffer: VecDeque<EventRow>,
    done: bool,
}

impl Follower {
    async fn next(mut self) -> Option<(Result<Event, Refusal>, Follower)> {
        loop {
            if let Some(row) = self.buffer.pop_front() {
                let event = Event {
                    cursor: format!("{CURSOR_PREFIX}{}", row.seq),
                    event_type: FeedType::Durable(row.event.event_type()),
                    data: row.event.data(),
                    at: row.at,
                };
                return Some((Ok(event), self));
            }
            if self.done {
                return None;
            }
            if self.follow && *self.closing.borrow() {
                // Said in the stream, so a follower can tell a node going away from an
                // execution that ended: it follows again from its cursor.
                self.done = true;
                return Some((Err(stopping(self.cursor)), self));
            }
            let store = &self.fabric.store;
            match store.events_after(self.id, self.cursor, EVENT_PAGE).await {
                Ok(rows) if !rows.is_empty() => {
                    self.cursor = rows.last().map_or(self.cursor, |r| r.seq);
                    self.buffer.extend(rows);
                    continue;
                }
                Ok(_) => {}
                Err(e) => {
                    self.done = true;
                    return Some((Err(internal(e)), self));
                }
            }
            if !self.follow {
                self.done = true;
                continue;
            }
            match store.execution(self.id).await {
                Ok(Some(row)) if row.status.is_quiescent() && row.event_seq <= self.cursor => {
                    self.done = true;
                    continue;
                }
                Ok(_) => {}
                Err(e) => {
                    self.done = true;
                    return Some((Err(internal(e)), self));
                }
            }
            let closing = self.closing.wait_for(|closing| *closing);
            match &mut self.wake {
                Some(wake) => tokio::select! {
                    // Ends the follower at the top of the loop (or, should the fabric be gone,
                    // stops it all the same).
                    closed = closing => self.done = closed.is_err(),
                    woke = tokio::time::timeout(FOLLOW_POLL, wake.changed()) => {
                        if let Ok(Err(_)) = woke {
                            // The feed closed (the execution went quiet or its actor stopped): poll.
                            self.wake = None;
                        }
                    }
                },
                None => tokio::select! {
                    closed = closing => self.done = closed.is_err(),
                    () = tokio::time::sleep(Duration::from_millis(200)) => {}
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors() {
        assert_eq!(parse_cursor("").ok(), Some(0));
        assert_eq!(parse_cursor("cvei_42").ok(), Some(42));
        assert_eq!(parse_cursor("42").map_err(|r| r.code).err(), Some(ErrorCode::ParameterInvalid));
        for bad in ["cvei_-1", "cvei_+3", "cvei_03", "cvei_", "cvei_1x"] {
            assert_eq!(parse_cursor(bad).map_err(|r| r.code).err(), Some(ErrorCode::ParameterInvalid), "{bad}");
        }
        assert_eq!(parse_cursor("cvei_0").ok(), Some(0));
    }

    fn settled(index: u32, content: &str) -> TaskRow {
        let key = nexus_proto::TaskKey::Call { round: 1, index };
        TaskRow {
            status: TaskStatus::Failed,
            error_key: Some("tool_failed".into()),
            settled_at: Some(1),
            result: Some(json!({"content": content, "is_error": true})),
            ..TaskRow::new(ExecutionId::new_v4(), key, 1, "bash".into(), 1_000, 1)
        }
    }

    #[test]
    fn task_pages_fit_their_bound_and_carry_a_value_once() {
        // Six results of 900 KB: two fit one page, and the page says where to go on.
        let big = "x".repeat(900_000);
        let tasks: Vec<TaskRow> = (0..6).map(|i| settled(i, &big)).collect();
        let (page, next) = task_page(&tasks);
        assert_eq!(page.len(), 2);
        assert_eq!(next.as_deref(), Some("r1t1"));
        assert!(Value::Array(page.clone()).to_string().len() <= TASK_PAGE_BOUND);
        let (rest, next) = task_page(&tasks[4..]);
        assert_eq!((rest.len(), next), (2, None));
        // A task alone over the page bound still goes out, alone.
        let (alone, next) = task_page(&[settled(0, &"y".repeat(TASK_PAGE_BOUND)), settled(1, "z")]);
        assert_eq!((alone.len(), next.as_deref()), (1, Some("r1t0")));
        // The error message is a preview: the result's content is the one whole copy.
        let message = page[0]["error_message"].as_str().unwrap_or_default();
        assert!(
            message.len() <= ERROR_MESSAGE_BOUND + "…".len() && message.starts_with("tool_failed: xxx"),
            "{message}"
        );
        assert_eq!(page[0]["result"]["content"].as_str().map(str::len), Some(900_000));
    }
}
