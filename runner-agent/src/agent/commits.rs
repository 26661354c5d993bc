//! Results on their way to nexus: commits from the journal, their refusals, and the periodic
//! pass (`docs/protocol.md`, "Commit", "Runner journal").

use nexus_proto::ErrorCode;
use nexus_proto::runner::v1::runner_frame::Frame as Request;
use nexus_proto::runner::v1::{ClaimStatus, Commit};
use tracing::{info, warn};

use crate::journal::{EntryState, TaskKey};
use crate::retry::{self};
use crate::tools::ToolOutcome;

use super::*;

impl Agent {
    pub(super) fn send_commit(&mut self, key: &TaskKey) {
        // A result still on its way to the disk is sent when it gets there
        // ([`Agent::on_journal_flushed`]).
        if self.link.is_none() || self.committing.contains(key) || self.journal.has_unwritten(key) {
            return;
        }
        let Some(entry) = self.journal.get(key) else {
            return;
        };
        let EntryState::CommitPending { body, .. } = &entry.state else {
            return;
        };
        let frame = Request::Commit(Commit {
            run_public_id: key.run_public_id.clone(),
            task_key: key.task_key.clone(),
            claim_token: entry.claim_token.clone(),
            body_json: body.to_string(),
        });
        self.send_request(frame, Pending::Commit(key.clone()));
    }

    /// Drops results whose deadline passed (nexus settles those by expiry), then sends every
    /// other unacknowledged result that is not already in flight (or still on its way to the
    /// disk).
    pub(super) fn resend_commits(&mut self) {
        let now_ms = unix_now_ms();
        let committing = &self.committing;
        let expired = self.journal.remove_where(|entry| {
            matches!(entry.state, EntryState::CommitPending { .. })
                && entry.deadline_at_ms <= now_ms
                && !committing.contains(&entry.key)
        });
        for entry in &expired {
            warn!(
                run_public_id = %entry.key.run_public_id, task_key = %entry.key.task_key,
                "dropping a result whose claim deadline passed; nexus settles the task by expiry"
            );
        }
        let waiting: Vec<TaskKey> = self
            .journal
            .entries()
            .filter(|entry| matches!(entry.state, EntryState::CommitPending { .. }))
            .map(|entry| entry.key.clone())
            .collect();
        for key in waiting {
            self.send_commit(&key);
        }
    }

    // ---- events ----

    pub(super) fn on_commit_refused(&mut self, key: TaskKey, frame: nexus_proto::runner::v1::Refusal) {
        let (run_public_id, task_key) = (&key.run_public_id, &key.task_key);
        let http_status = frame.http_status;
        let refusal = refusal_of(frame);
        if retry::is_retryable_refusal(refusal.code) {
            warn!(%run_public_id, %task_key, code = %refusal.code, "nexus could not take the result now; it stays journaled");
            return;
        }
        // A malformed result leaves the park standing: replace it once with a short error the
        // model can read, rather than letting the task run into its deadline.
        let malformed = http_status == 422 && refusal.code != ErrorCode::ResultUnstorable;
        let first_refusal = self
            .journal
            .get(&key)
            .is_some_and(|entry| matches!(entry.state, EntryState::CommitPending { fallback: false, .. }));
        if malformed && first_refusal {
            warn!(%run_public_id, %task_key, code = %refusal.code, "nexus refused the result; committing a short error instead");
            let message = format!("the tool ran, but nexus refused its result ({}: {})", refusal.code, refusal.message);
            let body = ToolOutcome::error(message).into_commit_body();
            let replaced = self
                .journal
                .update(&key, move |entry| entry.state = EntryState::CommitPending { body, fallback: true });
            if let Some(ticket) = replaced {
                self.after_durable.push_back((ticket, AfterDurable::Commit(key)));
            }
            return;
        }
        warn!(%run_public_id, %task_key, code = %refusal.code, "nexus refused the commit for good; dropping the result");
        self.journal.remove(&key);
    }

    /// The periodic pass: drop a wedged stream, forget interrupted tasks whose deadline passed,
    /// re-send results, and read the claim status of running tools.
    pub(super) fn maintain(&mut self) {
        let wedged = self.link.as_ref().is_some_and(|link| {
            link.pending.values().any(|(_, sent_at)| sent_at.elapsed() >= self.config.request_timeout)
        });
        if wedged {
            self.lose_link("nexus did not answer a request in time");
        }
        let now_ms = unix_now_ms();
        let running = &self.running;
        let forgotten = self.journal.remove_where(|entry| {
            matches!(entry.state, EntryState::Running)
                && entry.deadline_at_ms <= now_ms
                && !running.contains_key(&entry.key)
        });
        for entry in &forgotten {
            info!(
                run_public_id = %entry.key.run_public_id, task_key = %entry.key.task_key,
                "forgetting an interrupted task whose deadline passed"
            );
        }
        if self.link.is_none() {
            return;
        }
        self.resend_commits();
        let probes: Vec<(TaskKey, String)> = self
            .running
            .keys()
            .filter(|key| !self.probing.contains(*key))
            .filter_map(|key| self.journal.get(key).map(|entry| (key.clone(), entry.claim_token.clone())))
            .collect();
        for (key, claim_token) in probes {
            let frame = Request::ClaimStatus(ClaimStatus {
                run_public_id: key.run_public_id.clone(),
                task_key: key.task_key.clone(),
                claim_token,
            });
            self.send_request(frame, Pending::Probe(key));
        }
    }
}
