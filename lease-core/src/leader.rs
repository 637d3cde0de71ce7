//! Leader-only work: observe who leads, and a campaign loop that runs a worker only while elected.
//!
//! [`Campaign`] (or the shorthand [`run`]) acquires a leader lease, runs the worker while the lease
//! is held, cancels the worker the moment the lease is lost, campaigns again with backoff, and on
//! shutdown cancels the worker and **releases at once**, so a follower takes over without waiting
//! for the TTL or the lock-delay (an explicit release is not subject to lock-delay). Events
//! ([`LeaderEvent`]) tell the application what happened, including who leads now.
//!
//! [`LeaderObserver`] is the follower's view: the current [`Leader`] of a key (its sequencer and
//! the value it advertises), kept fresh by the backend's watch. It is obtained from
//! [`Backend::observe_leader`], without campaigning.

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::backoff::Backoff;
use crate::{Backend, BoxError, Error, LeaseSpec, LeaseWatcher, LostReason, Sequencer, Target};

/// The holder of a leader key, as followers see it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Leader {
    /// The leader's fencing token (key, LockIndex, session).
    pub sequencer: Sequencer,
    /// The value the leader advertises in the key (e.g. its address).
    pub value: Vec<u8>,
}

impl Leader {
    /// A leader from its parts (for backends).
    pub fn new(sequencer: Sequencer, value: Vec<u8>) -> Self {
        Leader { sequencer, value }
    }

    /// The advertised value as text, if it is UTF-8.
    pub fn value_str(&self) -> Option<&str> {
        std::str::from_utf8(&self.value).ok()
    }
}

/// Who holds a leader key now, kept fresh by the backend's watch until dropped.
///
/// Cloning gives another view of the same observation.
#[derive(Clone, Debug)]
pub struct LeaderObserver {
    key: String,
    rx: watch::Receiver<Option<Leader>>,
}

impl LeaderObserver {
    /// An observer of `key` fed by a backend's watch task through `rx`. The task should stop when
    /// every receiver is gone (`watch::Sender::closed`).
    pub fn new(key: impl Into<String>, rx: watch::Receiver<Option<Leader>>) -> Self {
        LeaderObserver {
            key: key.into(),
            rx,
        }
    }

    /// The observed key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The leader as last seen (no I/O), or `None` while nobody holds the key, and once the
    /// observation has ended (the backend could no longer confirm the key; observe again).
    pub fn leader(&self) -> Option<Leader> {
        if self.rx.has_changed().is_err() {
            return None;
        }
        self.rx.borrow().clone()
    }

    /// Waits until the leader changes (a new holder, the key released, or a new advertised value)
    /// and returns the new one.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a change that arrives while nobody waits is reported by the next call.
    pub async fn changed(&mut self) -> Result<Option<Leader>, Error> {
        self.rx.changed().await.map_err(|_| Error::ObserverClosed {
            key: self.key.clone(),
        })?;
        Ok(self.rx.borrow_and_update().clone())
    }

    /// Waits until the leader satisfies `condition` (checked on the current value first).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn wait_for(
        &mut self,
        mut condition: impl FnMut(Option<&Leader>) -> bool,
    ) -> Result<Option<Leader>, Error> {
        let key = &self.key;
        let leader = self
            .rx
            .wait_for(|leader| condition(leader.as_ref()))
            .await
            .map_err(|_| Error::ObserverClosed { key: key.clone() })?;
        Ok(leader.clone())
    }
}

