//! The offer window of one runner stream (`docs/protocol.md`, "Offers"): which claimable tasks
//! were offered (`work_available`) on the current stream, and which wait for room in offer order
//! `(started_at, task_key)`.
//!
//! Pure bookkeeping without I/O: the [`ExecutorActor`](super::ExecutorActor) decides what is
//! claimable and sends the frames. Offers are hints; the inbox is level-triggered, so a new stream
//! starts a fresh window over the whole claimable inbox.

use std::collections::{BTreeSet, HashSet};

use nexus_proto::{ExecutionId, TaskKey};

use super::TaskId;

/// A task's place in line: `(started_at, task_key, run)`; keys of one round sort in call order.
type OfferKey = (i64, TaskKey, ExecutionId);

fn offer_key(id: &TaskId, started_at: i64) -> OfferKey {
    (started_at, id.1, id.0)
}

/// What became of an offer the window let out (see [`OfferWindow::fill`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Sent {
    /// The frame was queued: the task is outstanding on this stream.
    Offered,
    /// The task is no longer claimable (claimed or settled meanwhile): it leaves the line.
    Gone,
    /// The stream cannot take the frame now: the task keeps its place and filling stops.
    Blocked,
}

/// The offers of one stream: at most `bound` outstanding, the rest waiting, oldest first. A task
/// is outstanding or waiting, never both, and never offered twice on one stream.
#[derive(Debug)]
pub(super) struct OfferWindow {
    bound: usize,
    /// Offered on this stream and not yet claimed or settled.
    offered: HashSet<TaskId>,
    /// Claimable and not yet offered on this stream, in offer order.
    waiting: BTreeSet<OfferKey>,
}

impl OfferWindow {
    /// An empty window that lets out at most `bound` offers at a time.
    pub(super) fn new(bound: usize) -> OfferWindow {
        OfferWindow { bound, offered: HashSet::new(), waiting: BTreeSet::new() }
    }

    /// Empties the window (no stream is attached).
    pub(super) fn clear(&mut self) {
        self.offered.clear();
        self.waiting.clear();
    }

