//! Guarded work: acquire a lease, run a future under it, give the lease back.
//!
//! This is what `#[leader_only]` and `#[semaphore]` expand to, and it is usable by hand:
//! [`guarded`] acquires from a given backend, [`guarded_by_default`] from the process-wide default
//! (see [`set_default_backend`](crate::set_default_backend)). The work runs under
//! [`Lease::run`](crate::Lease::run), so it is dropped at its next await point the moment the lease
//! is known lost, and the caller learns which of the four outcomes happened from
//! `Result<T, GuardError>`. While the work runs, [`current_sequencer`] and [`current_lease`] reach
//! the lease it runs under.
//!
//! The task-local record of the leases a task's guarded work runs under also keeps a nested
//! guarded call on a key the task already holds from waiting for itself: it fails at once with
//! [`GuardError::AlreadyHeld`].

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::{
    Backend, Error, Lease, LeaseSpec, LeaseWatcher, LostReason, Sequencer, default_backend,
};

tokio::task_local! {
    /// The leases this task's guarded work runs under, innermost last.
    static HELD_BY_TASK: Arc<[HeldLease]>;
}

/// One lease guarded work of this task runs under.
#[derive(Clone)]
struct HeldLease {
    /// The key or prefix, as the spec named it.
    key: String,
    watcher: LeaseWatcher,
}

/// Runs `work` with `watcher` (the lease on `key`) recorded as held by the current task, on top
/// of the leases the task already holds: [`current_lease`] answers it, and a nested guarded call
/// on `key` is refused.
pub(crate) fn run_as_held<F: Future>(
    key: &str,
    watcher: LeaseWatcher,
    work: F,
) -> impl Future<Output = F::Output> + use<F> {
    let mut held: Vec<HeldLease> = HELD_BY_TASK
        .try_with(|held| held.to_vec())
        .unwrap_or_default();
    held.push(HeldLease {
        key: key.to_owned(),
        watcher,
    });
    HELD_BY_TASK.scope(held.into(), work)
}

/// `Err(Error::AlreadyHeld)` if guarded work of the current task already runs under a lease on
/// `key` (a leader key or a semaphore's prefix; the backend is not compared, since the same
/// backend is reached through many handles).
pub(crate) fn refuse_if_held_by_this_task(key: &str) -> Result<(), Error> {
    let held = HELD_BY_TASK
        .try_with(|held| held.iter().any(|lease| lease.key == key))
        .unwrap_or(false);
    if held {
        return Err(Error::AlreadyHeld {
            key: key.to_owned(),
        });
    }
    Ok(())
}

/// Why guarded work did not run to completion.
///
/// `Ok(value)` means the work ran under the lease and finished while the lease was held; each
/// variant here says why not, and whether the work started at all.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GuardError {
    /// The lease is held elsewhere and the wait ran out (or was `never`): the work did not run.
    #[error("lease {key:?} is held elsewhere (waited {waited:?}); the work did not run")]
    Busy {
        /// The key (leader) or prefix (semaphore).
        key: String,
        /// How long the acquisition waited.
        waited: Duration,
    },

    /// The lease was lost while the work ran: the work was cancelled at its next await point.
    #[error("the lease was lost ({0}); the work was cancelled")]
    Lost(#[source] LostReason),

    /// The work ran longer than the spec's [`max_run`](crate::LeaseSpec::max_run): it was
    /// cancelled at its next await point while the lease was still held, and the lease was
    /// given back (after the [`min_hold`](crate::LeaseSpec::min_hold), if that is longer).
    #[error("the work on lease {key:?} ran past its max_run of {max_run:?} and was cancelled")]
    TimedOut {
        /// The key (leader) or prefix (semaphore).
        key: String,
        /// The bound that passed.
        max_run: Duration,
    },

    /// The lease is already held by this task: the call is nested in guarded work on the same
    /// key or semaphore. It failed at once, without waiting for itself; the work did not run.
    #[error(
        "lease {key:?} is already held by this task (a guarded call nested in guarded work on the \
         same key or semaphore); the nested work did not run: call the unguarded work directly, \
         or guard it with another key"
    )]
    AlreadyHeld {
        /// The key (leader) or prefix (semaphore).
        key: String,
    },

    /// The lease could not be acquired (backend unreachable, invalid spec, no default backend…):
    /// the work did not run.
    #[error("the lease could not be acquired: {0}; the work did not run")]
    Backend(#[source] Error),
}