/// What a campaign reports to the application, through [`Campaign::on_event`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum LeaderEvent {
    /// This node was elected; the worker starts now.
    Elected {
        /// The new lease's fencing token; its index rises with every election.
        sequencer: Sequencer,
    },
    /// The lease was lost; the worker has already been cancelled (its future dropped).
    Lost {
        /// The lost lease's fencing token.
        sequencer: Sequencer,
        /// Why it was lost.
        reason: LostReason,
    },
    /// The worker returned `Ok`; the lease has been released.
    WorkerFinished {
        /// The released lease's fencing token.
        sequencer: Sequencer,
    },
    /// The worker returned `Err`; the lease has been released and the campaign backs off before
    /// campaigning again.
    WorkerFailed {
        /// The released lease's fencing token.
        sequencer: Sequencer,
        /// The worker's error.
        error: Arc<dyn std::error::Error + Send + Sync>,
    },
    /// The worker panicked; the lease has been released and the campaign backs off before
    /// campaigning again.
    WorkerPanicked {
        /// The released lease's fencing token.
        sequencer: Sequencer,
        /// The panic's message, when it was a string.
        message: String,
    },
    /// The campaign stopped on shutdown: the worker was cancelled and the lease released.
    Released {
        /// The released lease's fencing token.
        sequencer: Sequencer,
    },
    /// Acquiring failed with a retryable error; the campaign tries again after `retry_in`.
    AcquireFailed {
        /// The error.
        error: Arc<Error>,
        /// The backoff before the next attempt.
        retry_in: Duration,
    },
    /// The key's holder changed, as observed by the backend's watch (for a leader key on a backend
    /// that supports [`Backend::observe_leader`]). `None` while nobody holds it. Observed
    /// independently of the other events, so it can arrive just before or after `Elected`.
    LeaderChanged {
        /// The new leader.
        leader: Option<Leader>,
    },
}

/// What the campaign does when the worker returns `Ok(())` on its own.
///
/// A worker that returns `Err` or panics always makes the campaign step down (release the lease,
/// so another node can take over), back off, and campaign again.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum AfterWorker {
    /// Release the lease and end the campaign with [`CampaignEnd::WorkerFinished`]: the work is
    /// done.
    #[default]
    Stop,
    /// Release the lease and campaign again (another node may win).
    Recampaign,
}

/// Why a campaign ended without error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CampaignEnd {
    /// The shutdown token was cancelled; any lease was released.
    Shutdown,
    /// The worker returned `Ok` and [`AfterWorker::Stop`] was chosen; the lease was released.
    WorkerFinished,
}

type EventSink = Arc<dyn Fn(LeaderEvent) + Send + Sync>;

/// A campaign for a leader lease that runs a worker while elected.
///
/// # Examples
///
/// ```no_run
/// # async fn example() -> Result<(), lease_core::Error> {
/// use std::sync::Arc;
/// use lease_core::leader::{Campaign, LeaderEvent};
/// use lease_core::memory::Memory;
/// use lease_core::LeaseSpec;
/// use tokio_util::sync::CancellationToken;
///
/// let shutdown = CancellationToken::new();
/// Campaign::new(Arc::new(Memory::new()), LeaseSpec::leader("service/reports/leader").value("node-1"))
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
#[must_use = "a campaign does nothing until `run_until` is awaited"]
pub struct Campaign {
    backend: Arc<dyn Backend>,
    spec: LeaseSpec,
    min_backoff: Duration,
    max_backoff: Duration,
    after_worker: AfterWorker,
    on_event: Option<EventSink>,
}

impl fmt::Debug for Campaign {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Campaign")
            .field("backend", &self.backend)
            .field("spec", &self.spec)
            .field("min_backoff", &self.min_backoff)
            .field("max_backoff", &self.max_backoff)
            .field("after_worker", &self.after_worker)
            .finish_non_exhaustive()
    }
}

impl Campaign {
    /// The default first backoff after a failure.
    pub const DEFAULT_MIN_BACKOFF: Duration = Duration::from_millis(100);
    /// The default longest backoff.
    pub const DEFAULT_MAX_BACKOFF: Duration = Duration::from_secs(10);

    /// A campaign for the lease `spec` names (normally [`LeaseSpec::leader`] with the default
    /// [`Wait::Forever`](crate::Wait::Forever); a semaphore spec runs the worker on up to `limit`
    /// nodes at once).
    pub fn new(backend: Arc<dyn Backend>, spec: LeaseSpec) -> Self {
        Campaign {
            backend,
            spec,
            min_backoff: Self::DEFAULT_MIN_BACKOFF,
            max_backoff: Self::DEFAULT_MAX_BACKOFF,
            after_worker: AfterWorker::default(),
            on_event: None,
        }
    }

    /// The backoff after a failure (acquire error, failed or panicking worker): starts at `min`,
    /// doubles with each consecutive failure up to `max`, and returns to `min` after an election
    /// that ends in a loss or a finished worker. After a loss, the campaign waits `min`.
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

