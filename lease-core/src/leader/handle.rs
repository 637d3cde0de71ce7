//! What a running campaign shares with the rest of the process: its terms ([`Term`]), who leads,
//! its state and its events, through a cloneable [`CampaignHandle`].
//!
//! The campaign loop (`campaign`) writes; routes, workers and health checks read. One
//! campaign per key per process is the point: a leader-only route and a leader-only worker that
//! each ran their own would contend with each other for the same key.

use std::fmt;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::{Notify, broadcast, watch};
use tokio::time::Instant;

use super::event::{CampaignEnd, EventSink, LeaderEvent};
use super::observe::LeaderWatch;
use crate::observer::Leader;
use crate::{Error, LeaseWatcher, LostReason, Sequencer};

/// One term of this node as leader (or as a holder of a slot, for a semaphore campaign): the
/// lease's view, and the work in flight under it.
///
/// The campaign publishes a `Term` when it is elected. Code that runs leader-only work outside
/// the campaign's worker (a request handler, through `lease-tower`'s leader-only layer) takes a
/// [`TermGuard`] with [`begin`](Term::begin) for as long as the work runs: when the campaign
/// steps down voluntarily (shutdown, or its worker returned), it refuses new work and waits for
/// the guards, at most [`Campaign::drain_timeout`](super::Campaign::drain_timeout), before it
/// releases the lease.
///
/// Two concerns, two tools: the guard is about hand-off (the step-down waits for it), the
/// [`lease`](Term::lease) is about loss. Loss does not wait for anything: the lease reports it
/// the moment it is known (or its fence deadline has passed), and work run through it
/// ([`LeaseWatcher::run`]) is dropped.
///
/// Cloning is one reference-count increment.
#[derive(Clone)]
pub struct Term {
    inner: Arc<TermInner>,
}

struct TermInner {
    /// Shared with the guards only, so that its reference count, less this one, is the work in
    /// flight: a guard costs one increment and one decrement, and no counter of its own.
    work: Arc<TermWork>,
}

struct TermWork {
    lease: LeaseWatcher,
    stepping_down: AtomicBool,
    /// Notified when a guard goes while stepping down.
    drained: Arc<Notify>,
}

impl fmt::Debug for Term {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Term")
            .field("sequencer", self.sequencer())
            .field("held", &self.is_held())
            .field("stepping_down", &self.is_stepping_down())
            .field("in_flight", &self.in_flight())
            .finish()
    }
}

impl Term {
    pub(super) fn new(lease: LeaseWatcher) -> Self {
        Term {
            inner: Arc::new(TermInner {
                work: Arc::new(TermWork {
                    lease,
                    stepping_down: AtomicBool::new(false),
                    drained: Arc::new(Notify::new()),
                }),
            }),
        }
    }

    /// The term's lease: its sequencer, `is_held`, `lost()` and `run`.
    pub fn lease(&self) -> &LeaseWatcher {
        &self.inner.work.lease
    }

    /// The term's fencing token; shorthand for `self.lease().sequencer()`.
    pub fn sequencer(&self) -> &Sequencer {
        self.lease().sequencer()
    }

    /// Whether the lease is still held (an atomic read and the fence deadline; no I/O).
    pub fn is_held(&self) -> bool {
        self.lease().is_held()
    }

    /// Whether the campaign is stepping down: it refuses new work and releases the lease once
    /// the work in flight is done or the drain timeout has passed.
    pub fn is_stepping_down(&self) -> bool {
        self.inner.work.stepping_down.load(Ordering::SeqCst)
    }

    /// How many [`TermGuard`]s are alive.
    pub fn in_flight(&self) -> usize {
        Arc::strong_count(&self.inner.work) - 1
    }

    /// Starts a piece of work under this term, for as long as the returned guard lives: `None`
    /// once the campaign is stepping down. A voluntary step-down waits for the guard to be
    /// dropped (up to the campaign's drain timeout) before it releases the lease.
    ///
    /// It reads no clock and does not tell whether the lease is still held: the work checks
    /// that through [`lease`](Self::lease) (before each step, as [`LeaseWatcher::run`] does).
    pub fn begin(&self) -> Option<TermGuard> {
        if self.is_stepping_down() {
            return None;
        }
        let guard = TermGuard {
            work: Some(Arc::clone(&self.inner.work)),
        };
        // A step-down that began meanwhile may already have found no work to wait for; the
        // guard's drop gives its place back.
        if self.is_stepping_down() {
            return None;
        }
        Some(guard)
    }

