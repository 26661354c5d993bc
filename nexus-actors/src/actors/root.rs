//! The Root actor: the supervisor of every other actor and the registry that finds them
//! (`docs/architecture.md`, "Actors").
//!
//! Root owns the maps from public ids to live actors. An ExecutorActor or ExecutionActor is
//! started on first use and loads its state from the store in `pre_start`; Root forgets it when it
//! stops, and a child's failure never stops Root.
//!
//! No handler waits for a cold peer to load. A message for an actor that is not live is handed
//! to Root ([`RootMsg::Deliver`]), which queues it, starts the actor in a loading task it owns,
//! and delivers the queue in order once the actor is up ([`RootMsg::Loaded`]). A message for a
//! live actor goes straight to it from the sender, read off the shared [`Registry`], so the hot
//! path never passes through Root's mailbox. Messages from one sender to one actor keep their
//! order either way: while an actor loads, every message for it queues behind the first.
//!
//! Root also owns the delivery timer of every scheduled input (`docs/executions.md`, "Scheduled
//! inputs"): one task per held input, sleeping on the fabric clock until its `deliver_at`, then
//! delivering it ([`crate::actors::execution::queue::deliver_scheduled`]). The hold itself is in
//! the store; a timer only says when to look, so recovery arms them again from the store.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef, ActorStatus, RpcReplyPort, SupervisionEvent};
use tokio::task::JoinHandle;

use nexus_proto::{ErrorCode, ExecutionId, InputId, MemberId, Refusal, RunnerId};

use crate::actors::execution::{ExecutionActor, ExecutionArgs, ExecutionHandle, ExecutionMsg};
use crate::actors::executor::{ExecutorActor, ExecutorArgs, ExecutorHandle, ExecutorMsg};
use crate::actors::fabric::Fabric;
use crate::actors::handle::{self, ActorError};
use crate::actors::profile::{ProfileActor, ProfileArgs, ProfileHandle, ProfileMsg};

/// How many actors of each kind are alive: chaos tests check that counts return to baseline.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Census {
    /// ExecutorActors (runner inboxes).
    pub executors: usize,
    /// ExecutionActors.
    pub executions: usize,
    /// ProfileActors.
    pub profiles: usize,
    /// ConnectionActors (live runner streams).
    pub connections: usize,
}

/// A message for an actor Root finds by id.
pub enum Delivery {
    /// To the ExecutorActor of a runner.
    Executor(RunnerId, ExecutorMsg),
    /// To the ExecutionActor of an execution.
    Execution(ExecutionId, ExecutionMsg),
}

/// What a loading task reports.
pub enum Loaded {
    /// An ExecutorActor started, or could not.
    Executor(RunnerId, Result<ActorRef<ExecutorMsg>, Refusal>),
    /// An ExecutionActor started, or could not.
    Execution(ExecutionId, Result<ActorRef<ExecutionMsg>, Refusal>),
}

/// Root's messages.
pub enum RootMsg {
    /// Deliver a message to an actor that was not live when it was sent; start it if needed.
    Deliver(Delivery),
    /// Make sure the actor of an execution is live; answers once it is, or why it cannot be
    /// (`not_found` for an unknown execution).
    LoadExecution(ExecutionId, RpcReplyPort<Result<(), Refusal>>),
    /// Make sure the actor of a runner's inbox is live.
    LoadExecutor(RunnerId, RpcReplyPort<Result<(), Refusal>>),
    /// A loading task finished.
    Loaded(Loaded),
    /// Finds or spawns the ProfileActor of an Agent member (it loads nothing, so this never
    /// waits on the store).
    Profile(MemberId, RpcReplyPort<Result<ActorRef<ProfileMsg>, Refusal>>),
    /// Counts the live actors.
    Census(RpcReplyPort<Census>),
    /// Arm (or arm again) the delivery timer of a held input: at `deliver_at` (Unix ms, on the
    /// fabric clock) it is delivered; a time already come delivers it at once.
    Schedule(InputId, i64),
    /// Drop the delivery timer of an input that is not held any more (canceled).
    Unschedule(InputId),
}

/// How long a delivery that failed on the store waits before it tries again, in milliseconds.
const DELIVERY_RETRY_MS: u64 = 5_000;

/// Root's arguments.
pub struct RootArgs {
    /// The shared context.
    pub fabric: Arc<Fabric>,
    /// The live runner inboxes and executions, shared with every [`RootHandle`].
    pub registry: Arc<Registry>,
}

