//! Task keys: the name of a task inside its execution, in one of three grammars
//! (`docs/executions.md`, "Task keys"):
//!
//! | key | task |
//! | --- | --- |
//! | `r{round}t{index}` | the `index`th tool call the model asked for in round `round` |
//! | `h{round}-{event}` or `h{round}-{event}-g{generation}` | a lifecycle hook's task about model round `round`; a retry is generation 2, 3, ... |
//! | `c{round}-summary` or `c{round}-summary-fallback` | the summary task of a compaction of round `round`, and its kernel fallback |
//!
//! Numbers are decimal without leading zeros, so every key has exactly one spelling and
//! `parse(key.to_string()) == key`.

use std::fmt;
use std::str::FromStr;

use crate::status::LifecycleEvent;

/// A parsed task key. Ordered by grammar, then numerically, so a round's calls sort in call order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TaskKey {
    /// `r{round}t{index}`: a tool call of a model round.
    Call {
        /// The model round.
        round: i64,
        /// The call's position in the round's answer, from 0.
        index: u32,
    },
    /// `h{round}-{event}[-g{generation}]`: a lifecycle hook's task.
    Hook {
        /// The model round the boundary concerns.
        round: i64,
        /// The hook's event.
        event: LifecycleEvent,
        /// 1 for the first task (no suffix), then one more per retry.
        generation: u32,
    },
    /// `c{round}-summary[-fallback]`: a compaction's summary task.
    Summary {
        /// The model round being compacted.
        round: i64,
        /// The kernel fallback of a delegated summary nobody answered.
        fallback: bool,
    },
}

/// A string that is no task key.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a task key (r<round>t<index>, h<round>-<event>[-g<n>] or c<round>-summary[-fallback])")]
pub struct InvalidTaskKey(pub String);

impl TaskKey {
    /// The first generation of the hook task of `event` about `round`.
    pub const fn hook(round: i64, event: LifecycleEvent) -> TaskKey {
        TaskKey::Hook { round, event, generation: 1 }
    }

    /// The model round the task belongs to or concerns.
    pub const fn round(self) -> i64 {
        match self {
            TaskKey::Call { round, .. } | TaskKey::Hook { round, .. } | TaskKey::Summary { round, .. } => round,
        }
    }

    /// Whether this is a hook task's key.
    pub const fn is_hook(self) -> bool {
        matches!(self, TaskKey::Hook { .. })
    }

    /// Whether this is a summary task's key.
    pub const fn is_summary(self) -> bool {
        matches!(self, TaskKey::Summary { .. })
    }

    /// The hook's event, for a hook task's key.
    pub const fn hook_event(self) -> Option<LifecycleEvent> {
        match self {
            TaskKey::Hook { event, .. } => Some(event),
            _ => None,
        }
    }

    /// A hook task's key with its generation set to 1: the event/source pair that every retry
    /// shares. Other keys are returned as they are.
    pub const fn first_generation(self) -> TaskKey {
        match self {
            TaskKey::Hook { round, event, .. } => TaskKey::Hook { round, event, generation: 1 },
            other => other,
        }
    }
}

impl fmt::Display for TaskKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            TaskKey::Call { round, index } => write!(f, "r{round}t{index}"),
            TaskKey::Hook { round, event, generation: 1 } => write!(f, "h{round}-{event}"),
            TaskKey::Hook { round, event, generation } => write!(f, "h{round}-{event}-g{generation}"),
            TaskKey::Summary { round, fallback: false } => write!(f, "c{round}-summary"),
            TaskKey::Summary { round, fallback: true } => write!(f, "c{round}-summary-fallback"),
        }
    }
}

/// A decimal number without sign or leading zeros.
fn number<T: FromStr>(text: &str) -> Option<T> {
    let canonical =
        !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) && (text.len() == 1 || !text.starts_with('0'));
    canonical.then(|| text.parse().ok()).flatten()
}

