//! The holder task: the one place where loss, release, shutdown and the fence are ordered.
//!
//! A backend's `acquire` ends by handing [`Keepers::start`] what it holds (a [`Hold`]). The task
//! started there runs [`keep`]: the moment loss is known, `is_held()` turns false and every
//! `lost()` future wakes, *then* the backend cleans up; on release, `is_held()` turns false
//! *before* the backend gives the lease back, so nobody else can hold it while we still think we
//! do. Release and clean-up are bounded by [`RELEASE_BOUND`]. If the runtime drops the task first
//! (the process is ending), [`Hold::abandon`] gives the lease back from a detached runtime.

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::lease::state::{Fence, LeaseState};
use crate::lease::{CheckSequencer, Lease, ReleaseRequest, detached};
use crate::{Backend, BackendKind, BoxFuture, Error, LeaseSpec, LostReason, Sequencer, Wait};

/// The longest a release (or the clean-up after a loss) may take before the holder gives up on
/// it; the backend then frees the lease when its session or connection expires.
pub const RELEASE_BOUND: Duration = Duration::from_secs(5);

/// How long past its spec's [`Wait::UpTo`](crate::Wait::UpTo) an acquire may still answer:
/// the last attempt's answer on its way. [`instrument_acquire`] ends every backend's acquire
/// there.
pub const ACQUIRE_SLACK: Duration = Duration::from_millis(500);

/// How long the one attempt of a [`Wait::Never`](crate::Wait::Never) acquire may take before
/// [`instrument_acquire`] ends it: longer than a backend's own errors take to come (lease-consul
/// fails a request that waits 5 s at its outage gate with the refusal, which names the agent's
/// connection limit), so that those come first.
pub const ATTEMPT_BOUND: Duration = Duration::from_secs(15);

/// What a backend does while it holds one lease: the part of the backend contract that
/// [`Keepers::start`] drives.
///
/// A backend author implements it for the state of one held lease (its session, its watch) and
/// never orders loss and release by hand: the holder task does that.
pub trait Hold: Send + 'static {
    /// Watches the lease until it is lost and returns why.
    ///
    /// Confirm the lease's [`Fence`] with the send time of every request the backend answered
    /// (a renewal, a blocking read); the holder task declares [`LostReason::SelfFenced`] when the
    /// fence's deadline passes, so a watch never needs its own timer for that.
    ///
    /// It may be called again after an earlier call's future was dropped unfinished (the holder
    /// task watches a lease kept until its release time anew), and must watch as before.
    fn watch(&mut self) -> impl Future<Output = LostReason> + Send;

    /// Gives the lease back. Called once, after the lease is marked released, and bounded by
    /// [`RELEASE_BOUND`].
    fn release(&mut self) -> impl Future<Output = Result<(), Error>> + Send;

    /// After the loss was published with the reason `watch` returned: a more precise reason, if
    /// one more read can tell (Consul: whether the session of a released key still exists).
    /// Loss is never delayed for it. Bounded by [`RELEASE_BOUND`]. The default refines nothing.
    fn refine(&mut self, reason: &LostReason) -> impl Future<Output = Option<LostReason>> + Send {
        let _ = reason;
        std::future::ready(None)
    }

    /// Cleans up after a loss for `reason` (as published, refined if it was), without handing
    /// the lease on faster than the backend's lock-delay would (the guarded work may still be
    /// stopping). Bounded by [`RELEASE_BOUND`].
    fn clean_up(&mut self, reason: &LostReason) -> impl Future<Output = ()> + Send;

    /// Asks the backend to keep the lease held *on its server* until `until` if it is given
    /// back before then: a lease released at a set time ([`Lease::release_at`], which a guarded
    /// call's [`min_hold`](crate::LeaseSpec::min_hold) uses) whose holder task is stopped early
    /// ([`Keepers::shutdown`], the runtime shutting down as the process exits). Returns whether the
    /// backend can.
    ///
    /// Called by the holder task, with `until` ahead, when such a release is asked for; the
    /// task then keeps the lease held and watched in this process until `until` and calls
    /// [`release`](Hold::release). A backend that returns `true` makes every later
    /// [`release`](Hold::release) and [`abandon`](Hold::abandon) called before `until` leave the
    /// lease held on its server, to be freed there by itself at `until` (as soon after as the
    /// backend can tell, and say how much later in its docs), with no request from this
    /// process: a row's or key's expiry set to `until` instead of a delete, renewals stopped
    /// instead of a release. It must not hand the lease to another holder before `until`. One
    /// called at or after `until` gives the lease back as usual.
    ///
    /// The default returns `false`: the lease is kept only while this process keeps it, and a
    /// shutdown before `until` gives it back at once.
    fn keep_until(&mut self, until: Instant) -> bool {
        let _ = until;
        false
    }

    /// The last resort, when the runtime drops the holder task before `release` or `clean_up`
    /// finished (the process is ending): a future that gives the lease back without the dying
    /// runtime. It runs on a detached runtime, and the process waits for it for about a second.
    /// It must not use connections of the old runtime. The default does nothing: the backend
    /// frees the lease when its session expires.
    fn abandon(self) -> Option<BoxFuture<'static, ()>>
    where
        Self: Sized,
    {
        None
    }
}

