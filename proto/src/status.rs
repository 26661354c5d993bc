//! The statuses and kinds of the domain, one closed vocabulary each (`docs/executions.md`,
//! "Statuses"; `docs/protocol.md`, "Inbox rows"). Their words are the spec's; code compares the
//! enums, and the words appear only where a row or a frame is (de)serialized.

use crate::words;

words! {
    /// The status of a task (an inbox row). The settled ones are terminal: a task settles at most
    /// once and never leaves a settled status.
    pub enum TaskStatus("task status") {
        /// Written, not yet started (a compaction's summary task before it runs).
        Waiting => "waiting",
        /// Parked by the approval stage until a person decides or the hold runs out.
        NeedsApproval => "needs_approval",
        /// Running in-process (a kernel call, a kernel summarizer).
        Running => "running",
        /// In a runner's inbox, claimable or claimed, until its deadline.
        Dispatched => "dispatched",
        /// Waiting for a person's answer (a call of the `ask` kernel tool).
        AwaitingInput => "awaiting_input",
        /// Settled with a result.
        Completed => "completed",
        /// Settled without one: the call could not run.
        Failed => "failed",
        /// Settled by a cancellation.
        Canceled => "canceled",
        /// Settled at its deadline with no effect possible (never claimed, or replayable).
        TimedOut => "timed_out",
        /// Settled at its deadline after a claim whose effect may have happened.
        Uncertain => "uncertain",
        /// Settled without running because an earlier step failed (not built yet).
        Skipped => "skipped",
    }
}

impl TaskStatus {
    /// Whether the status is terminal.
    pub const fn is_settled(self) -> bool {
        matches!(
            self,
            TaskStatus::Completed
                | TaskStatus::Failed
                | TaskStatus::Canceled
                | TaskStatus::TimedOut
                | TaskStatus::Uncertain
                | TaskStatus::Skipped
        )
    }

    /// Whether a person may retry or abandon a task that holds its execution in this status.
    pub const fn is_repairable(self) -> bool {
        matches!(self, TaskStatus::Failed | TaskStatus::TimedOut | TaskStatus::Uncertain)
    }
}

words! {
    /// The status of an execution (a run).
    pub enum RunStatus("run status") {
        /// Admitted, not yet materialized.
        Pending => "pending",
        /// Materialized and making progress.
        Running => "running",
        /// Paused by a person: nothing is scheduled and the clocks are frozen.
        Paused => "paused",
        /// Stopped on a failure or a decision until a person acts.
        NeedsAttention => "needs_attention",
        /// A stop is draining the execution's open work.
        Canceling => "canceling",
        /// Ended with a final answer.
        Completed => "completed",
        /// Ended by a stop or a refusal.
        Canceled => "canceled",
    }
}

impl RunStatus {
    /// Whether the execution has ended for a follower: terminal, or quiescent until a person acts.
    pub const fn is_quiescent(self) -> bool {
        matches!(self, RunStatus::Completed | RunStatus::Canceled | RunStatus::NeedsAttention)
    }

    /// Whether the execution can never run again.
    pub const fn is_terminal(self) -> bool {
        matches!(self, RunStatus::Completed | RunStatus::Canceled)
    }
}

words! {
    /// Why an execution needs attention.
    pub enum AttentionReason("attention reason") {
        /// A failure halted it (a model failure, a failed hook, the repeat brake).
        HaltFailure => "halt_failure",
        /// Its deliverable could not be resolved.
        DeliverableUnresolved => "deliverable_unresolved",
        /// It waits for a person's answer.
        AwaitingHuman => "awaiting_human",
        /// A call waits for approval.
        ApprovalRequired => "approval_required",
    }
}

words! {
    /// The kind of a task in an execution's graph.
    pub enum TaskKind("task kind") {
        /// A model step run in-process (a kernel summarizer).
        ModelTask => "model_task",
        /// A tool call: in a runner's inbox, or run in-process for a kernel tool.
        ToolTask => "tool_task",
        /// A wait on another task (not built yet).
        AwaitTask => "await_task",
        /// A join of several tasks (not built yet).
        JoinTask => "join_task",
        /// A child execution (not built yet).
        DelegationTask => "delegation_task",
    }
}

