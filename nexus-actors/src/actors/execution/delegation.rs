//! Delegation in an execution (`docs/delegation.md`): the kernel tools `delegate_task`, `wait`,
//! `join` (nexus's extension), `spawn`, `send`, `status` and `cancel`.
//!
//! A child is an execution of its own, in a conversation whose parent is the caller's, started by
//! one store transaction that also writes the parent–child row ([`Store::start_child`]); the
//! caller's call is that child's handle (its task key). The approval stage leaves a delegation
//! call `running` ([`super::approval::route`]); [`launch`] then starts the child (or reads the
//! children a `wait` or `join` names) in a task of the actor and answers with
//! [`DelegationMsg::Started`]. A call that waits (`delegate_task` with `wait: true`, `wait`,
//! `join`) becomes a *waiter*: state of the parent, re-derived after a restart from the durable
//! call row and the children's rows, so a join resumes where it stood.
//!
//! A child tells its parent when it ends ([`DelegationMsg::ChildEnded`], cast from the child's
//! terminal save; recovery re-sends it for any result nobody consumed, [`reconcile_all`]). The
//! parent then decides its waiters ([`evaluate`]), and any ended child nobody waits for is
//! *mail*: read at the parent's next safe boundary as a `<task_result>` user message, or, when
//! the parent's turn has ended, a new turn of its conversation (`wake: auto`) or the first thing
//! its next turn reads (`wake: passive`). Each consumption is a compare-and-set on the child's
//! row, written with (or before) the write that hands the result on, so a result is consumed once.
//! When the parent's turn ends, each child still running is canceled (`lifetime: turn`) or
//! detached to the parent's conversation (`lifetime: conversation`), and that is recorded.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use ractor::{ActorProcessingErr, ActorRef};
use serde_json::{Map, Value, json};
use tokio::task::JoinHandle;
use tracing::Instrument;

use nexus_proto::{
    ChildDisposition, ChildKind, ChildLifetime, ChildWake, ConversationId, ErrorCode, ExecutionId, InputId, JoinLosers,
    JoinPolicy, RunStatus, TaskKey, TaskStatus,
};

use crate::actors::fabric::Fabric;
use crate::actors::root::RootHandle;
use crate::declaration::FrozenDeclaration;
use crate::model::ChatMessage;
use crate::store::children::{ChildRow, Consumption, PROMPT_HEAD_CHARS};
use crate::store::{ExecutionRow, InputRow, TaskRow};

use super::{ExecutionHandle, ExecutionMsg, ExecutionState, kernel};

/// The delegation tools by wire name.
pub const TOOLS: [&str; 7] = ["delegate_task", "wait", "join", "spawn", "send", "status", "cancel"];

/// A wait's default and largest timeout, in milliseconds (REFERENCE 5: 1 h, effective ≤ 24 h).
pub const WAIT_TIMEOUT_MS: (i64, i64) = (3_600_000, 86_400_000);

/// The most tasks one `join` names.
pub const JOIN_WIDTH: usize = 32;

/// The most children one execution starts (nexus's guard against runaway fan-out; the origin
/// sets no ceiling): a starting call beyond it is refused as a call error envelope.
pub const CHILDREN_PER_EXECUTION: usize = 256;

/// The deepest a child may be nested: a child of a child ... of a top-level execution, this many
/// levels down (nexus's guard against runaway recursion; the origin sets no ceiling).
pub const DELEGATION_DEPTH: usize = 16;

/// Whether `execution` may start one more child: within [`CHILDREN_PER_EXECUTION`] and
/// [`DELEGATION_DEPTH`]; `Err` is the call error envelope's text.
///
/// # Errors
/// A store failure.
pub(super) async fn within_bounds(
    store: &crate::store::Store,
    execution: &ExecutionRow,
) -> Result<Result<(), String>, kernel::KernelFailure> {
    if store.children_count(execution.public_id).await? >= CHILDREN_PER_EXECUTION {
        return Ok(Err(format!(
            "delegation bound: this run started {CHILDREN_PER_EXECUTION} children already, the most one run may; \
             join or wait for the ones it has"
        )));
    }
    // The run's depth is the number of parents above it; its child would be one deeper.
    let mut depth = 0;
    let mut above = execution.parent_execution_public_id;
    while let Some(parent) = above {
        depth += 1;
        if depth >= DELEGATION_DEPTH {
            return Ok(Err(format!(
                "delegation bound: this run is nested {DELEGATION_DEPTH} levels deep, the deepest that may start \
                 another child; do the work here"
            )));
        }
        above = store.parent_of(parent).await?.map(|row| row.parent_execution_public_id);
    }
    Ok(Ok(()))
}

/// Whether `task` is a call of a delegation tool: its served name, with no runner target.
pub fn is_call(task: &TaskRow) -> bool {
    task.target_executor_public_id.is_none() && TOOLS.contains(&task.tool_name.as_str())
}

/// Whether `declaration` offers any delegation tool: only then can the execution have children.
pub fn delegates(declaration: &FrozenDeclaration) -> bool {
    declaration.tools.iter().any(|tool| {
        tool.route.is_none()
            && tool
                .canonical_name()
                .is_some_and(|name| nexus_kernel_tools::lookup(name).is_some_and(|kernel| TOOLS.contains(&kernel.name)))
    })
}

/// Gives a new delegation call its budget (`timeout_ms`): a wait's or join's own `timeout_ms`
/// (default 1 h, cut to 24 h), the wait of `delegate_task`/`spawn` with `wait: true` (1 h). The
/// others keep the default task budget.
pub(super) fn budget(task: &mut TaskRow) {
    if !is_call(task) {
        return;
    }
    let asked = task.tool_input.get("timeout_ms").and_then(Value::as_i64).filter(|ms| *ms >= 1);
    match task.tool_name.as_str() {
        "wait" | "join" => task.timeout_ms = asked.unwrap_or(WAIT_TIMEOUT_MS.0).min(WAIT_TIMEOUT_MS.1),
        "delegate_task" | "spawn" if task.tool_input.get("wait") == Some(&Value::Bool(true)) => {
            task.timeout_ms = WAIT_TIMEOUT_MS.0;
        }
        _ => {}
    }
}

/// Whether `task` starts a child (`delegate_task`, `spawn`).
fn starts_child(task: &TaskRow) -> bool {
    is_call(task) && matches!(task.tool_name.as_str(), "delegate_task" | "spawn")
}

/// Reserves the allocation of the child `task` will start, out of the execution's remainder,
/// when the execution has a budget (`docs/delegation.md`, "Budgets"): before the approval stage,
/// so a child that does not fit is never started. The allocation is kept in the ledger under the
/// call's key, written with the round's save, until the child ends or will never start.
///
/// # Errors
/// `budget_exhausted` ([`super::budget::reserve_child`]); nothing is held then.
pub(super) fn reserve_allocation(state: &mut ExecutionState, task: &TaskRow) -> Result<(), nexus_proto::Refusal> {
    if !starts_child(task) || state.row.budget.is_none() {
        return Ok(());
    }
    if let Some(allocation) = super::budget::reserve_child(state, None)?
        && let Some(ledger) = &mut state.row.budget
    {
        ledger.children.insert(task.task_key.to_string(), allocation);
    }
    Ok(())
}

