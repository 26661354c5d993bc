//! The chaos harness: a seed and a small deterministic generator, one-at-a-time scenarios, and a
//! fake runner that records what it observed for the invariant checks ([`crate::invariants`]).
//!
//! The seed comes from `NEXUS_CHAOS_SEED` (decimal or `0x` hex) or, when unset, from the
//! operating system's randomness. Each scenario derives its own generator from the seed and its name, so rerunning one scenario
//! alone with the printed seed replays the same fault plan. The plan is deterministic; the timing
//! of threads and sockets under it is not, which is why every scenario ends in invariant checks
//! rather than in exact transcripts.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::sync::MutexGuard;
use tokio::time::Instant;
use uuid::Uuid;

use nexus_actors::clock::Clock;
use nexus_proto::runner::v1::{WorkAvailable, nexus_frame};

use crate::invariants::{Ack, Grant, Observations, Offer};
use crate::raw_runner::{RawRunner, Reply};
use crate::server::Minted;

/// The environment variable that fixes the seed.
pub const SEED_VAR: &str = "NEXUS_CHAOS_SEED";

/// The suite's base seed: `NEXUS_CHAOS_SEED`, or a random one when unset.
///
/// # Panics
/// When `NEXUS_CHAOS_SEED` is set but is not a number.
pub fn base_seed() -> u64 {
    match std::env::var(SEED_VAR) {
        Ok(text) if !text.trim().is_empty() => {
            parse_seed(text.trim()).unwrap_or_else(|| panic!("{SEED_VAR}={text}: expected a decimal or 0x-hex number"))
        }
        _ => rand::random(),
    }
}

fn parse_seed(text: &str) -> Option<u64> {
    match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => text.parse().ok(),
    }
}

/// SplitMix64: tiny, fast and good enough to drive a fault plan; the same seed gives the same
/// sequence on every platform.
#[derive(Clone, Debug)]
pub struct ChaosRng {
    state: u64,
}

impl ChaosRng {
    /// A generator from a seed.
    pub fn new(seed: u64) -> ChaosRng {
        ChaosRng { state: seed }
    }

    /// A generator for one named stream under `seed` (a scenario, a runner, a task).
    pub fn derive(seed: u64, name: &str) -> ChaosRng {
        // FNV-1a over the name, mixed into the seed.
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in name.bytes() {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
        let mut rng = ChaosRng::new(seed ^ hash.rotate_left(17));
        rng.next_u64();
        rng
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `low..high` (`low` when the range is empty).
    pub fn range(&mut self, low: u64, high: u64) -> u64 {
        if high <= low {
            return low;
        }
        low + self.next_u64() % (high - low)
    }

    /// An index below `len` (0 when `len` is 0).
    pub fn index(&mut self, len: usize) -> usize {
        usize::try_from(self.range(0, len as u64)).unwrap_or(0)
    }

    /// `true` with probability `percent` / 100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.range(0, 100) < percent
    }

    /// A duration in `low..high` milliseconds.
    pub fn millis(&mut self, low: u64, high: u64) -> Duration {
        Duration::from_millis(self.range(low, high))
    }

    /// Shuffles `items` in place (Fisher-Yates).
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.index(i + 1);
            items.swap(i, j);
        }
    }
}

/// Scenarios run one at a time, whatever the test harness's thread count.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// One running scenario: holds the suite's lock, knows its seed and its name, and prints both at
/// its start and its end. Put [`Scenario::tag`] in every assertion message.
#[derive(Debug)]
pub struct Scenario {
    /// The scenario's name (the test's name).
    pub name: &'static str,
    /// The suite's base seed.
    pub seed: u64,
    /// The scenario's generator, derived from the seed and the name.
    pub rng: ChaosRng,
    started: Instant,
    _serial: MutexGuard<'static, ()>,
}

impl Scenario {
    /// Waits for the previous scenario to end, then starts this one.
    pub async fn begin(name: &'static str) -> Scenario {
        let serial = SERIAL.lock().await;
        crate::server::init_tracing();
        let seed = base_seed();
        eprintln!(
            "chaos scenario {name}: seed {seed} (replay: {SEED_VAR}={seed} cargo test -p nexus-tests --test chaos {name})"
        );
        Scenario { name, seed, rng: ChaosRng::derive(seed, name), started: Instant::now(), _serial: serial }
    }

