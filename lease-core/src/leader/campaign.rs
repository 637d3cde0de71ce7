//! The campaign loop: acquire the lease, run the worker while it is held, cancel the worker the
//! moment it is lost, campaign again with backoff, and hand the lease on when stepping down.
//!
//! The loop publishes what it does through the campaign's shared state (`handle`): the current
//! [`Term`], who leads, its [`CampaignState`], and [`LeaderEvent`]s.

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::io::Write as _;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::event::{AfterWorker, CampaignEnd, EventSink, LeaderEvent};
use super::handle::{CampaignHandle, CampaignState, Shared, Term, announce_leaders, emit, lock};
use super::observe::LeaderWatch;
use crate::backoff::Backoff;
use crate::{Backend, BoxError, Error, Lease, LeaseSpec, LeaseWatcher, LostReason, Target};

/// A campaign for a leader lease: one election for its key in this process, shared by a worker,
/// leader-only routes and health checks through its [`CampaignHandle`].
///
/// Build it with [`try_new`](Self::try_new), take [`handle`](Self::handle)s for whatever needs to
/// know about the election, then run it once, with a worker ([`run_until`](Self::run_until)) or
/// without ([`hold_until`](Self::hold_until)).
///
/// # Examples
///
/// ```no_run
/// # async fn example() -> Result<(), lease_core::Error> {
/// use lease_core::leader::{Campaign, LeaderEvent};
/// use lease_core::memory::Memory;
/// use lease_core::LeaseSpec;
/// use lease_core::CancellationToken;
///
/// let shutdown = CancellationToken::new();
/// let stop = shutdown.clone();
/// tokio::spawn(async move {
///     // SIGTERM or Ctrl-C: step down, so a follower leads at once.
///     lease_core::shutdown_signal().await;
///     stop.cancel();
/// });
/// Campaign::try_new(Memory::new(), LeaseSpec::leader("service/reports/leader").value("node-1"))?
///     .on_event(|event| {
///         if let LeaderEvent::Elected { sequencer } = &event {
///             println!("leading as {sequencer}");
///         }
///     })
///     .run_until(shutdown, |lease| async move {
///         loop {
///             // Leader-only work; cancelled at an await point the moment the lease is lost.
///             println!("tick under {}", lease.sequencer());
///             tokio::time::sleep(std::time::Duration::from_secs(1)).await;
///         }
///     })
///     .await?;
/// # Ok(())
/// # }
/// ```
#[must_use = "a campaign does nothing until `run_until` or `hold_until` is awaited"]
pub struct Campaign {
    backend: Arc<dyn Backend>,
    spec: LeaseSpec,
    min_backoff: Duration,
    max_backoff: Duration,
    after_worker: AfterWorker,
    drain_timeout: Duration,
    on_event: Option<EventSink>,
    shared: Arc<Shared>,
}

impl fmt::Debug for Campaign {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Campaign")
            .field("backend", &self.backend)
            .field("spec", &self.spec)
            .field("min_backoff", &self.min_backoff)
            .field("max_backoff", &self.max_backoff)
            .field("after_worker", &self.after_worker)
            .field("drain_timeout", &self.drain_timeout)
            .finish_non_exhaustive()
    }
}

impl Campaign {
    /// The default first backoff after a failure.
    pub const DEFAULT_MIN_BACKOFF: Duration = Duration::from_millis(100);
    /// The default longest backoff.
    pub const DEFAULT_MAX_BACKOFF: Duration = Duration::from_secs(10);
    /// The default [`drain_timeout`](Self::drain_timeout).
    pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