    /// Calls `on_event` for every [`LeaderEvent`]. It is called from the campaign's tasks: keep it
    /// short (log, or send on a channel).
    pub fn on_event(mut self, on_event: impl Fn(LeaderEvent) + Send + Sync + 'static) -> Self {
        self.on_event = Some(Arc::new(on_event));
        self
    }

    /// Campaigns until `shutdown` is cancelled (or the worker finishes, see [`AfterWorker`]).
    ///
    /// Each election spawns `worker(lease)` as a task; `lease` is a [`LeaseWatcher`] carrying the
    /// sequencer to hand to downstream systems. The task is aborted (its future dropped at its
    /// next await point) as soon as the lease is lost or shutdown is requested, and the lease is
    /// only released or reported lost after the worker is gone. A panic in the worker is caught by
    /// the task and reported as [`LeaderEvent::WorkerPanicked`]; it never ends the campaign.
    ///
    /// Returns `Err` only for errors retrying cannot fix: an invalid spec, a key used by another
    /// kind of lock, a permission or configuration error.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future aborts the worker and drops the lease, which the backend then releases
    /// in the background; on this path the release is not ordered after the worker's end (the
    /// abort takes effect at the worker's next await point). Prefer cancelling `shutdown`, which
    /// waits for the worker to be gone and then for the release.
    pub async fn run_until<W, Fut>(
        self,
        shutdown: CancellationToken,
        mut worker: W,
    ) -> Result<CampaignEnd, Error>
    where
        W: FnMut(LeaseWatcher) -> Fut + Send,
        Fut: Future<Output = Result<(), BoxError>> + Send + 'static,
    {
        self.spec.validate()?;
        let emit = |event: LeaderEvent| {
            if let Some(sink) = &self.on_event {
                sink(event);
            }
        };
        let _observer = self.spawn_observer();
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
                    tracing::debug!(%error, ?retry_in, "campaign: acquire failed, retrying");
                    emit(LeaderEvent::AcquireFailed {
                        error: Arc::new(error),
                        retry_in,
                    });
                    if sleep_unless_shutdown(retry_in, &shutdown).await {
                        return Ok(CampaignEnd::Shutdown);
                    }
                    continue;
                }
                Err(error) => return Err(error),
            };
            let sequencer = lease.sequencer().clone();
            tracing::info!(%sequencer, "campaign: elected");
            emit(LeaderEvent::Elected {
                sequencer: sequencer.clone(),
            });

            let watcher = lease.watcher();
            let work = worker(watcher.clone());
            // A task of its own, so a panic is caught as a JoinError; the watcher also drops the
            // work from inside the task the moment the lease is lost.
            // Aborted if this future is dropped mid-tenure: a detached worker would run on after
            // the lease it needs is gone.
            let mut task: AbortOnDrop<Result<Result<(), BoxError>, LostReason>> =
                AbortOnDrop(tokio::spawn(async move { watcher.run(work).await }));
            let outcome = tokio::select! {
                biased;
                () = shutdown.cancelled() => Tenure::Shutdown,
                reason = lease.lost() => Tenure::Lost(reason),
                joined = &mut task => Tenure::Exited(joined),
            };
            if !matches!(outcome, Tenure::Exited(_)) {
                task.0.abort();
                // Wait until the worker's future is really dropped before anyone else may lead.
                if let Err(join_error) = (&mut task).await {
                    if join_error.is_panic() {
                        let message = panic_message(join_error.into_panic());
                        tracing::error!(%sequencer, %message, "campaign: the worker panicked as its tenure ended");
                    }
                }
            }
            let failure = match outcome {
                Tenure::Shutdown => {
                    if let Err(error) = lease.release().await {
                        tracing::warn!(%error, "campaign: release on shutdown failed; the backend frees the lease when the session expires");
                    }
                    tracing::info!(%sequencer, "campaign: released on shutdown");
                    emit(LeaderEvent::Released { sequencer });
                    return Ok(CampaignEnd::Shutdown);
                }
                Tenure::Lost(reason) | Tenure::Exited(Ok(Err(reason))) => {
                    drop(lease);
                    tracing::warn!(%sequencer, %reason, "campaign: lost the lease; worker cancelled");
                    emit(LeaderEvent::Lost { sequencer, reason });
                    backoff.reset();
                    if sleep_unless_shutdown(self.min_backoff, &shutdown).await {
                        return Ok(CampaignEnd::Shutdown);
                    }
                    continue;
                }
                Tenure::Exited(Ok(Ok(Ok(())))) => {
                    release_quietly(lease).await;
                    tracing::info!(%sequencer, "campaign: worker finished; lease released");
                    emit(LeaderEvent::WorkerFinished { sequencer });
                    match self.after_worker {
                        AfterWorker::Stop => return Ok(CampaignEnd::WorkerFinished),
                        AfterWorker::Recampaign => {
                            backoff.reset();
                            // A worker with nothing to do must not turn the campaign into a busy
                            // loop of sessions, nor keep the lease from the other nodes.
                            if sleep_unless_shutdown(self.min_backoff, &shutdown).await {
                                return Ok(CampaignEnd::Shutdown);
                            }
                            continue;
                        }
                    }
                }
                Tenure::Exited(Ok(Ok(Err(error)))) => {
                    release_quietly(lease).await;
                    tracing::warn!(%sequencer, %error, "campaign: worker failed; stepped down");
                    LeaderEvent::WorkerFailed {
                        sequencer,
                        error: Arc::from(error),
                    }
                }
                Tenure::Exited(Err(join_error)) => {
                    release_quietly(lease).await;
                    let message = if join_error.is_panic() {
                        panic_message(join_error.into_panic())
                    } else {
                        "the worker task was cancelled (runtime shutting down)".to_owned()
                    };
                    tracing::error!(%sequencer, %message, "campaign: worker panicked; stepped down");
                    LeaderEvent::WorkerPanicked { sequencer, message }
                }
            };
            emit(failure);
            if sleep_unless_shutdown(backoff.next_pause(), &shutdown).await {
                return Ok(CampaignEnd::Shutdown);
            }
        }
    }

    /// Emits `LeaderChanged` events from the backend's observation of a leader key, if there is
    /// someone to tell and the backend can observe.
    fn spawn_observer(&self) -> Option<AbortOnDrop<()>> {
        let sink = self.on_event.clone()?;
        let Target::Leader { key } = self.spec.target() else {
            return None;
        };
        let backend = Arc::clone(&self.backend);
        let key = key.clone();
        let task = tokio::spawn(async move {
            // An observation that cannot start or that ends (the backend briefly away) is tried
            // again; meanwhile the leader is reported unknown rather than stale.
            let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
            loop {
                match backend.observe_leader(&key).await {
                    Ok(mut observer) => {
                        backoff.reset();
                        sink(LeaderEvent::LeaderChanged {
                            leader: observer.leader(),
                        });
                        while let Ok(leader) = observer.changed().await {
                            sink(LeaderEvent::LeaderChanged { leader });
                        }
                        sink(LeaderEvent::LeaderChanged { leader: None });
                    }
                    Err(Error::Unsupported { .. }) => {
                        tracing::debug!("campaign: this backend cannot observe the leader");
                        return;
                    }
                    Err(error) if error.is_transient() => {
                        tracing::warn!(%error, "campaign: cannot observe the leader yet; retrying");
                    }
                    Err(error) => {
                        tracing::error!(%error, "campaign: cannot observe the leader");
                        return;
                    }
                }
                tokio::time::sleep(backoff.next_pause()).await;
            }
        });
        Some(AbortOnDrop(task))
    }
}

/// Campaigns for `spec` on `backend` and runs `worker` while elected, until `shutdown` is
/// cancelled. Shorthand for [`Campaign::new`] + [`Campaign::run_until`]; see there.
pub async fn run<W, Fut>(
    backend: Arc<dyn Backend>,
    spec: LeaseSpec,
    shutdown: CancellationToken,
    worker: W,
) -> Result<CampaignEnd, Error>
where
    W: FnMut(LeaseWatcher) -> Fut + Send,
    Fut: Future<Output = Result<(), BoxError>> + Send + 'static,
{
    Campaign::new(backend, spec)
        .run_until(shutdown, worker)
        .await
}

enum Tenure {
    Shutdown,
    Lost(LostReason),
    Exited(Result<Result<Result<(), BoxError>, LostReason>, tokio::task::JoinError>),
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

async fn release_quietly(lease: crate::Lease) {
    if let Err(error) = lease.release().await {
        tracing::warn!(%error, "campaign: release failed; the backend frees the lease when the session expires");
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
