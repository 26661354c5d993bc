//! What execution saves write: how many saves, and the bytes of the text they bind (every text
//! parameter of every statement of [`Store::save_execution`](super::Store::save_execution), JSON
//! included; integers are not counted). A save of a long execution writes what is new, so its
//! bytes stay flat as the transcript grows (`docs/architecture.md`, "Transcript storage"); these
//! counters are how the bench and the tests see it.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use nexus_proto::ExecutionId;

/// How many `(execution, round)` tallies the ledger keeps: the most recent ones.
pub const RECENT_ROUNDS: usize = 4_096;

/// Saves and the text bytes they bound.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SaveBytes {
    /// Saves acknowledged durable.
    pub saves: u64,
    /// The text bytes those saves bound.
    pub bytes: u64,
}

impl SaveBytes {
    /// Mean bytes per save; 0 with no save.
    pub fn per_save(self) -> f64 {
        match self.saves {
            0 => 0.0,
            saves => self.bytes as f64 / saves as f64,
        }
    }

    fn add(&mut self, bytes: u64) {
        self.saves += 1;
        self.bytes += bytes;
    }
}

/// The store's counters: a cumulative total, and a tally per `(execution, round)` for the
/// [`RECENT_ROUNDS`] most recent pairs (older ones are forgotten, so memory stays bounded).
#[derive(Debug, Default)]
pub(super) struct SaveLedger {
    saves: AtomicU64,
    bytes: AtomicU64,
    recent: Mutex<Recent>,
}

#[derive(Debug, Default)]
struct Recent {
    tallies: HashMap<(ExecutionId, i64), SaveBytes>,
    /// The pairs in `tallies`, oldest first.
    order: VecDeque<(ExecutionId, i64)>,
}

impl SaveLedger {
    /// Counts one durable save of `execution` at `round` that bound `bytes`.
    pub(super) fn record(&self, execution: ExecutionId, round: i64, bytes: u64) {
        self.saves.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        let mut recent = self.recent.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let key = (execution, round);
        if let Some(tally) = recent.tallies.get_mut(&key) {
            tally.add(bytes);
            return;
        }
        if recent.order.len() == RECENT_ROUNDS
            && let Some(oldest) = recent.order.pop_front()
        {
            recent.tallies.remove(&oldest);
        }
        recent.order.push_back(key);
        recent.tallies.entry(key).or_default().add(bytes);
    }

    /// Every save since the store opened.
    pub(super) fn total(&self) -> SaveBytes {
        SaveBytes { saves: self.saves.load(Ordering::Relaxed), bytes: self.bytes.load(Ordering::Relaxed) }
    }

    /// The saves of `execution` while its row stood at `round`, if that pair is still kept.
    pub(super) fn of_round(&self, execution: ExecutionId, round: i64) -> Option<SaveBytes> {
        let recent = self.recent.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        recent.tallies.get(&(execution, round)).copied()
    }
}

/// A text parameter whose length a save counts.
pub(super) trait BoundText {
    /// Its length in bytes; 0 for a null.
    fn text_len(&self) -> usize;
}

impl BoundText for String {
    fn text_len(&self) -> usize {
        self.len()
    }
}

impl BoundText for &String {
    fn text_len(&self) -> usize {
        self.len()
    }
}

impl BoundText for &str {
    fn text_len(&self) -> usize {
        self.len()
    }
}

impl<T: BoundText> BoundText for Option<T> {
    fn text_len(&self) -> usize {
        self.as_ref().map_or(0, BoundText::text_len)
    }
}

impl<T: BoundText> BoundText for &Option<T> {
    fn text_len(&self) -> usize {
        self.as_ref().map_or(0, BoundText::text_len)
    }
}

/// Adds `value`'s length to `bytes` and hands `value` back, to be bound: a statement counts its
/// text where it binds it.
pub(super) fn counted<T: BoundText>(bytes: &mut u64, value: T) -> T {
    *bytes += value.text_len() as u64;
    value
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ledger_tallies_rounds_and_forgets_the_oldest() {
        let ledger = SaveLedger::default();
        let (a, b) = (ExecutionId::new_v4(), ExecutionId::new_v4());
        ledger.record(a, 1, 100);
        ledger.record(b, 1, 7);
        ledger.record(a, 1, 50);
        ledger.record(a, 2, 10);
        assert_eq!(ledger.of_round(a, 1), Some(SaveBytes { saves: 2, bytes: 150 }));
        assert_eq!(ledger.of_round(b, 1), Some(SaveBytes { saves: 1, bytes: 7 }));
        assert_eq!(ledger.of_round(a, 3), None);
        assert_eq!(ledger.total(), SaveBytes { saves: 4, bytes: 167 });
        assert!((ledger.of_round(a, 1).expect("kept").per_save() - 75.0).abs() < f64::EPSILON);
        for round in 3..(3 + RECENT_ROUNDS as i64) {
            ledger.record(b, round, 1);
        }
        assert_eq!(ledger.of_round(a, 1), None, "the oldest pairs are forgotten");
        assert_eq!(ledger.of_round(b, 3 + RECENT_ROUNDS as i64 - 1), Some(SaveBytes { saves: 1, bytes: 1 }));
        assert_eq!(ledger.total().saves, 4 + RECENT_ROUNDS as u64);
    }

    #[test]
    fn counted_text_is_its_bytes_and_a_null_is_none() {
        let mut bytes = 0;
        let owned = counted(&mut bytes, "héllo".to_owned());
        let none: Option<String> = counted(&mut bytes, None);
        let some = counted(&mut bytes, Some("abc"));
        assert_eq!((owned.as_str(), none, some, bytes), ("héllo", None, Some("abc"), 9));
    }
}