    /// A campaign for the lease `spec` names (normally [`LeaseSpec::leader`] with the default
    /// [`Wait::Forever`](crate::Wait::Forever); a semaphore spec runs the worker on up to `limit`
    /// nodes at once), after checking `spec` ([`LeaseSpec::validate`]): an invalid key, TTL,
    /// lock-delay or limit fails here rather than when the campaign runs.
    ///
    /// `backend` is any backend: by value (`Memory::new()`, `Consul::from_env()?`), in an `Arc`,
    /// or an `Arc<dyn Backend>` chosen at start-up, shared as it is
    /// ([`into_shared`](crate::backend::into_shared)).
    pub fn try_new(backend: impl Backend, spec: LeaseSpec) -> Result<Self, Error> {
        spec.validate()?;
        Ok(Self::new(backend, spec))
    }

    /// [`try_new`](Self::try_new) without the check: an invalid spec is reported when the
    /// campaign runs, as the error of [`run_until`](Self::run_until) and
    /// [`CampaignState::Failed`]. Prefer `try_new`.
    pub fn new(backend: impl Backend, spec: LeaseSpec) -> Self {
        let backend = crate::backend::into_shared(backend);
        let watch = match spec.target() {
            Target::Leader { key } => Some(LeaderWatch::new(Arc::clone(&backend), key.clone())),
            _ => None,
        };
        let shared = Arc::new(Shared::new(
            spec.key().to_owned(),
            spec.advertised_value().to_vec(),
            watch,
        ));
        Campaign {
            backend,
            spec,
            min_backoff: Self::DEFAULT_MIN_BACKOFF,
            max_backoff: Self::DEFAULT_MAX_BACKOFF,
            after_worker: AfterWorker::default(),
            drain_timeout: Self::DEFAULT_DRAIN_TIMEOUT,
            on_event: None,
            shared,
        }
    }

    /// A handle on this campaign: its current term, who leads, its state and events. Take as
    /// many as needed (for a leader-only layer, a health check...) before running it.
    pub fn handle(&self) -> CampaignHandle {
        CampaignHandle {
            shared: Arc::clone(&self.shared),
        }
    }

    /// The backoff after a failure (acquire error, failed or panicking worker): starts at `min`,
    /// doubles with each consecutive failure up to `max`, and returns to `min` after an election
    /// that ends in a loss or a finished worker. After a loss, the campaign waits `min` plus the
    /// spec's [settle time](LeaseSpec::settle), so that a contender that was already waiting
    /// (and settles before it takes the lease) takes over, rather than this node again.
    pub fn backoff(mut self, min: Duration, max: Duration) -> Self {
        self.min_backoff = min;
        self.max_backoff = max.max(min);
        self
    }

    /// What to do when the worker returns `Ok(())`. Default: [`AfterWorker::Stop`].
    pub fn after_worker_returns(mut self, after: AfterWorker) -> Self {
        self.after_worker = after;
        self
    }

    /// How long a voluntary step-down (shutdown, or the worker returned) keeps the lease for
    /// the work in flight under the term ([`Term::begin`]: leader-only requests) to finish.
    ///
    /// Stepping down, the campaign refuses new work at once and cancels the worker, then waits
    /// until no [`TermGuard`](super::TermGuard) is left or `timeout` has passed, and only then
    /// releases the lease; the release cancels whatever is still running. With no work in flight
    /// the lease is released at once. A loss never waits. Default:
    /// [`DEFAULT_DRAIN_TIMEOUT`](Self::DEFAULT_DRAIN_TIMEOUT) (10 s); `Duration::ZERO` releases
    /// at once.
    pub fn drain_timeout(mut self, timeout: Duration) -> Self {
        self.drain_timeout = timeout;
        self
    }

    /// Calls `on_event` for every [`LeaderEvent`]. It is called from the campaign's tasks: keep it
    /// short (log, or send on a channel). [`CampaignHandle::events`] offers the same events to
    /// any number of receivers.
    pub fn on_event(mut self, on_event: impl Fn(LeaderEvent) + Send + Sync + 'static) -> Self {
        self.on_event = Some(Arc::new(on_event));
        self
    }

