//! The pure part of execution control: how a pause and a resume move deadlines, which open tasks
//! a stop settles at once and which it drains or cancels at their runners, and how long a pause
//! lasted (`docs/executions.md`, "Control"). No I/O: [`super`] writes and sends what these
//! decide.

use nexus_proto::{TaskKey, TaskStatus};

use crate::clock::{FROZEN_EPOCH_MS, deadline_after, frozen_remaining_ms, is_frozen};
use crate::store::TaskRow;

/// How a pause or a resume moves an open task's deadline. The ExecutorActor applies it to its
/// open tasks (`ExecutorHandle::shift_deadlines`) and the ExecutionActor to its approval holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeadlineShift {
    /// The execution paused at `at` (Unix milliseconds): a live deadline becomes
    /// [`FROZEN_EPOCH_MS`] plus what it had left (never less than zero).
    Freeze {
        /// When the pause began.
        at: i64,
    },
    /// The execution resumed at `at`: a frozen deadline becomes `at` plus what it had left.
    Thaw {
        /// When the resume happened.
        at: i64,
    },
}

impl DeadlineShift {
    /// The moved deadline, or `None` when this shift leaves `deadline_at` as it is (freezing a
    /// frozen deadline, thawing a live one).
    pub fn apply(self, deadline_at: i64) -> Option<i64> {
        match self {
            DeadlineShift::Freeze { at } if !is_frozen(deadline_at) => {
                Some(FROZEN_EPOCH_MS.saturating_add(deadline_at.saturating_sub(at).max(0)))
            }
            DeadlineShift::Thaw { at } => frozen_remaining_ms(deadline_at).map(|left| deadline_after(at, left)),
            DeadlineShift::Freeze { .. } => None,
        }
    }
}

/// Whether a task is in a runner's hands: dispatched to its inbox or claimed there.
pub fn at_runner(task: &TaskRow) -> bool {
    task.target_executor_public_id.is_some() && matches!(task.status, TaskStatus::Dispatched | TaskStatus::Running)
}

/// What a stop does with the execution's open tasks (`docs/executions.md`, "Control"): what never
/// reached a runner (a call parked for approval, a call of `ask` awaiting its answer, a waiting
/// summary) settles `canceled` at once;
/// what is at a runner drains (graceful) or is canceled there (forced).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StopPlan {
    /// Settle `canceled` (`task_canceled`) now.
    pub settle_now: Vec<TaskKey>,
    /// In a runner's hands: waited for, or canceled at the runner when the stop is forced.
    pub at_runners: Vec<TaskKey>,
}

impl StopPlan {
    /// The plan for `open`, the execution's unsettled tasks.
    pub fn of(open: &[TaskRow]) -> StopPlan {
        let (at_runners, elsewhere): (Vec<&TaskRow>, Vec<&TaskRow>) = open.iter().partition(|t| at_runner(t));
        StopPlan {
            settle_now: elsewhere.iter().map(|t| t.task_key).collect(),
            at_runners: at_runners.iter().map(|t| t.task_key).collect(),
        }
    }
}

/// How long a pause that began at `paused_at` lasted at `now` (Unix milliseconds; never
/// negative): what `turn_status running {paused_ms}` reports and every open deadline moved by.
pub fn paused_ms(paused_at: i64, now: i64) -> i64 {
    now.saturating_sub(paused_at).max(0)
}

#[cfg(test)]
mod tests {
    use nexus_proto::{ExecutionId, RunnerId};

    use super::*;

    #[test]
    fn a_pause_freezes_what_is_left_and_a_resume_shifts_by_the_paused_time() {
        let paused_at = 1_000_000;
        let deadline = paused_at + 7_500;
        let frozen = DeadlineShift::Freeze { at: paused_at }.apply(deadline).expect("frozen");
        assert!(is_frozen(frozen));
        assert_eq!(frozen_remaining_ms(frozen), Some(7_500));
        // Freezing twice (a repeated message) changes nothing; thawing a live deadline neither.
        assert_eq!(DeadlineShift::Freeze { at: paused_at + 50 }.apply(frozen), None);
        assert_eq!(DeadlineShift::Thaw { at: paused_at }.apply(deadline), None);
        let resumed_at = paused_at + 60_000;
        let thawed = DeadlineShift::Thaw { at: resumed_at }.apply(frozen).expect("thawed");
        assert_eq!(thawed - deadline, resumed_at - paused_at, "moved forward by exactly the paused time");
        // A deadline that had already passed when the pause began has nothing left.
        let late = DeadlineShift::Freeze { at: paused_at }.apply(paused_at - 10).expect("frozen");
        assert_eq!(DeadlineShift::Thaw { at: resumed_at }.apply(late), Some(resumed_at));
        assert!(!is_frozen(i64::from(i32::MAX) * 1_000), "a live deadline in 2038 is not frozen");
    }

    #[test]
    fn a_stop_settles_what_never_reached_a_runner_and_drains_the_rest() {
        let run = ExecutionId::new_v4();
        let task = |index: u32, status: TaskStatus, runner: Option<RunnerId>| TaskRow {
            status,
            target_executor_public_id: runner,
            ..TaskRow::new(run, TaskKey::Call { round: 1, index }, 1, "t".into(), 1_000, 0)
        };
        let runner = Some(RunnerId::new_v4());
        let open = [
            task(0, TaskStatus::Dispatched, runner),
            task(1, TaskStatus::NeedsApproval, runner),
            task(2, TaskStatus::Running, runner),
            task(3, TaskStatus::Waiting, None),
            task(4, TaskStatus::Running, None),
            task(5, TaskStatus::AwaitingInput, None),
        ];
        let plan = StopPlan::of(&open);
        let keys = |indices: &[u32]| -> Vec<TaskKey> {
            indices.iter().map(|&index| TaskKey::Call { round: 1, index }).collect()
        };
        assert_eq!(plan.at_runners, keys(&[0, 2]), "dispatched or claimed at a runner");
        assert_eq!(plan.settle_now, keys(&[1, 3, 4, 5]), "parked, waiting, run in-process, or awaiting an answer");
        assert_eq!(StopPlan::of(&[]), StopPlan::default());
        assert_eq!(paused_ms(1_000, 4_500), 3_500);
        assert_eq!(paused_ms(5_000, 4_500), 0, "a clock read before the pause is no time");
    }
}