/// The live ExecutorActors and ExecutionActors by public id. Root alone writes it (when an actor
/// is up, and on a child's exit); [`RootHandle`] reads it, so that reaching a live actor (every
/// offer, settlement and door call does) never waits in Root's mailbox.
#[derive(Debug, Default)]
pub struct Registry {
    executors: std::sync::RwLock<HashMap<RunnerId, ActorRef<ExecutorMsg>>>,
    executions: std::sync::RwLock<HashMap<ExecutionId, ActorRef<ExecutionMsg>>>,
}

fn read<K: std::hash::Hash + Eq, V: Clone>(map: &std::sync::RwLock<HashMap<K, V>>, key: &K) -> Option<V> {
    map.read().unwrap_or_else(std::sync::PoisonError::into_inner).get(key).cloned()
}

fn write<K, V>(map: &std::sync::RwLock<HashMap<K, V>>) -> std::sync::RwLockWriteGuard<'_, HashMap<K, V>> {
    map.write().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Removes the entry of the actor `id` that exited, returning its key.
fn take_exited<K: Copy + std::hash::Hash + Eq, M>(
    map: &std::sync::RwLock<HashMap<K, ActorRef<M>>>,
    id: ractor::ActorId,
) -> Option<K> {
    let mut map = write(map);
    let key = map.iter().find(|(_, actor)| actor.get_id() == id).map(|(key, _)| *key)?;
    map.remove(&key);
    Some(key)
}

fn count<K, V>(map: &std::sync::RwLock<HashMap<K, V>>) -> usize {
    map.read().unwrap_or_else(std::sync::PoisonError::into_inner).len()
}

/// An actor being loaded: what waits for it, and the task loading it; no task yet while the
/// actor's previous incarnation is still stopping (it is started once that one has exited, so
/// that two actors never hold one execution).
struct Loading<M> {
    queued: Vec<M>,
    waiters: Vec<RpcReplyPort<Result<(), Refusal>>>,
    task: Option<JoinHandle<()>>,
}

/// Root's state.
pub struct RootState {
    fabric: Arc<Fabric>,
    registry: Arc<Registry>,
    profiles: HashMap<MemberId, ActorRef<ProfileMsg>>,
    loading_executors: HashMap<RunnerId, Loading<ExecutorMsg>>,
    loading_executions: HashMap<ExecutionId, Loading<ExecutionMsg>>,
    /// The delivery timer of each held input ([`RootMsg::Schedule`]). A timer that has fired
    /// leaves its finished handle here until the next schedule sweeps it.
    deliveries: HashMap<InputId, JoinHandle<()>>,
}

/// The Root actor.
pub struct RootActor;

/// The typed handle on Root, and through it on every actor found by id.
#[derive(Clone, Debug)]
pub struct RootHandle {
    actor: ActorRef<RootMsg>,
    registry: Arc<Registry>,
    deadline: Duration,
}

/// A live actor ref that is still worth sending to: a stopping actor drops its mailbox.
fn alive<M>(actor: Option<ActorRef<M>>) -> Option<ActorRef<M>> {
    actor.filter(|actor| matches!(actor.get_status(), ActorStatus::Starting | ActorStatus::Running))
}

impl RootHandle {
    /// Wraps Root's actor ref and the registry it keeps; calls wait at most `deadline`.
    pub fn new(actor: ActorRef<RootMsg>, registry: Arc<Registry>, deadline: Duration) -> Self {
        RootHandle { actor, registry, deadline }
    }

    /// The deadline of every call made through this handle and the handles it gives out.
    pub fn deadline(&self) -> Duration {
        self.deadline
    }

    /// The cell to link children to.
    pub fn cell(&self) -> ActorCell {
        self.actor.get_cell()
    }

    /// The handle of a runner's inbox (its ExecutorActor), live or not.
    pub fn executor(&self, runner: RunnerId) -> ExecutorHandle {
        ExecutorHandle::new(runner, self.clone())
    }

    /// The handle of an execution's actor, live or not.
    pub fn execution(&self, execution: ExecutionId) -> ExecutionHandle {
        ExecutionHandle::new(execution, self.clone())
    }

    /// The ProfileActor of `member`.
    ///
    /// # Errors
    /// [`ActorError`] during shutdown, or when Root does not answer in time.
    pub async fn profile(&self, member: MemberId) -> Result<ProfileHandle, Refusal> {
        let actor =
            handle::call(&self.actor, "server", self.deadline, |reply| RootMsg::Profile(member, reply)).await??;
        Ok(ProfileHandle::new(actor, self.deadline))
    }