    /// Campaigns until `shutdown` is cancelled (or the worker finishes, see [`AfterWorker`]).
    ///
    /// Each election publishes a [`Term`] on the campaign's handles and spawns `worker(lease)` as
    /// a task; `lease` is a [`LeaseWatcher`] carrying the sequencer to hand to downstream
    /// systems. The task is aborted (its future dropped at its next await point) as soon as the
    /// lease is lost or the campaign steps down, and the lease is only released or reported lost
    /// after the worker is gone. A panic in the worker is caught by the task and reported as
    /// [`LeaderEvent::WorkerPanicked`]; it never ends the campaign.
    ///
    /// Inside the worker's task, [`current_sequencer`](crate::current_sequencer) and
    /// [`current_lease`](crate::current_lease) answer the term's lease, and a guarded call on the
    /// campaign's key fails at once with [`GuardError::AlreadyHeld`](crate::GuardError::AlreadyHeld)
    /// rather than waiting for the worker's own lease. A campaign run from guarded work that
    /// already holds its key ends at once with [`Error::AlreadyHeld`].
    ///
    /// Errors are retried exactly when [`Error::is_transient`] says so. Returns `Err` for an
    /// error retrying cannot fix: an invalid spec, a key used by another kind of lock, a
    /// permission or configuration error; the handles then report [`CampaignState::Failed`].
    /// Such an end is logged at ERROR and, when no tracing subscriber is installed (nothing would
    /// show that event), also said in one line on stderr: `lease: the campaign for "<key>"
    /// failed and will not retry: <error>`.
    ///
    /// # Spans
    ///
    /// The campaign and its worker run in the caller's span: the span the returned future is
    /// polled in (`.instrument(span)`), or, when it is polled outside any span (handed to
    /// [`tokio::spawn`]), the span that was current where `run_until` was called. Each
    /// acquisition's `lease.acquire` span is a child of it; the `lease.hold` span that lives as
    /// long as the lease has no parent and follows from `lease.acquire`.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future aborts the worker and drops the lease, which the backend then releases
    /// in the background; on this path the release is not ordered after the worker's end (the
    /// abort takes effect at the worker's next await point), and work in flight is not drained.
    /// Prefer cancelling `shutdown`, which steps down in order.
    pub fn run_until<W, Fut>(
        self,
        shutdown: CancellationToken,
        mut worker: W,
    ) -> impl Future<Output = Result<CampaignEnd, Error>>
    where
        W: FnMut(LeaseWatcher) -> Fut + Send,
        Fut: Future<Output = Result<(), BoxError>> + Send + 'static,
    {
        let caller = tracing::Span::current();
        async move {
            let polled_in = tracing::Span::current();
            let span = if polled_in.is_none() {
                caller
            } else {
                polled_in
            };
            let mut run = RunGuard::start(Arc::clone(&self.shared));
            let result = self.campaign(&shutdown, &mut worker).instrument(span).await;
            run.finish(&result);
            result
        }
    }

    /// [`run_until`](Self::run_until) without a worker: for a campaign whose terms are used
    /// elsewhere (leader-only routes, a health check), through its handles.
    pub fn hold_until(
        self,
        shutdown: CancellationToken,
    ) -> impl Future<Output = Result<CampaignEnd, Error>> {
        self.run_until(shutdown, |_lease| {
            std::future::pending::<Result<(), BoxError>>()
        })
    }

    fn emit(&self, event: LeaderEvent) {
        emit(&self.shared, self.on_event.as_ref(), event);
    }

