//! Blocking work that a deadline or a stop can abandon.
//!
//! A file tool's system calls can block where no timeout reaches them (an `open` of a FIFO, a
//! read on a hung network mount). So each call runs on a thread of its own, and the tool's future
//! only waits for that thread's answer, its deadline or its stop, whichever comes first: the slot
//! comes back when the call ends, even if the thread is still stuck in the kernel. Such a thread
//! is a *stray*: it finishes (or is ended with the process, which never waits for it) on its own,
//! and the [`Cancel`] it holds tells it to stop at its next check. Strays are counted; while
//! [`MAX_STRAYS`] of them live, new blocking calls are refused rather than piling up threads.
//!
//! These threads are not tokio's blocking pool on purpose: the journal's writes use that pool, and
//! stuck tool threads there would hold them back, and a runtime waits for its pool at shutdown.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::StopReason;

/// At most this many abandoned threads may still be running; past it, blocking calls are
/// refused ([`Ended::Busy`]) until some finish.
pub(crate) const MAX_STRAYS: usize = 32;

const RUNNING: u8 = 0;
const DONE: u8 = 1;
const ABANDONED: u8 = 2;

/// What the blocking work checks between steps: once abandoned, nobody reads its answer.
#[derive(Clone, Debug)]
pub(crate) struct Cancel(Arc<AtomicU8>);

impl Cancel {
    /// A call nobody abandons (for work run outside [`run`], in tests).
    #[cfg(test)]
    pub(crate) fn never() -> Cancel {
        Cancel(Arc::new(AtomicU8::new(RUNNING)))
    }

    /// Marks it abandoned, as a deadline would.
    #[cfg(test)]
    pub(crate) fn abandon_for_test(&self) {
        self.0.store(ABANDONED, Ordering::Release);
    }

    /// Whether the call's deadline or stop came first: the work should stop now.
    pub(crate) fn abandoned(&self) -> bool {
        self.0.load(Ordering::Acquire) == ABANDONED
    }
}

/// How many abandoned threads still run, shared by every call of one toolbox.
#[derive(Clone, Debug, Default)]
pub(crate) struct Strays(Arc<AtomicUsize>);

impl Strays {
    /// Abandoned threads still running.
    pub(crate) fn count(&self) -> usize {
        self.0.load(Ordering::Acquire)
    }
}

/// How a blocking call ended.
#[derive(Debug)]
pub(crate) enum Ended<T> {
    /// The work returned this.
    Done(T),
    /// The deadline came first; the thread was abandoned.
    TimedOut,
    /// The stop came first; the thread was abandoned.
    Stopped(StopReason),
    /// [`MAX_STRAYS`] abandoned threads still run; the work was not started.
    Busy,
    /// The work panicked, or no thread could be started (the sentence says which).
    Crashed(String),
}