words! {
    /// The kind of an inbox row as a runner sees it (`work_available.kind`, the claimed row's
    /// `kind`). Only `tool_call` rows are claimable.
    pub enum InboxKind("inbox row kind") {
        /// A tool call for the runner to claim, run and commit.
        ToolCall => "tool_call",
        /// A question for a person (never claimable; not built yet).
        Ask => "ask",
        /// An approval request (never claimable; not built yet).
        Approval => "approval",
    }
}

impl TaskKind {
    /// The inbox kind of a task of this kind, when a runner can see it at all.
    pub const fn inbox_kind(self) -> Option<InboxKind> {
        match self {
            TaskKind::ToolTask => Some(InboxKind::ToolCall),
            _ => None,
        }
    }
}

words! {
    /// The standing of an executor.
    pub enum ExecutorStatus("executor status") {
        /// Eligible: it may be addressed, claim and commit.
        Active => "active",
        /// Taken out of service for good.
        Revoked => "revoked",
    }
}

words! {
    /// What an executor is.
    pub enum ExecutorKind("executor kind") {
        /// A runner: environment-local tools on a worker machine (`runner-agent`).
        Runner => "runner",
        /// A tools provider shared by several Agents (not built yet).
        ToolsProvider => "tools_provider",
    }
}

words! {
    /// Who an executor serves.
    pub enum AssignmentScope("assignment scope") {
        /// Every Agent of the deployment.
        AccountWide => "account_wide",
        /// The Agents of one Human.
        UserPrivate => "user_private",
    }
}

words! {
    /// A runner's presence, for display only (never a gate).
    pub enum Presence("presence") {
        /// A stream is attached and was seen recently.
        Online => "online",
        /// No live stream, or none seen recently.
        Offline => "offline",
        /// No stream ever said hello.
        NotYetSeen => "not_yet_seen",
    }
}

words! {
    /// What a member is.
    pub enum MemberKind("member kind") {
        /// An Agent: has a profile that answers inputs.
        Agent => "agent",
        /// A Human.
        Human => "human",
    }
}

words! {
    /// A member's standing.
    pub enum MemberStatus("member status") {
        /// In good standing.
        Active => "active",
        /// Suspended: may read and take work away, never start work.
        Suspended => "suspended",
    }
}

words! {
    /// A Human member's role toward an Agent it holds a grant on (`docs/executions.md`, "People
    /// in the loop"): a steward acts for the Agent, a viewer reads what it does.
    pub enum GrantRole("grant role") {
        /// May post inputs to the Agent and act on its executions (approve, deny, retry, abandon,
        /// pause, resume, stop, regenerate, compact, estimate), and read them.
        Steward => "steward",
        /// May read the Agent's executions, conversations and events, never act on them.
        Viewer => "viewer",
    }
}

words! {
    /// A lifecycle hook's event (the keys of `lifecycle_hooks`).
    pub enum LifecycleEvent("lifecycle event") {
        /// Before the first model round.
        TurnStart => "turn_start",
        /// Before compaction work.
        PreCompact => "pre_compact",
        /// After compaction, before the execution goes on.
        PostCompact => "post_compact",
        /// When a final answer is ready.
        Stop => "stop",
    }
}

words! {
    /// How an input reaches its conversation (`delivery_mode`, `docs/executions.md`,
    /// "Conversations: one turn at a time").
    pub enum DeliveryMode("delivery mode") {
        /// A turn of its own, after every turn admitted before it has ended (the default).
        Queue => "queue",
        /// Applied by the conversation's live execution at its next safe boundary; a turn of its
        /// own when no execution is live, or when the live one ends before a boundary.
        Steer => "steer",
    }
}