/// The budget of the children that ended (what each spent replaces its allocation) and of the
/// allocations no child will use: those of calls that settled without a child, and all of them
/// once the turn has ended.
fn settle_budgets(state: &mut ExecutionState, children: &[ChildRow]) {
    let Some(ledger) = &state.row.budget else { return };
    if ledger.children.is_empty() {
        return;
    }
    let held: Vec<(String, crate::budget::BudgetLimits)> =
        ledger.children.iter().map(|(key, limits)| (key.clone(), *limits)).collect();
    let ended_turn = state.row.status.is_terminal();
    for (key, allocation) in held {
        let child = children.iter().find(|c| c.task_key.to_string() == key);
        let call_open = key.parse::<TaskKey>().ok().is_some_and(|k| is_open(state, k));
        match child {
            Some(child) if child.ended() => {
                let spent = child.budget.as_ref().map(crate::budget::BudgetLedger::spent).unwrap_or_default();
                super::budget::child_settled(state, &allocation, &spent);
            }
            // A child still running keeps its allocation, after the turn too.
            Some(_) => continue,
            None if call_open && !ended_turn => continue,
            None => {
                if let Some(ledger) = &mut state.row.budget {
                    ledger.release_child(&allocation);
                }
            }
        }
        if let Some(ledger) = &mut state.row.budget {
            ledger.children.remove(&key);
        }
    }
}

/// The delegation bookkeeping of an execution.
#[derive(Default)]
pub struct DelegationState {
    /// The calls waiting on children, by task key.
    waiters: BTreeMap<TaskKey, Waiter>,
    /// Their deadline timers.
    timers: HashMap<TaskKey, JoinHandle<()>>,
    /// Ended children whose results the next boundary reads, by (parent, key).
    mail: BTreeMap<(ExecutionId, TaskKey), ChildRow>,
    /// Consumptions written with the next save.
    pub(super) consuming: Vec<Consumption>,
    /// The children this actor handed on already (so a repeated notice hands nothing twice).
    handed: BTreeSet<(ExecutionId, TaskKey)>,
    /// The end's dispositions were made.
    disposed: bool,
    /// This child told its parent it ended.
    told_parent: bool,
}

/// A call waiting on children.
#[derive(Clone, Debug)]
enum Waiter {
    /// One child: `wait`, or `delegate_task`/`spawn` with `wait: true`.
    One {
        /// The execution the child belongs to (this one, or `wait`'s `run_public_id`).
        parent: ExecutionId,
        /// The child's key.
        child: TaskKey,
    },
    /// Several, under a policy.
    Join(Join),
}

/// A parsed `join` call.
#[derive(Clone, Debug, PartialEq)]
pub struct Join {
    /// The children, in the order named.
    pub tasks: Vec<TaskKey>,
    /// The policy.
    pub policy: JoinPolicy,
    /// `best_effort`'s count boundary.
    pub min_successes: Option<usize>,
    /// What becomes of the children the join no longer needs.
    pub losers: JoinLosers,
}

impl Join {
    /// Reads a `join` input.
    ///
    /// # Errors
    /// The call error envelope's text, naming the field.
    pub fn parse(input: &Value) -> Result<Join, String> {
        let object = input.as_object().ok_or("the input must be an object")?;
        only(object, &["tasks", "policy", "timeout_ms", "min_successes", "losers"])?;
        let tasks = object
            .get("tasks")
            .and_then(Value::as_array)
            .filter(|tasks| !tasks.is_empty())
            .ok_or("tasks must be a non-empty array of task keys")?;
        if tasks.len() > JOIN_WIDTH {
            return Err(format!("tasks names {} tasks; a join takes at most {JOIN_WIDTH}", tasks.len()));
        }
        let mut keys = Vec::new();
        for task in tasks {
            let key = task
                .as_str()
                .and_then(|text| text.parse::<TaskKey>().ok())
                .ok_or_else(|| format!("tasks: {task} is not a task key (r<round>t<index>)"))?;
            if keys.contains(&key) {
                return Err(format!("tasks: {key} is named twice"));
            }
            keys.push(key);
        }
        let policy =
            object.get("policy").and_then(Value::as_str).and_then(|word| word.parse::<JoinPolicy>().ok()).ok_or(
                match object.get("policy") {
                    None | Some(Value::Null) => "policy is required: all_required, first_success or best_effort",
                    Some(_) => "policy must be all_required, first_success or best_effort",
                },
            )?;
        let min_successes = match object.get("min_successes") {
            None | Some(Value::Null) => None,
            Some(value) => {
                let n = value.as_u64().filter(|n| *n >= 1).ok_or("min_successes must be an integer ≥ 1")?;
                if policy != JoinPolicy::BestEffort {
                    return Err("min_successes is read by best_effort only".into());
                }
                if n > keys.len() as u64 {
                    return Err(format!("min_successes is {n}, but the join names only {} of them", keys.len()));
                }
                Some(usize::try_from(n).unwrap_or(usize::MAX))
            }
        };
        let losers = match object.get("losers") {
            None | Some(Value::Null) => JoinLosers::Cancel,
            Some(value) => value
                .as_str()
                .and_then(|word| word.parse::<JoinLosers>().ok())
                .ok_or("losers must be cancel or detach")?,
        };
        if let Some(timeout) = object.get("timeout_ms")
            && timeout.as_i64().is_none_or(|ms| ms < 1)
        {
            return Err("timeout_ms must be an integer ≥ 1 (milliseconds)".into());
        }
        Ok(Join { tasks: keys, policy, min_successes, losers })
    }
}

/// Refuses a parameter outside `known` (the call error envelope's text).
fn only(object: &Map<String, Value>, known: &[&str]) -> Result<(), String> {
    match object.keys().find(|key| !known.contains(&key.as_str())) {
        Some(key) => Err(format!("{key} is not a parameter of this tool; it takes {}", known.join(", "))),
        None => Ok(()),
    }
}

/// A parsed `delegate_task` call.
#[derive(Clone, Debug, PartialEq)]
pub struct Delegate {
    /// The self-contained prompt.
    pub prompt: String,
    /// An explicit model reference.
    pub model: Option<String>,
    /// `turn` or `conversation` (default).
    pub lifetime: ChildLifetime,
    /// `auto` (default) or `passive`.
    pub wake: ChildWake,
    /// Inline (`true`) or in the background.
    pub wait: bool,
    /// The narrowing of the caller's tools, when given.
    pub tools: Option<Vec<String>>,
}