    /// Refuses new work from now on.
    pub(super) fn step_down(&self) {
        self.inner.work.stepping_down.store(true, Ordering::SeqCst);
    }

    /// Completes when, after [`step_down`](Self::step_down), no guard is left.
    pub(super) async fn drained(&self) {
        loop {
            let mut notified = pin!(self.inner.work.drained.notified());
            // Registered before the count is read: a guard dropped in between still wakes it.
            notified.as_mut().enable();
            if self.in_flight() == 0 {
                return;
            }
            notified.await;
        }
    }
}

/// A piece of work in flight under a [`Term`]; a voluntary step-down waits for it to be dropped
/// before the lease is released. Taken by [`Term::begin`] or [`CampaignHandle::begin`].
///
/// It does not keep the lease: a loss is not delayed by it. Check the term's lease (or run the
/// work through [`LeaseWatcher::run`]) to stop when the lease is lost.
#[must_use = "the step-down waits only while the guard is alive"]
pub struct TermGuard {
    /// `Some` until dropped.
    work: Option<Arc<TermWork>>,
}

impl fmt::Debug for TermGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TermGuard")
            .field(
                "sequencer",
                &self.work.as_ref().map(|w| w.lease.sequencer()),
            )
            .finish()
    }
}

impl Drop for TermGuard {
    fn drop(&mut self) {
        let Some(work) = self.work.take() else {
            return;
        };
        if work.stepping_down.load(Ordering::SeqCst) {
            // The drain counts references: wake it once this one is gone.
            let drained = Arc::clone(&work.drained);
            drop(work);
            drained.notify_waiters();
        }
    }
}

impl TermGuard {
    /// The lease of the term the work runs under.
    pub fn lease(&self) -> &LeaseWatcher {
        match &self.work {
            Some(work) => &work.lease,
            // Only `drop` takes it.
            None => unreachable!("a TermGuard is alive until dropped"),
        }
    }

    /// The term's fencing token; shorthand for `self.lease().sequencer()`.
    pub fn sequencer(&self) -> &Sequencer {
        self.lease().sequencer()
    }
}

/// Where a campaign is in its life, as [`CampaignHandle::state`] reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CampaignState {
    /// Built, but `run_until` (or `hold_until`) has not been polled yet.
    NotStarted,
    /// Campaigning, leading, or backing off between attempts.
    Running,
    /// `run_until` returned `Ok` with this end.
    Ended(CampaignEnd),
    /// `run_until` returned an error retrying cannot fix (an invalid spec, a key used by another
    /// kind of lock, a permission denial...); its message. The campaign does not run again.
    /// The end is logged at ERROR, and said in one line on stderr when no tracing subscriber is
    /// installed (see [`Campaign::run_until`](super::Campaign::run_until)).
    Failed(String),
    /// The `run_until` future was dropped before it ended.
    Abandoned,
}

/// A cloneable view of one [`Campaign`](super::Campaign): its current term, who leads, its state
/// and its events. Obtained with [`Campaign::handle`](super::Campaign::handle) before the
/// campaign runs; it stays valid after the campaign ends.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), lease_core::Error> {
/// use lease_core::leader::Campaign;
/// use lease_core::memory::Memory;
/// use lease_core::LeaseSpec;
/// use lease_core::CancellationToken;
///
/// let campaign = Campaign::try_new(Memory::new(), LeaseSpec::leader("service/jobs/leader"))?;
/// let handle = campaign.handle();
/// let shutdown = CancellationToken::new();
/// let running = tokio::spawn(campaign.hold_until(shutdown.clone()));
///
/// // A health check, a route and a worker all read the same election.
/// let mut terms = handle.terms();
/// let term = terms.wait_for(|term| term.is_some()).await.map(|t| t.clone());
/// let term = term.ok().flatten().expect("the only contender is elected");
/// assert!(handle.is_leader());
/// assert_eq!(handle.term().map(|t| t.sequencer().clone()), Some(term.sequencer().clone()));
///
/// shutdown.cancel();
/// running.await.expect("the campaign task")?;
/// assert!(!handle.is_leader());
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct CampaignHandle {
    pub(super) shared: Arc<Shared>,
}

