//! Where an execution stands: its [`Phase`], read from the facts the ExecutionActor holds, and the
//! one table of the moves between phases (`docs/executions.md`, "Phases"). Pure: no I/O.
//!
//! The run status a door shows is a projection of the phase ([`Phase::status`]): `running`
//! covers the five working phases (at a boundary, awaiting the model, awaiting tasks, awaiting a
//! hook, compacting). The actor writes the status only by entering a phase, and after every
//! message it reads the phase again from its facts ([`Phase::of`]); each move, either way, must be
//! one the table allows ([`Phase::allows`]).

use std::fmt;

use nexus_proto::{RunStatus, TaskKey};

/// How a finished execution ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// A final answer was delivered (`completed`).
    Completed,
    /// It was stopped or refused at materialization (`canceled`).
    Canceled,
}

/// Where an execution stands between two messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// `pending`: the declaration is not frozen yet.
    Materializing,
    /// Nothing is out and the driver decides what comes after round `round` (0 before the
    /// first): judge hooks, compact, deliver, or start the next round. The driver never rests
    /// here: a message that reaches a boundary leaves it within the same message.
    Boundary {
        /// The last round started.
        round: i64,
    },
    /// The model call of round `round` is out.
    AwaitingModel {
        /// The round.
        round: i64,
    },
    /// Calls of round `round` are open: at runners, parked for approval, awaiting an answer (`ask`),
    /// or running in-process.
    AwaitingTasks {
        /// The round.
        round: i64,
    },
    /// A lifecycle hook task is out and holds its boundary.
    AwaitingHook {
        /// The hook task.
        task_key: TaskKey,
    },
    /// The history is being compacted before round `source`.
    Compacting {
        /// The round the compaction is for.
        source: i64,
    },
    /// `paused`: nothing new is scheduled.
    Paused,
    /// `canceling`: a stop drains the work at runners.
    Canceling,
    /// `needs_attention`: held for a person (a failed hook, a failed model step).
    NeedsAttention,
    /// `completed` or `canceled`.
    Done(End),
}

/// What the actor holds that decides its phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Facts {
    /// The run status as stored.
    pub status: RunStatus,
    /// The last round started.
    pub round: i64,
    /// A model call of the round is out.
    pub model_call: bool,
    /// The first open (unsettled) hook task, if any.
    pub open_hook: Option<TaskKey>,
    /// Any call of the round (not a hook, not a summary) is unsettled.
    pub open_calls: bool,
    /// The round a compaction in progress is for.
    pub compacting: Option<i64>,
}

/// The coarse kind of a phase, for the transition table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Materializing,
    Boundary,
    AwaitingModel,
    AwaitingTasks,
    AwaitingHook,
    Compacting,
    Paused,
    Canceling,
    NeedsAttention,
    Done,
}

impl Phase {
    /// The phase `facts` describe. The status decides first; a running execution is awaiting
    /// its model, else a hook, else its calls, else compacting, else at a boundary.
    pub fn of(facts: &Facts) -> Phase {
        match facts.status {
            RunStatus::Pending => Phase::Materializing,
            RunStatus::Paused => Phase::Paused,
            RunStatus::Canceling => Phase::Canceling,
            RunStatus::NeedsAttention => Phase::NeedsAttention,
            RunStatus::Completed => Phase::Done(End::Completed),
            RunStatus::Canceled => Phase::Done(End::Canceled),
            RunStatus::Running => {
                if facts.model_call {
                    Phase::AwaitingModel { round: facts.round }
                } else if let Some(task_key) = facts.open_hook {
                    Phase::AwaitingHook { task_key }
                } else if facts.open_calls {
                    Phase::AwaitingTasks { round: facts.round }
                } else if let Some(source) = facts.compacting {
                    Phase::Compacting { source }
                } else {
                    Phase::Boundary { round: facts.round }
                }
            }
        }
    }