words! {
    /// What became of a `steer` input (`docs/executions.md`, "Conversations: one turn at a time").
    pub enum SteerOutcome("steer outcome") {
        /// The live execution applied it at a boundary, as a user message.
        Applied => "applied",
        /// It became a turn with its own execution.
        Turn => "turn",
        /// It was canceled before it was applied.
        Canceled => "canceled",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_word_round_trips_through_text_and_serde() {
        fn check<T>(all: &[T])
        where
            T: Copy + PartialEq + std::fmt::Debug + std::fmt::Display + std::str::FromStr + serde::Serialize,
            T: serde::de::DeserializeOwned,
            <T as std::str::FromStr>::Err: std::fmt::Debug,
        {
            let mut seen = std::collections::HashSet::new();
            for word in all {
                let text = word.to_string();
                assert!(seen.insert(text.clone()), "{text} is spelled twice");
                assert_eq!(text.parse::<T>().expect("parses"), *word);
                let json = serde_json::to_value(word).expect("serializes");
                assert_eq!(json, serde_json::Value::String(text));
                assert_eq!(serde_json::from_value::<T>(json).expect("deserializes"), *word);
            }
        }
        check(TaskStatus::ALL);
        check(RunStatus::ALL);
        check(AttentionReason::ALL);
        check(TaskKind::ALL);
        check(InboxKind::ALL);
        check(ExecutorStatus::ALL);
        check(ExecutorKind::ALL);
        check(AssignmentScope::ALL);
        check(Presence::ALL);
        check(MemberKind::ALL);
        check(MemberStatus::ALL);
        check(GrantRole::ALL);
        check(LifecycleEvent::ALL);
        check(DeliveryMode::ALL);
        check(SteerOutcome::ALL);
        let unknown = "archived".parse::<RunStatus>().expect_err("not a run status");
        assert_eq!(unknown.to_string(), "\"archived\" is not a run status");
        assert!(serde_json::from_str::<TaskStatus>("\"queued\"").is_err());
    }

    #[test]
    fn settled_quiescent_and_repairable() {
        let settled: Vec<_> = TaskStatus::ALL.iter().filter(|s| s.is_settled()).map(|s| s.as_str()).collect();
        assert_eq!(settled, ["completed", "failed", "canceled", "timed_out", "uncertain", "skipped"]);
        let repairable: Vec<_> = TaskStatus::ALL.iter().filter(|s| s.is_repairable()).map(|s| s.as_str()).collect();
        assert_eq!(repairable, ["failed", "timed_out", "uncertain"]);
        let quiescent: Vec<_> = RunStatus::ALL.iter().filter(|s| s.is_quiescent()).map(|s| s.as_str()).collect();
        assert_eq!(quiescent, ["needs_attention", "completed", "canceled"]);
        assert_eq!(TaskKind::ToolTask.inbox_kind(), Some(InboxKind::ToolCall));
        assert_eq!(TaskKind::ModelTask.inbox_kind(), None);
    }
}

words! {
    /// How a child execution was started (`docs/delegation.md`).
    pub enum ChildKind("child kind") {
        /// By `delegate_task`: a one-shot child on a self-contained prompt.
        Delegate => "delegate",
        /// By `spawn`: a child conversation that later `send`s may address.
        Spawn => "spawn",
    }
}

words! {
    /// How long a child may outlive its parent's turn (`delegate_task`/`spawn` `lifetime`).
    pub enum ChildLifetime("lifetime") {
        /// The child ends with the parent's turn: canceled when the turn ends before it.
        Turn => "turn",
        /// The child may outlive the turn; its result then arrives as mail.
        Conversation => "conversation",
    }
}

words! {
    /// What a background child's result does when it arrives after the parent's turn ended
    /// (`delegate_task`/`spawn` `wake`).
    pub enum ChildWake("wake") {
        /// It starts a turn of the parent's conversation.
        Auto => "auto",
        /// It waits for the conversation's next turn, which reads it first.
        Passive => "passive",
    }
}

words! {
    /// What became of a child its parent stopped waiting for: the end of the parent's turn, or
    /// a join that no longer needs it.
    pub enum ChildDisposition("child disposition") {
        /// It was canceled.
        Canceled => "canceled",
        /// It runs on, answering to a named owner (the parent's conversation).
        Detached => "detached",
    }
}

words! {
    /// A join's policy (the extension kernel tool `join`, `docs/delegation.md`).
    pub enum JoinPolicy("join policy") {
        /// Every child must succeed; the first failure fails the join and cancels the rest.
        AllRequired => "all_required",
        /// The first success is the selection; the others are canceled or detached.
        FirstSuccess => "first_success",
        /// Ends at its boundary (every child ended, `min_successes` reached, or the timeout) with
        /// whatever succeeded.
        BestEffort => "best_effort",
    }
}

words! {
    /// What a join does with the children it no longer needs.
    pub enum JoinLosers("losers") {
        /// Cancel them (`join_loser_canceled`).
        Cancel => "cancel",
        /// Let them run on, detached to the parent's conversation.
        Detach => "detach",
    }
}