/// The holder tasks of one backend handle (and its clones): starts them, and shuts them down.
///
/// A backend keeps one `Keepers` and builds every [`Lease`] with [`Keepers::start`]; its
/// [`Backend::shutdown`] calls [`Keepers::shutdown`].
#[derive(Clone, Default)]
pub struct Keepers {
    generation: Arc<Mutex<Generation>>,
}

/// The tasks started since the last shutdown, and the token that stops them.
#[derive(Clone, Default)]
struct Generation {
    tracker: TaskTracker,
    stop: CancellationToken,
}

impl std::fmt::Debug for Keepers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keepers")
            .field("running", &self.current().tracker.len())
            .finish()
    }
}

impl Keepers {
    /// No holder tasks yet.
    pub fn new() -> Self {
        Self::default()
    }

    fn current(&self) -> Generation {
        self.generation
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Builds the [`Lease`] for an acquisition and starts its holder task.
    ///
    /// The task runs in a `lease.hold` span with no parent that follows from the span current
    /// here (the backend's `lease.acquire`).
    ///
    /// - `sequencer`: the acquisition's fencing token;
    /// - `fence`: its self-fencing deadline, already confirmed by the acquisition;
    /// - `backend`: answers [`Lease::check`] through [`Backend::check_sequencer`];
    /// - `hold`: what the task watches, releases and cleans up.
    ///
    /// Must be called within a tokio runtime.
    pub fn start<H: Hold>(
        &self,
        sequencer: Sequencer,
        fence: Fence,
        backend: Arc<dyn Backend>,
        hold: H,
    ) -> Lease {
        // Not a child of the acquire (nor of the request that asked for it, which ends long
        // before the lease does): it follows from it.
        let span = tracing::info_span!(parent: None, "lease.hold", sequencer = %sequencer);
        span.follows_from(tracing::Span::current());
        let generation = self.current();
        let check_sequencer: CheckSequencer = {
            let backend = Arc::clone(&backend);
            Arc::new(move |sequencer: Sequencer| {
                let backend = Arc::clone(&backend);
                Box::pin(async move { backend.check_sequencer(&sequencer).await })
            })
        };
        let (lease, keeper) = lease_and_keeper(
            sequencer,
            fence,
            check_sequencer,
            generation.stop.clone(),
            hold,
        );
        crate::runtime::spawn(generation.tracker.track_future(keeper.instrument(span)));
        lease
    }

    /// Runs `clean_up` (giving back what a cancelled acquire created) on the current runtime,
    /// tracked so [`shutdown`](Keepers::shutdown) waits for it. If the runtime drops it
    /// unfinished, or there is no runtime, `abandon` runs as in [`Hold::abandon`].
    pub fn spawn_clean_up<F, A>(&self, clean_up: F, abandon: A)
    where
        F: Future<Output = ()> + Send + 'static,
        A: FnOnce() -> Option<BoxFuture<'static, ()>> + Send + 'static,
    {
        let guard = Guard(Some(Abandon(abandon)));
        let task = async move {
            let mut guard = guard;
            clean_up.await;
            guard.disarm();
        };
        match tokio::runtime::Handle::try_current() {
            Ok(_) => {
                let tracker = self.current().tracker;
                crate::runtime::spawn(tracker.track_future(task));
            }
            // Dropping the task drops its guard, which hands over to the detached runtime.
            Err(_) => drop(task),
        }
    }

    /// Releases every lease started here that is still held, and waits for them and for every
    /// pending release or clean-up to finish, at most [`RELEASE_BOUND`] (plus a little).
    /// Leases acquired afterwards are not affected.
    ///
    /// Call it (through [`Backend::shutdown`]) before `main` returns, so the next holder takes
    /// over at once instead of waiting for the session TTL.
    pub async fn shutdown(&self) {
        let ending = std::mem::take(
            &mut *self
                .generation
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        ending.stop.cancel();
        ending.tracker.close();
        let bound = RELEASE_BOUND + Duration::from_millis(500);
        if tokio::time::timeout(bound, ending.tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                remaining = ending.tracker.len(),
                "shutdown: some releases did not finish in time; the backend frees them when their sessions expire"
            );
        }
    }
}

/// The lease handle and its holder task, not started yet: what [`Keepers::start`] spawns.
fn lease_and_keeper<H: Hold>(
    sequencer: Sequencer,
    fence: Fence,
    check_sequencer: CheckSequencer,
    stop: CancellationToken,
    hold: H,
) -> (Lease, impl Future<Output = ()> + Send + 'static) {
    let state = Arc::new(LeaseState::new(fence));
    let (release_tx, release_rx) = oneshot::channel();
    let lease = Lease::new(sequencer, Arc::clone(&state), check_sequencer, release_tx);
    let kept = Kept {
        hold,
        state: Arc::clone(&state),
    };
    (lease, keep(state, release_rx, stop, Guard(Some(kept))))
}

/// A clean-up closure, as [`Keepers::spawn_clean_up`] takes it.
struct Abandon<A>(A);

/// Owns what must be given back; hands it to the detached runtime if dropped while armed.
struct Guard<T: GuardTarget>(Option<T>);

/// What a [`Guard`] gives back: a held lease, or a cancelled acquire's leftovers.
trait GuardTarget {
    fn into_abandon(self) -> Option<BoxFuture<'static, ()>>;
}

/// A held lease, with its state: a release asked for at a set time that the holder task had not
/// yet taken up when the runtime dropped it still keeps the lease on the server
/// ([`Hold::keep_until`]).
struct Kept<H> {
    hold: H,
    state: Arc<LeaseState>,
}

impl<H: Hold> GuardTarget for Kept<H> {
    fn into_abandon(mut self) -> Option<BoxFuture<'static, ()>> {
        let released = matches!(self.state.lost_reason(), None | Some(LostReason::Released));
        if let Some(until) = self.state.release_due_at().filter(|_| released) {
            self.hold.keep_until(until);
        }
        Hold::abandon(self.hold)
    }
}

