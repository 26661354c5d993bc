//! The event feed with the transcript deltas woven in (`docs/executions.md`, "Events": durable
//! items, plus the ephemeral `text_delta`, `tool_call_started`, `tool_call_arguments_delta` and
//! `stream_reset`).
//!
//! Durable events come from the store, so a slow reader never loses one: it reads on from its
//! cursor. Deltas are never stored: they come from the execution's broadcast as they happen, and a
//! watcher that falls more than [`crate::actors::fabric::TRANSCRIPT_FEED_CAPACITY`] deltas behind is sent one explicit
//! `resync` item `{missed, cursor}` instead of a silent gap — the durable `round_result` events
//! carry every settled answer in full, so a client that sees `resync` rebuilds the transcript from
//! them.
//!
//! The runners' `task_progress` items ([`crate::actors::progress`]) are woven in the same way when
//! asked for: never stored, throttled per task before they reach the feed, and a watcher that
//! falls behind skips the oldest (the next frame supersedes them).

use std::pin::Pin;

use futures::{Stream, StreamExt};
use serde_json::json;
use tokio::sync::broadcast::{self, error::RecvError};

use nexus_proto::{ExecutionId, Refusal};

use super::{Api, Caller, Event, FeedType};
use crate::actors::fabric::TranscriptEvent;
use crate::actors::progress::TaskProgress;
use crate::clock::Clock;

/// The ephemeral items a follower asks for besides the durable events.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Feed {
    /// The transcript deltas (and `resync`).
    pub transcript: bool,
    /// The runners' `task_progress` items.
    pub progress: bool,
}

type Durable = Pin<Box<dyn Stream<Item = Result<Event, Refusal>> + Send>>;

struct Watch {
    durable: Durable,
    transcript: Option<broadcast::Receiver<TranscriptEvent>>,
    progress: Option<broadcast::Receiver<TaskProgress>>,
    id: ExecutionId,
    /// The cursor of the last durable event sent, for `resync`.
    cursor: String,
    /// Stamps the deltas and resyncs, which are never stored.
    clock: Clock,
}

enum Next {
    Durable(Option<Result<Event, Refusal>>),
    Delta(Result<TranscriptEvent, RecvError>),
    Progress(Result<TaskProgress, RecvError>),
}

/// The next item of an optional receiver; never, without one.
async fn recv_opt<T: Clone>(receiver: &mut Option<broadcast::Receiver<T>>) -> Result<T, RecvError> {
    match receiver {
        Some(receiver) => receiver.recv().await,
        None => std::future::pending().await,
    }
}

/// A progress item as a feed item: no cursor, `task_progress`, its data, the runner's time.
fn progress_event(item: &TaskProgress) -> Event {
    Event { cursor: String::new(), event_type: FeedType::TaskProgress, data: item.data(), at: item.at }
}

/// A transcript delta as a feed item: no cursor (it cannot be resumed), the delta's type, and
/// `{round, model, ...delta}` as data.
fn delta_event(event: TranscriptEvent, at: i64) -> Event {
    let mut data = event.delta.data();
    if let Some(object) = data.as_object_mut() {
        object.insert("round".into(), json!(event.round));
        object.insert("model".into(), json!(event.model));
    }
    Event { cursor: String::new(), event_type: FeedType::Delta(event.delta.event_type()), data, at }
}

impl Watch {
    async fn next(mut self) -> Option<(Result<Event, Refusal>, Watch)> {
        loop {
            let next = if self.transcript.is_none() && self.progress.is_none() {
                Next::Durable(self.durable.next().await)
            } else {
                tokio::select! {
                    // Deltas first: a model step streams before its answer is saved, so every
                    // delta of a round is already queued when its durable `round_result` can be
                    // read, and taking the queued deltas first keeps them ahead of it. Progress
                    // goes before the durable items too: a task's last progress is published
                    // before its settlement is.
                    biased;
                    delta = recv_opt(&mut self.transcript) => Next::Delta(delta),
                    progress = recv_opt(&mut self.progress) => Next::Progress(progress),
                    item = self.durable.next() => Next::Durable(item),
                }
            };
            match next {
                // The durable feed decides the end: once the execution is quiet and every event
                // was sent, the watch ends too.
                Next::Durable(item) => {
                    let item = item?;
                    if let Ok(event) = &item {
                        self.cursor.clone_from(&event.cursor);
                    }
                    return Some((item, self));
                }
                Next::Delta(Ok(delta)) if delta.execution_public_id == self.id => {
                    return Some((Ok(delta_event(delta, self.clock.now_ms())), self));
                }
                Next::Delta(Ok(_)) => {}
                Next::Delta(Err(RecvError::Lagged(missed))) => {
                    let data = json!({"missed": missed, "cursor": self.cursor,
                                      "reason": "the watcher read too slowly; rebuild the transcript from round_result events"});
                    return Some((
                        Ok(Event {
                            cursor: String::new(),
                            event_type: FeedType::Resync,
                            data,
                            at: self.clock.now_ms(),
                        }),
                        self,
                    ));
                }
                Next::Delta(Err(RecvError::Closed)) => self.transcript = None,
                Next::Progress(Ok(item)) if item.execution_public_id == self.id => {
                    return Some((Ok(progress_event(&item)), self));
                }
                // Another execution's, or items skipped by a slow watcher: the next frame of a
                // task supersedes the ones before it.
                Next::Progress(Ok(_) | Err(RecvError::Lagged(_))) => {}
                Next::Progress(Err(RecvError::Closed)) => self.progress = None,
            }
        }
    }
}

