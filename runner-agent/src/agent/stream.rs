//! The stream's life: hello, welcome, attach, announce, and what a lost stream drops and
//! schedules (`docs/protocol.md`, "Reconnect").

use std::collections::HashMap;
use std::time::Duration;

use nexus_proto::RUNNER_PROTOCOL_VERSION;
use nexus_proto::runner::v1::runner_frame::Frame as Request;
use nexus_proto::runner::v1::{Announce, Hello, RunnerFrame};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::{error, info, warn};

use super::link::{ConnectError, Connected, HELLO_REQUEST_ID};
use crate::claim::RequestError;

use super::*;

/// The longest wait between two rounds of a list of several nodes.
const CLUSTER_ROUND_DELAY_MAX: Duration = Duration::from_secs(1);

impl Agent {
    /// Whether the URLs ask for plaintext (`http://`; they all share one scheme).
    pub(super) fn plaintext(&self) -> bool {
        self.nexus_url().get(..7).is_some_and(|scheme| scheme.eq_ignore_ascii_case("http://"))
    }

    /// The URL of the node this agent is connected or connecting to.
    pub(super) fn nexus_url(&self) -> &str {
        &self.config.nexus_urls[self.node]
    }

    pub(super) fn hello(&self) -> Hello {
        Hello {
            executor_public_id: self.config.runner_id.to_string(),
            credential: self.config.credential.expose().to_owned(),
            protocol_version: RUNNER_PROTOCOL_VERSION,
            // This runner reads NexusBatch frames (`docs/protocol.md`, "Batches").
            batches: true,
        }
    }

    pub(super) fn open_after(&self, delay: Duration) -> Connecting {
        let bounds = (self.config.connect_timeout, self.config.handshake_timeout);
        let tls = self.config.tls.clone();
        let is_final = move |error: &ConnectError| error.fatal().is_some() || error.tls_failure(&tls).is_some();
        let target = self.endpoints[self.node].clone();
        Box::pin(link::open(target, self.hello(), bounds, delay, self.last_address, is_final))
    }

    /// Notes that node `index` refused this runner; whether another node of the list has not
    /// (so the agent goes on trying).
    pub(super) fn refused_by(&mut self, index: usize) -> bool {
        self.refusals.insert(index);
        self.refusals.len() < self.endpoints.len()
    }

    /// The node this agent tried refused it for good (`why`: a refusal word, or TLS). With
    /// several nodes, while one of the list has not refused, it is left for the next one
    /// (another cluster's node, say) and this returns `true`; `false` means the agent stops.
    pub(super) fn leave_refusing_node(&mut self, why: &str) -> bool {
        if self.endpoints.len() < 2 || !self.refused_by(self.node) {
            return false;
        }
        error!(nexus = self.nexus_url(), reason = why, "this node refused this runner; trying the next");
        self.schedule_reconnect();
        true
    }

    /// Opens the next stream: with several URLs, to the next node of the list (the one just
    /// lost or refused may be gone; `docs/cluster.md`, "Runners"). The nodes of a round are tried
    /// one after another at once; after a whole round without a welcome the backoff's delay
    /// comes before the next.
    pub(super) fn schedule_reconnect(&mut self) {
        let count = self.endpoints.len();
        self.attempts += 1;
        self.node = (self.node + 1) % count;
        let delay = match (self.attempts.is_multiple_of(count), count) {
            (false, _) => Duration::ZERO,
            (true, 1) => self.backoff.next_delay(),
            // Between rounds of several nodes the wait stays short: standbys refuse at once while
            // a take-over is under way, which must not grow the backoff to its cap.
            (true, _) => self.backoff.next_delay().min(CLUSTER_ROUND_DELAY_MAX),
        };
        info!(
            nexus = self.nexus_url(),
            delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
            "reconnecting"
        );
        self.connecting = Some(self.open_after(delay));
    }

    pub(super) fn on_connected(&mut self, connected: Connected) {
        let Connected { outbound, inbound, welcome, after_welcome, address } = connected;
        self.last_address = address;
        if welcome.protocol_version != RUNNER_PROTOCOL_VERSION {
            warn!(theirs = welcome.protocol_version, ours = RUNNER_PROTOCOL_VERSION, "protocol versions differ");
        }
        // A slow pinger must not look dead: allow three ping intervals of silence.
        let ping_bound = Duration::from_millis(welcome.ping_interval_ms.saturating_mul(3));
        let liveness = self.config.liveness_timeout.max(ping_bound);
        self.attempts = 0;
        self.refusals.clear();
        info!(
            nexus = self.nexus_url(),
            address = address.map(|address| address.to_string()),
            credential_epoch = welcome.credential_epoch,
            liveness_ms = u64::try_from(liveness.as_millis()).unwrap_or(u64::MAX),
            "connected to nexus"
        );
        if self.fence.welcomed(Instant::now()) {
            warn!(
                "nexus keeps closing this runner's stream and welcoming it straight back: another runner-agent may be \
                 using this runner's credential, each new stream fencing the other; stop it, or give it a runner of its \
                 own (nexus admin runner create)"
            );
        }
        self.attach(outbound, liveness);
        if let Some(link) = self.link.as_mut() {
            link.batches = welcome.batches;
        }
        self.inbound = Some(inbound);
        self.after_connect();
        // Frames that shared a batch with the welcome come after it, as if they came alone.
        for frame in after_welcome {
            self.on_frame(frame);
        }
    }

    pub(super) fn attach(&mut self, outbound: mpsc::Sender<RunnerFrame>, liveness: Duration) {
        let now = Instant::now();
        self.link = Some(Link {
            outbound,
            outbox: Vec::new(),
            next_request_id: HELLO_REQUEST_ID + 1,
            pending: HashMap::new(),
            last_frame_at: now,
            connected_at: now,
            liveness,
            batches: true,
        });
    }

    /// Announce (whole replacement), then re-send every unacknowledged result.
    pub(super) fn after_connect(&mut self) {
        let body_json = self.toolbox.announcement().to_string();
        self.send_request(Request::Announce(Announce { body_json }), Pending::Announce);
        self.resend_commits();
    }

    pub(super) fn lose_link(&mut self, reason: &str) {
        let Some(link) = self.link.take() else { return };
        self.fence.lost(false);
        self.inbound = None;
        warn!(reason, "lost the stream to nexus");
        for (pending, _) in link.pending.into_values() {
            if let Pending::Claim(key, _) = &pending {
                // nexus never grants a claim twice (`docs/protocol.md`, "Claim"): a grant lost
                // with the stream cannot be asked for again, and the call lapses at its deadline.
                warn!(
                    run_public_id = %key.run_public_id,
                    task_key = %key.task_key,
                    "a claim was unanswered when the stream dropped; if nexus granted it, the grant is lost and \
                     nexus settles the call at its deadline without running it here"
                );
            }
            self.abandon(pending, RequestError::Disconnected);
        }
        // Hints are level-triggered: nexus sends them all again after the next welcome.
        self.hints.clear();
        self.hinted.clear();
        if link.connected_at.elapsed() >= self.config.healthy_after {
            self.backoff.reset();
        }
        if !self.draining {
            self.schedule_reconnect();
        }
    }
}