impl<A: FnOnce() -> Option<BoxFuture<'static, ()>>> GuardTarget for Abandon<A> {
    fn into_abandon(self) -> Option<BoxFuture<'static, ()>> {
        (self.0)()
    }
}

impl<T: GuardTarget> Guard<T> {
    fn disarm(&mut self) {
        self.0 = None;
    }
}

impl<T: GuardTarget> Drop for Guard<T> {
    fn drop(&mut self) {
        if let Some(clean_up) = self.0.take().and_then(GuardTarget::into_abandon) {
            detached::finish(clean_up);
        }
    }
}

/// The lease handle's one release request, as the holder task has it: still to come, or
/// received. A oneshot receiver must not be polled again once it has answered, so the two
/// states are one value, and a received request cannot be waited for a second time.
enum Release {
    /// Not asked yet: the handle may still ask, or be dropped (which asks too).
    Awaited(oneshot::Receiver<ReleaseRequest>),
    /// Asked: the reply channel if someone waits for the answer, `None` if nobody does (a
    /// dropped handle).
    Received(ReleaseRequest),
}

impl Release {
    /// The reply channel of a request already received; `None` if none was (nobody waits).
    fn received(self) -> ReleaseRequest {
        match self {
            Release::Received(reply) => reply,
            Release::Awaited(_) => None,
        }
    }