    async fn campaign<W, Fut>(
        &self,
        shutdown: &CancellationToken,
        worker: &mut W,
    ) -> Result<CampaignEnd, Error>
    where
        W: FnMut(LeaseWatcher) -> Fut + Send,
        Fut: Future<Output = Result<(), BoxError>> + Send + 'static,
    {
        self.spec.validate()?;
        // Campaigning from guarded work on the same key would wait for this task itself.
        crate::guard::refuse_if_held_by_this_task(self.spec.key())?;
        let _observing = self.shared.watch.as_ref().map(LeaderWatch::start);
        let _announcer = self.shared.watch.as_ref().map(|_| {
            AbortOnDrop(crate::runtime::spawn(
                announce_leaders(Arc::clone(&self.shared), self.on_event.clone()).in_current_span(),
            ))
        });
        let mut backoff = Backoff::new(self.min_backoff, self.max_backoff);
        loop {
            let acquired = tokio::select! {
                biased;
                () = shutdown.cancelled() => return Ok(CampaignEnd::Shutdown),
                acquired = self.backend.acquire(&self.spec) => acquired,
            };
            let lease = match acquired {
                Ok(lease) => lease,
                Err(error) if error.is_transient() => {
                    let retry_in = backoff.next_pause();
                    tracing::event!(super::RETRY_LEVEL, %error, ?retry_in, "campaign: acquire failed, retrying");
                    let error = Arc::new(error);
                    *lock(&self.shared.last_error) = Some(Arc::clone(&error));
                    self.emit(LeaderEvent::AcquireFailed { error, retry_in });
                    if sleep_unless_shutdown(retry_in, shutdown).await {
                        return Ok(CampaignEnd::Shutdown);
                    }
                    continue;
                }
                Err(error) => {
                    tracing::error!(%error, key = %self.shared.key, "campaign: cannot campaign; retrying cannot fix this");
                    return Err(error);
                }
            };
            let sequencer = lease.sequencer().clone();
            tracing::info!(%sequencer, "campaign: elected");
            let term = Term::new(lease.watcher());
            self.shared.begin_term(&term);
            self.emit(LeaderEvent::Elected {
                sequencer: sequencer.clone(),
            });
            self.refresh_leader();

            let watcher = lease.watcher();
            let work = worker(watcher.clone());
            // A task of its own, so a panic is caught as a JoinError; the watcher also drops the
            // work from inside the task the moment the lease is lost.
            // Aborted if this future is dropped mid-term: a detached worker would run on after
            // the lease it needs is gone.
            // Recorded as held by the worker's task: `current_sequencer()` answers inside it, and
            // a guarded call on this key from it fails at once instead of waiting for itself.
            // In the campaign's span, which is the caller's (see `run_until`).
            let work = crate::guard::run_as_held(self.spec.key(), watcher.clone(), async move {
                watcher.run(work).await
            });
            let mut task: AbortOnDrop<Result<Result<(), BoxError>, LostReason>> =
                AbortOnDrop(crate::runtime::spawn(work.in_current_span()));
            let (outcome, worker_ended) = tokio::select! {
                biased;
                () = shutdown.cancelled() => (TermEnd::Shutdown, false),
                reason = lease.lost() => (TermEnd::Lost(reason), false),
                joined = &mut task => (TermEnd::of_worker(joined), true),
            };
            if let TermEnd::Lost(reason) = &outcome {
                // Recorded at the loss, before the worker has stopped: readiness reads it.
                *lock(&self.shared.last_loss) = Some((reason.clone(), Instant::now()));
            }
            if !worker_ended {
                task.0.abort();
                // Wait until the worker's future is really dropped before anyone else may lead.
                if let Err(join_error) = (&mut task).await {
                    if join_error.is_panic() {
                        let message = panic_message(join_error.into_panic());
                        tracing::error!(%sequencer, %message, "campaign: the worker panicked as its term ended");
                    }
                }
            }
            let failure = match outcome {
                TermEnd::Shutdown => {
                    self.step_down(&term, lease).await;
                    tracing::info!(%sequencer, "campaign: released on shutdown");
                    self.end_term();
                    self.emit(LeaderEvent::Released { sequencer });
                    return Ok(CampaignEnd::Shutdown);
                }
                TermEnd::Lost(reason) => {
                    drop(lease);
                    tracing::warn!(%sequencer, %reason, "campaign: lost the lease; worker cancelled");
                    self.end_term();
                    self.emit(LeaderEvent::Lost { sequencer, reason });
                    backoff.reset();
                    // Longer than the settle time of the contenders that were waiting: one of
                    // them takes over, not this node again with a session of its own.
                    let pause = self.min_backoff + self.spec.settle_time();
                    if sleep_unless_shutdown(pause, shutdown).await {
                        return Ok(CampaignEnd::Shutdown);
                    }
                    continue;
                }
                TermEnd::Finished => {
                    self.step_down(&term, lease).await;
                    tracing::info!(%sequencer, "campaign: worker finished; lease released");
                    self.end_term();
                    self.emit(LeaderEvent::WorkerFinished { sequencer });
                    match self.after_worker {
                        AfterWorker::Stop => return Ok(CampaignEnd::WorkerFinished),
                        AfterWorker::Recampaign => {
                            backoff.reset();
                            // A worker with nothing to do must not turn the campaign into a busy
                            // loop of sessions, nor keep the lease from the other nodes.
                            if sleep_unless_shutdown(self.min_backoff, shutdown).await {
                                return Ok(CampaignEnd::Shutdown);
                            }
                            continue;
                        }
                    }
                }
                TermEnd::Failed(error) => {
                    self.step_down(&term, lease).await;
                    tracing::warn!(%sequencer, %error, "campaign: worker failed; stepped down");
                    LeaderEvent::WorkerFailed {
                        sequencer,
                        error: Arc::from(error),
                    }
                }
                TermEnd::Panicked(join_error) => {
                    self.step_down(&term, lease).await;
                    let message = if join_error.is_panic() {
                        panic_message(join_error.into_panic())
                    } else {
                        "the worker task was cancelled (runtime shutting down)".to_owned()
                    };
                    tracing::error!(%sequencer, %message, "campaign: worker panicked; stepped down");
                    LeaderEvent::WorkerPanicked { sequencer, message }
                }
            };
            self.end_term();
            self.emit(failure);
            if sleep_unless_shutdown(backoff.next_pause(), shutdown).await {
                return Ok(CampaignEnd::Shutdown);
            }
        }
    }

