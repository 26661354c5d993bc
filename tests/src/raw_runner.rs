//! A scripted fake runner: speaks `nexus.runner.v1` frame by frame so tests can hold a claim,
//! commit twice, use a wrong token or never answer. It also keeps an [`OfferTally`] of the
//! offers outstanding on its stream, counted in the order the frames arrive.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Endpoint;
use uuid::Uuid;

use nexus_proto::runner::v1::runner_service_client::RunnerServiceClient;
use nexus_proto::runner::v1::{
    Announce, Claim, ClaimStatus, Commit, Extend, Hello, Pong, RunnerFrame, WorkAvailable, nexus_frame, runner_frame,
};

use crate::server::Minted;

/// The answer to one request.
#[derive(Clone, Debug, PartialEq)]
pub enum Reply {
    /// A result frame.
    Frame(nexus_frame::Frame),
    /// A refusal with the spec's word.
    Refused {
        /// The word.
        code: String,
        /// The HTTP status the origin would answer.
        http_status: u32,
    },
    /// The stream ended before an answer.
    Lost,
}

impl Reply {
    /// The refusal word, or `None` for a result.
    pub fn code(&self) -> Option<&str> {
        match self {
            Reply::Refused { code, .. } => Some(code),
            Reply::Lost => Some("lost"),
            Reply::Frame(_) => None,
        }
    }

    /// `(claim_token, task_json)` of a granted claim.
    pub fn granted(&self) -> Option<(String, Value)> {
        match self {
            Reply::Frame(nexus_frame::Frame::ClaimGranted(g)) => {
                Some((g.claim_token.clone(), serde_json::from_str(&g.task_json).expect("task json")))
            }
            _ => None,
        }
    }

    /// `(idle, status)` of a commit.
    pub fn committed(&self) -> Option<(bool, String)> {
        match self {
            Reply::Frame(nexus_frame::Frame::Committed(c)) => Some((c.idle, c.status.clone())),
            _ => None,
        }
    }
}

type Waiters = Arc<Mutex<HashMap<u64, oneshot::Sender<Reply>>>>;

/// The offers (`work_available`) one stream received, counted by its reader in arrival order:
/// an offer is outstanding from its arrival until a claim of that task is granted on the stream
/// or nexus sends `work_canceled` for it. Settlements the runner does not see (an expiry) are not
/// subtracted, so `outstanding` is an upper bound of what nexus counts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OfferTally {
    /// Offers received.
    pub received: usize,
    /// Offers outstanding now.
    pub outstanding: usize,
    /// The most offers that were ever outstanding at once.
    pub high_water: usize,
    /// Offers of a task that was already outstanding on this stream.
    pub repeats: usize,
}

#[derive(Debug, Default)]
struct OfferLedger {
    tally: OfferTally,
    outstanding: HashSet<(String, String)>,
}

impl OfferLedger {
    fn offered(&mut self, run: &str, task_key: &str) {
        self.tally.received += 1;
        if !self.outstanding.insert((run.to_owned(), task_key.to_owned())) {
            self.tally.repeats += 1;
        }
        self.settle_counts();
    }

    fn withdrawn(&mut self, run: &str, task_key: &str) {
        self.outstanding.remove(&(run.to_owned(), task_key.to_owned()));
        self.settle_counts();
    }

    fn settle_counts(&mut self) {
        self.tally.outstanding = self.outstanding.len();
        self.tally.high_water = self.tally.high_water.max(self.tally.outstanding);
    }
}

/// One fake runner stream.
#[derive(Debug)]
pub struct RawRunner {
    outbound: mpsc::Sender<RunnerFrame>,
    waiters: Waiters,
    next_id: AtomicU64,
    pushes: mpsc::UnboundedReceiver<nexus_frame::Frame>,
    reader: tokio::task::JoinHandle<()>,
    offers: Arc<Mutex<OfferLedger>>,
    /// `NexusBatch` frames received, and the frames they held.
    batches: Arc<(AtomicU64, AtomicU64)>,
}

impl Drop for RawRunner {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl RawRunner {
    /// Connects as `runner` and announces `announcement`, asserting both are accepted.
    ///
    /// # Panics
    /// When the Hello or the announcement is refused.
    pub async fn connect_announced(url: &str, runner: &Minted, announcement: &Value) -> RawRunner {
        let (raw, hello) = RawRunner::connect(url, runner.id, &runner.token).await;
        assert_eq!(hello.code(), None, "hello refused: {hello:?}");
        let announced = raw.announce(announcement).await;
        assert_eq!(announced.code(), None, "announcement refused: {announced:?}");
        raw
    }

    /// Opens a stream and says Hello. Returns the runner, and the Hello's reply (Welcome or a
    /// refusal).
    pub async fn connect(url: &str, runner: Uuid, credential: &str) -> (RawRunner, Reply) {
        RawRunner::connect_with(url, runner, credential, false).await
    }

