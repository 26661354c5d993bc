//! Time: the one [`Clock`] every deadline, hold, timestamp and timer of the server reads, and the
//! deadline arithmetic that never overflows (`docs/architecture.md`, "Time").
//!
//! The clock reads Unix milliseconds, anchored once on the system clock and then carried forward
//! by tokio's monotonic clock. So a test can run it in tokio's paused time, and a test can also
//! move it forward at once ([`Clock::advance`]): every sleeper on [`Clock::sleep_until`] wakes and
//! checks again. Nothing in the server reads the system clock after start-up.
//!
//! Deadlines are stored as Unix milliseconds. A paused execution's deadlines are stored frozen,
//! at or past [`FROZEN_EPOCH_MS`] (the year 10000); [`deadline_after`] keeps every live deadline
//! below it, whatever the timeout, so a live deadline can never read as frozen.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::watch;
use tokio::time::Instant;

/// Where frozen deadlines start, in Unix milliseconds: 10000-01-01T00:00:00Z. A deadline at or
/// past it is frozen, and reads as this epoch plus the milliseconds it had left when its
/// execution paused.
pub const FROZEN_EPOCH_MS: i64 = 253_402_300_800_000;

/// The longest park any task may have, in milliseconds: 7 days. Announced `timeout_ms`, hook
/// `timeout_ms` and the configured defaults are bounded by it.
pub const TIMEOUT_BOUND_MS: u64 = 7 * 24 * 60 * 60 * 1_000;

/// Whether a stored deadline is frozen (its execution is paused).
pub fn is_frozen(deadline_at: i64) -> bool {
    deadline_at >= FROZEN_EPOCH_MS
}

/// What a frozen deadline had left when it froze, in milliseconds; `None` for a live one.
pub fn frozen_remaining_ms(deadline_at: i64) -> Option<i64> {
    is_frozen(deadline_at).then(|| deadline_at - FROZEN_EPOCH_MS)
}

/// The live deadline `timeout_ms` after `now` (both milliseconds): saturating, and always below
/// [`FROZEN_EPOCH_MS`].
pub fn deadline_after(now: i64, timeout_ms: i64) -> i64 {
    now.saturating_add(timeout_ms.max(0)).min(FROZEN_EPOCH_MS - 1)
}

/// The server's clock. Cheap to clone; clones share one time.
#[derive(Clone, Debug)]
pub struct Clock {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// Unix milliseconds at `origin`.
    origin_ms: i64,
    origin: Instant,
    /// How far [`Clock::advance`] moved the clock, in milliseconds; sleepers watch it.
    skew: watch::Sender<i64>,
}

impl Default for Clock {
    fn default() -> Self {
        Clock::system()
    }
}

impl Clock {
    /// A clock that reads the system's time now and runs on tokio's clock from here.
    #[expect(clippy::disallowed_methods, reason = "the server's one read of the system clock: the anchor")]
    pub fn system() -> Clock {
        let origin_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |elapsed| i64::try_from(elapsed.as_millis()).unwrap_or(i64::MAX));
        Clock::starting_at(origin_ms)
    }

    /// A clock that reads `origin_ms` (Unix milliseconds) now.
    pub fn starting_at(origin_ms: i64) -> Clock {
        Clock { inner: Arc::new(Inner { origin_ms, origin: Instant::now(), skew: watch::channel(0).0 }) }
    }

    /// The time, in Unix milliseconds.
    pub fn now_ms(&self) -> i64 {
        let elapsed = i64::try_from(self.inner.origin.elapsed().as_millis()).unwrap_or(i64::MAX);
        self.inner.origin_ms.saturating_add(elapsed).saturating_add(*self.inner.skew.borrow())
    }

    /// Moves the clock forward by `by` at once: every deadline within it is due now. For tests:
    /// a server never moves its own clock.
    pub fn advance(&self, by: Duration) {
        let by = i64::try_from(by.as_millis()).unwrap_or(i64::MAX);
        self.inner.skew.send_modify(|skew| *skew = skew.saturating_add(by));
    }

    /// Waits until the clock reads `deadline_ms` or later.
    pub async fn sleep_until(&self, deadline_ms: i64) {
        let mut skew = self.inner.skew.subscribe();
        loop {
            let now = self.now_ms();
            if now >= deadline_ms {
                return;
            }
            let wait = Duration::from_millis(u64::try_from(deadline_ms - now).unwrap_or(u64::MAX));
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                changed = skew.changed() => {
                    // Only a clock with no advancer left could close it: plain sleep then.
                    if changed.is_err() {
                        tokio::time::sleep(wait).await;
                    }
                }
            }
        }
    }

    /// Waits `duration` on this clock.
    pub async fn sleep(&self, duration: Duration) {
        let wait = i64::try_from(duration.as_millis()).unwrap_or(i64::MAX);
        self.sleep_until(self.now_ms().saturating_add(wait)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlines_saturate_and_never_read_as_frozen() {
        assert_eq!(deadline_after(1_000, 500), 1_500);
        assert_eq!(deadline_after(1_000, -5), 1_000, "a negative timeout is no time");
        for timeout in [i64::MAX, FROZEN_EPOCH_MS, FROZEN_EPOCH_MS - 999] {
            let deadline = deadline_after(1_000, timeout);
            assert!(!is_frozen(deadline), "{timeout} gave a frozen-looking deadline {deadline}");
            assert_eq!(frozen_remaining_ms(deadline), None);
        }
        assert_eq!(frozen_remaining_ms(FROZEN_EPOCH_MS + 7), Some(7));
        let week = i64::try_from(TIMEOUT_BOUND_MS).expect("fits");
        assert!(!is_frozen(deadline_after(Clock::system().now_ms(), week)));
    }

    #[tokio::test(start_paused = true)]
    async fn the_clock_runs_on_tokio_time() {
        let clock = Clock::starting_at(10_000);
        assert_eq!(clock.now_ms(), 10_000);
        tokio::time::advance(Duration::from_millis(2_500)).await;
        assert_eq!(clock.now_ms(), 12_500);
        // A sleeper wakes when paused time reaches its deadline, not before.
        let sleeper = tokio::spawn({
            let clock = clock.clone();
            async move {
                clock.sleep_until(20_000).await;
                clock.now_ms()
            }
        });
        tokio::time::sleep(Duration::from_millis(7_000)).await;
        assert!(!sleeper.is_finished(), "woke before its deadline");
        assert_eq!(sleeper.await.expect("sleeper"), 20_000);
    }

    #[tokio::test(start_paused = true)]
    async fn advancing_wakes_every_sleeper_that_is_due_and_only_those() {
        let clock = Clock::starting_at(0);
        let due = tokio::spawn({
            let clock = clock.clone();
            async move { clock.sleep_until(60_000).await }
        });
        let later = tokio::spawn({
            let clock = clock.clone();
            async move { clock.sleep(Duration::from_secs(3_600)).await }
        });
        tokio::task::yield_now().await;
        clock.advance(Duration::from_secs(61));
        due.await.expect("the due sleeper wakes");
        assert!(clock.now_ms() >= 61_000);
        tokio::task::yield_now().await;
        assert!(!later.is_finished(), "a sleeper past the advance sleeps on");
        clock.advance(Duration::from_secs(3_600));
        later.await.expect("the later sleeper wakes");
    }
}
