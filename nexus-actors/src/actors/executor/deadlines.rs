//! The inbox's deadlines: every open task's `deadline_at` and one alarm for the earliest live one
//! (issue 10, item 6: one timer per inbox, not a tokio task per open task).
//!
//! Pure bookkeeping apart from holding the alarm's task: the
//! [`ExecutorActor`](super::ExecutorActor) arms it after every message and expires what is due
//! when it rings. A frozen deadline (a paused execution's, `docs/executions.md`, "Control") sorts
//! after every live one and never arms the alarm.

use std::collections::{BTreeSet, HashMap};

use tokio::task::JoinHandle;

use crate::clock::is_frozen;

use super::TaskId;

/// Deadlines by task and in order, and the armed alarm.
#[derive(Debug, Default)]
pub(super) struct Deadlines {
    by_task: HashMap<TaskId, i64>,
    in_order: BTreeSet<(i64, TaskId)>,
    alarm: Option<(i64, JoinHandle<()>)>,
}

impl Deadlines {
    /// Sets (or moves) `id`'s deadline, Unix milliseconds.
    pub(super) fn set(&mut self, id: TaskId, deadline_at: i64) {
        if let Some(old) = self.by_task.insert(id, deadline_at) {
            self.in_order.remove(&(old, id));
        }
        self.in_order.insert((deadline_at, id));
    }

    /// Forgets `id` (it settled); answers whether it was held.
    pub(super) fn remove(&mut self, id: &TaskId) -> bool {
        match self.by_task.remove(id) {
            Some(at) => {
                self.in_order.remove(&(at, *id));
                true
            }
            None => false,
        }
    }

    /// Tasks held (the debug build's invariant checks and the tests read it).
    #[cfg(any(test, debug_assertions))]
    pub(super) fn len(&self) -> usize {
        self.by_task.len()
    }

    /// The earliest deadline that can come due (not frozen).
    pub(super) fn next_live(&self) -> Option<i64> {
        self.in_order.first().map(|(at, _)| *at).filter(|at| !is_frozen(*at))
    }

    /// Every live deadline at or before `now`, earliest first. They stay filed until their
    /// tasks settle ([`Deadlines::remove`]).
    pub(super) fn due(&self, now: i64) -> Vec<(TaskId, i64)> {
        self.in_order.iter().take_while(|(at, _)| *at <= now && !is_frozen(*at)).map(|(at, id)| (*id, *at)).collect()
    }

    /// The deadline the alarm is armed for.
    pub(super) fn armed_for(&self) -> Option<i64> {
        self.alarm.as_ref().map(|(at, _)| *at)
    }

    /// Arms the alarm for `at`, replacing any other.
    pub(super) fn arm(&mut self, at: i64, alarm: JoinHandle<()>) {
        if let Some((_, old)) = self.alarm.replace((at, alarm)) {
            old.abort();
        }
    }

    /// The alarm for `at` rang: it is no longer armed (unless it was re-armed since).
    pub(super) fn rang(&mut self, at: i64) {
        if self.armed_for() == Some(at) {
            self.alarm = None;
        }
    }

    /// Stops the alarm.
    pub(super) fn disarm(&mut self) {
        if let Some((_, alarm)) = self.alarm.take() {
            alarm.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use nexus_proto::{ExecutionId, TaskKey};

    use super::*;
    use crate::clock::FROZEN_EPOCH_MS;

    fn id(index: u32) -> TaskId {
        (ExecutionId::from(uuid::Uuid::nil()), TaskKey::Call { round: 1, index })
    }

    #[test]
    fn due_takes_the_earliest_first_and_moved_deadlines_follow() {
        let mut deadlines = Deadlines::default();
        deadlines.set(id(0), 300);
        deadlines.set(id(1), 100);
        deadlines.set(id(2), 200);
        deadlines.set(id(1), 400);
        assert_eq!(deadlines.next_live(), Some(200));
        assert_eq!(deadlines.due(300), vec![(id(2), 200), (id(0), 300)]);
        assert_eq!(deadlines.len(), 3, "due deadlines stay filed until their tasks settle");
        assert!(deadlines.remove(&id(2)) && deadlines.remove(&id(0)));
        assert!(deadlines.remove(&id(1)));
        assert!(!deadlines.remove(&id(1)));
        assert_eq!(deadlines.next_live(), None);
    }

    #[test]
    fn a_frozen_deadline_never_comes_due() {
        let mut deadlines = Deadlines::default();
        deadlines.set(id(0), FROZEN_EPOCH_MS + 5);
        assert_eq!(deadlines.next_live(), None);
        assert!(deadlines.due(i64::MAX).is_empty());
        deadlines.set(id(1), 10);
        assert_eq!(deadlines.next_live(), Some(10));
        assert_eq!(deadlines.due(i64::MAX), vec![(id(1), 10)]);
        assert_eq!(deadlines.len(), 2);
    }
}