    /// Counts the live actors.
    ///
    /// # Errors
    /// [`ActorError`] during shutdown, or when Root does not answer in time.
    pub async fn census(&self) -> Result<Census, ActorError> {
        handle::call(&self.actor, "server", self.deadline, RootMsg::Census).await
    }

    /// Arms the delivery timer of the held input `input`, due at `deliver_at` (Unix ms): at that
    /// time it joins its conversation's line (`docs/executions.md`, "Scheduled inputs"). Call it
    /// after the admission that held it is in the store ([`crate::store::queue::Admission::Scheduled`]);
    /// were the node to die first, recovery arms it from the store. Never waits.
    ///
    /// # Errors
    /// [`ActorError::Stopped`] during shutdown (recovery arms it at the next start).
    pub fn schedule_delivery(&self, input: InputId, deliver_at: i64) -> Result<(), ActorError> {
        handle::cast(&self.actor, "server", RootMsg::Schedule(input, deliver_at))
    }

    /// Drops the delivery timer of `input`, canceled while held. Only tidies: a timer that fires
    /// for an input that is not held any more does nothing. Never waits.
    ///
    /// # Errors
    /// [`ActorError::Stopped`] during shutdown.
    pub fn unschedule_delivery(&self, input: InputId) -> Result<(), ActorError> {
        handle::cast(&self.actor, "server", RootMsg::Unschedule(input))
    }

    /// Stops Root and, through supervision, every actor.
    pub fn stop(&self) {
        self.actor.stop(Some("shutdown".into()));
    }

    /// Sends `message` to the ExecutorActor of `runner`: at once when it is live, else through
    /// Root, which starts it. Never waits.
    ///
    /// # Errors
    /// [`ActorError::Stopped`] during shutdown.
    pub(crate) fn to_executor(&self, runner: RunnerId, message: ExecutorMsg) -> Result<(), ActorError> {
        match alive(read(&self.registry.executors, &runner)) {
            Some(actor) => match actor.cast(message) {
                Ok(()) => Ok(()),
                // It began stopping after the look-up: Root holds the message for its successor.
                Err(ractor::MessagingErr::SendErr(message)) => self.via_root(Delivery::Executor(runner, message)),
                Err(_) => Err(ActorError::Stopped { actor: "executor" }),
            },
            None => self.via_root(Delivery::Executor(runner, message)),
        }
    }

    /// Sends `message` to the ExecutionActor of `execution`, as [`Self::to_executor`] does.
    ///
    /// # Errors
    /// [`ActorError::Stopped`] during shutdown.
    pub(crate) fn to_execution(&self, execution: ExecutionId, message: ExecutionMsg) -> Result<(), ActorError> {
        match alive(read(&self.registry.executions, &execution)) {
            Some(actor) => match actor.cast(message) {
                Ok(()) => Ok(()),
                // It began stopping after the look-up: Root holds the message for its successor.
                Err(ractor::MessagingErr::SendErr(message)) => self.via_root(Delivery::Execution(execution, message)),
                Err(_) => Err(ActorError::Stopped { actor: "execution" }),
            },
            None => self.via_root(Delivery::Execution(execution, message)),
        }
    }

    fn via_root(&self, delivery: Delivery) -> Result<(), ActorError> {
        handle::cast(&self.actor, "server", RootMsg::Deliver(delivery))
    }

