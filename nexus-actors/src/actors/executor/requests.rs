//! Answering the requests of one message from a runner stream (`docs/protocol.md`, "Batches";
//! issue 10, items 1 and 4).
//!
//! Every request is decided in order against the inbox as it stands. A request that changes a
//! task row (a claim, an extension, a commit's settlement) stages that row instead of writing
//! it; the staged rows of the message go to the store in one group-committed write, and only once
//! it is durable are they applied and answered. A request is answered exactly as if it had come
//! alone: one that names a task staged earlier in the message, and an announcement, first wait
//! for the staged writes before them. A failed write changes nothing here and answers each of
//! its requests `internal`; a row another node claimed first answers only its own request.

use std::collections::HashSet;

use nexus_proto::runner::v1::NexusFrame;
use nexus_proto::{AssignmentScope, Refusal};

use super::{
    Decided, ExecutorState, Requests, RunnerRequest, Staged, TaskId, announce, claim, claim_status, commit, extend,
    find, internal, progress, refusal_frame,
};

/// A staged request waiting for its write: where its answer goes and what it staged.
struct Waiting {
    slot: usize,
    request_id: u64,
    staged: Staged,
}

/// The answers to `requests`, in their order, each with its request id.
pub(super) async fn answer(state: &mut ExecutorState, requests: Requests) -> Vec<NexusFrame> {
    let mut answers: Vec<Option<NexusFrame>> = Vec::with_capacity(requests.len());
    let mut waiting: Vec<Waiting> = Vec::new();
    let mut staged: HashSet<TaskId> = HashSet::new();
    for (request_id, request) in requests {
        let request = match request {
            Ok(request) => request,
            Err(refusal) => {
                answers.push(Some(refusal_frame(request_id, &refusal)));
                continue;
            }
        };
        let barrier = match task_of(&request) {
            Some(id) => staged.contains(&id),
            None => true,
        };
        if barrier && !waiting.is_empty() {
            write(state, &mut answers, &mut waiting).await;
            staged.clear();
        }
        let decided = decide(state, request).await;
        let slot = answers.len();
        match decided {
            Ok(Decided::Answer(frame)) => answers.push(Some(NexusFrame { request_id, frame: Some(frame) })),
            Ok(Decided::Write(change)) => {
                staged.insert(change.id());
                answers.push(None);
                waiting.push(Waiting { slot, request_id, staged: change });
            }
            Err(refusal) => answers.push(Some(refusal_frame(request_id, &refusal))),
        }
    }
    write(state, &mut answers, &mut waiting).await;
    answers.into_iter().map(|answer| answer.expect("every staged request is answered once written")).collect()
}

/// The task a request names; `None` for an announcement.
fn task_of(request: &RunnerRequest) -> Option<TaskId> {
    match request {
        RunnerRequest::Announce(_) => None,
        RunnerRequest::Claim { task }
        | RunnerRequest::ClaimStatus { task, .. }
        | RunnerRequest::Extend { task, .. }
        | RunnerRequest::Commit { task, .. }
        | RunnerRequest::Progress { task, .. } => Some(*task),
    }
}

async fn decide(state: &mut ExecutorState, request: RunnerRequest) -> Result<Decided, Refusal> {
    match request {
        RunnerRequest::Announce(body) => announce(state, &body).await.map(Decided::Answer),
        RunnerRequest::Claim { task } => {
            let task = find(state, task).await?;
            if state.row.assignment_scope == AssignmentScope::AccountWide {
                claim(state, task)
            } else {
                super::eligibility::claim_assigned(state, task).await
            }
        }
        RunnerRequest::ClaimStatus { task, claim_token } => {
            claim_status(state, &find(state, task).await?, &claim_token).map(Decided::Answer)
        }
        RunnerRequest::Extend { task, claim_token, timeout_ms } => {
            extend(state, find(state, task).await?, &claim_token, timeout_ms)
        }
        RunnerRequest::Commit { task, claim_token, body_json } => {
            commit(state, find(state, task).await?, &claim_token, &body_json)
        }
        RunnerRequest::Progress { task, claim_token, frame_json } => {
            progress(state, task, &claim_token, &frame_json).map(Decided::Answer)
        }
    }
}

/// Writes the staged rows in one store write, then applies and answers each.
async fn write(state: &mut ExecutorState, answers: &mut [Option<NexusFrame>], waiting: &mut Vec<Waiting>) {
    if waiting.is_empty() {
        return;
    }
    let rows = waiting.iter().map(|w| w.staged.row.clone()).collect();
    let written = state.fabric.store.update_tasks(rows).await;
    match written {
        Ok(written) => {
            debug_assert_eq!(written.len(), waiting.len(), "one answer per staged row");
            for (w, written) in waiting.drain(..).zip(written) {
                let frame = match w.staged.apply(state, written) {
                    Ok(frame) => NexusFrame { request_id: w.request_id, frame: Some(frame) },
                    Err(refusal) => refusal_frame(w.request_id, &refusal),
                };
                answers[w.slot] = Some(frame);
            }
        }
        Err(e) => {
            tracing::warn!(runner_id = %state.row.public_id, error = %e, rows = waiting.len(), "an inbox write failed");
            let refusal = internal(e);
            for w in waiting.drain(..) {
                answers[w.slot] = Some(refusal_frame(w.request_id, &refusal));
            }
        }
    }
}