    /// The run status this phase shows.
    pub fn status(self) -> RunStatus {
        match self {
            Phase::Materializing => RunStatus::Pending,
            Phase::Boundary { .. }
            | Phase::AwaitingModel { .. }
            | Phase::AwaitingTasks { .. }
            | Phase::AwaitingHook { .. }
            | Phase::Compacting { .. } => RunStatus::Running,
            Phase::Paused => RunStatus::Paused,
            Phase::Canceling => RunStatus::Canceling,
            Phase::NeedsAttention => RunStatus::NeedsAttention,
            Phase::Done(End::Completed) => RunStatus::Completed,
            Phase::Done(End::Canceled) => RunStatus::Canceled,
        }
    }

    /// Whether the execution is doing its own work (`running`): a pause applies to it.
    pub fn is_working(self) -> bool {
        self.status() == RunStatus::Running
    }

    fn kind(self) -> Kind {
        match self {
            Phase::Materializing => Kind::Materializing,
            Phase::Boundary { .. } => Kind::Boundary,
            Phase::AwaitingModel { .. } => Kind::AwaitingModel,
            Phase::AwaitingTasks { .. } => Kind::AwaitingTasks,
            Phase::AwaitingHook { .. } => Kind::AwaitingHook,
            Phase::Compacting { .. } => Kind::Compacting,
            Phase::Paused => Kind::Paused,
            Phase::Canceling => Kind::Canceling,
            Phase::NeedsAttention => Kind::NeedsAttention,
            Phase::Done(_) => Kind::Done,
        }
    }

    /// Whether the execution may move from `self` to `next`: the one table of its moves.
    ///
    /// - A working phase reaches any other working phase (a message may carry the driver through
    ///   several steps: a settlement ends the round, passes its boundary and starts the next
    ///   model call), and halts (`needs_attention`) or completes.
    /// - Materializing freezes the declaration and works, or is refused (`canceled`).
    /// - A working phase pauses; a paused execution resumes into a working phase.
    /// - A held execution (`needs_attention`) is repaired into a working phase.
    /// - Any phase but the end stops: `canceling` while runner work drains, else `canceled`
    ///   at once; `canceling` only ends.
    /// - The end is final.
    pub fn allows(self, next: Phase) -> bool {
        use Kind::*;
        let (from, to) = (self.kind(), next.kind());
        let working = |kind: Kind| matches!(kind, Boundary | AwaitingModel | AwaitingTasks | AwaitingHook | Compacting);
        match (from, to) {
            (Done, _) => false,
            (_, Done) if next == Phase::Done(End::Canceled) => true,
            (Canceling, _) => false,
            (_, Canceling) => true,
            (Materializing, to) => working(to) || to == NeedsAttention,
            (from, to) if working(from) && working(to) => true,
            (from, NeedsAttention | Paused) if working(from) => true,
            (from, Done) if working(from) => next == Phase::Done(End::Completed),
            (Paused | NeedsAttention, to) => working(to),
            _ => false,
        }
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Phase::Materializing => f.write_str("materializing"),
            Phase::Boundary { round } => write!(f, "at the boundary after r{round}"),
            Phase::AwaitingModel { round } => write!(f, "awaiting the model (r{round})"),
            Phase::AwaitingTasks { round } => write!(f, "awaiting the calls of r{round}"),
            Phase::AwaitingHook { task_key } => write!(f, "awaiting hook {task_key}"),
            Phase::Compacting { source } => write!(f, "compacting before r{source}"),
            Phase::Paused => f.write_str("paused"),
            Phase::Canceling => f.write_str("canceling"),
            Phase::NeedsAttention => f.write_str("needs attention"),
            Phase::Done(End::Completed) => f.write_str("completed"),
            Phase::Done(End::Canceled) => f.write_str("canceled"),
        }
    }
}

#[cfg(test)]
mod tests {
    use nexus_proto::LifecycleEvent;

    use super::*;

    fn running() -> Facts {
        Facts {
            status: RunStatus::Running,
            round: 2,
            model_call: false,
            open_hook: None,
            open_calls: false,
            compacting: None,
        }
    }