    /// Steps down voluntarily: refuses new work under `term`, waits for the work in flight (at
    /// most the drain timeout, and not past a loss), then releases the lease.
    async fn step_down(&self, term: &Term, lease: Lease) {
        term.step_down();
        let in_flight = term.in_flight();
        if in_flight > 0 {
            tracing::info!(sequencer = %term.sequencer(), in_flight, timeout = ?self.drain_timeout, "campaign: stepping down; waiting for the work in flight");
            let drained = tokio::select! {
                biased;
                () = term.drained() => true,
                _ = lease.lost() => true,
                () = tokio::time::sleep(self.drain_timeout) => false,
            };
            if !drained {
                tracing::warn!(sequencer = %term.sequencer(), in_flight = term.in_flight(), "campaign: work still in flight after the drain timeout; releasing, which cancels it");
            }
        }
        if let Err(error) = lease.release().await {
            tracing::warn!(%error, "campaign: release failed; the backend frees the lease when the session expires");
        }
    }

    /// The term is over: handles no longer see it.
    fn end_term(&self) {
        self.shared.end_term();
        self.refresh_leader();
    }

    fn refresh_leader(&self) {
        self.shared.refresh_leader(|leader| {
            self.emit(LeaderEvent::LeaderChanged { leader });
        });
    }
}

/// Campaigns for `spec` on `backend` and runs `worker` while elected, until `shutdown` is
/// cancelled. Shorthand for [`Campaign::new`] + [`Campaign::run_until`]; see there.
pub fn run<W, Fut>(
    backend: impl Backend,
    spec: LeaseSpec,
    shutdown: CancellationToken,
    worker: W,
) -> impl Future<Output = Result<CampaignEnd, Error>>
where
    W: FnMut(LeaseWatcher) -> Fut + Send,
    Fut: Future<Output = Result<(), BoxError>> + Send + 'static,
{
    Campaign::new(backend, spec).run_until(shutdown, worker)
}

