//! Task progress on the feed (`docs/executions.md`, "Events"; `docs/protocol.md`, "Progress"): a
//! runner's `Progress` frames for a task it holds a valid claim on become ephemeral
//! `task_progress` items of the execution's feed, throttled per task.
//!
//! The throttle ([`ProgressThrottle`]) lives in the task's ExecutorActor, which checks the claim:
//! the first frame of a task goes out at once; a frame that comes sooner than the interval after
//! the last one sent is held, and a newer one replaces it (the newest wins); the held frame goes
//! out when the interval has passed, or when the task settles. So a task puts at most one item
//! per interval on the feed, and its last frame is never lost to the throttle. Nothing is stored
//! or replayed: a watcher sees the progress made while it watches.

use std::collections::HashMap;

use serde_json::{Value, json};
use tokio::task::JoinHandle;

use nexus_proto::{ExecutionId, RunnerId, TaskKey};

/// How many `task_progress` items a watcher may fall behind before the oldest are skipped.
pub const PROGRESS_FEED_CAPACITY: usize = 1024;

/// The shortest interval between two items of one task, in milliseconds: the spec drops frames
/// closer than this, so `[runner] progress_interval_ms` is never set below it.
pub const PROGRESS_MIN_INTERVAL_MS: u64 = 250;

/// One `task_progress` item: which task, and the runner's frame as it sent it (a JSON object of
/// at most [`crate::actors::executor::PROGRESS_FRAME_BOUND`] bytes, e.g. `{"text_tail", "bytes"}`
/// from runner-agent's bash).
#[derive(Clone, Debug, PartialEq)]
pub struct TaskProgress {
    /// The execution whose feed shows it.
    pub execution_public_id: ExecutionId,
    /// The task.
    pub task_key: TaskKey,
    /// The callable the model called.
    pub tool_name: String,
    /// The runner running the task.
    pub runner_executor_public_id: RunnerId,
    /// The frame.
    pub frame: Value,
    /// When the runner sent it, Unix milliseconds.
    pub at: i64,
}

impl TaskProgress {
    /// The item's data: `{task_key, tool_name, runner_executor_public_id, frame}`.
    #[must_use]
    pub fn data(&self) -> Value {
        json!({
            "task_key": self.task_key,
            "tool_name": self.tool_name,
            "runner_executor_public_id": self.runner_executor_public_id,
            "frame": self.frame,
        })
    }
}

type TaskId = (ExecutionId, TaskKey);

#[derive(Debug)]
struct Slot {
    /// When the last item went out, Unix milliseconds.
    sent_at: i64,
    /// The newest frame that came too soon, waiting for its turn.
    held: Option<TaskProgress>,
}

/// The per-task throttle of one ExecutorActor, with the one alarm for the earliest held frame.
#[derive(Debug)]
pub struct ProgressThrottle {
    interval_ms: i64,
    slots: HashMap<TaskId, Slot>,
    alarm: Option<(i64, JoinHandle<()>)>,
}

impl ProgressThrottle {
    /// A throttle letting one item per task through every `interval_ms` milliseconds (at least
    /// [`PROGRESS_MIN_INTERVAL_MS`]).
    #[must_use]
    pub fn new(interval_ms: u64) -> Self {
        let interval_ms = i64::try_from(interval_ms.max(PROGRESS_MIN_INTERVAL_MS)).unwrap_or(i64::MAX);
        ProgressThrottle { interval_ms, slots: HashMap::new(), alarm: None }
    }

    /// Takes a frame at `now`: answers it when it goes out at once, else holds it in place of any
    /// frame held before.
    pub fn offer(&mut self, item: TaskProgress, now: i64) -> Option<TaskProgress> {
        let id = (item.execution_public_id, item.task_key);
        match self.slots.get_mut(&id) {
            Some(slot) if now.saturating_sub(slot.sent_at) < self.interval_ms => {
                slot.held = Some(item);
                None
            }
            Some(slot) => {
                slot.sent_at = now;
                slot.held = None;
                Some(item)
            }
            None => {
                self.slots.insert(id, Slot { sent_at: now, held: None });
                Some(item)
            }
        }
    }