impl Delegate {
    /// Reads a `delegate_task` input (REFERENCE 5: its refusals are call error envelopes).
    ///
    /// # Errors
    /// The envelope's text.
    pub fn parse(input: &Value) -> Result<Delegate, String> {
        let object = input.as_object().ok_or("the input must be an object")?;
        only(object, &["prompt", "model", "lifetime", "wake", "wait", "tools"])?;
        let prompt = object.get("prompt").and_then(Value::as_str).unwrap_or_default();
        if prompt.trim().is_empty() {
            return Err("prompt is empty".into());
        }
        let (lifetime, wake) = lifetime_and_wake(object)?;
        let wait = match object.get("wait") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(wait)) => *wait,
            Some(_) => return Err("wait must be true or false.".into()),
        };
        let model = match object.get("model") {
            None | Some(Value::Null) => None,
            Some(Value::String(model)) if !model.trim().is_empty() => Some(model.clone()),
            Some(_) => return Err("model must be a provider/model reference".into()),
        };
        let tools = match object.get("tools") {
            None | Some(Value::Null) => None,
            Some(Value::Array(names)) => Some(
                names
                    .iter()
                    .map(|name| name.as_str().map(str::to_owned).ok_or("tools must be an array of tool names"))
                    .collect::<Result<Vec<_>, _>>()?,
            ),
            Some(_) => return Err("tools must be an array of tool names".into()),
        };
        Ok(Delegate { prompt: prompt.to_owned(), model, lifetime, wake, wait, tools })
    }
}

/// `lifetime` (default `conversation`) and `wake` (default `auto`) of a starting call.
pub(super) fn lifetime_and_wake(object: &Map<String, Value>) -> Result<(ChildLifetime, ChildWake), String> {
    let lifetime = match object.get("lifetime") {
        None | Some(Value::Null) => ChildLifetime::Conversation,
        Some(value) => value.as_str().and_then(|w| w.parse().ok()).ok_or("lifetime must be turn or conversation")?,
    };
    let wake = match object.get("wake") {
        None | Some(Value::Null) => ChildWake::Auto,
        Some(value) => value.as_str().and_then(|w| w.parse().ok()).ok_or("wake must be auto or passive")?,
    };
    Ok((lifetime, wake))
}

/// The messages of delegation to an ExecutionActor ([`ExecutionMsg::Delegation`]).
pub enum DelegationMsg {
    /// A starting call's child is in the store (or the call was refused, or a `wait`/`join` was
    /// read): `Ok(Some(waiter))` waits, `Ok(None)` settles `task` as it is, `Err` settles it with
    /// the call error envelope.
    Started {
        /// The call, `running`; settled already in `Settle`.
        task: Box<TaskRow>,
        /// What comes of it.
        outcome: Started,
    },
    /// A child ended (or recovery asks the parent to look at its children again: `None`).
    ChildEnded(Option<ExecutionId>),
    /// A waiter's deadline passed.
    Deadline {
        /// The waiting call.
        task_key: TaskKey,
    },
}

/// What a starting call came to.
pub enum Started {
    /// It waits on children.
    Wait(WaiterSpec),
    /// It settled: write this row (conditional on `running`) and narrate it.
    Settle(Box<TaskRow>),
}

/// A waiter, as the call that makes it was read.
pub struct WaiterSpec(Waiter);

impl ExecutionHandle {
    /// Tells the execution that its child `child` ended (or, with `None`, to look at its children
    /// again after a restart). Never waits.
    ///
    /// # Errors
    /// [`crate::actors::handle::ActorError::Stopped`] during shutdown; recovery tells it again.
    pub fn child_ended(&self, child: Option<ExecutionId>) -> Result<(), crate::actors::handle::ActorError> {
        self.root.to_execution(self.execution, ExecutionMsg::Delegation(DelegationMsg::ChildEnded(child)))
    }
}

/// What a delegation call's task may read.
struct Call {
    fabric: Arc<Fabric>,
    root: RootHandle,
    declaration: Arc<FrozenDeclaration>,
    execution: ExecutionRow,
    /// The model the caller runs on now (its chain's current route).
    current_model: Option<String>,
    /// The child's allocation, when the caller has a budget ([`reserve_allocation`]).
    allocation: Option<crate::budget::BudgetLimits>,
    task: TaskRow,
}

/// Starts the delegation call `task` (`running`, durable): in a task of the actor, which answers
/// [`DelegationMsg::Started`]. Called by [`kernel::launch`] after the save that made the row
/// durable, and again after a restart (starting a child is idempotent on the call).
pub(super) fn launch(myself: &ActorRef<ExecutionMsg>, state: &mut ExecutionState, task: &TaskRow) {
    let Some(declaration) = state.declaration.clone() else { return };
    if state.delegation.waiters.contains_key(&task.task_key) || state.kernel_calls.contains_key(&task.task_key) {
        return;
    }
    let chain = super::model_chain(&declaration);
    let call = Call {
        fabric: Arc::clone(&state.fabric),
        root: state.root.clone(),
        current_model: chain.get(state.model_index).or(chain.first()).cloned(),
        allocation: state.row.budget.as_ref().and_then(|l| l.children.get(&task.task_key.to_string()).copied()),
        declaration,
        execution: ExecutionRow { transcript: Value::Null, declaration: None, ..state.row.clone() },
        task: task.clone(),
    };
    let actor = myself.clone();
    let span = tracing::info_span!("delegation_call", execution_id = %call.execution.public_id, task_key = %task.task_key, tool = %task.tool_name);
    let handle = tokio::spawn(
        async move {
            let outcome = match start(&call).await {
                Ok(outcome) => outcome,
                Err(failure) => {
                    tracing::warn!(error = %failure, "delegation call failed");
                    let mut task = call.task.clone();
                    let message = format!("{} failed inside the server: {failure}; retry the call", task.callable_name);
                    fail(&mut task, ErrorCode::Internal.as_str(), message, call.fabric.clock.now_ms());
                    Started::Settle(Box::new(task))
                }
            };
            let task = Box::new(call.task);
            let _ = actor.cast(ExecutionMsg::Delegation(DelegationMsg::Started { task, outcome }));
        }
        .instrument(span),
    );
    state.kernel_calls.insert(task.task_key, handle);
}

fn fail(task: &mut TaskRow, key: &str, message: String, now: i64) {
    task.status = TaskStatus::Failed;
    task.error_key = Some(key.to_owned());
    task.settled_at = Some(now);
    task.result = Some(json!({"content": message, "is_error": true, "outcome": "failed"}));
}