impl GuardError {
    /// True for [`GuardError::Busy`]: held elsewhere, the work did not run.
    pub fn is_busy(&self) -> bool {
        matches!(self, GuardError::Busy { .. })
    }

    /// True for [`GuardError::Lost`]: the work started and was cancelled.
    pub fn is_lost(&self) -> bool {
        matches!(self, GuardError::Lost(_))
    }

    /// What kind of failure it is, as [`Error::kind`] says it of the same failure.
    pub fn kind(&self) -> crate::ErrorKind {
        use crate::ErrorKind;
        match self {
            GuardError::Busy { .. } => ErrorKind::Busy,
            GuardError::Lost(_) => ErrorKind::Lost,
            GuardError::TimedOut { .. } => ErrorKind::TimedOut,
            GuardError::AlreadyHeld { .. } => ErrorKind::Usage,
            GuardError::Backend(error) => error.kind(),
        }
    }
}

impl From<GuardError> for Error {
    /// Folds the outcome back into the backend error type, for callers that propagate with `?`.
    fn from(error: GuardError) -> Self {
        match error {
            GuardError::Busy { key, waited } => Error::Busy { key, waited },
            GuardError::Lost(reason) => Error::Lost(reason),
            GuardError::AlreadyHeld { key } => Error::AlreadyHeld { key },
            GuardError::TimedOut { key, max_run } => Error::WorkTimedOut { key, max_run },
            GuardError::Backend(error) => error,
        }
    }
}