    /// Asks the ExecutionActor of `execution` and waits at most the deadline for its answer,
    /// loading the actor first when it is not live. A quiet execution's actor stops itself: a
    /// question that finds it stopping is asked again of the fresh actor Root starts once the old
    /// one has exited.
    ///
    /// # Errors
    /// `not_found` for an unknown execution; [`ActorError`] as a refusal when the actor cannot be
    /// reached or does not answer in time.
    pub(crate) async fn ask_execution<T: Send + 'static>(
        &self,
        execution: ExecutionId,
        build: impl Fn(RpcReplyPort<T>) -> ExecutionMsg,
    ) -> Result<T, Refusal> {
        let mut attempts = 0;
        loop {
            attempts += 1;
            self.load_execution(execution).await?;
            let Some(actor) = alive(read(&self.registry.executions, &execution)) else {
                if attempts < 5 {
                    continue;
                }
                return Err(ActorError::Stopped { actor: "execution" }.into());
            };
            match handle::call(&actor, "execution", self.deadline, &build).await {
                Err(ActorError::Stopped { .. }) if attempts < 5 => continue,
                answer => return Ok(answer?),
            }
        }
    }

    /// Makes sure the actor of `execution` is live.
    ///
    /// # Errors
    /// `not_found` for an unknown execution; `internal` when its state cannot be loaded;
    /// `unavailable` during shutdown or past the deadline.
    pub async fn load_execution(&self, execution: ExecutionId) -> Result<(), Refusal> {
        if alive(read(&self.registry.executions, &execution)).is_some() {
            return Ok(());
        }
        handle::call(&self.actor, "server", self.deadline, |reply| RootMsg::LoadExecution(execution, reply)).await?
    }

    /// Makes sure the actor of `runner`'s inbox is live.
    ///
    /// # Errors
    /// `internal` when its state cannot be loaded; `unavailable` during shutdown or past the
    /// deadline.
    pub async fn load_executor(&self, runner: RunnerId) -> Result<(), Refusal> {
        if alive(read(&self.registry.executors, &runner)).is_some() {
            return Ok(());
        }
        handle::call(&self.actor, "server", self.deadline, |reply| RootMsg::LoadExecutor(runner, reply)).await?
    }
}

fn spawn_failed(what: &str, id: impl std::fmt::Display, error: impl std::fmt::Display) -> Refusal {
    tracing::error!(%id, error = %error, "{what} actor failed to start");
    Refusal::new(ErrorCode::Internal, format!("the {what} {id} could not be loaded: {error}"))
}

/// Starts the ExecutorActor of `runner` (its `pre_start` loads the inbox).
async fn load_executor(
    fabric: Arc<Fabric>,
    root: RootHandle,
    runner: RunnerId,
) -> Result<ActorRef<ExecutorMsg>, Refusal> {
    let cell = root.cell();
    let args = ExecutorArgs { fabric, root, public_id: runner };
    Actor::spawn_linked(None, ExecutorActor, args, cell)
        .await
        .map(|(actor, _)| actor)
        .map_err(|e| spawn_failed("executor", runner, e))
}

/// Starts the ExecutionActor of `execution` (its `pre_start` rebuilds it from the store, starting
/// from the row read here).
async fn load_execution(
    fabric: Arc<Fabric>,
    root: RootHandle,
    execution: ExecutionId,
) -> Result<ActorRef<ExecutionMsg>, Refusal> {
    let row = match fabric.store.execution(execution).await {
        Ok(Some(row)) => row,
        Ok(None) => return Err(Refusal::new(ErrorCode::NotFound, format!("no execution {execution}"))),
        Err(e) => return Err(spawn_failed("execution", execution, e)),
    };
    let cell = root.cell();
    let args = ExecutionArgs { fabric, root, public_id: execution, row };
    Actor::spawn_linked(None, ExecutionActor, args, cell)
        .await
        .map(|(actor, _)| actor)
        .map_err(|e| spawn_failed("execution", execution, e))
}

impl RootState {
    fn root(&self, myself: &ActorRef<RootMsg>) -> RootHandle {
        RootHandle::new(myself.clone(), self.registry.clone(), self.fabric.config.actors.call_timeout())
    }

    /// Queues `message` (if any) and `waiter` (if any) for the ExecutorActor of `runner`, starting
    /// its loading task unless one runs or its previous incarnation is still stopping.
    fn await_executor(
        &mut self,
        myself: &ActorRef<RootMsg>,
        runner: RunnerId,
        message: Option<ExecutorMsg>,
        waiter: Option<RpcReplyPort<Result<(), Refusal>>>,
    ) {
        let registered = read(&self.registry.executors, &runner);
        if let Some(actor) = alive(registered.clone()) {
            deliver_now(&actor, message, waiter);
            return;
        }
        let (fabric, root) = (self.fabric.clone(), self.root(myself));
        let loading = self.loading_executors.entry(runner).or_insert_with(Loading::new);
        loading.queued.extend(message);
        loading.waiters.extend(waiter);
        if registered.is_none() && loading.task.is_none() {
            loading.task = Some(spawn_loader(myself, "load_executor", runner, async move {
                Loaded::Executor(runner, load_executor(fabric, root, runner).await)
            }));
        }
    }