impl fmt::Debug for CampaignHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CampaignHandle")
            .field("key", &self.shared.key)
            .field("state", &self.state())
            .field("term", &self.term())
            .field("leader", &self.leader())
            .finish()
    }
}

impl CampaignHandle {
    /// The campaign's key (the leader key, or the semaphore's prefix).
    pub fn key(&self) -> &str {
        &self.shared.key
    }

    /// This node's current term, if it holds the lease now (no I/O).
    pub fn term(&self) -> Option<Term> {
        self.shared
            .terms
            .borrow()
            .as_ref()
            .filter(|term| term.is_held())
            .cloned()
    }

    /// Starts a piece of work under the term the campaign has published, as [`Term::begin`]:
    /// `None` while no term is published (this node does not lead) or once the campaign is
    /// stepping down. The guard carries the term.
    ///
    /// Like `Term::begin` it reads no clock: the lease may have been lost a moment ago (the
    /// campaign unpublishes a term once it has stopped the worker), which the guard's
    /// [`lease`](TermGuard::lease) tells, and the work checks before each step.
    pub fn begin(&self) -> Option<TermGuard> {
        self.shared.terms.borrow().as_ref()?.begin()
    }

    /// A receiver of every term change: `Some` when elected, `None` when the term ended. A
    /// term's loss is reported by the term itself first ([`Term::lease`]); the campaign publishes
    /// `None` once it has stopped the worker.
    pub fn terms(&self) -> watch::Receiver<Option<Term>> {
        self.shared.terms.subscribe()
    }

    /// Whether this node holds the lease now (an atomic read).
    pub fn is_leader(&self) -> bool {
        self.term().is_some()
    }

    /// Who leads, for a leader campaign: this node while it holds the lease, whatever the
    /// backend's watch says meanwhile (during an outage it cannot confirm anything); otherwise
    /// the holder the watch has confirmed, `None` while nobody leads or nothing is known.
    pub fn leader(&self) -> Option<Leader> {
        self.shared.leader.borrow().clone()
    }

    /// A receiver of every change of [`leader`](Self::leader).
    pub fn leaders(&self) -> watch::Receiver<Option<Leader>> {
        self.shared.leader.subscribe()
    }

    /// The watch the campaign follows its leader key with (`None` for a semaphore campaign),
    /// to share with other users of the key in this process, such as a sequencer check.
    pub fn leader_watch(&self) -> Option<&LeaderWatch> {
        self.shared.watch.as_ref()
    }

    /// Where the campaign is in its life.
    pub fn state(&self) -> CampaignState {
        self.shared.state.borrow().clone()
    }

    /// A receiver of every change of [`state`](Self::state).
    pub fn states(&self) -> watch::Receiver<CampaignState> {
        self.shared.state.subscribe()
    }

    /// The error of the last failed attempt to acquire, if nothing has succeeded since: no
    /// election, and no leader seen (the campaign retries it; see
    /// [`LeaderEvent::AcquireFailed`]). For logs and metrics; not for clients, since it may name
    /// internal addresses.
    pub fn last_error(&self) -> Option<Arc<Error>> {
        lock(&self.shared.last_error).clone()
    }

    /// Why and when this node's last term was lost, if it was lost (not released) and no term
    /// has begun since. A [`LostReason::SelfFenced`] loss during a backend outage is what
    /// `lease_tower::health` reads to turn a node unready no later than its self-fence.
    pub fn last_loss(&self) -> Option<(LostReason, Instant)> {
        lock(&self.shared.last_loss).clone()
    }

    /// A receiver of the campaign's events from now on, as
    /// [`Campaign::on_event`](super::Campaign::on_event) sees them. A receiver that falls more than 64 events behind
    /// loses the oldest ([`broadcast::error::RecvError::Lagged`]).
    pub fn events(&self) -> broadcast::Receiver<LeaderEvent> {
        self.shared.events.subscribe()
    }
}