    /// `[chaos <name> seed=<seed>]`, for assertion messages.
    pub fn tag(&self) -> String {
        format!("[chaos {} seed={}]", self.name, self.seed)
    }

    /// A generator for a named sub-stream (a runner, a kill plan) of this scenario.
    pub fn rng_for(&self, stream: &str) -> ChaosRng {
        ChaosRng::derive(self.seed, &format!("{}/{stream}", self.name))
    }

    /// Time since the scenario began.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }
}

impl Drop for Scenario {
    fn drop(&mut self) {
        let outcome = if std::thread::panicking() { "FAILED" } else { "passed" };
        eprintln!("chaos scenario {} {outcome} in {:.1?} (seed {})", self.name, self.started.elapsed(), self.seed);
    }
}

/// What every fake runner of a scenario saw, shared between them.
#[derive(Clone, Debug, Default)]
pub struct Ledger {
    inner: Arc<Mutex<Observations>>,
    /// Stamps what the runners saw.
    clock: Clock,
}

impl Ledger {
    /// An empty ledger.
    pub fn new() -> Ledger {
        Ledger::default()
    }

    /// A copy of everything recorded so far.
    pub fn snapshot(&self) -> Observations {
        self.inner.lock().expect("ledger").clone()
    }

    fn record(&self, f: impl FnOnce(&mut Observations)) {
        f(&mut self.inner.lock().expect("ledger"));
    }

    /// Records a refusal word seen by a fake runner (for the scenario's own expectations).
    pub fn refused(&self, code: &str) {
        self.record(|o| *o.refusals.entry(code.to_owned()).or_default() += 1);
    }
}

/// A [`RawRunner`] that records every offer, grant and commit answer it sees in a [`Ledger`].
#[derive(Debug)]
pub struct ObservedRunner {
    /// The runner's UUID.
    pub id: Uuid,
    /// The stream.
    pub raw: RawRunner,
    ledger: Ledger,
}

impl ObservedRunner {
    /// Connects to `url` as `runner` and says Hello; returns the Hello's answer beside it.
    pub async fn connect(url: &str, runner: &Minted, ledger: &Ledger) -> (ObservedRunner, Reply) {
        let (raw, hello) = RawRunner::connect(url, runner.id, &runner.token).await;
        (ObservedRunner { id: runner.id, raw, ledger: ledger.clone() }, hello)
    }