/// Runs the I/O of a delegation call (off the actor).
async fn start(call: &Call) -> Result<Started, kernel::KernelFailure> {
    let now = call.fabric.clock.now_ms();
    let settled = |outcome: Result<Value, String>| {
        let mut task = call.task.clone();
        kernel::settle(&mut task, Some(outcome), now);
        Started::Settle(Box::new(task))
    };
    match call.task.tool_name.as_str() {
        "delegate_task" => {
            let delegate = match Delegate::parse(&call.task.tool_input) {
                Ok(delegate) => delegate,
                Err(message) => return Ok(settled(Err(message))),
            };
            let child = match delegate_child(call, &delegate, now).await? {
                Ok(child) => child,
                Err(message) => return Ok(settled(Err(message))),
            };
            Ok(started(call, &child, delegate.wait, now))
        }
        "wait" => Ok(match parse_wait(call).await? {
            Ok(waiter) => Started::Wait(WaiterSpec(waiter)),
            Err(message) => settled(Err(message)),
        }),
        "join" => Ok(match Join::parse(&call.task.tool_input) {
            Ok(join) => match own_children(call, &join.tasks).await? {
                Ok(()) => Started::Wait(WaiterSpec(Waiter::Join(join))),
                Err(message) => settled(Err(message)),
            },
            Err(message) => settled(Err(message)),
        }),
        name => match super::conversation_tools::run(
            &call.fabric,
            &call.root,
            &call.declaration,
            &call.execution,
            call.current_model.as_deref(),
            call.allocation,
            &call.task,
            name,
        )
        .await?
        {
            super::conversation_tools::Outcome::Result(outcome) => Ok(settled(outcome)),
            super::conversation_tools::Outcome::Child { child, wait } => Ok(started(call, &child, wait, now)),
        },
    }
}

/// What a call that started `child` comes to: a waiter (`wait: true`), or settled with the
/// background text.
fn started(call: &Call, child: &ChildRow, wait: bool, now: i64) -> Started {
    if wait {
        return Started::Wait(WaiterSpec(Waiter::One { parent: call.execution.public_id, child: child.task_key }));
    }
    let mut task = call.task.clone();
    let text = format!(
        "Task {} started in the background (execution {}, conversation {}). Its result arrives later as a \
         <task_result task=\"{}\"> message; call wait or join with this key to block on it.",
        child.task_key, child.child_execution_public_id, child.child_conversation_public_id, child.task_key
    );
    kernel::settle(&mut task, Some(Ok(Value::String(text))), now);
    Started::Settle(Box::new(task))
}

/// Whether every key of `tasks` names a child this execution started.
async fn own_children(call: &Call, tasks: &[TaskKey]) -> Result<Result<(), String>, kernel::KernelFailure> {
    let children = call.fabric.store.children_of(call.execution.public_id).await?;
    for key in tasks {
        if !children.iter().any(|child| child.task_key == *key) {
            return Ok(Err(format!(
                "tasks: {key} is not a task this run started with delegate_task or spawn; name the key its call reported"
            )));
        }
    }
    Ok(Ok(()))
}

/// Reads a `wait` call: its child must be one of this execution's, or of `run_public_id`, an
/// execution of the same conversation.
async fn parse_wait(call: &Call) -> Result<Result<Waiter, String>, kernel::KernelFailure> {
    let Some(object) = call.task.tool_input.as_object() else { return Ok(Err("the input must be an object".into())) };
    if let Err(message) = only(object, &["task", "run_public_id", "agent_loop", "timeout_ms"]) {
        return Ok(Err(message));
    }
    let Some(key) = object.get("task").and_then(Value::as_str).and_then(|text| text.parse::<TaskKey>().ok()) else {
        return Ok(Err("task must be the key of a task this run started (r<round>t<index>)".into()));
    };
    if let Some(timeout) = object.get("timeout_ms")
        && timeout.as_i64().is_none_or(|ms| ms < 1)
    {
        return Ok(Err("timeout_ms must be an integer ≥ 1 (milliseconds)".into()));
    }
    let run = object.get("run_public_id").or_else(|| object.get("agent_loop"));
    let parent = match run {
        None | Some(Value::Null) => call.execution.public_id,
        Some(value) => {
            let Some(id) = value.as_str().and_then(|text| text.parse::<ExecutionId>().ok()) else {
                return Ok(Err("run_public_id must be an execution id".into()));
            };
            let other = call.fabric.store.execution(id).await?;
            if other.is_none_or(|other| other.conversation_public_id != call.execution.conversation_public_id) {
                return Ok(Err(format!("run_public_id: {id} is not a run of this conversation")));
            }
            id
        }
    };
    if call.fabric.store.child(parent, key).await?.is_none() {
        return Ok(Err(format!("task: {key} is not a task run {parent} started with delegate_task or spawn")));
    }
    Ok(Ok(Waiter::One { parent, child: key }))
}

/// Starts `delegate_task`'s child: the caller's frozen declaration, its tools narrowed by
/// `tools`, on `model` or the caller's current model, in a new child conversation whose only
/// input is the prompt (an empty context). Answers the child (the existing one after a restart).
async fn delegate_child(
    call: &Call,
    delegate: &Delegate,
    now: i64,
) -> Result<Result<ChildRow, String>, kernel::KernelFailure> {
    if let Some(existing) = call.fabric.store.child(call.execution.public_id, call.task.task_key).await? {
        return Ok(Ok(existing));
    }
    if let Err(message) = within_bounds(&call.fabric.store, &call.execution).await? {
        return Ok(Err(message));
    }
    let mut frozen = (*call.declaration).clone();
    if let Some(names) = &delegate.tools {
        for name in names {
            if !frozen.tools.iter().any(|tool| tool.name == *name) {
                return Ok(Err(format!("tools: {name} is not one of your tools; name only tools you have")));
            }
        }
        frozen.tools.retain(|tool| names.contains(&tool.name));
    }
    match &delegate.model {
        Some(model) => {
            if let Err(error) = call.fabric.models.resolve(model) {
                return Ok(Err(format!(
                    "model_not_authorized: {model} is not available here ({}); omit model to use your own",
                    error.word()
                )));
            }
            frozen.default_model = Some(model.clone());
        }
        None => frozen.default_model = call.current_model.clone().or(frozen.default_model),
    }
    let frozen = frozen.redigested();
    let declaration = serde_json::to_value(&frozen)?;
    let parent_input = call.fabric.store.input(call.execution.input_public_id).await?;
    let at = call.as_ref();
    let child = new_child(&at, ChildKind::Delegate, &delegate.prompt, delegate.lifetime, delegate.wake, None, now);
    let input = child_input(&child, &at, &delegate.prompt, parent_input.as_ref(), None, None);
    let mut execution = child_execution(&child, &at, input.public_id, Some(declaration), now);
    execution.budget = call.allocation.map(|a| crate::budget::BudgetLedger::for_child(a, now));
    let (child, created) = call.fabric.store.start_child(&child, &input, &execution, &[]).await?;
    if created {
        tracing::info!(child = %child.child_execution_public_id, task_key = %child.task_key, "child delegated");
    }
    wake_child(&call.root, &child).await;
    Ok(Ok(child))
}