    /// As [`Self::await_executor`], for the ExecutionActor of `execution`.
    fn await_execution(
        &mut self,
        myself: &ActorRef<RootMsg>,
        execution: ExecutionId,
        message: Option<ExecutionMsg>,
        waiter: Option<RpcReplyPort<Result<(), Refusal>>>,
    ) {
        let registered = read(&self.registry.executions, &execution);
        if let Some(actor) = alive(registered.clone()) {
            deliver_now(&actor, message, waiter);
            return;
        }
        let (fabric, root) = (self.fabric.clone(), self.root(myself));
        let loading = self.loading_executions.entry(execution).or_insert_with(Loading::new);
        loading.queued.extend(message);
        loading.waiters.extend(waiter);
        if registered.is_none() && loading.task.is_none() {
            loading.task = Some(spawn_loader(myself, "load_execution", execution, async move {
                Loaded::Execution(execution, load_execution(fabric, root, execution).await)
            }));
        }
    }
}

impl<M> Loading<M> {
    fn new() -> Self {
        Loading { queued: Vec::new(), waiters: Vec::new(), task: None }
    }
}

fn deliver_now<M: ractor::Message>(
    actor: &ActorRef<M>,
    message: Option<M>,
    waiter: Option<RpcReplyPort<Result<(), Refusal>>>,
) {
    if let Some(message) = message {
        let _ = actor.cast(message);
    }
    if let Some(waiter) = waiter {
        let _ = waiter.send(Ok(()));
    }
}

/// Runs `load` in a task Root owns (aborted when Root stops), which reports to Root.
fn spawn_loader(
    myself: &ActorRef<RootMsg>,
    name: &'static str,
    id: impl std::fmt::Display,
    load: impl std::future::Future<Output = Loaded> + Send + 'static,
) -> JoinHandle<()> {
    let root = myself.clone();
    tokio::spawn(tracing::Instrument::instrument(
        async move {
            let loaded = load.await;
            let _ = root.cast(RootMsg::Loaded(loaded));
        },
        tracing::info_span!("loader", task = name, id = %id),
    ))
}

/// The delivery timer of one held input: sleeps on the fabric clock (so a test that moves the
/// clock fires it) until `deliver_at`, then delivers the input, trying again after
/// [`DELIVERY_RETRY_MS`] while the store fails. Owned by Root, aborted when Root stops.
fn spawn_delivery(fabric: Arc<Fabric>, root: RootHandle, input: InputId, deliver_at: i64) -> JoinHandle<()> {
    tokio::spawn(tracing::Instrument::instrument(
        async move {
            fabric.clock.sleep_until(deliver_at).await;
            while let Err(error) = crate::actors::execution::queue::deliver_scheduled(&fabric, &root, input).await {
                if *fabric.closing.borrow() {
                    return;
                }
                tracing::warn!(%error, "cannot deliver a scheduled input now; trying again");
                fabric.clock.sleep(Duration::from_millis(DELIVERY_RETRY_MS)).await;
            }
        },
        tracing::debug_span!("delivery", %input, deliver_at),
    ))
}

/// Hands a loaded actor its queue, in order, and answers its waiters; or, when it could not be
/// loaded, drops the queue with a warning (what it said is in the store, and the actor rereads
/// it when it next loads) and answers the waiters with the reason.
fn finish_loading<M: ractor::Message>(
    loading: Option<Loading<M>>,
    result: &Result<ActorRef<M>, Refusal>,
    what: &'static str,
    id: impl std::fmt::Display,
) {
    let Some(loading) = loading else { return };
    match result {
        Ok(actor) => {
            for message in loading.queued {
                if actor.cast(message).is_err() {
                    tracing::warn!(%id, "the {what} stopped before hearing of a message; it rereads the store");
                }
            }
            for waiter in loading.waiters {
                let _ = waiter.send(Ok(()));
            }
        }
        Err(refusal) => {
            if !loading.queued.is_empty() {
                tracing::warn!(%id, code = %refusal.code, dropped = loading.queued.len(), "cannot reach the {what}");
            }
            for waiter in loading.waiters {
                let _ = waiter.send(Err(refusal.clone()));
            }
        }
    }
}

impl Actor for RootActor {
    type Msg = RootMsg;
    type State = RootState;
    type Arguments = RootArgs;

    async fn pre_start(&self, _myself: ActorRef<Self::Msg>, args: RootArgs) -> Result<RootState, ActorProcessingErr> {
        Ok(RootState {
            fabric: args.fabric,
            registry: args.registry,
            profiles: HashMap::new(),
            loading_executors: HashMap::new(),
            loading_executions: HashMap::new(),
            deliveries: HashMap::new(),
        })
    }

