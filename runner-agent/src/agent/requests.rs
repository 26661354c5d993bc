//! Requests on the stream and their answers: numbering, the pending table, pushes, and
//! the claim handles' requests (`docs/protocol.md`, "Request ids").

use nexus_proto::ErrorCode;
use nexus_proto::runner::v1::nexus_frame::Frame as Answer;
use nexus_proto::runner::v1::runner_frame::Frame as Request;
use nexus_proto::runner::v1::{ClaimStatus, Extend, NexusFrame, Pong, Progress, RunnerFrame};
use tokio::time::Instant;
use tracing::{debug, error, info, warn};

use crate::claim::{ControlRequest, RequestError};

use super::*;

impl Agent {
    /// Sends a request with a fresh id and remembers what answers it. Without a stream the
    /// request is abandoned at once.
    pub(super) fn send_request(&mut self, frame: Request, pending: Pending) {
        let Some(request_id) = self.send_numbered(frame) else {
            self.abandon(pending, RequestError::Disconnected);
            return;
        };
        match &pending {
            Pending::Claim(key) => self.claiming.insert(key.clone()),
            Pending::Commit(key) => self.committing.insert(key.clone()),
            Pending::Probe(key) => self.probing.insert(key.clone()),
            _ => false,
        };
        if let Some(link) = self.link.as_mut() {
            link.pending.insert(request_id, (pending, Instant::now()));
        }
    }

    /// Sends `frame` under a fresh request id; `None` when there is no usable stream.
    pub(super) fn send_numbered(&mut self, frame: Request) -> Option<u64> {
        let link = self.link.as_mut()?;
        let request_id = link.next_request_id;
        link.next_request_id += 1;
        let frame = RunnerFrame { request_id, frame: Some(frame) };
        if link.outbound.try_send(frame).is_err() {
            self.lose_link("nexus stopped reading the stream");
            return None;
        }
        Some(request_id)
    }

    /// Sends a frame that expects no answer (request id 0).
    pub(super) fn send_push(&mut self, frame: Request) {
        let Some(link) = self.link.as_ref() else {
            return;
        };
        if link.outbound.try_send(RunnerFrame { request_id: 0, frame: Some(frame) }).is_err() {
            self.lose_link("nexus stopped reading the stream");
        }
    }

    /// Forgets a request: clears its in-flight mark and tells a waiting handle.
    pub(super) fn abandon(&mut self, pending: Pending, why: RequestError) {
        self.untrack(&pending);
        match pending {
            Pending::Extend { reply, .. } => drop(reply.send(Err(why))),
            Pending::ClaimStatus(reply) => drop(reply.send(Err(why))),
            _ => {}
        }
    }

    pub(super) fn untrack(&mut self, pending: &Pending) {
        match pending {
            Pending::Claim(key) => self.claiming.remove(key),
            Pending::Commit(key) => self.committing.remove(key),
            Pending::Probe(key) => self.probing.remove(key),
            _ => false,
        };
    }

    pub(super) async fn on_frame(&mut self, frame: NexusFrame) {
        if let Some(link) = self.link.as_mut() {
            link.last_frame_at = Instant::now();
        }
        let NexusFrame { request_id, frame } = frame;
        let Some(frame) = frame else {
            debug!(request_id, "ignoring an empty frame");
            return;
        };
        match frame {
            Answer::Ping(ping) => self.send_push(Request::Pong(Pong { nonce: ping.nonce })),
            Answer::WorkAvailable(work) => self.on_work_available(work),
            Answer::WorkCanceled(canceled) => self.on_work_canceled(canceled),
            answer => {
                let pending = self.link.as_mut().and_then(|link| link.pending.remove(&request_id));
                match pending {
                    Some((pending, _)) => self.on_answer(pending, answer).await,
                    None => debug!(request_id, "ignoring an answer to no open request"),
                }
            }
        }
    }

    pub(super) async fn on_answer(&mut self, pending: Pending, answer: Answer) {
        self.untrack(&pending);
        match (pending, answer) {
            (Pending::Announce, Answer::Announced(_)) => info!("nexus accepted the announcement"),
            (Pending::Announce, Answer::Refusal(refusal)) => error!(
                code = %refusal.code, message = %refusal.message,
                "nexus refused the announcement; the tools stay as last announced"
            ),
            (Pending::Claim(key), Answer::ClaimGranted(grant)) => self.on_claim_granted(key, grant).await,
            (Pending::Claim(key), Answer::Refusal(refusal)) => {
                debug!(run_public_id = %key.run_public_id, task_key = %key.task_key, code = %refusal.code, "claim refused");
            }
            (Pending::Commit(key), Answer::Committed(committed)) => {
                self.journal.remove(&key);
                persist(&self.journal).await;
                info!(
                    run_public_id = %key.run_public_id, task_key = %key.task_key,
                    idle = committed.idle, status = %committed.status, "commit acknowledged"
                );
            }
            (Pending::Commit(key), Answer::Refusal(refusal)) => self.on_commit_refused(key, refusal).await,
            (Pending::Probe(key), Answer::ClaimState(state)) => {
                if !state.active {
                    self.stop_task(&key, "the claim is no longer active");
                }
            }
            (Pending::Probe(key), Answer::Refusal(refusal)) => {
                if refusal_of(refusal).code == ErrorCode::NotClaimant {
                    self.stop_task(&key, "nexus says this runner no longer holds the claim");
                }
            }
            (Pending::Extend { key, reply }, Answer::Extended(extended)) => {
                if let Some(entry) = self.journal.get_mut(&key) {
                    entry.deadline_at_ms = extended.deadline_at_ms;
                    persist(&self.journal).await;
                }
                drop(reply.send(Ok(extended.deadline_at_ms)));
            }
            (Pending::ClaimStatus(reply), Answer::ClaimState(state)) => drop(reply.send(Ok(state.active))),
            (Pending::Extend { reply, .. }, Answer::Refusal(refusal)) => {
                drop(reply.send(Err(RequestError::Refused(refusal_of(refusal)))));
            }
            (Pending::ClaimStatus(reply), Answer::Refusal(refusal)) => {
                drop(reply.send(Err(RequestError::Refused(refusal_of(refusal)))));
            }
            (pending, _) => {
                warn!("nexus answered a request with a frame of another kind");
                self.abandon(pending, RequestError::UnexpectedAnswer);
            }
        }
        self.pump_claims();
    }

    pub(super) fn on_control(&mut self, request: ControlRequest) {
        match request {
            ControlRequest::Progress { key, claim_token, frame_json } => {
                // Fire and forget: progress is throttled and never stored, so an answer (if
                // any) is not waited for and cannot wedge the stream.
                if self.running.contains_key(&key) {
                    self.send_numbered(Request::Progress(Progress {
                        run_public_id: key.run_public_id,
                        task_key: key.task_key,
                        claim_token,
                        frame_json,
                    }));
                }
            }
            ControlRequest::Extend { key, claim_token, timeout_ms, reply } => {
                let frame = Request::Extend(Extend {
                    run_public_id: key.run_public_id.clone(),
                    task_key: key.task_key.clone(),
                    claim_token,
                    timeout_ms,
                });
                self.send_request(frame, Pending::Extend { key, reply });
            }
            ControlRequest::ClaimStatus { key, claim_token, reply } => {
                let frame = Request::ClaimStatus(ClaimStatus {
                    run_public_id: key.run_public_id,
                    task_key: key.task_key,
                    claim_token,
                });
                self.send_request(frame, Pending::ClaimStatus(reply));
            }
        }
    }
}