/// Loads a child's actor, so it materializes and runs (recovery loads it anyway if this fails).
pub(super) async fn wake_child(root: &RootHandle, child: &ChildRow) {
    if let Err(refusal) = root.execution(child.child_execution_public_id).load().await {
        tracing::warn!(child = %child.child_execution_public_id, code = %refusal.code, "cannot start the child now; recovery does");
    }
}

/// A new child row of `call`.
pub(super) fn new_child(
    call_execution: &ExecutionRowRef<'_>,
    kind: ChildKind,
    prompt: &str,
    lifetime: ChildLifetime,
    wake: ChildWake,
    label: Option<String>,
    now: i64,
) -> ChildRow {
    ChildRow {
        parent_execution_public_id: call_execution.execution.public_id,
        task_key: call_execution.task.task_key,
        parent_conversation_public_id: call_execution.execution.conversation_public_id,
        kind,
        child_conversation_public_id: ConversationId::new_v4(),
        child_execution_public_id: ExecutionId::new_v4(),
        lifetime,
        wake,
        label,
        prompt_head: prompt.chars().take(PROMPT_HEAD_CHARS).collect(),
        consumed_by: None,
        consumed_at: None,
        disposition: None,
        owner: None,
        created_at: now,
        status: RunStatus::Pending,
        final_text: None,
        error_key: None,
        budget: None,
    }
}

/// The child's only input: the prompt, posted for the caller's Agent by the caller's speaker
/// (the child keeps the caller's principal, R52).
pub(super) fn child_input(
    child: &ChildRow,
    call: &ExecutionRowRef<'_>,
    prompt: &str,
    parent_input: Option<&InputRow>,
    execution_declaration: Option<Value>,
    runner: Option<nexus_proto::RunnerId>,
) -> InputRow {
    InputRow {
        public_id: InputId::new_v4(),
        conversation_public_id: child.child_conversation_public_id,
        member_public_id: call.execution.member_public_id,
        text: prompt.to_owned(),
        execution_declaration,
        runner_executor_public_id: runner,
        tool_names: None,
        variables: None,
        posted_by_public_id: parent_input.and_then(|input| input.posted_by_public_id),
        turn: 0,
        deliver_at: None,
        budget: None,
    }
}

/// The child's pending execution, its declaration frozen already when given.
pub(super) fn child_execution(
    child: &ChildRow,
    call: &ExecutionRowRef<'_>,
    input: InputId,
    declaration: Option<Value>,
    now: i64,
) -> ExecutionRow {
    ExecutionRow {
        parent_execution_public_id: Some(call.execution.public_id),
        ..ExecutionRow::pending(
            child.child_execution_public_id,
            child.child_conversation_public_id,
            input,
            call.execution.member_public_id,
            declaration,
            now,
        )
    }
}

/// The caller's execution and call, as the child builders read them.
pub struct ExecutionRowRef<'a> {
    /// The calling execution.
    pub execution: &'a ExecutionRow,
    /// The call.
    pub task: &'a TaskRow,
}

impl Call {
    fn as_ref(&self) -> ExecutionRowRef<'_> {
        ExecutionRowRef { execution: &self.execution, task: &self.task }
    }
}

/// Handles one [`DelegationMsg`].
///
/// # Errors
/// A store failure, which stops the actor (it reloads from the store on next use).
pub(super) async fn handle(
    myself: &ActorRef<ExecutionMsg>,
    state: &mut ExecutionState,
    msg: DelegationMsg,
) -> Result<(), ActorProcessingErr> {
    match msg {
        DelegationMsg::Started { task, outcome } => {
            state.kernel_calls.remove(&task.task_key);
            // A stop may have settled the call meanwhile: it stays settled, and a child it started
            // late is canceled (its result is nobody's mail).
            if !is_open(state, task.task_key) {
                if starts_child(&task)
                    && let Some(child) = state.fabric.store.child(state.row.public_id, task.task_key).await?
                    && !child.ended()
                {
                    let by = format!("task:{}", task.task_key);
                    state
                        .fabric
                        .store
                        .dispose_child(state.row.public_id, task.task_key, ChildDisposition::Canceled, None, Some(by))
                        .await?;
                    state.delegation.handed.insert((state.row.public_id, task.task_key));
                    stop_child(&state.root, child.child_execution_public_id);
                }
                return Ok(());
            }
            match outcome {
                Started::Settle(row) => settle_call(myself, state, *row).await?,
                Started::Wait(WaiterSpec(waiter)) => {
                    state.delegation.waiters.insert(task.task_key, waiter);
                    arm(myself, state, task.task_key);
                    evaluate(myself, state).await?;
                }
            }
        }
        DelegationMsg::ChildEnded(_) => evaluate(myself, state).await?,
        DelegationMsg::Deadline { task_key } => {
            state.delegation.timers.remove(&task_key);
            evaluate(myself, state).await?;
            // A deadline moved later (or frozen) is armed again.
            if state.delegation.waiters.contains_key(&task_key) {
                arm(myself, state, task_key);
            }
        }
    }
    // What the children changed (the budget's ledger and its narration) is written now, also
    // for a parent whose turn has ended.
    if !state.events.is_empty() {
        super::save(state, &[]).await?;
    }
    Ok(())
}

/// Whether the call `task_key` is still open (`running`) in this round.
fn is_open(state: &ExecutionState, task_key: TaskKey) -> bool {
    state.pending.get(&task_key).is_some_and(|task| task.status == TaskStatus::Running)
}

/// Writes a delegation call's settlement (conditional on `running`: a stop that won stays won)
/// and hands it to the round like any settlement.
async fn settle_call(
    myself: &ActorRef<ExecutionMsg>,
    state: &mut ExecutionState,
    task: TaskRow,
) -> Result<(), ActorProcessingErr> {
    if state.fabric.store.settle_running_task(&task).await? {
        let _ = myself.cast(ExecutionMsg::TaskSettled(Box::new(task)));
    }
    Ok(())
}

/// Arms the deadline timer of the waiting call `task_key`.
fn arm(myself: &ActorRef<ExecutionMsg>, state: &mut ExecutionState, task_key: TaskKey) {
    let Some(deadline_at) = state.pending.get(&task_key).map(|task| task.deadline_at) else { return };
    if crate::clock::is_frozen(deadline_at) {
        return;
    }
    let actor = myself.clone();
    let clock = state.fabric.clock.clone();
    let timer = tokio::spawn(async move {
        clock.sleep_until(deadline_at).await;
        let _ = actor.cast(ExecutionMsg::Delegation(DelegationMsg::Deadline { task_key }));
    });
    if let Some(old) = state.delegation.timers.insert(task_key, timer) {
        old.abort();
    }
}

/// Stops every timer (the actor is stopping).
pub(super) fn disarm_all(state: &mut ExecutionState) {
    for (_, timer) in state.delegation.timers.drain() {
        timer.abort();
    }
}

