//! The Root actor: the supervisor of every other actor and the registry that finds them.
//!
//! Root owns the maps from public ids to live actors. It spawns an actor on first use (the actor
//! loads its state from the store in `pre_start`), and forgets it when it stops. A child's
//! failure is logged and never stops Root: one runner's drop never stops the registry. Root never
//! calls another actor, so any actor may call Root from a handler without risking a deadlock;
//! in return, no actor calls Root from its `pre_start`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use tokio::sync::watch;
use uuid::Uuid;

use nexus_proto::{ErrorCode, Refusal};

use crate::actors::execution::{ExecutionActor, ExecutionArgs, ExecutionMsg};
use crate::actors::executor::{ExecutorActor, ExecutorArgs, ExecutorMsg};
use crate::actors::profile::{ProfileActor, ProfileArgs, ProfileMsg};
use crate::config::ServerConfig;
use crate::model::ModelRegistry;
use crate::store::Store;

/// What every actor shares: the store, the configuration, the model registry, the event bus and
/// the handle to Root.
#[derive(Debug)]
pub struct Fabric {
    /// The durable store.
    pub store: Store,
    /// The validated configuration.
    pub config: ServerConfig,
    /// Resolved model providers.
    pub models: ModelRegistry,
    /// Wake-ups for event followers.
    pub events: EventBus,
    /// Live runner streams (ConnectionActors), for the census.
    pub connections: std::sync::atomic::AtomicUsize,
    /// Turns `true` when the server shuts down: runner streams close first, so the transport's
    /// drain does not wait on them.
    pub closing: watch::Sender<bool>,
    /// The frozen declarations the live executions hold, shared by digest.
    pub declarations: FrozenDeclarations,
}

/// Frozen declarations shared by the executions that froze the same bytes: the digest is SHA-256
/// over the canonical JSON, so one digest is one declaration, and a thousand idle executions of
/// one profile hold one copy of its tool schemas rather than a thousand.
#[derive(Debug, Default)]
pub struct FrozenDeclarations {
    live: Mutex<HashMap<String, std::sync::Weak<crate::declaration::FrozenDeclaration>>>,
}

impl FrozenDeclarations {
    /// The shared copy of `declaration`: the one a live execution already holds, or this one.
    pub fn intern(
        &self,
        declaration: crate::declaration::FrozenDeclaration,
    ) -> Arc<crate::declaration::FrozenDeclaration> {
        let mut live = self.live.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(shared) = live.get(&declaration.digest).and_then(std::sync::Weak::upgrade) {
            return shared;
        }
        // Entries of ended executions are swept whenever the table doubles.
        if live.len() >= 64 && live.len().is_power_of_two() {
            live.retain(|_, held| held.strong_count() > 0);
        }
        let shared = Arc::new(declaration);
        live.insert(shared.digest.clone(), Arc::downgrade(&shared));
        shared
    }
}

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

/// Per-execution wake-ups: the last durable event sequence. Followers read the store; this only
/// tells them when to look. Also the ephemeral transcript feed ([`TranscriptEvent`]): deltas of
/// streamed model answers, never stored.
#[derive(Debug, Default)]
pub struct EventBus {
    feeds: Mutex<HashMap<Uuid, watch::Sender<i64>>>,
    /// Made by the first subscriber; until then deltas are dropped at no cost.
    transcript: std::sync::OnceLock<tokio::sync::broadcast::Sender<TranscriptEvent>>,
}

/// How many transcript events a subscriber may fall behind before it is told it lagged.
pub const TRANSCRIPT_FEED_CAPACITY: usize = 4096;

/// One ephemeral transcript delta of an execution's model step (REFERENCE.md 7, "Events":
/// `text_delta`, `tool_call_started`, `tool_call_arguments_delta`, `stream_reset`). Not durable:
/// a subscriber that connects later never sees it, and the settled `round_result` event carries
/// the same answer durably.
#[derive(Clone, Debug, PartialEq)]
pub struct TranscriptEvent {
    /// The execution.
    pub execution_public_id: Uuid,
    /// The round whose model step streamed it.
    pub round: i64,
    /// The model reference streaming it.
    pub model: String,
    /// The delta.
    pub delta: crate::model::TranscriptDelta,
}

impl EventBus {
    /// A receiver of the execution's last sequence number.
    pub fn subscribe(&self, execution: Uuid) -> watch::Receiver<i64> {
        let mut feeds = self.feeds.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        feeds.entry(execution).or_insert_with(|| watch::channel(0).0).subscribe()
    }

    /// Announces that events up to `seq` are durable.
    pub fn publish(&self, execution: Uuid, seq: i64) {
        let feeds = self.feeds.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(feed) = feeds.get(&execution) {
            feed.send_replace(seq);
        }
    }

    /// Closes the feed of an execution that has ended; followers see the close and finish.
    pub fn close(&self, execution: Uuid) {
        let mut feeds = self.feeds.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        feeds.remove(&execution);
    }