    /// Starts a fresh window for a new stream: every claimable task `(id, started_at)` waits,
    /// none is outstanding.
    pub(super) fn reset<'a>(&mut self, claimable: impl IntoIterator<Item = (&'a TaskId, i64)>) {
        self.offered.clear();
        self.waiting = claimable.into_iter().map(|(id, started_at)| offer_key(id, started_at)).collect();
    }

    /// Puts a claimable task in line, unless it is outstanding on this stream already.
    pub(super) fn enqueue(&mut self, id: &TaskId, started_at: i64) {
        if !self.offered.contains(id) {
            self.waiting.insert(offer_key(id, started_at));
        }
    }

    /// Takes a task out (claimed or settled): an outstanding one makes room for the next offer.
    pub(super) fn withdraw(&mut self, id: &TaskId, started_at: i64) {
        self.offered.remove(id);
        self.waiting.remove(&offer_key(id, started_at));
    }

    /// Lets out waiting tasks, oldest first, while there is room; `offer` sends each one. Returns
    /// how many were offered.
    pub(super) fn fill(&mut self, mut offer: impl FnMut(&TaskId) -> Sent) -> usize {
        let mut sent = 0;
        while self.offered.len() < self.bound {
            let Some(key) = self.waiting.pop_first() else { break };
            let id = (key.2, key.1);
            match offer(&id) {
                Sent::Offered => {
                    self.offered.insert(id);
                    sent += 1;
                }
                Sent::Gone => {}
                Sent::Blocked => {
                    self.waiting.insert(key);
                    break;
                }
            }
        }
        sent
    }

    /// Offers outstanding now (the debug build's invariant checks and the tests read it).
    #[cfg(any(test, debug_assertions))]
    pub(super) fn outstanding(&self) -> usize {
        self.offered.len()
    }

    /// Tasks waiting for room (as [`OfferWindow::outstanding`]).
    #[cfg(any(test, debug_assertions))]
    pub(super) fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Asserts the window's own invariant: never more than `bound` offers outstanding.
    #[cfg(debug_assertions)]
    pub(super) fn check(&self) {
        assert!(
            self.offered.len() <= self.bound,
            "{} offers outstanding, over the window of {}",
            self.offered.len(),
            self.bound
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u128, key: &str) -> TaskId {
        (ExecutionId::from_uuid(uuid::Uuid::from_u128(n)), key.parse().expect("a task key"))
    }

    /// Fills the window, recording the keys let out.
    fn drain(window: &mut OfferWindow) -> Vec<String> {
        let mut keys = Vec::new();
        window.fill(|id| {
            keys.push(id.1.to_string());
            Sent::Offered
        });
        keys
    }

    #[test]
    fn fills_to_its_bound_oldest_first_and_refills_as_offers_leave() {
        let tasks =
            [(id(1, "r1t9"), 30), (id(1, "r1t10"), 30), (id(2, "r1t0"), 10), (id(1, "r1t2"), 20), (id(1, "r1t3"), 40)];
        let mut window = OfferWindow::new(3);
        window.reset(tasks.iter().map(|(id, at)| (id, *at)));
        // started_at first, then the task key in call order (r1t9 before r1t10).
        assert_eq!(drain(&mut window), ["r1t0", "r1t2", "r1t9"]);
        assert_eq!((window.outstanding(), window.waiting()), (3, 2));
        assert!(drain(&mut window).is_empty(), "a full window lets nothing out");

        // A claim of an outstanding task makes room for exactly one, the oldest waiting.
        window.withdraw(&tasks[2].0, 10);
        assert_eq!(drain(&mut window), ["r1t10"]);
        // A task settled while waiting leaves the line without taking room.
        window.withdraw(&tasks[4].0, 40);
        window.withdraw(&tasks[3].0, 20);
        assert!(drain(&mut window).is_empty());
        assert_eq!((window.outstanding(), window.waiting()), (2, 0));
    }

    #[test]
    fn an_outstanding_task_is_never_offered_twice_but_a_new_stream_offers_it_again() {
        let task = id(1, "r1t0");
        let mut window = OfferWindow::new(4);
        window.enqueue(&task, 5);
        window.enqueue(&task, 5);
        assert_eq!(drain(&mut window), ["r1t0"]);
        window.enqueue(&task, 5);
        assert!(drain(&mut window).is_empty(), "a repeated offer of an outstanding task is not sent");
        window.reset([(&task, 5)]);
        assert_eq!(drain(&mut window), ["r1t0"], "the inbox is level-triggered: a new stream hears it again");
        window.clear();
        assert_eq!((window.outstanding(), window.waiting()), (0, 0));
    }

    #[test]
    fn a_blocked_offer_keeps_its_place_and_a_gone_one_leaves() {
        let tasks = [(id(1, "r1t0"), 1), (id(1, "r1t1"), 2), (id(1, "r1t2"), 3)];
        let mut window = OfferWindow::new(3);
        window.reset(tasks.iter().map(|(id, at)| (id, *at)));
        assert_eq!(window.fill(|_| Sent::Blocked), 0);
        assert_eq!((window.outstanding(), window.waiting()), (0, 3));
        let mut seen = Vec::new();
        let sent = window.fill(|id| {
            seen.push(id.1.to_string());
            if id.1 == tasks[0].0.1 { Sent::Gone } else { Sent::Offered }
        });
        assert_eq!((sent, seen), (2, vec!["r1t0".to_owned(), "r1t1".to_owned(), "r1t2".to_owned()]));
        assert_eq!((window.outstanding(), window.waiting()), (2, 0));
    }

    #[cfg(debug_assertions)]
    #[test]
    #[should_panic(expected = "over the window")]
    fn a_window_over_its_bound_fails_its_check() {
        let mut window = OfferWindow::new(1);
        window.offered.insert(id(1, "r1t0"));
        window.offered.insert(id(1, "r1t1"));
        window.check();
    }
}