/// Marks the campaign running, and its end (or abandonment) on the handles.
struct RunGuard {
    shared: Arc<Shared>,
    finished: bool,
}

impl RunGuard {
    fn start(shared: Arc<Shared>) -> Self {
        shared.state.send_replace(CampaignState::Running);
        RunGuard {
            shared,
            finished: false,
        }
    }

    fn finish(&mut self, result: &Result<CampaignEnd, Error>) {
        self.finished = true;
        self.shared.end_term();
        self.shared.state.send_replace(match result {
            Ok(end) => CampaignState::Ended(*end),
            Err(error) => {
                say_failed_without_subscriber(&self.shared.key, error);
                CampaignState::Failed(error.to_string())
            }
        });
    }
}

/// A campaign that ends for good must not end unseen: when no tracing subscriber would show its
/// error event (none is installed, globally or for this thread), one line on stderr says so.
fn say_failed_without_subscriber(key: &str, error: &Error) {
    let unseen = tracing::dispatcher::get_default(|dispatch| {
        dispatch.is::<tracing::subscriber::NoSubscriber>()
    });
    if unseen {
        // Not `eprintln!`, which panics when stderr is closed.
        let _ = writeln!(
            std::io::stderr(),
            "lease: the campaign for {key:?} failed and will not retry: {error}"
        );
    }
}

impl Drop for RunGuard {
    fn drop(&mut self) {
        if !self.finished {
            self.shared.end_term();
            self.shared.state.send_replace(CampaignState::Abandoned);
        }
    }
}

/// How a term ended.
enum TermEnd {
    /// The campaign was told to shut down.
    Shutdown,
    /// The lease was lost: seen by the campaign, or by the worker's run, which then returned.
    Lost(LostReason),
    /// The worker returned `Ok`.
    Finished,
    /// The worker returned an error.
    Failed(BoxError),
    /// The worker's task panicked, or was cancelled with its runtime.
    Panicked(tokio::task::JoinError),
}

impl TermEnd {
    /// What the worker's task ended with: its result, inside the run that drops it on a loss,
    /// inside the task.
    fn of_worker(
        joined: Result<Result<Result<(), BoxError>, LostReason>, tokio::task::JoinError>,
    ) -> TermEnd {
        match joined {
            Ok(Ok(Ok(()))) => TermEnd::Finished,
            Ok(Ok(Err(error))) => TermEnd::Failed(error),
            Ok(Err(reason)) => TermEnd::Lost(reason),
            Err(join_error) => TermEnd::Panicked(join_error),
        }
    }
}

/// A task that is aborted when its handle is dropped; awaiting it awaits the task.
struct AbortOnDrop<T>(JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl<T> Future for AbortOnDrop<T> {
    type Output = Result<T, tokio::task::JoinError>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        std::pin::Pin::new(&mut self.0).poll(cx)
    }
}

/// Sleeps `delay`; returns true if shutdown was requested meanwhile (or before).
async fn sleep_unless_shutdown(delay: Duration, shutdown: &CancellationToken) -> bool {
    tokio::select! {
        biased;
        () = shutdown.cancelled() => true,
        // `sleep` saturates a delay too long to add to now; `sleep_until(now + delay)` would panic.
        () = tokio::time::sleep(delay) => false,
    }
}

fn panic_message(payload: Box<dyn Any + Send>) -> String {
    match payload.downcast::<String>() {
        Ok(message) => *message,
        Err(payload) => match payload.downcast::<&'static str>() {
            Ok(message) => (*message).to_owned(),
            Err(_) => "a panic with a non-string payload".to_owned(),
        },
    }
}