/// Runs `work` on a thread of its own and waits for it until `until`, or until `stop` resolves.
pub(crate) async fn run<T, W, S>(strays: &Strays, until: Instant, stop: S, work: W) -> Ended<T>
where
    T: Send + 'static,
    W: FnOnce(&Cancel) -> T + Send + 'static,
    S: Future<Output = StopReason>,
{
    if strays.count() >= MAX_STRAYS {
        return Ended::Busy;
    }
    let cancel = Cancel(Arc::new(AtomicU8::new(RUNNING)));
    let (answer_tx, answer) = oneshot::channel();
    let thread_cancel = cancel.clone();
    let thread_strays = strays.clone();
    let spawned = std::thread::Builder::new().name("nexus-tool".to_owned()).spawn(move || {
        let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| work(&thread_cancel)));
        if thread_cancel.0.compare_exchange(RUNNING, DONE, Ordering::AcqRel, Ordering::Acquire).is_err() {
            // Abandoned: it was counted as a stray, and is one no more.
            thread_strays.0.fetch_sub(1, Ordering::AcqRel);
        }
        let _ = answer_tx.send(outcome);
    });
    if let Err(err) = spawned {
        return Ended::Crashed(format!("could not start a thread for it: {err}"));
    }
    let abandon = || {
        // Counted first, so the thread's decrement never comes before this increment.
        strays.0.fetch_add(1, Ordering::AcqRel);
        if cancel.0.compare_exchange(RUNNING, ABANDONED, Ordering::AcqRel, Ordering::Acquire).is_err() {
            strays.0.fetch_sub(1, Ordering::AcqRel);
        }
    };
    tokio::select! {
        answered = answer => match answered {
            Ok(Ok(value)) => Ended::Done(value),
            Ok(Err(_)) => Ended::Crashed("it crashed".to_owned()),
            Err(_) => Ended::Crashed("its thread ended without an answer".to_owned()),
        },
        () = tokio::time::sleep_until(until) => {
            abandon();
            Ended::TimedOut
        }
        reason = stop => {
            abandon();
            Ended::Stopped(reason)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::time::Duration;

    use super::*;

    fn never_stopped() -> std::future::Pending<StopReason> {
        std::future::pending()
    }

    #[tokio::test]
    async fn work_that_answers_in_time_is_done() {
        let strays = Strays::default();
        let until = Instant::now() + Duration::from_secs(30);
        let ended = run(&strays, until, never_stopped(), |cancel| !cancel.abandoned()).await;
        assert!(matches!(ended, Ended::Done(true)), "{ended:?}");
        let ended = run(&strays, until, never_stopped(), |_| -> u8 { panic!("boom") }).await;
        assert!(matches!(ended, Ended::Crashed(_)), "{ended:?}");
        assert_eq!(strays.count(), 0);
    }

    #[tokio::test]
    async fn a_stuck_call_is_abandoned_at_its_deadline_and_counted_until_it_ends() {
        let strays = Strays::default();
        let (release_tx, release) = mpsc::channel::<()>();
        let (finished_tx, finished) = mpsc::channel::<bool>();
        let started = Instant::now();
        let until = started + Duration::from_millis(100);
        // Blocks until released, as a system call would: nothing but the deadline ends the wait.
        let ended = run(&strays, until, never_stopped(), move |cancel| {
            let _ = release.recv();
            let _ = finished_tx.send(cancel.abandoned());
        })
        .await;
        assert!(matches!(ended, Ended::TimedOut), "{ended:?}");
        assert!(started.elapsed() < Duration::from_secs(20), "took {:?}", started.elapsed());
        assert_eq!(strays.count(), 1, "the stuck thread is a stray");

        release_tx.send(()).unwrap();
        let saw_abandoned = finished.recv_timeout(Duration::from_secs(20)).expect("the thread ends once released");
        assert!(saw_abandoned, "the thread learns that nobody waits for it");
        let deadline = Instant::now() + Duration::from_secs(20);
        while strays.count() != 0 {
            assert!(Instant::now() < deadline, "the stray is never uncounted");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    #[tokio::test]
    async fn a_stop_abandons_a_stuck_call_and_too_many_strays_refuse_new_work() {
        let strays = Strays::default();
        let until = Instant::now() + Duration::from_secs(600);
        let mut releases = Vec::new();
        for _ in 0..MAX_STRAYS {
            let (release_tx, release) = mpsc::channel::<()>();
            releases.push(release_tx);
            let stop = async { StopReason::Canceled };
            let ended = run(&strays, until, stop, move |_| {
                let _ = release.recv();
            })
            .await;
            assert!(matches!(ended, Ended::Stopped(StopReason::Canceled)), "{ended:?}");
        }
        assert_eq!(strays.count(), MAX_STRAYS);
        let ended = run(&strays, until, never_stopped(), |_| ()).await;
        assert!(matches!(ended, Ended::Busy), "{ended:?}");

        drop(releases);
        let deadline = Instant::now() + Duration::from_secs(20);
        while strays.count() != 0 {
            assert!(Instant::now() < deadline, "{} strays remain", strays.count());
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let ended = run(&strays, until, never_stopped(), |_| 7).await;
        assert!(matches!(ended, Ended::Done(7)), "{ended:?}");
    }
}