fn parse(key: &str) -> Option<TaskKey> {
    if let Some(rest) = key.strip_prefix('r') {
        let (round, index) = rest.split_once('t')?;
        return Some(TaskKey::Call { round: number(round)?, index: number(index)? });
    }
    if let Some(rest) = key.strip_prefix('h') {
        let (round, rest) = rest.split_once('-')?;
        let round = number(round)?;
        let (event, generation) = match rest.rsplit_once("-g") {
            Some((event, generation)) if generation.bytes().all(|b| b.is_ascii_digit()) => {
                (event, number::<u32>(generation).filter(|g| *g >= 2)?)
            }
            _ => (rest, 1),
        };
        return Some(TaskKey::Hook { round, event: event.parse().ok()?, generation });
    }
    let rest = key.strip_prefix('c')?;
    let (round, fallback) = match rest.strip_suffix("-summary-fallback") {
        Some(round) => (round, true),
        None => (rest.strip_suffix("-summary")?, false),
    };
    Some(TaskKey::Summary { round: number(round)?, fallback })
}

impl FromStr for TaskKey {
    type Err = InvalidTaskKey;

    fn from_str(key: &str) -> Result<Self, Self::Err> {
        parse(key).ok_or_else(|| InvalidTaskKey(key.to_owned()))
    }
}

impl serde::Serialize for TaskKey {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for TaskKey {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let key = <std::borrow::Cow<'de, str> as serde::Deserialize>::deserialize(deserializer)?;
        key.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_grammar_round_trips_and_nothing_else_parses() {
        let rows = [
            ("r1t0", TaskKey::Call { round: 1, index: 0 }),
            ("r12t31", TaskKey::Call { round: 12, index: 31 }),
            ("h1-turn_start", TaskKey::hook(1, LifecycleEvent::TurnStart)),
            ("h3-stop-g2", TaskKey::Hook { round: 3, event: LifecycleEvent::Stop, generation: 2 }),
            ("h2-pre_compact", TaskKey::hook(2, LifecycleEvent::PreCompact)),
            ("h2-post_compact-g10", TaskKey::Hook { round: 2, event: LifecycleEvent::PostCompact, generation: 10 }),
            ("c4-summary", TaskKey::Summary { round: 4, fallback: false }),
            ("c4-summary-fallback", TaskKey::Summary { round: 4, fallback: true }),
        ];
        for (text, key) in rows {
            assert_eq!(text.parse::<TaskKey>(), Ok(key), "{text}");
            assert_eq!(key.to_string(), text);
            assert_eq!(serde_json::to_value(key).expect("json"), serde_json::json!(text));
        }
        for bad in [
            "",
            "r",
            "r1",
            "rt0",
            "r1t",
            "r01t0",
            "r1t00",
            "r-1t0",
            "x1t0",
            "h1",
            "h1-",
            "h1-lunch",
            "h1-stop-g1",
            "h1-stop-g",
            "h01-stop",
            "c1",
            "c-summary",
            "c1-summary-",
            "c01-summary",
            "r1t0 ",
            "h1-stop-g02",
        ] {
            assert!(bad.parse::<TaskKey>().is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn calls_sort_in_call_order_and_hooks_share_their_first_generation() {
        let mut keys: Vec<TaskKey> = ["r1t10", "r1t2", "r1t0"].iter().map(|k| k.parse().expect("key")).collect();
        keys.sort();
        assert_eq!(keys.iter().map(ToString::to_string).collect::<Vec<_>>(), ["r1t0", "r1t2", "r1t10"]);
        let retry: TaskKey = "h3-stop-g4".parse().expect("key");
        assert_eq!(retry.first_generation().to_string(), "h3-stop");
        assert_eq!(retry.hook_event(), Some(LifecycleEvent::Stop));
        assert_eq!(retry.round(), 3);
        assert!(retry.is_hook() && !retry.is_summary());
    }
}
