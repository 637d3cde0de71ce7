//! The [`Lease`] handle, and the one state machine every backend's holder task runs.
//!
//! A backend's `acquire` returns a [`Lease`] whose state lives in an `Arc` shared with a task the
//! backend spawned to keep the lease (renew its session, watch its key). That task runs
//! [`keep`], which owns the order of events: the moment loss is known, `is_held()` turns false and
//! every `lost()` future wakes, *then* the backend cleans up; on release, `is_held()` turns false
//! *before* the backend gives the lease back, so nobody else can hold it while we still think we do.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::{oneshot, watch};
use tracing::Instrument;

use crate::{Error, LostReason, Sequencer};

/// A boxed, sendable future, as returned by the dyn-compatible backend traits.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A held lease. Release it with [`release`](Lease::release), or drop it.
///
/// The lease is acquired by a backend's `acquire`, watched by a task of the backend while this
/// handle lives, and given back when it is released or dropped. While it is held:
///
/// - [`is_held`](Lease::is_held) is an atomic read, for every request's fast path;
/// - [`lost`](Lease::lost) completes the moment the lease is known lost;
/// - [`run`](Lease::run) runs work that is dropped at its next await point on loss;
/// - [`check`](Lease::check) asks the backend, for a critical step;
/// - [`sequencer`](Lease::sequencer) is the fencing token to hand to downstream systems.
///
/// Dropping the lease releases it in the background (the backend's task does it; no runtime is
/// needed in `Drop`). Call [`release`](Lease::release) to wait until it is given back.
#[must_use = "a lease is released as soon as it is dropped"]
pub struct Lease {
    /// The sequencer and the shared state, behind one `Arc` that watchers clone.
    watcher: LeaseWatcher,
    checker: Box<dyn Checker>,
    release_tx: Option<oneshot::Sender<ReleaseRequest>>,
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("sequencer", self.sequencer())
            .field("held", &self.is_held())
            .finish_non_exhaustive()
    }
}

impl Lease {
    /// The fencing token of this acquisition.
    pub fn sequencer(&self) -> &Sequencer {
        self.watcher.sequencer()
    }

    fn state(&self) -> &LeaseState {
        &self.watcher.shared.state
    }

    /// Whether the lease is still held, as far as this process knows. No I/O: an atomic read.
    ///
    /// Turns false the moment loss is detected (or release begins) and never turns true again.
    pub fn is_held(&self) -> bool {
        self.state().is_held()
    }

    /// Why the lease was lost, if it has been.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.state().lost.borrow().clone()
    }

    /// Completes with the reason when the lease is lost or released.
    ///
    /// The future does not borrow the lease: it can be moved into another task.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping it has no effect on the lease, and a new one can be created any time.
    pub fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        self.state().lost_signal()
    }

    /// A cheap, cloneable view of this lease's state, for code that must check or await loss
    /// without owning the lease (a request handler, another task).
    pub fn watcher(&self) -> LeaseWatcher {
        self.watcher.clone()
    }

    /// Runs `work` while the lease is held.
    ///
    /// Returns `Ok` with the work's output if it completes first. If the lease is lost first (or
    /// already was), `work` is dropped at its next await point and `Err` carries the reason. Loss
    /// is checked before the work is polled, so work is never started on a lost lease.
    ///
    /// # Cancel safety
    ///
    /// Dropping the returned future drops `work` and leaves the lease as it was.
    pub async fn run<F: Future>(&self, work: F) -> Result<F::Output, LostReason> {
        let lost = self.lost();
        tokio::select! {
            biased;
            reason = lost => Err(reason),
            out = work => Ok(out),
        }
    }

    /// Verifies with the backend, with one consistent read, that this acquisition still holds
    /// the lease. On loss, the lease is marked lost (so `run` cancels its work) and `Err` carries
    /// [`Error::Lost`].
    pub async fn check(&self) -> Result<(), Error> {
        if let Some(reason) = self.lost_reason() {
            return Err(Error::Lost(reason));
        }
        match self.checker.check(self.sequencer()).await {
            Err(Error::Lost(reason)) => {
                self.state().lose(reason.clone());
                Err(Error::Lost(reason))
            }
            other => other,
        }
    }

    /// Gives the lease back and waits until the backend confirms (Consul: the key is released and
    /// the session destroyed). `is_held()` turns false before anything is sent.
    ///
    /// Releasing a lease that was already lost only waits for its clean-up and returns `Ok`.
    pub async fn release(mut self) -> Result<(), Error> {
        let (reply_tx, reply_rx) = oneshot::channel();
        let Some(release_tx) = self.release_tx.take() else {
            return Ok(());
        };
        if release_tx.send(Some(reply_tx)).is_err() {
            // The holder task is gone (its runtime shut down): nothing is left to give back here.
            return Ok(());
        }
        reply_rx.await.unwrap_or(Ok(()))
    }

    /// Assembles a lease from a backend's parts; `keep` must be running with the matching
    /// [`Holding`].
    pub(crate) fn new(sequencer: Sequencer, checker: Box<dyn Checker>) -> (Lease, Holding) {
        let (lost_tx, _) = watch::channel(None);
        let state = Arc::new(LeaseState {
            held: AtomicBool::new(true),
            lost: lost_tx,
        });
        let (release_tx, release_rx) = oneshot::channel();
        let lease = Lease {
            watcher: LeaseWatcher {
                shared: Arc::new(WatcherShared {
                    sequencer: sequencer.clone(),
                    state: Arc::clone(&state),
                }),
            },
            checker,
            release_tx: Some(release_tx),
        };
        (
            lease,
            Holding {
                sequencer,
                state,
                release_rx,
            },
        )
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(tx) = self.release_tx.take() {
            // Tells the holder task to release in the background; it needs no reply.
            let _ = tx.send(None);
        }
    }
}