/// What a waiter came to.
struct Decision {
    status: TaskStatus,
    error_key: Option<&'static str>,
    /// What the model reads.
    content: String,
    /// The structured result.
    result: Value,
    /// Children whose results the call consumes.
    consume: Vec<ChildRow>,
    /// Children the call no longer needs, with what becomes of them.
    losers: Vec<(ChildRow, JoinLosers)>,
}

/// The children `waiter` names, by key (a missing one is `None`).
fn targets<'a>(
    waiter: &Waiter,
    mine: &'a [ChildRow],
    others: &'a BTreeMap<ExecutionId, Vec<ChildRow>>,
    me: ExecutionId,
) -> Vec<(TaskKey, Option<&'a ChildRow>)> {
    let find = |parent: ExecutionId, key: TaskKey| {
        let rows = if parent == me { mine } else { others.get(&parent).map_or(&[][..], Vec::as_slice) };
        rows.iter().find(|child| child.task_key == key)
    };
    match waiter {
        Waiter::One { parent, child } => vec![(*child, find(*parent, *child))],
        Waiter::Join(join) => join.tasks.iter().map(|key| (*key, find(me, *key))).collect(),
    }
}

/// One child as a join's result lists it.
fn child_entry(key: TaskKey, child: Option<&ChildRow>, loser: Option<JoinLosers>) -> Value {
    let Some(child) = child else { return json!({"task": key, "status": "unknown"}) };
    let status = match loser {
        Some(JoinLosers::Cancel) => "canceled",
        Some(JoinLosers::Detach) => "detached",
        None => child.result_status(),
    };
    let mut entry = json!({
        "task": key,
        "status": status,
        "execution_public_id": child.child_execution_public_id,
        "conversation_public_id": child.child_conversation_public_id,
    });
    if let Some(text) = child.final_text.as_ref().filter(|_| child.succeeded()) {
        entry["result"] = json!(text);
    }
    if loser == Some(JoinLosers::Cancel) {
        entry["error_key"] = json!(ErrorCode::JoinLoserCanceled.as_str());
    } else if let Some(key) = child.error_key.as_ref().filter(|_| child.ended() && !child.succeeded()) {
        entry["error_key"] = json!(key);
    }
    entry
}

/// Decides `waiter` on its children as they stand; `None` while it waits on.
fn decide(
    waiter: &Waiter,
    children: &[(TaskKey, Option<&ChildRow>)],
    timed_out: bool,
    timeout_ms: i64,
) -> Option<Decision> {
    let ended: Vec<ChildRow> = children.iter().filter_map(|(_, c)| c.filter(|c| c.ended()).cloned()).collect();
    let live: Vec<ChildRow> = children.iter().filter_map(|(_, c)| c.filter(|c| !c.ended()).cloned()).collect();
    match waiter {
        Waiter::One { .. } => {
            let (key, child) = children.first().copied()?;
            let child = child?;
            if child.ended() {
                let (status, error_key, content) = if child.succeeded() {
                    (TaskStatus::Completed, None, child.final_text.clone().unwrap_or_default())
                } else {
                    let why = child.error_key.clone().unwrap_or_else(|| "canceled".into());
                    (
                        TaskStatus::Failed,
                        Some(ErrorCode::AwaitFailed.as_str()),
                        format!("task {key} {}: {why}", child.result_status()),
                    )
                };
                let result = child_entry(key, Some(child), None);
                return Some(Decision {
                    status,
                    error_key,
                    content,
                    result,
                    consume: vec![child.clone()],
                    losers: Vec::new(),
                });
            }
            if timed_out {
                let result = child_entry(key, Some(child), None);
                let content = format!(
                    "task {key} is still {} after {timeout_ms} ms; wait again, or let its result arrive later as a \
                     <task_result task=\"{key}\"> message",
                    child.status
                );
                return Some(Decision {
                    status: TaskStatus::Completed,
                    error_key: None,
                    content,
                    result,
                    consume: Vec::new(),
                    losers: Vec::new(),
                });
            }
            None
        }
        Waiter::Join(join) => {
            let successes: Vec<&ChildRow> = ended.iter().filter(|c| c.succeeded()).collect();
            let failed = ended.iter().any(|c| !c.succeeded());
            let all_ended = live.is_empty();
            let (status, error_key, selection) = match join.policy {
                JoinPolicy::AllRequired if failed => {
                    (TaskStatus::Failed, Some(ErrorCode::QuorumUnreachable.as_str()), None)
                }
                JoinPolicy::AllRequired if all_ended => (TaskStatus::Completed, None, None),
                JoinPolicy::FirstSuccess => {
                    match children.iter().find_map(|(key, c)| c.filter(|c| c.succeeded()).map(|_| *key)) {
                        Some(key) => (TaskStatus::Completed, None, Some(key)),
                        None if all_ended => (TaskStatus::Failed, Some(ErrorCode::JoinStarved.as_str()), None),
                        None if timed_out => (TaskStatus::TimedOut, Some(ErrorCode::AwaitTimeout.as_str()), None),
                        None => return None,
                    }
                }
                JoinPolicy::BestEffort => {
                    let reached = join.min_successes.is_some_and(|n| successes.len() >= n);
                    if !(reached || all_ended || timed_out) {
                        return None;
                    }
                    match join.min_successes {
                        Some(n) if successes.len() < n => {
                            (TaskStatus::Failed, Some(ErrorCode::QuorumUnreachable.as_str()), None)
                        }
                        _ => (TaskStatus::Completed, None, None),
                    }
                }
                JoinPolicy::AllRequired if timed_out => {
                    (TaskStatus::TimedOut, Some(ErrorCode::AwaitTimeout.as_str()), None)
                }
                JoinPolicy::AllRequired => return None,
            };
            let losers: Vec<(ChildRow, JoinLosers)> = live.iter().map(|c| (c.clone(), join.losers)).collect();
            let entries: Vec<Value> = children
                .iter()
                .map(|(key, child)| {
                    let loser = child.filter(|c| !c.ended()).map(|_| join.losers);
                    child_entry(*key, *child, loser)
                })
                .collect();
            let outcome = match status {
                TaskStatus::Completed => "completed",
                TaskStatus::TimedOut => "timed_out",
                _ => "failed",
            };
            let mut result = json!({"policy": join.policy, "outcome": outcome, "tasks": entries});
            if let Some(selection) = selection {
                result["selection"] = json!(selection);
            }
            let content = result.to_string();
            Some(Decision { status, error_key, content, result, consume: ended, losers })
        }
    }
}