    /// A receiver of every execution's transcript deltas from now on (filter by
    /// [`TranscriptEvent::execution_public_id`]). A receiver more than
    /// [`TRANSCRIPT_FEED_CAPACITY`] events behind gets `RecvError::Lagged`: an explicit resync
    /// signal (read the durable events), never a silent gap.
    pub fn subscribe_transcript(&self) -> tokio::sync::broadcast::Receiver<TranscriptEvent> {
        self.transcript.get_or_init(|| tokio::sync::broadcast::channel(TRANSCRIPT_FEED_CAPACITY).0).subscribe()
    }

    /// Publishes one transcript delta to the current subscribers; without any it is dropped.
    pub fn publish_transcript(&self, event: TranscriptEvent) {
        if let Some(feed) = self.transcript.get() {
            let _ = feed.send(event);
        }
    }
}

/// Root's messages.
pub enum RootMsg {
    /// Finds or spawns the ExecutorActor of a runner.
    Executor(Uuid, RpcReplyPort<Result<ActorRef<ExecutorMsg>, Refusal>>),
    /// Finds or spawns the ExecutionActor of an execution.
    Execution(Uuid, RpcReplyPort<Result<ActorRef<ExecutionMsg>, Refusal>>),
    /// Finds or spawns the ProfileActor of an Agent member.
    Profile(Uuid, RpcReplyPort<Result<ActorRef<ProfileMsg>, Refusal>>),
    /// Counts the live actors.
    Census(RpcReplyPort<Census>),
}

/// Root's arguments.
pub struct RootArgs {
    /// The shared context.
    pub fabric: Arc<Fabric>,
    /// The live runner inboxes and executions, shared with every [`RootHandle`].
    pub registry: Arc<Registry>,
}

/// The live ExecutorActors and ExecutionActors by public id. Root alone writes it (on spawn and
/// on a child's exit); [`RootHandle`] reads it, so that finding a live actor — every offer,
/// settlement and door call does — never waits in Root's mailbox behind an actor being loaded.
#[derive(Debug, Default)]
pub struct Registry {
    executors: std::sync::RwLock<HashMap<Uuid, ActorRef<ExecutorMsg>>>,
    executions: std::sync::RwLock<HashMap<Uuid, ActorRef<ExecutionMsg>>>,
}

fn read<K: std::hash::Hash + Eq, V: Clone>(map: &std::sync::RwLock<HashMap<K, V>>, key: &K) -> Option<V> {
    map.read().unwrap_or_else(std::sync::PoisonError::into_inner).get(key).cloned()
}

fn write<K, V>(map: &std::sync::RwLock<HashMap<K, V>>) -> std::sync::RwLockWriteGuard<'_, HashMap<K, V>> {
    map.write().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Root's state: the live actors by public id.
pub struct RootState {
    fabric: Arc<Fabric>,
    registry: Arc<Registry>,
    profiles: HashMap<Uuid, ActorRef<ProfileMsg>>,
}

/// The Root actor.
pub struct RootActor;

/// A typed handle on Root.
#[derive(Clone, Debug)]
pub struct RootHandle {
    actor: ActorRef<RootMsg>,
    registry: Arc<Registry>,
}

fn gone(what: &str) -> Refusal {
    Refusal::new(ErrorCode::Unavailable, format!("the {what} is shutting down; retry shortly"))
}

impl RootHandle {
    /// Wraps Root's actor ref and the registry it keeps.
    pub fn new(actor: ActorRef<RootMsg>, registry: Arc<Registry>) -> Self {
        RootHandle { actor, registry }
    }

    /// The cell to link children to.
    pub fn cell(&self) -> ActorCell {
        self.actor.get_cell()
    }

    /// The ExecutorActor of `runner`.
    ///
    /// # Errors
    /// `unavailable` during shutdown; `internal` when its state cannot be loaded.
    pub async fn executor(&self, runner: Uuid) -> Result<ActorRef<ExecutorMsg>, Refusal> {
        if let Some(live) = read(&self.registry.executors, &runner) {
            return Ok(live);
        }
        ractor::call!(self.actor, RootMsg::Executor, runner).map_err(|_| gone("server"))?
    }

    /// The ExecutionActor of `execution`.
    ///
    /// # Errors
    /// `unavailable` during shutdown; `not_found` for an unknown execution.
    pub async fn execution(&self, execution: Uuid) -> Result<ActorRef<ExecutionMsg>, Refusal> {
        if let Some(live) = read(&self.registry.executions, &execution) {
            return Ok(live);
        }
        ractor::call!(self.actor, RootMsg::Execution, execution).map_err(|_| gone("server"))?
    }

    /// The ProfileActor of `member`.
    ///
    /// # Errors
    /// `unavailable` during shutdown.
    pub async fn profile(&self, member: Uuid) -> Result<ActorRef<ProfileMsg>, Refusal> {
        ractor::call!(self.actor, RootMsg::Profile, member).map_err(|_| gone("server"))?
    }