    /// Connects and insists on a Welcome, retrying for up to `limit` (nexus may be fencing the
    /// previous stream, or restarting).
    ///
    /// # Panics
    /// When no Welcome comes within `limit`.
    pub async fn connect_welcomed(url: &str, runner: &Minted, ledger: &Ledger, limit: Duration) -> ObservedRunner {
        let deadline = Instant::now() + limit;
        loop {
            let (observed, hello) = ObservedRunner::connect(url, runner, ledger).await;
            if matches!(hello, Reply::Frame(nexus_frame::Frame::Welcome(_))) {
                return observed;
            }
            assert!(Instant::now() < deadline, "runner {} got no welcome within {limit:?}: {hello:?}", runner.id);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Announces `body`.
    pub async fn announce(&self, body: &Value) -> Reply {
        self.raw.announce(body).await
    }

    /// The next `work_available` push within `limit`, recorded as an offer.
    pub async fn next_work(&mut self, limit: Duration) -> Option<WorkAvailable> {
        let work = self.raw.next_work(limit).await?;
        self.observe_offer(&work);
        Some(work)
    }

    /// The next push of any kind within `limit`; offers are recorded.
    pub async fn next_push(&mut self, limit: Duration) -> Option<nexus_frame::Frame> {
        let push = self.raw.next_push(limit).await?;
        if let nexus_frame::Frame::WorkAvailable(work) = &push {
            self.observe_offer(work);
        }
        Some(push)
    }

    fn observe_offer(&self, work: &WorkAvailable) {
        let offer = Offer { runner: self.id, run: uuid(&work.run_public_id), task_key: work.task_key.clone() };
        self.ledger.record(|o| o.offers.push(offer));
    }

    /// Claims a task; a grant is recorded with the address the row carried.
    pub async fn claim(&self, run: &str, task_key: &str) -> Reply {
        let reply = self.raw.claim(run, task_key).await;
        self.observe_claim(run, task_key, &reply);
        reply
    }

    /// Records the answer to a claim sent by other means (e.g. pipelined frames).
    pub fn observe_claim(&self, run: &str, task_key: &str, reply: &Reply) {
        if let Some((token, task)) = reply.granted() {
            let addressed_to =
                task["addressed_to"]["executor_public_id"].as_str().and_then(|s| Uuid::parse_str(s).ok());
            let grant = Grant {
                runner: self.id,
                run: uuid(run),
                task_key: task_key.to_owned(),
                token,
                addressed_to,
                at_ms: self.ledger.clock.now_ms(),
            };
            self.ledger.record(|o| o.grants.push(grant));
        } else if let Some(code) = reply.code() {
            self.ledger.refused(code);
        }
    }

    /// Commits `body`; an acknowledgement is recorded with the body it acknowledged.
    pub async fn commit(&self, run: &str, task_key: &str, token: &str, body: Value) -> Reply {
        let reply = self.raw.commit(run, task_key, token, &body).await;
        self.observe_commit(run, task_key, token, &body, &reply);
        reply
    }

    /// Records the answer to a commit sent by other means.
    pub fn observe_commit(&self, run: &str, task_key: &str, token: &str, body: &Value, reply: &Reply) {
        if let Some((idle, status)) = reply.committed() {
            let ack = Ack {
                runner: self.id,
                run: uuid(run),
                task_key: task_key.to_owned(),
                token: token.to_owned(),
                body: body.clone(),
                idle,
                status,
                at_ms: self.ledger.clock.now_ms(),
            };
            self.ledger.record(|o| o.acks.push(ack));
        } else if let Some(code) = reply.code() {
            self.ledger.refused(code);
        }
    }

    /// The next push within `limit`, or why there is none: the stream is quiet, or it ended.
    ///
    /// An ended stream is told apart without a request: `RawRunner`'s push channel closes with
    /// its reader, so a wait that returns empty before its limit saw the channel close. (A
    /// request sent just after the reader ended can wait out its whole timeout instead; see the
    /// chaos report.)
    pub async fn poll_push(&mut self, limit: Duration) -> Push {
        let started = Instant::now();
        match self.next_push(limit).await {
            Some(frame) => Push::Frame(frame),
            None if started.elapsed() < limit => Push::Ended,
            None => Push::Quiet,
        }
    }
}

/// What [`ObservedRunner::poll_push`] saw.
#[derive(Clone, Debug, PartialEq)]
pub enum Push {
    /// A push frame (offers are already recorded).
    Frame(nexus_frame::Frame),
    /// Nothing within the limit; the stream is open.
    Quiet,
    /// The stream ended.
    Ended,
}

fn uuid(text: &str) -> Uuid {
    Uuid::parse_str(text).unwrap_or_else(|_| panic!("nexus sent a run id that is not a UUID: {text:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_generator_is_deterministic_and_spread() {
        let mut a = ChaosRng::derive(42, "soak");
        let mut b = ChaosRng::derive(42, "soak");
        let mut c = ChaosRng::derive(42, "other");
        let first: Vec<u64> = (0..8).map(|_| a.next_u64()).collect();
        assert_eq!(first, (0..8).map(|_| b.next_u64()).collect::<Vec<_>>());
        assert_ne!(first, (0..8).map(|_| c.next_u64()).collect::<Vec<_>>());
        let mut rng = ChaosRng::new(7);
        let mut seen = [0u32; 10];
        for _ in 0..10_000 {
            seen[rng.index(10)] += 1;
        }
        assert!(seen.iter().all(|n| (800..1200).contains(n)), "{seen:?}");
        let mut items: Vec<u32> = (0..20).collect();
        rng.shuffle(&mut items);
        let mut sorted = items.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..20).collect::<Vec<_>>());
        assert_ne!(items, sorted);
        assert_eq!(parse_seed("0x10"), Some(16));
        assert_eq!(parse_seed("17"), Some(17));
        assert_eq!(parse_seed("x"), None);
    }
}