    async fn post_stop(&self, _myself: ActorRef<Self::Msg>, state: &mut RootState) -> Result<(), ActorProcessingErr> {
        for task in state.loading_executors.values().filter_map(|loading| loading.task.as_ref()) {
            task.abort();
        }
        for task in state.loading_executions.values().filter_map(|loading| loading.task.as_ref()) {
            task.abort();
        }
        for (_, timer) in state.deliveries.drain() {
            timer.abort();
        }
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: RootMsg,
        state: &mut RootState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            RootMsg::Deliver(Delivery::Executor(runner, message)) => {
                state.await_executor(&myself, runner, Some(message), None);
            }
            RootMsg::Deliver(Delivery::Execution(execution, message)) => {
                state.await_execution(&myself, execution, Some(message), None);
            }
            RootMsg::LoadExecutor(runner, reply) => state.await_executor(&myself, runner, None, Some(reply)),
            RootMsg::LoadExecution(execution, reply) => state.await_execution(&myself, execution, None, Some(reply)),
            RootMsg::Loaded(Loaded::Executor(runner, result)) => {
                // Registered before the queue is handed over: a sender that reads the registry
                // from now on casts after the queued messages.
                if let Ok(actor) = &result {
                    write(&state.registry.executors).insert(runner, actor.clone());
                }
                finish_loading(state.loading_executors.remove(&runner), &result, "executor", runner);
            }
            RootMsg::Loaded(Loaded::Execution(execution, result)) => {
                if let Ok(actor) = &result {
                    write(&state.registry.executions).insert(execution, actor.clone());
                }
                finish_loading(state.loading_executions.remove(&execution), &result, "execution", execution);
            }
            RootMsg::Schedule(input, deliver_at) => {
                state.deliveries.retain(|_, timer| !timer.is_finished());
                let timer = spawn_delivery(state.fabric.clone(), state.root(&myself), input, deliver_at);
                if let Some(old) = state.deliveries.insert(input, timer) {
                    old.abort();
                }
            }
            RootMsg::Unschedule(input) => {
                if let Some(timer) = state.deliveries.remove(&input) {
                    timer.abort();
                }
            }
            RootMsg::Census(reply) => {
                let _ = reply.send(Census {
                    executors: count(&state.registry.executors),
                    executions: count(&state.registry.executions),
                    profiles: state.profiles.len(),
                    connections: state.fabric.connections.load(std::sync::atomic::Ordering::Relaxed),
                });
            }
            RootMsg::Profile(member, reply) => {
                if let Some(found) = state.profiles.get(&member) {
                    let _ = reply.send(Ok(found.clone()));
                    return Ok(());
                }
                // A ProfileActor's pre_start reads nothing: spawning it never waits on the store.
                let args = ProfileArgs { fabric: state.fabric.clone(), member };
                let result = Actor::spawn_linked(None, ProfileActor, args, myself.get_cell())
                    .await
                    .map(|(actor, _)| actor)
                    .map_err(|e| spawn_failed("profile", member, e));
                if let Ok(actor) = &result {
                    state.profiles.insert(member, actor.clone());
                }
                let _ = reply.send(result);
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<Self::Msg>,
        event: SupervisionEvent,
        state: &mut RootState,
    ) -> Result<(), ActorProcessingErr> {
        // A child's exit is never Root's exit: forget it, and the next message for it starts it
        // again from the store.
        let (cell, failure) = match &event {
            SupervisionEvent::ActorTerminated(cell, _, _) => (Some(cell.get_id()), None),
            SupervisionEvent::ActorFailed(cell, error) => (Some(cell.get_id()), Some(error.to_string())),
            _ => (None, None),
        };
        if let Some(id) = cell {
            if let Some(failure) = failure {
                tracing::error!(actor = %id, error = %failure, "actor failed; it restarts from the store on next use");
            }
            let executor = take_exited(&state.registry.executors, id);
            let execution = take_exited(&state.registry.executions, id);
            state.profiles.retain(|_, a| a.get_id() != id);
            // What queued while it stopped goes to a fresh actor.
            if let Some(runner) = executor
                && state.loading_executors.contains_key(&runner)
            {
                state.await_executor(&myself, runner, None, None);
            }
            if let Some(execution) = execution
                && state.loading_executions.contains_key(&execution)
            {
                state.await_execution(&myself, execution, None, None);
            }
        }
        Ok(())
    }
}