/// Looks at the children again: decides the waiters that can be decided, queues (or mails) the
/// results nobody waits for, and after the end disposes of the children still running.
///
/// # Errors
/// A store failure.
pub(super) async fn evaluate(
    myself: &ActorRef<ExecutionMsg>,
    state: &mut ExecutionState,
) -> Result<(), ActorProcessingErr> {
    if !state.declaration.as_deref().is_some_and(delegates) {
        return Ok(());
    }
    let me = state.row.public_id;
    let children = state.fabric.store.children_of(me).await?;
    let mut others: BTreeMap<ExecutionId, Vec<ChildRow>> = BTreeMap::new();
    for waiter in state.delegation.waiters.values() {
        if let Waiter::One { parent, .. } = waiter
            && *parent != me
            && !others.contains_key(parent)
        {
            let rows = state.fabric.store.children_of(*parent).await?;
            others.insert(*parent, rows);
        }
    }
    let now = state.fabric.clock.now_ms();
    let keys: Vec<TaskKey> = state.delegation.waiters.keys().copied().collect();
    for key in keys {
        let Some(task) = state.pending.get(&key).filter(|t| t.status == TaskStatus::Running).cloned() else {
            state.delegation.waiters.remove(&key);
            if let Some(timer) = state.delegation.timers.remove(&key) {
                timer.abort();
            }
            continue;
        };
        let Some(waiter) = state.delegation.waiters.get(&key).cloned() else { continue };
        let timed_out = !crate::clock::is_frozen(task.deadline_at) && task.deadline_at <= now;
        let named = targets(&waiter, &children, &others, me);
        let Some(decision) = decide(&waiter, &named, timed_out, task.timeout_ms) else { continue };
        state.delegation.waiters.remove(&key);
        if let Some(timer) = state.delegation.timers.remove(&key) {
            timer.abort();
        }
        apply(myself, state, task, decision).await?;
    }
    // Results nobody waits for are mail.
    let waited: BTreeSet<(ExecutionId, TaskKey)> = state
        .delegation
        .waiters
        .values()
        .flat_map(|waiter| match waiter {
            Waiter::One { parent, child } => vec![(*parent, *child)],
            Waiter::Join(join) => join.tasks.iter().map(|key| (me, *key)).collect(),
        })
        .collect();
    for child in children.iter().filter(|c| c.ended() && c.consumed_by.is_none()) {
        let at = (child.parent_execution_public_id, child.task_key);
        if waited.contains(&at) || state.delegation.handed.contains(&at) {
            continue;
        }
        if state.row.status.is_terminal() {
            mail_after_end(state, child).await?;
        } else if state.row.status != RunStatus::Canceling {
            state.delegation.mail.insert(at, child.clone());
        }
    }
    settle_budgets(state, &children);
    if state.row.status.is_terminal() {
        dispose_at_end(state, &children).await?;
    }
    Ok(())
}

/// Carries out `decision` for the waiting call `task`: consumptions first (so a crash before the
/// settlement consumes nothing twice: the call, decided again, consumes the same children), then
/// the losers, then the settlement.
async fn apply(
    myself: &ActorRef<ExecutionMsg>,
    state: &mut ExecutionState,
    mut task: TaskRow,
    decision: Decision,
) -> Result<(), ActorProcessingErr> {
    let by = format!("task:{}", task.task_key);
    let consumed: Vec<Consumption> = decision
        .consume
        .iter()
        .map(|c| Consumption { parent: c.parent_execution_public_id, task_key: c.task_key, by: by.clone() })
        .collect();
    if !consumed.is_empty() {
        state.fabric.store.consume_children(&consumed).await?;
    }
    for child in &decision.consume {
        state.delegation.handed.insert((child.parent_execution_public_id, child.task_key));
        state.delegation.mail.remove(&(child.parent_execution_public_id, child.task_key));
    }
    for (child, losers) in &decision.losers {
        let at = (child.parent_execution_public_id, child.task_key);
        match losers {
            JoinLosers::Cancel => {
                state
                    .fabric
                    .store
                    .dispose_child(at.0, at.1, ChildDisposition::Canceled, None, Some(by.clone()))
                    .await?;
                state.delegation.handed.insert(at);
                stop_child(&state.root, child.child_execution_public_id);
            }
            JoinLosers::Detach => {
                let owner = format!("conversation:{}", state.row.conversation_public_id);
                state.fabric.store.dispose_child(at.0, at.1, ChildDisposition::Detached, Some(owner), None).await?;
            }
        }
    }
    let now = state.fabric.clock.now_ms();
    task.status = decision.status;
    task.error_key = decision.error_key.map(str::to_owned);
    task.settled_at = Some(now);
    let is_error = decision.status != TaskStatus::Completed;
    let outcome = decision.status.as_str();
    task.result = Some(json!({
        "content": decision.content, "structured_content": decision.result, "is_error": is_error, "outcome": outcome
    }));
    settle_call(myself, state, task).await
}

/// Stops a child execution (forced), off the actor.
fn stop_child(root: &RootHandle, child: ExecutionId) {
    let handle = root.execution(child);
    tokio::spawn(async move {
        if let Err(refusal) = handle.stop(true).await {
            tracing::debug!(%child, code = %refusal.code, "the child did not stop (it may have ended already)");
        }
    });
}

/// The `<task_result>` envelope of an ended child (REFERENCE 5, "Result envelope"): one user
/// message with the prompt's head and the child's answer (or why there is none), escaped so that
/// nothing inside can close or open an envelope.
#[must_use]
pub fn envelope(child: &ChildRow) -> String {
    let body = match (child.succeeded(), &child.final_text, &child.error_key) {
        (true, Some(text), _) => text.clone(),
        (_, _, Some(key)) => format!("the task ended without an answer: {key}"),
        _ => "the task ended without an answer".to_owned(),
    };
    format!(
        "<task_result task=\"{}\" status=\"{}\">\n<prompt>{}</prompt>\n{}\n</task_result>",
        child.task_key,
        child.result_status(),
        escape(&child.prompt_head),
        escape(&body)
    )
}

/// Neutralises the envelope's own tags inside text (REFERENCE 5).
fn escape(text: &str) -> String {
    text.replace("</task_result", "&lt;/task_result")
        .replace("<task_result ", "&lt;task_result ")
        .replace("</message", "&lt;/message")
        .replace("<message ", "&lt;message ")
}

/// At a safe boundary: the results queued as mail join the transcript as `<task_result>` user
/// messages, consumed with the next save.
pub(super) fn apply_mail(state: &mut ExecutionState) {
    let mail = std::mem::take(&mut state.delegation.mail);
    for ((parent, key), child) in mail {
        if !state.delegation.handed.insert((parent, key)) {
            continue;
        }
        state.transcript.push(ChatMessage::User { content: envelope(&child) });
        state.delegation.consuming.push(Consumption {
            parent,
            task_key: key,
            by: format!("execution:{}", state.row.public_id),
        });
    }
}