impl Api {
    /// [`Api::events`], with the execution's transcript deltas woven in when `feed.transcript` is
    /// set (they carry an empty cursor; a `resync` item `{missed, cursor, reason}` replaces any
    /// that a slow watcher missed), and its `task_progress` items when `feed.progress` is set
    /// (empty cursor; data `{task_key, tool_name, runner_executor_public_id, frame}`). Both are
    /// only sent while following: they are never stored.
    ///
    /// # Errors
    /// As [`Api::events`]: 404 `not_found`; 400 `parameter_invalid` for a bad cursor.
    pub async fn watch(
        &self,
        caller: &Caller,
        id: ExecutionId,
        after: &str,
        follow: bool,
        feed: Feed,
    ) -> Result<impl Stream<Item = Result<Event, Refusal>> + Send + 'static + use<>, Refusal> {
        // Subscribed before the first durable read, so nothing streamed after it is missed.
        let deltas = (follow && feed.transcript).then(|| self.fabric.events.subscribe_transcript());
        let progress = (follow && feed.progress).then(|| self.fabric.events.subscribe_progress());
        let durable: Durable = Box::pin(self.events(caller, id, after, follow).await?);
        let watch = Watch {
            durable,
            transcript: deltas,
            progress,
            id,
            cursor: after.to_owned(),
            clock: self.fabric.clock.clone(),
        };
        Ok(futures::stream::unfold(watch, Watch::next))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::actors::fabric::{EventBus, TRANSCRIPT_FEED_CAPACITY};
    use crate::model::{DeltaType, TranscriptDelta};

    fn delta(execution: ExecutionId, text: &str) -> TranscriptEvent {
        TranscriptEvent {
            execution_public_id: execution,
            round: 1,
            model: "scripted/x".into(),
            delta: TranscriptDelta::Text { text: text.into() },
        }
    }

    fn watching(bus: &EventBus, id: ExecutionId) -> Watch {
        let durable: Durable = Box::pin(futures::stream::pending());
        Watch {
            durable,
            transcript: Some(bus.subscribe_transcript()),
            progress: Some(bus.subscribe_progress()),
            id,
            cursor: "cvei_7".into(),
            clock: Clock::system(),
        }
    }

    #[tokio::test]
    async fn a_slow_watcher_gets_one_resync_and_then_the_live_deltas() {
        let bus = EventBus::default();
        let (id, other) = (ExecutionId::new_v4(), ExecutionId::new_v4());
        let watch = watching(&bus, id);
        // Another execution's deltas are never shown; this one's overflow the feed.
        bus.publish_transcript(delta(other, "not yours"));
        for i in 0..TRANSCRIPT_FEED_CAPACITY + 10 {
            bus.publish_transcript(delta(id, &format!("t{i}")));
        }
        let (first, watch) = watch.next().await.expect("an item");
        let first = first.expect("ok");
        assert_eq!(first.event_type, FeedType::Resync);
        assert_eq!(first.cursor, "", "resync is not resumable");
        assert_eq!(first.data["cursor"], "cvei_7", "it names the durable cursor to reread from");
        assert!(first.data["missed"].as_u64().is_some_and(|m| m >= 10), "{}", first.data);
        // After the gap is announced, the deltas still held arrive in order, with their round.
        let (second, _) = watch.next().await.expect("an item");
        let second = second.expect("ok");
        assert_eq!(second.event_type, FeedType::Delta(DeltaType::TextDelta));
        assert_eq!(second.data["round"], 1);
        assert!(second.data["text"].as_str().is_some_and(|t| t.starts_with('t')), "{}", second.data);
    }

    #[tokio::test]
    async fn a_watcher_in_step_sees_every_delta_and_no_resync() {
        let bus = EventBus::default();
        let id = ExecutionId::new_v4();
        let mut watch = watching(&bus, id);
        for text in ["a", "b", "c"] {
            bus.publish_transcript(delta(id, text));
            let (item, next) = watch.next().await.expect("an item");
            let item = item.expect("ok");
            assert_eq!(
                (item.event_type, item.data["text"].as_str()),
                (FeedType::Delta(DeltaType::TextDelta), Some(text))
            );
            watch = next;
        }
    }
}