/// The state of one campaign, shared by the loop and every handle.
pub(super) struct Shared {
    pub(super) key: String,
    /// The value this node advertises in the key.
    pub(super) value: Vec<u8>,
    /// The watch of who leads; `None` for a semaphore campaign.
    pub(super) watch: Option<LeaderWatch>,
    pub(super) terms: watch::Sender<Option<Term>>,
    pub(super) leader: watch::Sender<Option<Leader>>,
    pub(super) state: watch::Sender<CampaignState>,
    pub(super) last_error: Mutex<Option<Arc<Error>>>,
    /// Why and when the last term was lost, until the next term begins.
    pub(super) last_loss: Mutex<Option<(LostReason, Instant)>>,
    /// The sequencer of this node's last term: a watch that still shows it after the term ended
    /// is behind.
    last_term: Mutex<Option<Sequencer>>,
    pub(super) events: broadcast::Sender<LeaderEvent>,
    /// Serializes the computation and announcement of who leads.
    refresh: Mutex<()>,
}

/// Sends `event` to the campaign's sink and to its handles' receivers.
pub(super) fn emit(shared: &Shared, sink: Option<&EventSink>, event: LeaderEvent) {
    if shared.events.receiver_count() > 0 {
        let _ = shared.events.send(event.clone());
    }
    if let Some(sink) = sink {
        sink(event);
    }
}

/// How many events a slow [`CampaignHandle::events`] receiver may fall behind.
const EVENT_BACKLOG: usize = 64;

impl Shared {
    pub(super) fn new(key: String, value: Vec<u8>, watch: Option<LeaderWatch>) -> Self {
        Shared {
            key,
            value,
            watch,
            terms: watch::channel(None).0,
            leader: watch::channel(None).0,
            state: watch::channel(CampaignState::NotStarted).0,
            last_error: Mutex::new(None),
            last_loss: Mutex::new(None),
            last_term: Mutex::new(None),
            events: broadcast::channel(EVENT_BACKLOG).0,
            refresh: Mutex::new(()),
        }
    }

    /// Publishes a new term.
    pub(super) fn begin_term(&self, term: &Term) {
        *lock(&self.last_error) = None;
        *lock(&self.last_loss) = None;
        *lock(&self.last_term) = Some(term.sequencer().clone());
        self.terms.send_replace(Some(term.clone()));
        crate::metrics::is_leader(&self.key, true);
    }

    /// Unpublishes the term, if any: handles no longer see it.
    pub(super) fn end_term(&self) {
        self.terms.send_replace(None);
        crate::metrics::is_leader(&self.key, false);
    }

    /// Recomputes who leads, and calls `announce` (in order, with no other refresh between)
    /// if it changed. While this node holds its term, it is the leader: an outage that ends the
    /// backend's watch does not make this node report "nobody" while it leads and runs its
    /// worker.
    pub(super) fn refresh_leader(&self, announce: impl FnOnce(Option<Leader>)) {
        let Some(watch) = self.watch.as_ref() else {
            return;
        };
        let _serial = lock(&self.refresh);
        let held = self
            .terms
            .borrow()
            .as_ref()
            .filter(|t| t.is_held())
            .cloned();
        let leader = match held {
            Some(term) => Some(Leader::new(term.sequencer().clone(), self.value.clone())),
            None => {
                let last_term = lock(&self.last_term).clone();
                watch
                    .leader()
                    .filter(|leader| Some(&leader.sequencer) != last_term.as_ref())
            }
        };
        if leader.is_some() {
            // The backend answered since: an earlier failed attempt is no longer news.
            *lock(&self.last_error) = None;
        }
        let changed = self.leader.send_if_modified(|current| {
            let changed = *current != leader;
            if changed {
                current.clone_from(&leader);
            }
            changed
        });
        if changed {
            announce(leader);
        }
    }
}

/// Announces who leads whenever the watch or this node's term says something new.
pub(super) async fn announce_leaders(shared: Arc<Shared>, sink: Option<EventSink>) {
    let Some(watch) = shared.watch.as_ref() else {
        return;
    };
    let mut observed = watch.subscribe();
    let mut terms = shared.terms.subscribe();
    loop {
        shared.refresh_leader(|leader| {
            emit(
                &shared,
                sink.as_ref(),
                LeaderEvent::LeaderChanged { leader },
            );
        });
        let term = terms.borrow_and_update().clone();
        // A loss turns this node into a follower before the campaign has stopped its worker.
        let lost = async move {
            match term {
                Some(term) if term.is_held() => {
                    term.lease().lost().await;
                }
                _ => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            changed = observed.changed() => if changed.is_err() { return },
            changed = terms.changed() => if changed.is_err() { return },
            () = lost => {}
        }
    }
}

/// Locks a mutex whose data stays consistent even if a holder panicked.
pub(super) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