    /// The reply channel of the request, waiting for it if it has not come yet, unless the
    /// backend shuts down first; `None` if nobody waits for the answer.
    async fn reply(self, stop: &CancellationToken) -> ReleaseRequest {
        match self {
            Release::Received(reply) => reply,
            Release::Awaited(release_rx) => tokio::select! {
                biased;
                request = release_rx => request.ok().flatten(),
                () = stop.cancelled() => None,
            },
        }
    }
}

async fn keep<H: Hold>(
    state: Arc<LeaseState>,
    mut release_rx: oneshot::Receiver<ReleaseRequest>,
    stop: CancellationToken,
    mut guard: Guard<Kept<H>>,
) {
    let Some(Kept { hold, .. }) = guard.0.as_mut() else {
        return;
    };
    // The futures are dropped before a branch's handler runs, so a handler can move the
    // receiver the first branch borrowed.
    let (found, release) = tokio::select! {
        biased;
        // A dropped lease handle asks for a release with nobody waiting for the answer.
        request = &mut release_rx => (None, Release::Received(request.unwrap_or(None))),
        () = stop.cancelled() => (None, Release::Awaited(release_rx)),
        // A loss found by `Lease::check`, or by a reader past the fence deadline.
        reason = state.lost_signal() => (Some(reason), Release::Awaited(release_rx)),
        reason = state.fence().expiry() => (Some(reason), Release::Awaited(release_rx)),
        reason = hold.watch() => (Some(reason), Release::Awaited(release_rx)),
    };
    // A release at a set time (`Lease::release_at`) keeps the lease, watched, until then.
    if found.is_none() {
        hold_until_due(&state, hold, &stop).await;
    }
    let reason = match found {
        Some(reason) => reason,
        // Asked to release (or shut down), but the lease may have been lost just before: that
        // is a loss.
        None if state.is_held() && state.lose(LostReason::Released) => {
            let result = match tokio::time::timeout(RELEASE_BOUND, hold.release()).await {
                Ok(result) => result,
                Err(_) => Err(Error::ReleaseTimedOut {
                    after: RELEASE_BOUND,
                }),
            };
            guard.disarm();
            state.tally().ended(&LostReason::Released);
            match &result {
                Ok(()) => tracing::debug!("lease released"),
                Err(error) => tracing::warn!(
                    %error,
                    "lease release failed; the backend frees it when the session expires"
                ),
            }
            if let Some(reply) = release.received() {
                let _ = reply.send(result);
            }
            return;
        }
        None => state.lost_signal().await,
    };
    if state.lose(reason.clone()) {
        tracing::warn!(%reason, "lease lost");
    }
    if let Ok(Some(refined)) = tokio::time::timeout(RELEASE_BOUND, hold.refine(&reason)).await {
        state.refine(refined);
    }
    let reason = state.lost_reason().unwrap_or(reason);
    state.tally().ended(&reason);
    if tokio::time::timeout(RELEASE_BOUND, hold.clean_up(&reason))
        .await
        .is_err()
    {
        tracing::warn!(
            "clean-up after a loss timed out; the backend frees the lease when the session expires"
        );
    }
    guard.disarm();
    // Answer a release, received before or coming after the loss, once the clean-up is done:
    // the lease was lost.
    if let Some(reply) = release.reply(&stop).await {
        let _ = reply.send(Err(Error::Lost(reason)));
    }
}