/// A cloneable, read-only view of a [`Lease`]: its sequencer, `is_held`, and `lost`.
///
/// It does not keep the lease alive: when the lease is released or dropped, the watcher reports
/// it lost with [`LostReason::Released`].
///
/// Work run through a watcher in another task is dropped at its next await point after the
/// release begins, but the release itself does not wait for that: release the lease only after
/// such work has finished (as [`Lease::run`], which borrows the lease, guarantees by construction).
#[derive(Clone)]
pub struct LeaseWatcher {
    // One `Arc`, so a clone is one reference-count increment: watchers are cloned per request.
    shared: Arc<WatcherShared>,
}

struct WatcherShared {
    sequencer: Sequencer,
    state: Arc<LeaseState>,
}

impl fmt::Debug for LeaseWatcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseWatcher")
            .field("sequencer", self.sequencer())
            .field("held", &self.is_held())
            .finish()
    }
}

impl LeaseWatcher {
    /// See [`Lease::sequencer`].
    pub fn sequencer(&self) -> &Sequencer {
        &self.shared.sequencer
    }

    /// See [`Lease::is_held`].
    pub fn is_held(&self) -> bool {
        self.shared.state.is_held()
    }

    /// See [`Lease::lost`].
    pub fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        self.shared.state.lost_signal()
    }

    /// See [`Lease::run`].
    pub async fn run<F: Future>(&self, work: F) -> Result<F::Output, LostReason> {
        tokio::select! {
            biased;
            reason = self.lost() => Err(reason),
            out = work => Ok(out),
        }
    }
}

/// The state shared by a lease handle, its watchers and its holder task.
struct LeaseState {
    held: AtomicBool,
    lost: watch::Sender<Option<LostReason>>,
}

impl LeaseState {
    fn is_held(&self) -> bool {
        self.held.load(Ordering::Acquire)
    }

    /// Marks the lease lost; the first reason wins. Returns whether this call marked it.
    fn lose(&self, reason: LostReason) -> bool {
        if !self.held.swap(false, Ordering::AcqRel) {
            return false;
        }
        self.lost.send_replace(Some(reason));
        true
    }

    fn lost_signal(&self) -> impl Future<Output = LostReason> + Send + 'static {
        let mut rx = self.lost.subscribe();
        async move {
            match rx.wait_for(Option::is_some).await {
                Ok(reason) => reason.clone().unwrap_or(LostReason::Released),
                // The sender lives in the state, which outlives every handle; if it is gone, so
                // is the lease.
                Err(_) => LostReason::Released,
            }
        }
    }
}

/// What a lease handle sends its holder task: release, with a reply channel if someone waits.
type ReleaseRequest = Option<oneshot::Sender<Result<(), Error>>>;

/// The holder task's end of a lease: the state to update and the release requests to obey.
pub(crate) struct Holding {
    sequencer: Sequencer,
    state: Arc<LeaseState>,
    release_rx: oneshot::Receiver<ReleaseRequest>,
}

impl fmt::Debug for Holding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Holding")
            .field("sequencer", &self.sequencer)
            .finish_non_exhaustive()
    }
}

/// A backend's explicit verification of a lease ([`Lease::check`]).
pub(crate) trait Checker: Send + Sync + 'static {
    /// One consistent read: `Ok` if `sequencer` is still the current holder,
    /// `Err(Error::Lost(_))` if not, another error if the backend could not tell.
    fn check<'a>(&'a self, sequencer: &'a Sequencer) -> BoxFuture<'a, Result<(), Error>>;
}

/// What a backend does while it holds a lease.
pub(crate) trait Hold: Send + 'static {
    /// Watches the lease until it is lost; returns why. Must self-fence (DESIGN rule 2).
    fn watch(&mut self) -> impl Future<Output = LostReason> + Send;
    /// Gives the lease back (called after the lease is marked released).
    fn release(self) -> impl Future<Output = Result<(), Error>> + Send;
    /// Cleans up after loss (e.g. destroys a session that may still exist).
    fn clean_up(self) -> impl Future<Output = ()> + Send;
}

/// Spawns the holder task of a lease: the single place where loss and release are ordered.
pub(crate) fn spawn_keeper<H: Hold>(holding: Holding, hold: H) {
    let span = tracing::info_span!("lease.hold", sequencer = %holding.sequencer);
    tokio::spawn(keep(holding, hold).instrument(span));
}

async fn keep<H: Hold>(holding: Holding, mut hold: H) {
    let Holding {
        state, release_rx, ..
    } = holding;
    let mut release_rx = release_rx;
    let outcome = tokio::select! {
        biased;
        request = &mut release_rx => Ok(request.unwrap_or(None)),
        // A loss found by `Lease::check` rather than by the watch.
        reason = state.lost_signal() => Err(reason),
        reason = hold.watch() => Err(reason),
    };
    match outcome {
        Ok(reply) => {
            state.lose(LostReason::Released);
            let result = hold.release().await;
            match &result {
                Ok(()) => tracing::debug!("lease released"),
                Err(error) => {
                    tracing::warn!(%error, "lease release failed; the backend frees it when the session expires")
                }
            }
            if let Some(reply) = reply {
                let _ = reply.send(result);
            }
        }
        Err(reason) => {
            if state.lose(reason.clone()) {
                tracing::warn!(%reason, "lease lost");
            }
            hold.clean_up().await;
            // Answer a release that comes after the loss once the clean-up is done.
            if let Ok(Some(reply)) = release_rx.await {
                let _ = reply.send(Ok(()));
            }
        }
    }
}