    /// The held frames whose interval has passed by `now`, each marked sent at `now`.
    pub fn due(&mut self, now: i64) -> Vec<TaskProgress> {
        let interval = self.interval_ms;
        let mut due = Vec::new();
        for slot in self.slots.values_mut() {
            if slot.held.is_some() && now.saturating_sub(slot.sent_at) >= interval {
                slot.sent_at = now;
                due.extend(slot.held.take());
            }
        }
        due
    }

    /// Forgets a task that settled, answering its held frame: the last word of its progress goes
    /// out rather than being lost to the throttle.
    pub fn release(&mut self, run: ExecutionId, task_key: TaskKey) -> Option<TaskProgress> {
        self.slots.remove(&(run, task_key)).and_then(|slot| slot.held)
    }

    /// When the earliest held frame is due, Unix milliseconds.
    #[must_use]
    pub fn next_due(&self) -> Option<i64> {
        self.slots.values().filter(|slot| slot.held.is_some()).map(|slot| slot.sent_at + self.interval_ms).min()
    }

    /// How many tasks the throttle remembers.
    #[must_use]
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether it remembers none.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// The time the alarm is set for, if it is.
    #[must_use]
    pub fn armed_for(&self) -> Option<i64> {
        self.alarm.as_ref().map(|(at, _)| *at)
    }

    /// Sets the alarm (the task that will ring it) for `at`, replacing any other.
    pub fn arm(&mut self, at: i64, alarm: JoinHandle<()>) {
        if let Some((_, old)) = self.alarm.replace((at, alarm)) {
            old.abort();
        }
    }

    /// Clears the alarm.
    pub fn disarm(&mut self) {
        if let Some((_, old)) = self.alarm.take() {
            old.abort();
        }
    }

    /// The alarm for `at` rang: it is no longer set.
    pub fn rang(&mut self, at: i64) {
        if self.armed_for() == Some(at) {
            self.alarm = None;
        }
    }
}

impl Drop for ProgressThrottle {
    fn drop(&mut self) {
        self.disarm();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(run: ExecutionId, index: u32, text: &str) -> TaskProgress {
        TaskProgress {
            execution_public_id: run,
            task_key: TaskKey::Call { round: 1, index },
            tool_name: "bash".into(),
            runner_executor_public_id: RunnerId::new_v4(),
            frame: json!({"text_tail": text}),
            at: 0,
        }
    }

    #[test]
    fn one_item_per_interval_per_task_and_the_newest_wins() {
        let run = ExecutionId::new_v4();
        let mut throttle = ProgressThrottle::new(1_000);
        assert!(throttle.offer(item(run, 0, "a"), 0).is_some(), "the first goes out at once");
        assert!(throttle.offer(item(run, 1, "other"), 10).is_some(), "another task has its own interval");
        assert!(throttle.offer(item(run, 0, "b"), 100).is_none());
        assert!(throttle.offer(item(run, 0, "c"), 900).is_none());
        assert_eq!(throttle.next_due(), Some(1_000));
        assert!(throttle.due(999).is_empty());
        let due = throttle.due(1_000);
        assert_eq!(due.len(), 1);
        assert_eq!(due[0].frame["text_tail"], "c", "the newest held frame wins");
        assert_eq!(throttle.next_due(), None);
        // Sent at 1000: the next one is held until 2000, and goes out when its task settles.
        assert!(throttle.offer(item(run, 0, "d"), 1_500).is_none());
        let last = throttle.release(run, TaskKey::Call { round: 1, index: 0 });
        assert_eq!(last.map(|i| i.frame["text_tail"].clone()), Some(json!("d")));
        assert_eq!(throttle.len(), 1);
        assert!(throttle.offer(item(run, 1, "late"), 2_000).is_some(), "an interval later it goes at once");
    }

    #[test]
    fn the_interval_is_never_below_the_spec_floor() {
        let run = ExecutionId::new_v4();
        let mut throttle = ProgressThrottle::new(0);
        assert!(throttle.offer(item(run, 0, "a"), 0).is_some());
        assert!(throttle.offer(item(run, 0, "b"), 249).is_none());
        assert_eq!(throttle.due(250).len(), 1);
    }
}