/// Keeps a lease whose release was asked for at a set time held, and watched, until that time or
/// until the holder task is stopped; what is left of the time is then the backend's to keep on
/// its server ([`Hold::keep_until`]). A loss meanwhile is declared on `state`.
async fn hold_until_due<H: Hold>(state: &LeaseState, hold: &mut H, stop: &CancellationToken) {
    let Some(until) = state.release_due_at() else {
        return;
    };
    if !state.is_held() {
        return;
    }
    let on_server = hold.keep_until(until);
    tracing::debug!(
        remaining = ?until.saturating_duration_since(Instant::now()),
        on_server,
        "keeping the lease until its release time"
    );
    let lost = tokio::select! {
        biased;
        () = stop.cancelled() => None,
        reason = state.lost_signal() => Some(reason),
        reason = state.fence().expiry() => Some(reason),
        reason = hold.watch() => Some(reason),
        () = tokio::time::sleep_until(until) => None,
    };
    if let Some(reason) = lost {
        if state.lose(reason.clone()) {
            tracing::warn!(%reason, "lease lost while kept until its release time");
        }
    }
}

/// How every backend's [`Backend::acquire`](crate::Backend::acquire) runs: `acquire` (the
/// backend's protocol, ending in [`Keepers::start`]) in a `lease.acquire` span, a child of the
/// caller's (the lease's `lease.hold` span follows from it), recording the acquisition's
/// metrics (the `metrics` module) under `backend`'s label, and held to the spec's wait: with
/// [`Wait::UpTo(d)`](crate::Wait::UpTo), an acquire the backend has not answered within `d` plus
/// [`ACQUIRE_SLACK`] (with [`Wait::Never`](crate::Wait::Never), within [`ATTEMPT_BOUND`]) is
/// dropped (a backend's acquire is cancel safe: what it had taken is given back) and answers
/// [`Error::AcquireTimedOut`], however slow or silent the server is.
///
/// ```
/// use lease_core::backend::instrument_acquire;
/// use lease_core::{BackendKind, BoxFuture, Error, Lease, LeaseSpec};
///
/// fn acquire<'a>(spec: &'a LeaseSpec) -> BoxFuture<'a, Result<Lease, Error>> {
///     instrument_acquire(BackendKind::Memory, spec, async move {
///         // The backend's protocol, ending in `Keepers::start`.
///         Err(Error::config("not a real backend"))
///     })
/// }
/// ```
pub fn instrument_acquire<'a>(
    backend: BackendKind,
    spec: &'a LeaseSpec,
    acquire: impl Future<Output = Result<Lease, Error>> + Send + 'a,
) -> BoxFuture<'a, Result<Lease, Error>> {
    let span = tracing::info_span!(
        "lease.acquire",
        key = spec.key(),
        backend = backend.as_str()
    );
    let bounded = async move {
        let bound = match spec.wait_policy() {
            Wait::Forever => return acquire.await,
            Wait::UpTo(wait) => wait.saturating_add(ACQUIRE_SLACK),
            Wait::Never => ATTEMPT_BOUND,
        };
        let started = Instant::now();
        match tokio::time::timeout(bound, acquire).await {
            Ok(acquired) => acquired,
            Err(_) => Err(Error::AcquireTimedOut {
                key: spec.key().to_owned(),
                waited: started.elapsed(),
            }),
        }
    };
    Box::pin(crate::metrics::acquire(backend, spec, bounded).instrument(span))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::time::Instant;

    /// What a test lease's backend was asked to do.
    #[derive(Clone, Default)]
    struct Calls(Arc<Mutex<Vec<String>>>);

    impl Calls {
        fn push(&self, call: String) {
            self.0
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(call);
        }

        fn taken(&self) -> Vec<String> {
            std::mem::take(&mut *self.0.lock().unwrap_or_else(PoisonError::into_inner))
        }
    }

    /// The backend's side of a held lease, reduced to recording what the holder task asks of
    /// it: its watch never reports a loss, so every loss here is one the lease's state knew
    /// before the holder task ran.
    struct Recorded(Calls);

    impl Hold for Recorded {
        async fn watch(&mut self) -> LostReason {
            std::future::pending().await
        }

        async fn release(&mut self) -> Result<(), Error> {
            self.0.push("release".to_owned());
            Ok(())
        }

        async fn clean_up(&mut self, reason: &LostReason) {
            self.0.push(format!("clean_up: {reason}"));
        }
    }

    /// A lease whose backend answers every check with `check`, and its holder task, spawned so
    /// that a panic in it is seen through its `JoinHandle`.
    fn spawned(
        fence: Fence,
        check: LostReason,
        calls: &Calls,
    ) -> (Lease, tokio::task::JoinHandle<()>) {
        let check_sequencer: CheckSequencer = Arc::new(move |_| {
            let check = check.clone();
            Box::pin(async move { Err(Error::Lost(check)) })
        });
        let sequencer = Sequencer::new(BackendKind::Memory, "k", 1, "holder");
        let (lease, keeper) = lease_and_keeper(
            sequencer,
            fence,
            check_sequencer,
            CancellationToken::new(),
            Recorded(calls.clone()),
        );
        (lease, tokio::spawn(keeper))
    }

    /// An acquire the backend never answers ends at its wait plus the slack (`Wait::Never`: at
    /// the attempt's bound), naming the key; `Wait::Forever` is not bounded, and an answer in
    /// time is the backend's.
    #[tokio::test(start_paused = true)]
    async fn an_acquire_ends_within_its_wait_whatever_the_backend_does() {
        let spec = LeaseSpec::leader("jobs/nightly").wait(Wait::UpTo(Duration::from_secs(2)));
        let started = Instant::now();
        let silent = instrument_acquire(BackendKind::Memory, &spec, std::future::pending());
        match silent.await {
            Err(Error::AcquireTimedOut { key, waited }) => {
                assert_eq!(key, "jobs/nightly");
                assert_eq!(waited, Duration::from_secs(2) + ACQUIRE_SLACK);
                assert_eq!(started.elapsed(), waited);
            }
            other => panic!("expected AcquireTimedOut, got {other:?}"),
        }
        let answered = instrument_acquire(BackendKind::Memory, &spec, async {
            tokio::time::sleep(Duration::from_secs(2)).await;
            Err(Error::Busy {
                key: "jobs/nightly".into(),
                waited: Duration::from_secs(2),
            })
        });
        assert!(answered.await.is_err_and(|e| e.is_busy()));
        let never = spec.clone().wait(Wait::Never);
        let started = Instant::now();
        let silent = instrument_acquire(BackendKind::Memory, &never, std::future::pending());
        match silent.await {
            Err(Error::AcquireTimedOut { waited, .. }) => {
                assert_eq!(waited, ATTEMPT_BOUND);
                assert_eq!(started.elapsed(), waited);
            }
            other => panic!("expected AcquireTimedOut, got {other:?}"),
        }
        let forever = spec.clone().wait(Wait::Forever);
        let slow = instrument_acquire(BackendKind::Memory, &forever, async {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            Err(Error::config("answered after an hour"))
        });
        assert!(matches!(slow.await, Err(Error::Config { .. })));
    }

    async fn assert_ended_without_panic(keeper: tokio::task::JoinHandle<()>) {
        match keeper.await {
            Ok(()) => {}
            Err(error) if error.is_panic() => {
                std::panic::resume_unwind(error.into_panic());
            }
            Err(error) => panic!("the holder task did not finish: {error}"),
        }
    }

    /// Break 3 of issue 33: `check` found the lease lost, then the handle was dropped before the
    /// holder task ran. The task sees the drop's request first (its select is biased), finds the
    /// lease not held, and must answer nobody rather than poll the spent receiver again.
    #[tokio::test]
    async fn a_lease_dropped_after_check_found_it_lost_is_cleaned_up_without_a_panic() {
        let calls = Calls::default();
        let taken = LostReason::KeyTaken {
            lock_index: 2,
            session: "other".to_owned(),
        };
        let (lease, keeper) = spawned(Fence::unbounded(), taken.clone(), &calls);
        // The holder task is waiting in its select.
        tokio::task::yield_now().await;
        assert!(lease.is_held());
        let checked = lease.check().await;
        assert!(
            matches!(&checked, Err(Error::Lost(reason)) if *reason == taken),
            "{checked:?}"
        );
        drop(lease);
        assert_ended_without_panic(keeper).await;
        assert_eq!(calls.taken(), [format!("clean_up: {taken}")]);
    }

    /// The same with the loss found by a reader past the fence deadline (a paused process),
    /// before the holder task's own timer fired.
    #[tokio::test(start_paused = true)]
    async fn a_lease_dropped_after_a_reader_found_it_past_its_fence_is_cleaned_up_without_a_panic()
    {
        let calls = Calls::default();
        let fence = Fence::new(Duration::from_secs(9), Instant::now());
        let (lease, keeper) = spawned(fence, LostReason::SessionInvalidated, &calls);
        tokio::task::yield_now().await;
        tokio::time::advance(Duration::from_secs(10)).await;
        assert!(!lease.is_held(), "past the fence deadline");
        drop(lease);
        assert_ended_without_panic(keeper).await;
        let calls = calls.taken();
        assert!(
            matches!(&calls[..], [clean_up] if clean_up.starts_with("clean_up: ")),
            "{calls:?}"
        );
    }

    /// A release asked for after the loss is answered with the loss, once the clean-up is done.
    #[tokio::test]
    async fn a_release_after_a_loss_the_state_knew_reports_the_loss() {
        let calls = Calls::default();
        let (lease, keeper) = spawned(Fence::unbounded(), LostReason::KeyDeleted, &calls);
        tokio::task::yield_now().await;
        let _ = lease.check().await;
        let released = lease.release().await;
        assert!(
            matches!(&released, Err(Error::Lost(LostReason::KeyDeleted))),
            "{released:?}"
        );
        assert_ended_without_panic(keeper).await;
        assert_eq!(
            calls.taken(),
            [format!("clean_up: {}", LostReason::KeyDeleted)]
        );
    }
}

