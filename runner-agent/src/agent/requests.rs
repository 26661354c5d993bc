//! Requests on the stream and their answers: numbering, the pending table, pushes, batches,
//! and the claim handles' requests (`docs/protocol.md`, "Request ids", "Batches").

use nexus_proto::ErrorCode;
use nexus_proto::runner::v1::nexus_frame::Frame as Answer;
use nexus_proto::runner::v1::runner_frame::Frame as Request;
use nexus_proto::runner::v1::{ClaimStatus, Extend, NexusFrame, Pong, Progress, RunnerBatch, RunnerFrame};
use prost::Message;
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
            Pending::Claim(key, tool) => {
                self.claiming.insert(key.clone(), tool.clone());
            }
            Pending::Commit(key) => {
                self.committing.insert(key.clone());
            }
            Pending::Probe(key) => {
                self.probing.insert(key.clone());
            }
            _ => {}
        }
        if let Some(link) = self.link.as_mut() {
            link.pending.insert(request_id, (pending, Instant::now()));
        }
    }

    /// Queues `frame` under a fresh request id, to go out when the turn ends; `None` when there
    /// is no stream.
    pub(super) fn send_numbered(&mut self, frame: Request) -> Option<u64> {
        let link = self.link.as_mut()?;
        let request_id = link.next_request_id;
        link.next_request_id += 1;
        link.outbox.push(RunnerFrame { request_id, frame: Some(frame) });
        Some(request_id)
    }

    /// Queues a frame that expects no answer (request id 0).
    pub(super) fn send_push(&mut self, frame: Request) {
        if let Some(link) = self.link.as_mut() {
            link.outbox.push(RunnerFrame { request_id: 0, frame: Some(frame) });
        }
    }

    /// Sends the frames this turn queued: runs of frames that may share a batch go as one
    /// `RunnerBatch` ([`coalesce`]), a frame alone as itself. A full outbound queue means nexus
    /// stopped reading: the stream is dropped.
    pub(super) fn flush_outbox(&mut self) {
        let Some(link) = self.link.as_mut() else { return };
        if link.outbox.is_empty() {
            return;
        }
        let outbox = std::mem::take(&mut link.outbox);
        // A nexus that did not say it reads batches gets one frame per request.
        let frames = if link.batches { coalesce(outbox) } else { outbox };
        let stalled = frames.into_iter().any(|frame| link.outbound.try_send(frame).is_err());
        if stalled {
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
            Pending::Claim(key, _) => {
                self.claiming.remove(key);
            }
            Pending::Commit(key) => {
                self.committing.remove(key);
            }
            Pending::Probe(key) => {
                self.probing.remove(key);
            }
            _ => {}
        }
    }

    /// One frame from nexus; a `NexusBatch` is handled frame by frame, each as if it came alone.
    pub(super) fn on_frame(&mut self, frame: NexusFrame) {
        if let Some(link) = self.link.as_mut() {
            link.last_frame_at = Instant::now();
        }
        match frame.frame {
            Some(Answer::Batch(batch)) => {
                for inner in batch.frames {
                    if matches!(inner.frame, Some(Answer::Batch(_))) {
                        debug!("ignoring a batch inside a batch");
                        continue;
                    }
                    self.on_single_frame(inner);
                }
            }
            _ => self.on_single_frame(frame),
        }
    }

    fn on_single_frame(&mut self, frame: NexusFrame) {
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
                    Some((pending, _)) => self.on_answer(pending, answer),
                    None => debug!(request_id, "ignoring an answer to no open request"),
                }
            }
        }
    }

    pub(super) fn on_answer(&mut self, pending: Pending, answer: Answer) {
        self.untrack(&pending);
        match (pending, answer) {
            (Pending::Announce, Answer::Announced(_)) => info!("nexus accepted the announcement"),
            (Pending::Announce, Answer::Refusal(refusal)) => error!(
                code = %refusal.code, message = %refusal.message,
                "nexus refused the announcement; the tools stay as last announced"
            ),
            (Pending::Claim(key, _), Answer::ClaimGranted(grant)) => self.on_claim_granted(key, grant),
            (Pending::Claim(key, _), Answer::Refusal(refusal)) => {
                debug!(run_public_id = %key.run_public_id, task_key = %key.task_key, code = %refusal.code, "claim refused");
            }
            (Pending::Commit(key), Answer::Committed(committed)) => {
                self.journal.remove(&key);
                info!(
                    run_public_id = %key.run_public_id, task_key = %key.task_key,
                    idle = committed.idle, status = %committed.status, "commit acknowledged"
                );
            }
            (Pending::Commit(key), Answer::Refusal(refusal)) => self.on_commit_refused(key, refusal),
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
                // The tool learns of the new deadline once the journal holds it.
                let deadline_at_ms = extended.deadline_at_ms;
                match self.journal.update(&key, |entry| entry.deadline_at_ms = deadline_at_ms) {
                    Some(ticket) => {
                        self.after_durable.push_back((ticket, AfterDurable::Extended { reply, deadline_at_ms }))
                    }
                    None => drop(reply.send(Ok(deadline_at_ms))),
                }
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

/// At most this many frames go in one `RunnerBatch` (`docs/protocol.md`, "Batches").
pub(super) const MAX_BATCH_FRAMES: usize = 256;
/// A `RunnerBatch` stays within this many encoded bytes: below the smallest frame bound nexus
/// accepts for `[runner] max_frame_bytes` (1,100,000), so a batch fits wherever its frames
/// would. A frame larger than this goes alone.
pub(super) const MAX_BATCH_BYTES: usize = 1_000_000;

/// Whether `frame` may travel inside a `RunnerBatch`: never hello, announce or another batch.
fn batchable(frame: &RunnerFrame) -> bool {
    matches!(
        frame.frame,
        Some(
            Request::Claim(_)
                | Request::ClaimStatus(_)
                | Request::Extend(_)
                | Request::Commit(_)
                | Request::Progress(_)
                | Request::Pong(_)
        )
    )
}

/// Bytes `frame` takes inside a batch: its field tag, its length and itself.
fn batched_len(frame: &RunnerFrame) -> usize {
    let len = frame.encoded_len();
    1 + prost::length_delimiter_len(len) + len
}

/// The frames to send for `frames`, in order: each run of batchable frames as `RunnerBatch`es
/// of at most [`MAX_BATCH_FRAMES`] frames and [`MAX_BATCH_BYTES`] bytes (outer request id 0), a
/// run of one as that frame alone, and every other frame alone.
pub(super) fn coalesce(frames: Vec<RunnerFrame>) -> Vec<RunnerFrame> {
    let mut out = Vec::new();
    let mut batch = Vec::new();
    let mut batch_bytes = 0;
    for frame in frames {
        let bytes = batched_len(&frame);
        if !batchable(&frame) || bytes > MAX_BATCH_BYTES {
            close_batch(&mut out, &mut batch);
            out.push(frame);
            continue;
        }
        if batch.len() == MAX_BATCH_FRAMES || batch_bytes + bytes > MAX_BATCH_BYTES {
            close_batch(&mut out, &mut batch);
        }
        if batch.is_empty() {
            batch_bytes = 0;
        }
        batch_bytes += bytes;
        batch.push(frame);
    }
    close_batch(&mut out, &mut batch);
    out
}

fn close_batch(out: &mut Vec<RunnerFrame>, batch: &mut Vec<RunnerFrame>) {
    match batch.len() {
        0 => {}
        1 => out.append(batch),
        _ => {
            let frames = std::mem::take(batch);
            out.push(RunnerFrame { request_id: 0, frame: Some(Request::Batch(RunnerBatch { frames })) });
        }
    }
}