    #[test]
    fn the_phase_is_read_from_the_status_then_what_is_out() {
        let hook = TaskKey::hook(2, LifecycleEvent::Stop);
        assert_eq!(Phase::of(&running()), Phase::Boundary { round: 2 });
        assert_eq!(
            Phase::of(&Facts { model_call: true, open_calls: true, ..running() }),
            Phase::AwaitingModel { round: 2 }
        );
        assert_eq!(
            Phase::of(&Facts { open_hook: Some(hook), compacting: Some(3), ..running() }),
            Phase::AwaitingHook { task_key: hook }
        );
        // Calls still open keep a compaction asked for by hand waiting at the boundary.
        assert_eq!(
            Phase::of(&Facts { open_calls: true, compacting: Some(3), ..running() }),
            Phase::AwaitingTasks { round: 2 }
        );
        assert_eq!(Phase::of(&Facts { compacting: Some(3), ..running() }), Phase::Compacting { source: 3 });
        let statuses = [
            (RunStatus::Pending, Phase::Materializing),
            (RunStatus::Paused, Phase::Paused),
            (RunStatus::Canceling, Phase::Canceling),
            (RunStatus::NeedsAttention, Phase::NeedsAttention),
            (RunStatus::Completed, Phase::Done(End::Completed)),
            (RunStatus::Canceled, Phase::Done(End::Canceled)),
        ];
        for (status, phase) in statuses {
            // Whatever is out, the status decides outside `running`.
            let facts = Facts { status, model_call: true, open_calls: true, open_hook: Some(hook), ..running() };
            assert_eq!(Phase::of(&facts), phase, "{status}");
            assert_eq!(phase.status(), status, "the status is the phase's projection");
        }
    }

    #[test]
    fn the_table_allows_the_driver_control_and_the_end_and_nothing_else() {
        let hook = Phase::AwaitingHook { task_key: TaskKey::hook(1, LifecycleEvent::TurnStart) };
        let working = [
            Phase::Boundary { round: 1 },
            Phase::AwaitingModel { round: 1 },
            Phase::AwaitingTasks { round: 1 },
            hook,
            Phase::Compacting { source: 2 },
        ];
        let (completed, canceled) = (Phase::Done(End::Completed), Phase::Done(End::Canceled));
        for from in working {
            for to in working {
                assert!(from.allows(to), "{from} -> {to}");
            }
            for to in [Phase::Paused, Phase::NeedsAttention, Phase::Canceling, completed, canceled] {
                assert!(from.allows(to), "{from} -> {to}");
            }
            assert!(!from.allows(Phase::Materializing), "{from} never goes back to materializing");
            assert!(Phase::Paused.allows(from) && Phase::NeedsAttention.allows(from), "resume and repair into {from}");
            assert!(Phase::Materializing.allows(from), "materializing -> {from}");
        }
        assert!(Phase::Materializing.allows(canceled), "refused at materialization");
        assert!(!Phase::Materializing.allows(completed) && !Phase::Materializing.allows(Phase::Paused));
        assert!(!Phase::Paused.allows(completed), "a paused execution completes nothing");
        assert!(!Phase::Paused.allows(Phase::NeedsAttention) && !Phase::NeedsAttention.allows(Phase::Paused));
        assert!(Phase::Paused.allows(canceled) && Phase::Paused.allows(Phase::Canceling));
        assert!(Phase::Canceling.allows(canceled));
        assert!(!Phase::Canceling.allows(completed), "a stop ends canceled");
        for to in working.into_iter().chain([Phase::Paused, Phase::NeedsAttention, Phase::Materializing]) {
            assert!(!Phase::Canceling.allows(to), "canceling -> {to}");
            assert!(!completed.allows(to) && !canceled.allows(to), "the end is final: -> {to}");
        }
        assert!(!completed.allows(canceled) && !canceled.allows(Phase::Canceling));
    }
}