    /// [`RawRunner::connect`], saying in the Hello whether this runner reads `NexusBatch`
    /// frames (`docs/protocol.md`, "Batches"). Batches are unpacked either way, each inner frame
    /// handled as if it came alone; [`RawRunner::batches_received`] counts them.
    pub async fn connect_with(url: &str, runner: Uuid, credential: &str, batches: bool) -> (RawRunner, Reply) {
        let channel = Endpoint::from_shared(url.to_owned()).expect("url").connect().await.expect("connect");
        let mut client = RunnerServiceClient::new(channel);
        let (outbound, receiver) = mpsc::channel(64);
        let waiters: Waiters = Arc::default();
        let (push_tx, pushes) = mpsc::unbounded_channel();
        let hello = RunnerFrame {
            request_id: 1,
            frame: Some(runner_frame::Frame::Hello(Hello {
                executor_public_id: runner.to_string(),
                credential: credential.to_owned(),
                protocol_version: nexus_proto::RUNNER_PROTOCOL_VERSION,
                batches,
            })),
        };
        let (hello_tx, hello_rx) = oneshot::channel();
        waiters.lock().expect("waiters").insert(1, hello_tx);
        outbound.send(hello).await.expect("queue hello");
        let response = client.connect(ReceiverStream::new(receiver)).await;
        let reader_waiters = waiters.clone();
        let pong = outbound.clone();
        let offers: Arc<Mutex<OfferLedger>> = Arc::default();
        let reader_offers = offers.clone();
        let batch_counts: Arc<(AtomicU64, AtomicU64)> = Arc::default();
        let reader_batches = batch_counts.clone();
        let reader = tokio::spawn(async move {
            let Ok(response) = response else {
                fail_all(&reader_waiters);
                return;
            };
            let mut inbound = response.into_inner();
            while let Ok(Some(outer)) = inbound.message().await {
                let frames = match outer.frame {
                    Some(nexus_frame::Frame::Batch(batch)) => {
                        reader_batches.0.fetch_add(1, Ordering::Relaxed);
                        reader_batches.1.fetch_add(batch.frames.len() as u64, Ordering::Relaxed);
                        batch.frames
                    }
                    body => vec![nexus_proto::runner::v1::NexusFrame { request_id: outer.request_id, frame: body }],
                };
                for frame in frames {
                    let Some(body) = frame.frame else { continue };
                    if frame.request_id == 0 {
                        match &body {
                            nexus_frame::Frame::Ping(ping) => {
                                let _ = pong
                                    .send(RunnerFrame {
                                        request_id: 0,
                                        frame: Some(runner_frame::Frame::Pong(Pong { nonce: ping.nonce })),
                                    })
                                    .await;
                                continue;
                            }
                            nexus_frame::Frame::WorkAvailable(work) => {
                                reader_offers.lock().expect("offers").offered(&work.run_public_id, &work.task_key);
                            }
                            nexus_frame::Frame::WorkCanceled(canceled) => {
                                reader_offers
                                    .lock()
                                    .expect("offers")
                                    .withdrawn(&canceled.run_public_id, &canceled.task_key);
                            }
                            _ => {}
                        }
                        let _ = push_tx.send(body);
                        continue;
                    }
                    if let nexus_frame::Frame::ClaimGranted(granted) = &body
                        && let Ok(task) = serde_json::from_str::<Value>(&granted.task_json)
                        && let (Some(run), Some(task_key)) = (task["run_public_id"].as_str(), task["task_key"].as_str())
                    {
                        reader_offers.lock().expect("offers").withdrawn(run, task_key);
                    }
                    let reply = match body {
                        nexus_frame::Frame::Refusal(r) => Reply::Refused { code: r.code, http_status: r.http_status },
                        other => Reply::Frame(other),
                    };
                    if let Some(waiter) = reader_waiters.lock().expect("waiters").remove(&frame.request_id) {
                        let _ = waiter.send(reply);
                    }
                }
            }
            fail_all(&reader_waiters);
        });
        let hello_reply = tokio::time::timeout(Duration::from_secs(10), hello_rx)
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or(Reply::Lost);
        let runner =
            RawRunner { outbound, waiters, next_id: AtomicU64::new(2), pushes, reader, offers, batches: batch_counts };
        (runner, hello_reply)
    }

    /// Sends one request and waits (10 s at most) for its answer.
    pub async fn request(&self, frame: runner_frame::Frame) -> Reply {
        let request_id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.waiters.lock().expect("waiters").insert(request_id, tx);
        if self.outbound.send(RunnerFrame { request_id, frame: Some(frame) }).await.is_err() {
            return Reply::Lost;
        }
        // The reader fails every waiter when the stream ends; one registered after that would
        // otherwise wait out the whole timeout.
        if self.reader.is_finished() {
            self.waiters.lock().expect("waiters").remove(&request_id);
            return Reply::Lost;
        }
        tokio::time::timeout(Duration::from_secs(10), rx).await.ok().and_then(Result::ok).unwrap_or(Reply::Lost)
    }

