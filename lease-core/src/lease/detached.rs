//! The last resort of clean-up: finishing a release when the runtime that should run it is gone.
//!
//! When a process ends normally, its runtime drops every task it still has: a holder task in the
//! middle of a release, or one that was never polled after its lease was dropped at the end of
//! `main`. Without a runtime nothing would give the lease back, and the next holder would wait out
//! the session TTL and the lock-delay. So a task dropped unfinished hands its clean-up to one
//! process-wide thread with a runtime of its own, and waits for it, bounded: all clean-ups of one
//! shutdown share a budget of [`BUDGET`], so a process holding many leases still exits promptly.

use std::sync::mpsc as std_mpsc;
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use crate::BoxFuture;

/// How long the clean-ups of one shutdown may hold up the process, in total.
pub(crate) const BUDGET: Duration = Duration::from_secs(1);

type Job = (BoxFuture<'static, ()>, std_mpsc::Sender<()>);

/// Runs `clean_up` on the detached runtime and blocks until it is done or this shutdown's budget
/// is spent. Never panics; if the thread cannot be started, the clean-up is skipped (the backend
/// frees the lease when its session expires).
pub(crate) fn finish(clean_up: BoxFuture<'static, ()>) {
    // A task of a simulated process (`runtime::local`) dropped with its set: the process was
    // killed, and nothing runs after it.
    if crate::runtime::is_local() {
        return;
    }
    let Some(jobs) = executor() else {
        return;
    };
    let (done_tx, done_rx) = std_mpsc::channel();
    if jobs.send((clean_up, done_tx)).is_err() {
        return;
    }
    let wait = budget_left();
    if !wait.is_zero() {
        let _ = done_rx.recv_timeout(wait);
    }
}

/// What is left of the current shutdown's budget. A shutdown is a burst of clean-ups; one that
/// comes long after the last burst starts a new budget.
fn budget_left() -> Duration {
    static BURST: Mutex<Option<Instant>> = Mutex::new(None);
    let mut started = BURST.lock().unwrap_or_else(PoisonError::into_inner);
    let now = Instant::now();
    let start = match *started {
        Some(start) if now.duration_since(start) < BUDGET * 2 => start,
        _ => {
            *started = Some(now);
            now
        }
    };
    (start + BUDGET).saturating_duration_since(now)
}

fn executor() -> Option<&'static mpsc::UnboundedSender<Job>> {
    static JOBS: OnceLock<Option<mpsc::UnboundedSender<Job>>> = OnceLock::new();
    JOBS.get_or_init(|| {
        let (tx, mut rx) = mpsc::unbounded_channel::<Job>();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .ok()?;
        std::thread::Builder::new()
            .name("lease-clean-up".into())
            .spawn(move || {
                runtime.block_on(async move {
                    while let Some((job, done)) = rx.recv().await {
                        tokio::spawn(async move {
                            let _ = tokio::time::timeout(BUDGET * 5, job).await;
                            let _ = done.send(());
                        });
                    }
                });
            })
            .ok()?;
        Some(tx)
    })
    .as_ref()
}