#[cfg(all(test, feature = "memory"))]
mod release_at_tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use super::*;

    /// A hold that records what the holder task asks of it.
    struct Recorded(Arc<Mutex<Vec<String>>>);

    impl Recorded {
        fn log(&self, event: impl Into<String>) {
            self.0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(event.into());
        }
    }

    impl Hold for Recorded {
        async fn watch(&mut self) -> LostReason {
            std::future::pending().await
        }

        async fn release(&mut self) -> Result<(), Error> {
            self.log("release");
            Ok(())
        }

        async fn clean_up(&mut self, _reason: &LostReason) {
            self.log("clean_up");
        }

        fn keep_until(&mut self, _until: Instant) -> bool {
            self.log("keep_until");
            true
        }

        fn abandon(self) -> Option<BoxFuture<'static, ()>> {
            self.log("abandon");
            None
        }
    }

    fn start(keepers: &Keepers, log: &Arc<Mutex<Vec<String>>>) -> Lease {
        keepers.start(
            Sequencer::new(BackendKind::Memory, "jobs/nightly", 1, "h"),
            Fence::unbounded(),
            Arc::new(crate::memory::Memory::new()),
            Recorded(Arc::clone(log)),
        )
    }

    /// A shutdown before the release time hands the rest to the backend: `keep_until`, then
    /// `release` (which the backend turns into a hold on its server).
    #[tokio::test]
    async fn a_shutdown_before_the_release_time_asks_the_backend_to_keep_the_lease() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let keepers = Keepers::new();
        let lease = start(&keepers, &log);
        let watcher = lease.watcher();
        lease.release_at(Instant::now() + Duration::from_secs(3600));
        tokio::time::timeout(Duration::from_secs(5), keepers.shutdown())
            .await
            .unwrap();
        assert_eq!(*log.lock().unwrap(), ["keep_until", "release"]);
        assert_eq!(watcher.lost_reason(), Some(LostReason::Released));
    }

    /// A runtime that ends before the holder task took the release up still keeps the lease:
    /// `keep_until` before `abandon`.
    #[test]
    fn a_runtime_that_ends_first_still_asks_the_backend_to_keep_the_lease() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let lease = start(&Keepers::new(), &log);
            lease.release_at(Instant::now() + Duration::from_secs(3600));
        });
        drop(runtime);
        assert_eq!(*log.lock().unwrap(), ["keep_until", "abandon"]);
    }
}