    /// Counts the live actors.
    ///
    /// # Errors
    /// `unavailable` during shutdown.
    pub async fn census(&self) -> Result<Census, Refusal> {
        ractor::call!(self.actor, RootMsg::Census).map_err(|_| gone("server"))
    }

    /// Stops Root and, through supervision, every actor.
    pub fn stop(&self) {
        self.actor.stop(Some("shutdown".into()));
    }
}

fn spawn_failed(what: &str, id: Uuid, error: impl std::fmt::Display) -> Refusal {
    tracing::error!(%id, error = %error, "{what} actor failed to start");
    Refusal::new(ErrorCode::Internal, format!("the {what} {id} could not be loaded: {error}"))
}

impl Actor for RootActor {
    type Msg = RootMsg;
    type State = RootState;
    type Arguments = RootArgs;

    async fn pre_start(&self, _myself: ActorRef<Self::Msg>, args: RootArgs) -> Result<RootState, ActorProcessingErr> {
        Ok(RootState { fabric: args.fabric, registry: args.registry, profiles: HashMap::new() })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: RootMsg,
        state: &mut RootState,
    ) -> Result<(), ActorProcessingErr> {
        let root = RootHandle::new(myself.clone(), state.registry.clone());
        match msg {
            RootMsg::Executor(id, reply) => {
                if let Some(found) = read(&state.registry.executors, &id) {
                    let _ = reply.send(Ok(found));
                    return Ok(());
                }
                let args = ExecutorArgs { fabric: state.fabric.clone(), root, public_id: id };
                let result = Actor::spawn_linked(None, ExecutorActor, args, myself.get_cell())
                    .await
                    .map(|(actor, _)| actor)
                    .map_err(|e| spawn_failed("executor", id, e));
                if let Ok(actor) = &result {
                    write(&state.registry.executors).insert(id, actor.clone());
                }
                let _ = reply.send(result);
            }
            RootMsg::Execution(id, reply) => {
                if let Some(found) = read(&state.registry.executions, &id) {
                    let _ = reply.send(Ok(found));
                    return Ok(());
                }
                match state.fabric.store.execution(id).await {
                    Ok(Some(_)) => {}
                    Ok(None) => {
                        let _ = reply.send(Err(Refusal::new(ErrorCode::NotFound, format!("no execution {id}"))));
                        return Ok(());
                    }
                    Err(e) => {
                        let _ = reply.send(Err(spawn_failed("execution", id, e)));
                        return Ok(());
                    }
                }
                let args = ExecutionArgs { fabric: state.fabric.clone(), root, public_id: id };
                let result = Actor::spawn_linked(None, ExecutionActor, args, myself.get_cell())
                    .await
                    .map(|(actor, _)| actor)
                    .map_err(|e| spawn_failed("execution", id, e));
                if let Ok(actor) = &result {
                    write(&state.registry.executions).insert(id, actor.clone());
                }
                let _ = reply.send(result);
            }
            RootMsg::Census(reply) => {
                let _ = reply.send(Census {
                    executors: state.registry.executors.read().map_or(0, |m| m.len()),
                    executions: state.registry.executions.read().map_or(0, |m| m.len()),
                    profiles: state.profiles.len(),
                    connections: state.fabric.connections.load(std::sync::atomic::Ordering::Relaxed),
                });
            }
            RootMsg::Profile(id, reply) => {
                if let Some(found) = state.profiles.get(&id) {
                    let _ = reply.send(Ok(found.clone()));
                    return Ok(());
                }
                let args = ProfileArgs { fabric: state.fabric.clone(), member: id };
                let result = Actor::spawn_linked(None, ProfileActor, args, myself.get_cell())
                    .await
                    .map(|(actor, _)| actor)
                    .map_err(|e| spawn_failed("profile", id, e));
                if let Ok(actor) = &result {
                    state.profiles.insert(id, actor.clone());
                }
                let _ = reply.send(result);
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        _myself: ActorRef<Self::Msg>,
        event: SupervisionEvent,
        state: &mut RootState,
    ) -> Result<(), ActorProcessingErr> {
        // A child's exit is never Root's exit: forget it, and the next lookup respawns it from
        // the store.
        let (cell, failure) = match &event {
            SupervisionEvent::ActorTerminated(cell, _, _) => (Some(cell.get_id()), None),
            SupervisionEvent::ActorFailed(cell, error) => (Some(cell.get_id()), Some(error.to_string())),
            _ => (None, None),
        };
        if let Some(id) = cell {
            if let Some(failure) = failure {
                tracing::error!(actor = %id, error = %failure, "actor failed; it restarts from the store on next use");
            }
            write(&state.registry.executors).retain(|_, a| a.get_id() != id);
            write(&state.registry.executions).retain(|_, a| a.get_id() != id);
            state.profiles.retain(|_, a| a.get_id() != id);
        }
        Ok(())
    }
}