/// At a turn's start (materialization): the `passive` results of the conversation's earlier
/// turns that nobody consumed are read first, before the input, whatever this turn declares
/// (one indexed read per turn).
///
/// # Errors
/// A store failure.
pub(super) async fn read_passive_mail(state: &mut ExecutionState) -> Result<(), ActorProcessingErr> {
    for child in state.fabric.store.passive_mail(state.row.conversation_public_id).await? {
        let at = (child.parent_execution_public_id, child.task_key);
        if !state.delegation.handed.insert(at) {
            continue;
        }
        state.transcript.push(ChatMessage::User { content: envelope(&child) });
        state.delegation.consuming.push(Consumption {
            parent: at.0,
            task_key: at.1,
            by: format!("execution:{}", state.row.public_id),
        });
    }
    Ok(())
}

/// A result that arrived after the parent's turn ended: `wake: auto` admits it as a turn of the
/// parent's conversation (queued, under the parent's frozen declaration), consumed in the same
/// transaction; `passive` leaves it for the conversation's next turn.
async fn mail_after_end(state: &mut ExecutionState, child: &ChildRow) -> Result<(), ActorProcessingErr> {
    let at = (child.parent_execution_public_id, child.task_key);
    state.delegation.handed.insert(at);
    if child.wake == ChildWake::Passive {
        return Ok(());
    }
    let Some(frozen) = state.declaration.as_deref() else { return Ok(()) };
    let now = state.fabric.clock.now_ms();
    let input = InputRow {
        public_id: InputId::new_v4(),
        conversation_public_id: state.row.conversation_public_id,
        member_public_id: state.row.member_public_id,
        text: envelope(child),
        execution_declaration: None,
        runner_executor_public_id: None,
        tool_names: None,
        variables: None,
        posted_by_public_id: None,
        turn: 0,
        deliver_at: None,
        budget: None,
    };
    let declaration = Some(serde_json::to_value(frozen)?);
    let mut execution = ExecutionRow::pending(
        ExecutionId::new_v4(),
        state.row.conversation_public_id,
        input.public_id,
        state.row.member_public_id,
        declaration,
        now,
    );
    // A budgeted turn's mail turn draws on what the turn left, as a child would: a share of the
    // remainder, or nothing once it is spent (`docs/delegation.md`, "Budgets").
    execution.budget = mail_budget(state, now);
    if state.fabric.store.mail_child(child, &input, &execution).await? {
        tracing::info!(execution_id = %state.row.public_id, task_key = %child.task_key, mail = %execution.public_id, "a child's result arrived after its turn; it starts a turn");
        super::queue::hand_off(&state.fabric, &state.root, state.row.conversation_public_id).await?;
    }
    Ok(())
}

/// The ledger of a mail turn of this (ended, budgeted) execution: a child's share of the
/// remainder, held by this execution for good; when no share is left, limits that spend nothing.
fn mail_budget(state: &mut ExecutionState, now: i64) -> Option<crate::budget::BudgetLedger> {
    state.row.budget.as_ref()?;
    let allocation = match super::budget::reserve_child(state, None) {
        Ok(Some(allocation)) => allocation,
        _ => state.row.budget.as_ref().map(crate::budget::BudgetLedger::exhausted_limits)?,
    };
    Some(crate::budget::BudgetLedger::for_child(allocation, now))
}

/// After the parent's turn ended: each child still running is canceled (`lifetime: turn`) or
/// detached to the parent's conversation (`lifetime: conversation`), recorded once.
async fn dispose_at_end(state: &mut ExecutionState, children: &[ChildRow]) -> Result<(), ActorProcessingErr> {
    if state.delegation.disposed {
        return Ok(());
    }
    state.delegation.disposed = true;
    let me = state.row.public_id;
    for child in children.iter().filter(|c| !c.ended() && c.disposition.is_none()) {
        match child.lifetime {
            ChildLifetime::Turn => {
                let by = format!("end:{me}");
                state
                    .fabric
                    .store
                    .dispose_child(me, child.task_key, ChildDisposition::Canceled, None, Some(by))
                    .await?;
                state.delegation.handed.insert((me, child.task_key));
                stop_child(&state.root, child.child_execution_public_id);
            }
            ChildLifetime::Conversation => {
                let owner = format!("conversation:{}", state.row.conversation_public_id);
                state
                    .fabric
                    .store
                    .dispose_child(me, child.task_key, ChildDisposition::Detached, Some(owner), None)
                    .await?;
            }
        }
    }
    Ok(())
}

/// Before the save that ends the execution: the budget of its children is settled as it stands
/// (the allocations no child will use are given back; a child still running keeps its own until
/// it ends), so the ended row shows what is really held.
///
/// # Errors
/// A store failure.
pub(super) async fn before_end(state: &mut ExecutionState) -> Result<(), ActorProcessingErr> {
    if state.row.budget.as_ref().is_none_or(|ledger| ledger.children.is_empty()) {
        return Ok(());
    }
    let children = state.fabric.store.children_of(state.row.public_id).await?;
    settle_budgets(state, &children);
    Ok(())
}

/// After the save that ended the execution: a child tells its parent; a parent hands on the
/// results nobody consumed and disposes of its children still running.
///
/// # Errors
/// A store failure; recovery does it again ([`reconcile_all`]).
pub(super) async fn ended(state: &mut ExecutionState) -> Result<(), ActorProcessingErr> {
    if let Some(parent) = state.row.parent_execution_public_id
        && !state.delegation.told_parent
    {
        state.delegation.told_parent = true;
        if let Err(error) = state.root.execution(parent).child_ended(Some(state.row.public_id)) {
            tracing::warn!(%parent, %error, "cannot tell the parent its child ended now; recovery does");
        }
    }
    if !state.declaration.as_deref().is_some_and(delegates) || state.delegation.disposed {
        return Ok(());
    }
    let children = state.fabric.store.children_of(state.row.public_id).await?;
    for child in children.iter().filter(|c| c.ended() && c.consumed_by.is_none()) {
        if !state.delegation.handed.contains(&(child.parent_execution_public_id, child.task_key)) {
            mail_after_end(state, child).await?;
        }
    }
    dispose_at_end(state, &children).await
}

/// Recovery: every parent with a result nobody consumed, or an end whose children were not
/// disposed of, looks at its children again; every child recorded canceled that has not ended
/// (the node died between the record and the stop, [`apply`], [`dispose_at_end`]) is stopped.
///
/// # Errors
/// A store failure.
pub async fn reconcile_all(fabric: &Fabric, root: &RootHandle) -> Result<(), crate::store::StoreError> {
    for parent in fabric.store.parents_to_reconcile().await? {
        if let Err(error) = root.execution(parent).child_ended(None) {
            tracing::warn!(%parent, %error, "cannot reconcile a parent's children now");
        }
    }
    for child in fabric.store.canceled_children_still_live().await? {
        tracing::info!(%child, "a child recorded canceled had not stopped; stopping it");
        stop_child(root, child);
    }
    Ok(())
}