#[cfg(all(test, feature = "memory"))]
mod tests {
    use std::process::Command;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::memory::Memory;

    /// Set in the child processes of the stderr tests, which run `campaign_fails_in_a_child`.
    const CHILD: &str = "LEASE_CORE_CAMPAIGN_FAILS_CHILD";
    const LINE: &str = "lease: the campaign for \"jobs\" failed and will not retry: ";

    /// Runs `campaign_fails_in_a_child` in a process of its own (this test binary), with or
    /// without a subscriber, and returns what it wrote on stderr.
    fn child_stderr(with_subscriber: bool) -> String {
        let exe = std::env::current_exe().expect("the test binary's path");
        let output = Command::new(exe)
            .args([
                "--exact",
                "leader::campaign::tests::campaign_fails_in_a_child",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(
                CHILD,
                if with_subscriber {
                    "subscriber"
                } else {
                    "none"
                },
            )
            .output()
            .expect("run the test binary");
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        assert!(
            output.status.success(),
            "the child failed: {}\n{stderr}",
            output.status
        );
        stderr
    }

    #[test]
    fn a_failed_campaign_says_so_on_stderr_when_no_subscriber_is_installed() {
        let stderr = child_stderr(false);
        let lines: Vec<&str> = stderr.lines().filter(|l| l.starts_with(LINE)).collect();
        assert_eq!(
            lines.len(),
            1,
            "one line, naming the key; stderr:\n{stderr}"
        );
        assert!(
            lines[0].contains("another kind of lock"),
            "the line gives the error: {stderr}"
        );
    }

    #[test]
    fn a_failed_campaign_leaves_stderr_to_the_subscriber_when_one_is_installed() {
        let stderr = child_stderr(true);
        assert!(
            !stderr.contains("lease: the campaign"),
            "nothing on stderr beside the ERROR event: {stderr}"
        );
        assert!(
            stderr.contains("child: 1 error event(s)"),
            "the subscriber saw the error event: {stderr}"
        );
    }

    /// Counts ERROR events, as a real subscriber would show them.
    struct CountErrors(Arc<AtomicUsize>);

    impl tracing::Subscriber for CountErrors {
        fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
            tracing::span::Id::from_u64(1)
        }
        fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
        fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
        fn event(&self, event: &tracing::Event<'_>) {
            if *event.metadata().level() == tracing::Level::ERROR {
                self.0.fetch_add(1, Ordering::Relaxed);
            }
        }
        fn enter(&self, _: &tracing::span::Id) {}
        fn exit(&self, _: &tracing::span::Id) {}
    }

    /// The child of the tests above: a campaign for a semaphore on a key a leader lock uses,
    /// which no retry can fix. Does nothing unless run by them.
    #[test]
    #[ignore = "run in a child process by the stderr tests of this module"]
    fn campaign_fails_in_a_child() {
        let Ok(mode) = std::env::var(CHILD) else {
            return;
        };
        let errors = Arc::new(AtomicUsize::new(0));
        if mode == "subscriber" {
            tracing::subscriber::set_global_default(CountErrors(Arc::clone(&errors)))
                .expect("the only subscriber of this process");
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        runtime.block_on(async {
            let memory = Memory::new();
            let _leader = memory
                .acquire(&LeaseSpec::leader("jobs"))
                .await
                .expect("the leader lock");
            let campaign =
                Campaign::try_new(memory, LeaseSpec::semaphore("jobs", 2)).expect("a valid spec");
            let handle = campaign.handle();
            let ended = campaign
                .hold_until(CancellationToken::new())
                .await
                .expect_err("a conflict ends the campaign");
            assert!(!ended.is_transient(), "{ended}");
            assert!(
                matches!(handle.state(), CampaignState::Failed(_)),
                "{:?}",
                handle.state()
            );
        });
        if mode == "subscriber" {
            eprintln!("child: {} error event(s)", errors.load(Ordering::Relaxed));
        }
    }
}
