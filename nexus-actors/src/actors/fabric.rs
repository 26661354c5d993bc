//! What every actor shares ([`Fabric`]): the store, the configuration, the model registry, the
//! clock, the event bus that wakes followers, and the frozen declarations shared by digest.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use nexus_proto::ExecutionId;

use crate::clock::Clock;
use crate::config::ServerConfig;
use crate::model::ModelRegistry;
use crate::store::Store;

/// What every actor shares: the store, the configuration, the model registry, the event bus and
/// the handle to Root.
#[derive(Debug)]
pub struct Fabric {
    /// The durable store.
    pub store: Store,
    /// The time every deadline, hold and timestamp reads (the store's own).
    pub clock: Clock,
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
    /// This node: its id from the data dir and where it listens (`GET /agent_api/v1/cluster`).
    pub node: crate::store::lease::NodeIdentity,
    /// What `/metrics` counts as it happens (`docs/metrics.md`).
    pub metrics: crate::metrics::Metrics,
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

/// Per-execution wake-ups: the last durable event sequence. Followers read the store; this only
/// tells them when to look. Also the ephemeral transcript feed ([`TranscriptEvent`]): deltas of
/// streamed model answers, never stored.
#[derive(Debug, Default)]
pub struct EventBus {
    feeds: Mutex<HashMap<ExecutionId, watch::Sender<i64>>>,
    /// Made by the first subscriber; until then deltas are dropped at no cost.
    transcript: std::sync::OnceLock<tokio::sync::broadcast::Sender<TranscriptEvent>>,
    /// The runners' throttled task progress ([`crate::actors::progress`]); made by the first
    /// subscriber, as `transcript`.
    progress: std::sync::OnceLock<tokio::sync::broadcast::Sender<crate::actors::progress::TaskProgress>>,
}

/// How many transcript events a subscriber may fall behind before it is told it lagged.
pub const TRANSCRIPT_FEED_CAPACITY: usize = 4096;

/// One ephemeral transcript delta of an execution's model step (`docs/executions.md`, "Events":
/// `text_delta`, `tool_call_started`, `tool_call_arguments_delta`, `stream_reset`). Not durable:
/// a subscriber that connects later never sees it, and the settled `round_result` event carries
/// the same answer durably.
#[derive(Clone, Debug, PartialEq)]
pub struct TranscriptEvent {
    /// The execution.
    pub execution_public_id: ExecutionId,
    /// The round whose model step streamed it.
    pub round: i64,
    /// The model reference streaming it.
    pub model: String,
    /// The delta.
    pub delta: crate::model::TranscriptDelta,
}

impl EventBus {
    /// A receiver of the execution's last sequence number.
    pub fn subscribe(&self, execution: ExecutionId) -> watch::Receiver<i64> {
        let mut feeds = self.feeds.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        feeds.entry(execution).or_insert_with(|| watch::channel(0).0).subscribe()
    }

    /// Announces that events up to `seq` are durable.
    pub fn publish(&self, execution: ExecutionId, seq: i64) {
        let feeds = self.feeds.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(feed) = feeds.get(&execution) {
            feed.send_replace(seq);
        }
    }

    /// Closes the feed of an execution that has ended; followers see the close and finish.
    pub fn close(&self, execution: ExecutionId) {
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

    /// A receiver of every execution's `task_progress` items (filter by
    /// [`crate::actors::progress::TaskProgress::execution_public_id`]). A receiver more than
    /// [`crate::actors::progress::PROGRESS_FEED_CAPACITY`] items behind skips the oldest: progress
    /// is superseded by the next frame, and nothing of it is durable.
    pub fn subscribe_progress(&self) -> tokio::sync::broadcast::Receiver<crate::actors::progress::TaskProgress> {
        self.progress
            .get_or_init(|| tokio::sync::broadcast::channel(crate::actors::progress::PROGRESS_FEED_CAPACITY).0)
            .subscribe()
    }

    /// Publishes one `task_progress` item to the current subscribers; without any it is dropped.
    pub fn publish_progress(&self, item: crate::actors::progress::TaskProgress) {
        if let Some(feed) = self.progress.get() {
            let _ = feed.send(item);
        }
    }
}