    /// Sends `frames` in one `RunnerBatch` (each with a fresh request id) and waits (10 s at
    /// most) for every answer, in order.
    pub async fn batch(&self, frames: Vec<runner_frame::Frame>) -> Vec<Reply> {
        let mut inner = Vec::with_capacity(frames.len());
        let mut answers = Vec::with_capacity(frames.len());
        for frame in frames {
            let request_id = self.next_id.fetch_add(1, Ordering::Relaxed);
            let (tx, rx) = oneshot::channel();
            self.waiters.lock().expect("waiters").insert(request_id, tx);
            inner.push(RunnerFrame { request_id, frame: Some(frame) });
            answers.push(rx);
        }
        let batch = runner_frame::Frame::Batch(nexus_proto::runner::v1::RunnerBatch { frames: inner });
        if self.outbound.send(RunnerFrame { request_id: 0, frame: Some(batch) }).await.is_err() {
            return answers.iter().map(|_| Reply::Lost).collect();
        }
        let mut replies = Vec::with_capacity(answers.len());
        for rx in answers {
            replies.push(
                tokio::time::timeout(Duration::from_secs(10), rx)
                    .await
                    .ok()
                    .and_then(Result::ok)
                    .unwrap_or(Reply::Lost),
            );
        }
        replies
    }

    /// `(NexusBatch frames received, frames they held)` so far.
    pub fn batches_received(&self) -> (u64, u64) {
        (self.batches.0.load(Ordering::Relaxed), self.batches.1.load(Ordering::Relaxed))
    }

    /// Announces `body` (whole replacement).
    pub async fn announce(&self, body: &Value) -> Reply {
        self.request(runner_frame::Frame::Announce(Announce { body_json: body.to_string() })).await
    }

    /// Claims a task.
    pub async fn claim(&self, run: &str, task_key: &str) -> Reply {
        self.request(runner_frame::Frame::Claim(Claim { run_public_id: run.to_owned(), task_key: task_key.to_owned() }))
            .await
    }

    /// Commits a result body.
    pub async fn commit(&self, run: &str, task_key: &str, token: &str, body: &Value) -> Reply {
        self.request(runner_frame::Frame::Commit(Commit {
            run_public_id: run.to_owned(),
            task_key: task_key.to_owned(),
            claim_token: token.to_owned(),
            body_json: body.to_string(),
        }))
        .await
    }

    /// Extends a claim.
    pub async fn extend(&self, run: &str, task_key: &str, token: &str, timeout_ms: i64) -> Reply {
        self.request(runner_frame::Frame::Extend(Extend {
            run_public_id: run.to_owned(),
            task_key: task_key.to_owned(),
            claim_token: token.to_owned(),
            timeout_ms,
        }))
        .await
    }

    /// Reads a claim's state.
    pub async fn claim_status(&self, run: &str, task_key: &str, token: &str) -> Reply {
        self.request(runner_frame::Frame::ClaimStatus(ClaimStatus {
            run_public_id: run.to_owned(),
            task_key: task_key.to_owned(),
            claim_token: token.to_owned(),
        }))
        .await
    }

    /// The next `work_available` push, within `limit`.
    pub async fn next_work(&mut self, limit: Duration) -> Option<WorkAvailable> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let frame = tokio::time::timeout_at(deadline, self.pushes.recv()).await.ok()??;
            if let nexus_frame::Frame::WorkAvailable(work) = frame {
                return Some(work);
            }
        }
    }

    /// The next push of any kind, within `limit`.
    pub async fn next_push(&mut self, limit: Duration) -> Option<nexus_frame::Frame> {
        tokio::time::timeout(limit, self.pushes.recv()).await.ok()?
    }

    /// Every `work_available` push already received, without waiting; other pushes are skipped.
    /// After an answer to a later request arrived, this holds every offer nexus sent before it.
    pub fn received_work(&mut self) -> Vec<WorkAvailable> {
        let mut work = Vec::new();
        while let Ok(frame) = self.pushes.try_recv() {
            if let nexus_frame::Frame::WorkAvailable(offer) = frame {
                work.push(offer);
            }
        }
        work
    }

    /// The offers this stream received so far, and how many were outstanding.
    pub fn offer_tally(&self) -> OfferTally {
        self.offers.lock().expect("offers").tally.clone()
    }

    /// Whether the stream is still open (its reader has not seen it end).
    pub fn is_open(&self) -> bool {
        !self.reader.is_finished()
    }
}

fn fail_all(waiters: &Waiters) {
    for (_, waiter) in waiters.lock().expect("waiters").drain() {
        let _ = waiter.send(Reply::Lost);
    }
}