/// Acquires `spec` from `backend`, runs `work` under the lease, then releases it.
///
/// - `Ok(output)`: the work ran to completion while the lease was held.
/// - [`GuardError::Busy`]: held elsewhere past `spec`'s wait; the work was not started.
/// - [`GuardError::Lost`]: the lease was lost first; the work was dropped at its next await
///   point (or never started, if the lease was lost before it was first polled).
/// - [`GuardError::TimedOut`]: the work ran past `spec`'s [`max_run`](LeaseSpec::max_run) and
///   was dropped at its next await point; the lease is released.
/// - [`GuardError::AlreadyHeld`]: guarded work of this task already holds `spec`'s key or
///   semaphore (this call is nested in it); refused at once, whatever `spec`'s wait, and the work
///   was not started. Work spawned onto another task is not nested: it contends as any other
///   holder would.
/// - [`GuardError::Backend`]: acquiring failed; the work was not started.
///
/// After the work completes the lease is released before this returns, so the next guarded call
/// can take it at once; with a [`min_hold`](LeaseSpec::min_hold) it returns at once and the lease
/// is released in the background when `min_hold` has passed since the work started (if the
/// process ends first, the backend's server keeps the lease until then where it can: see
/// [`LeaseSpec::min_hold`]). A failed
/// release does not discard the work's output: the holder task logs it, and the backend frees
/// the lease when the session expires.
///
/// # Cancel safety
///
/// Dropping the returned future drops `work` and releases the lease in the background.
///
/// # Examples
///
/// ```
/// # #[cfg(feature = "memory")]
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), lease_core::GuardError> {
/// use lease_core::{LeaseSpec, Wait, guarded, memory::Memory};
///
/// let backend = Memory::new();
/// let spec = LeaseSpec::leader("jobs/compact").wait(Wait::Never);
/// let rows = guarded(&backend, &spec, async {
///     let token = lease_core::current_sequencer();
///     assert!(token.is_some());
///     42
/// })
/// .await?;
/// assert_eq!(rows, 42);
/// # Ok(())
/// # }
/// # #[cfg(not(feature = "memory"))]
/// # fn main() {}
/// ```
pub async fn guarded<F: Future>(
    backend: &dyn Backend,
    spec: &LeaseSpec,
    work: F,
) -> Result<F::Output, GuardError> {
    // Every backend validates too; checked here first, a key built at run time (a macro's
    // `key = format!(…)`) fails the same way everywhere, before anything is sent.
    spec.validate().map_err(not_acquired)?;
    refuse_if_held_by_this_task(spec.key()).map_err(not_acquired)?;
    let lease = backend.acquire(spec).await.map_err(not_acquired)?;
    let started = Instant::now();
    let run = run_as_held(spec.key(), lease.watcher(), lease.run(work));
    let outcome = match spec.max_run_time() {
        None => run.await.map_err(GuardError::Lost),
        Some(max_run) => match tokio::time::timeout(max_run, run).await {
            Ok(outcome) => outcome.map_err(GuardError::Lost),
            Err(_elapsed) => Err(GuardError::TimedOut {
                key: spec.key().to_owned(),
                max_run,
            }),
        },
    };
    match outcome {
        // A lost lease has nothing left to keep or release.
        Err(GuardError::Lost(reason)) => Err(GuardError::Lost(reason)),
        finished => {
            release_after_min_hold(lease, spec.min_hold_time(), started).await;
            finished
        }
    }
}

/// Releases `lease` now, or in the background once `min_hold` has passed since `started`; a
/// process that ends before then leaves it held on the backend's server until then, where the
/// backend can ([`Lease::release_at`]).
async fn release_after_min_hold(lease: Lease, min_hold: Duration, started: Instant) {
    if min_hold.saturating_sub(started.elapsed()).is_zero() {
        // Already logged by the holder task; the output is still what the caller asked for.
        let _ = lease.release().await;
        return;
    }
    tracing::debug!(
        sequencer = %lease.sequencer(),
        ?min_hold,
        "guarded: work done; keeping the lease for its min_hold"
    );
    lease.release_at(started + min_hold);
}

/// The outcome of an acquisition that failed: the work did not run.
fn not_acquired(error: Error) -> GuardError {
    match error {
        Error::Busy { key, waited } => GuardError::Busy { key, waited },
        Error::AlreadyHeld { key } => GuardError::AlreadyHeld { key },
        other => GuardError::Backend(other),
    }
}

/// [`guarded`] on the default backend: the one in scope
/// ([`with_default_backend`](crate::with_default_backend)), else the process-wide one
/// ([`set_default_backend`](crate::set_default_backend)).
///
/// Fails with `GuardError::Backend(Error::NoDefaultBackend)` if there is neither; the work does
/// not run.
///
/// # Cancel safety
///
/// As [`guarded`].
pub async fn guarded_by_default<F: Future>(
    spec: &LeaseSpec,
    work: F,
) -> Result<F::Output, GuardError> {
    let backend = default_backend().map_err(GuardError::Backend)?;
    guarded(&*backend, spec, work).await
}

/// The sequencer of the lease the current guarded work runs under, or `None` outside guarded
/// work.
///
/// Hand it to downstream systems as a fencing token. It is task-local: work spawned onto other
/// tasks does not see it; pass the value along instead.
pub fn current_sequencer() -> Option<Sequencer> {
    current_lease().map(|lease| lease.sequencer().clone())
}

/// A watcher of the lease the current guarded work runs under, or `None` outside guarded work.
///
/// Use it to check [`is_held`](LeaseWatcher::is_held) before an irreversible step, or to hand
/// [`lost`](LeaseWatcher::lost) to a task the work spawns.
pub fn current_lease() -> Option<LeaseWatcher> {
    HELD_BY_TASK
        .try_with(|held| held.last().map(|lease| lease.watcher.clone()))
        .ok()
        .flatten()
}

/// Support for the code the attribute macros generate. Not a public API.
#[doc(hidden)]
pub mod __private {
    use std::future::Future;

    /// The attribute macros' compile-time check of a literal key: a key that breaks the key rule
    /// ([`crate::key_rule_broken`]) fails the constant the macro puts beside the function, with
    /// the rule's own words.
    pub const fn assert_key(key: &str) {
        if let Some(reason) = crate::key_rule_broken(key) {
            panic!("{}", reason);
        }
    }

    /// Returns the guarded body unchanged, pinning its output to the function's declared type so
    /// that `?` and `return` inside it infer as they did before the attribute was added.
    pub fn body<T, F: Future<Output = T>>(body: F) -> F {
        body
    }

    /// Folds the outcome of a lease attribute stacked on another into one: the outer lease's
    /// error, or whatever the inner guarded call returned.
    pub fn flatten<T>(
        outcome: Result<Result<T, crate::GuardError>, crate::GuardError>,
    ) -> Result<T, crate::GuardError> {
        outcome.and_then(|inner| inner)
    }
}

#[cfg(all(test, feature = "memory"))]
mod tests {
    use std::time::Duration;

    use tokio::time::Instant;

    use super::*;
    use crate::Wait;
    use crate::memory::Memory;

    const KEY: &str = "jobs/nightly";

    fn job() -> LeaseSpec {
        LeaseSpec::leader(KEY).wait(Wait::Never)
    }

    #[tokio::test(start_paused = true)]
    async fn min_hold_keeps_the_lease_after_a_fast_job_and_releases_it_after() {
        let memory = Memory::new();
        let spec = job().min_hold(Duration::from_secs(60));
        let started = Instant::now();
        let output = guarded(&memory, &spec, async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            7
        })
        .await;
        assert_eq!(output.ok(), Some(7), "returns as soon as the work is done");
        assert_eq!(started.elapsed(), Duration::from_secs(1));

        // Another node firing the same job 30 s later (a skewed schedule) skips it.
        tokio::time::sleep(Duration::from_secs(29)).await;
        let skewed = guarded(&memory, &job(), async {}).await;
        assert!(
            skewed.as_ref().is_err_and(GuardError::is_busy),
            "{skewed:?}"
        );

        // Once 60 s have passed since the work started, the lease is free again.
        tokio::time::sleep_until(started + Duration::from_secs(60)).await;
        let next = tokio::time::timeout(
            Duration::from_secs(5),
            guarded(&memory, &job().wait(Wait::Forever), async {}),
        )
        .await;
        assert!(matches!(next, Ok(Ok(()))), "{next:?}");
        assert!(Instant::now() < started + Duration::from_secs(61));
    }

    #[tokio::test(start_paused = true)]
    async fn a_job_longer_than_min_hold_releases_at_once() {
        let memory = Memory::new();
        let spec = job().min_hold(Duration::from_secs(10));
        let output = guarded(&memory, &spec, async {
            tokio::time::sleep(Duration::from_secs(20)).await;
        })
        .await;
        assert!(output.is_ok(), "{output:?}");
        assert!(memory.sessions().is_empty(), "{:?}", memory.sessions());
    }

    #[tokio::test(start_paused = true)]
    async fn max_run_cancels_a_long_job_with_its_own_outcome_and_releases() {
        let memory = Memory::new();
        let spec = job().max_run(Duration::from_secs(300));
        let dropped = Arc::new(());
        let in_work = Arc::clone(&dropped);
        let started = Instant::now();
        let outcome = guarded(&memory, &spec, async move {
            let _held = in_work;
            std::future::pending::<()>().await
        })
        .await;
        assert!(
            matches!(&outcome, Err(GuardError::TimedOut { key, max_run })
                if key == KEY && *max_run == Duration::from_secs(300)),
            "{outcome:?}"
        );
        assert_eq!(started.elapsed(), Duration::from_secs(300));
        assert_eq!(Arc::strong_count(&dropped), 1, "the work was dropped");
        assert!(memory.sessions().is_empty(), "released");
        let message = outcome.unwrap_err().to_string();
        assert!(message.contains("max_run"), "{message}");
        let folded: Error = GuardError::TimedOut {
            key: KEY.to_owned(),
            max_run: Duration::from_secs(1),
        }
        .into();
        assert!(matches!(folded, Error::WorkTimedOut { .. }), "{folded:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn max_run_then_min_hold_keeps_the_lease_until_min_hold() {
        let memory = Memory::new();
        let spec = job()
            .min_hold(Duration::from_secs(60))
            .max_run(Duration::from_secs(60));
        let outcome = guarded(&memory, &spec, std::future::pending::<()>()).await;
        assert!(
            matches!(outcome, Err(GuardError::TimedOut { .. })),
            "{outcome:?}"
        );
        // max_run == min_hold: the release is not delayed past the bound.
        assert!(memory.sessions().is_empty(), "{:?}", memory.sessions());
    }

    #[tokio::test(start_paused = true)]
    async fn a_shutdown_releases_a_lease_whose_delayed_release_is_pending() {
        let memory = Memory::new();
        let spec = job().min_hold(Duration::from_secs(3600));
        guarded(&memory, &spec, async {}).await.expect("ran");
        assert_eq!(memory.sessions().len(), 1, "kept for min_hold");
        memory.shutdown().await;
        assert!(memory.sessions().is_empty(), "{:?}", memory.sessions());
    }

    #[test]
    fn a_schedule_that_cannot_hold_is_refused() {
        for spec in [
            job().max_run(Duration::ZERO),
            job()
                .min_hold(Duration::from_secs(61))
                .max_run(Duration::from_secs(60)),
        ] {
            assert!(
                matches!(spec.validate(), Err(Error::InvalidSchedule { .. })),
                "{spec:?}"
            );
        }
        assert!(job().min_hold(Duration::from_secs(61)).validate().is_ok());
    }
}
