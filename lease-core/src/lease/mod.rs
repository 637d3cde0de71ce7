//! The [`Lease`] handle and its read-only view, [`LeaseWatcher`].
//!
//! A backend's `acquire` returns a [`Lease`] whose state lives in an `Arc` shared with a holder
//! task the backend started through [`Keepers::start`](crate::backend::Keepers::start) (see
//! `keeper`). The task orders loss and release; the handle reads the state without I/O, and checks
//! the fence deadline (`state`) itself, so a lease is never taken for held past it.

pub(crate) mod detached;
pub(crate) mod state;

use std::fmt;
use std::future::{Future, poll_fn};
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::Poll;

use tokio::sync::oneshot;

use state::LeaseState;
pub use state::{Fence, PAUSE_TOLERANCE};

use crate::{Error, LostReason, Sequencer};

/// How a lease asks whether its sequencer is still current: its backend's `check_sequencer`,
/// given by the holder task that built the lease (so that the lease does not depend on the
/// backend contract, which depends on it).
pub(crate) type CheckSequencer =
    Arc<dyn Fn(Sequencer) -> BoxFuture<'static, Result<(), Error>> + Send + Sync>;

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
    check_sequencer: CheckSequencer,
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
    /// Assembles the handle; [`Keepers::start`](crate::backend::Keepers::start) is the only caller.
    pub(crate) fn new(
        sequencer: Sequencer,
        state: Arc<LeaseState>,
        check_sequencer: CheckSequencer,
        release_tx: oneshot::Sender<ReleaseRequest>,
    ) -> Lease {
        Lease {
            watcher: LeaseWatcher {
                shared: Arc::new(WatcherShared { sequencer, state }),
            },
            check_sequencer,
            release_tx: Some(release_tx),
        }
    }

    /// The fencing token of this acquisition.
    pub fn sequencer(&self) -> &Sequencer {
        self.watcher.sequencer()
    }

    fn state(&self) -> &LeaseState {
        &self.watcher.shared.state
    }

    /// Whether the lease is still held, as far as this process knows. No I/O: an atomic read
    /// and a read of the monotonic clock.
    ///
    /// Turns false the moment loss is detected, release begins, or the self-fencing deadline
    /// passes (even if the holder task has not run since, as after the process was paused), and
    /// never turns true again.
    pub fn is_held(&self) -> bool {
        self.watcher.is_held()
    }

    /// Why the lease was lost, if it has been. Once `is_held()` has answered false, this is
    /// `Some`.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.state().lost_reason()
    }

    /// Completes with the reason when the lease is lost or released.
    ///
    /// The future does not borrow the lease: it can be moved into another task.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping it has no effect on the lease, and a new one can be created any time.
    pub fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        self.watcher.lost()
    }

    /// A cheap, cloneable view of this lease's state, for code that must check or await loss
    /// without owning the lease (a request handler, another task).
    pub fn watcher(&self) -> LeaseWatcher {
        self.watcher.clone()
    }

    /// Runs `work` while the lease is held.
    ///
    /// Returns `Ok` with the work's output if it completes first. If the lease is lost first (or
    /// already was), `work` is dropped and `Err` carries the reason. Before *every* poll of
    /// `work`, the lease's state and its self-fencing deadline are checked, so work is never
    /// started on a lost lease, and a process resumed after a pause longer than the lease's TTL
    /// drops the work without polling it again.
    ///
    /// A pause can still fall inside a poll, between that check and the work's next side effect.
    /// Work with a side effect to protect checks [`is_held`](Lease::is_held) immediately before
    /// it, which shrinks that window to a few instructions; nothing closes it entirely, which is
    /// why a downstream system that must never see a stale write checks the
    /// [`sequencer`](Lease::sequencer) it is handed (fencing).
    ///
    /// # Cancel safety
    ///
    /// Dropping the returned future drops `work` and leaves the lease as it was.
    pub async fn run<F: Future>(&self, work: F) -> Result<F::Output, LostReason> {
        self.watcher.run(work).await
    }

    /// Verifies with the backend, with one consistent read, that this acquisition still holds
    /// the lease ([`Backend::check_sequencer`](crate::Backend::check_sequencer)). On loss, the lease is marked lost (so `run`
    /// cancels its work) and `Err` carries [`Error::Lost`].
    pub async fn check(&self) -> Result<(), Error> {
        if let Some(reason) = self.lost_reason() {
            return Err(Error::Lost(reason));
        }
        match (self.check_sequencer)(self.sequencer().clone()).await {
            Err(Error::Lost(reason)) => {
                self.state().lose(reason.clone());
                Err(Error::Lost(self.lost_reason().unwrap_or(reason)))
            }
            // The read took time: the lease may have been lost meanwhile.
            Ok(()) => match self.lost_reason() {
                Some(reason) => Err(Error::Lost(reason)),
                None => Ok(()),
            },
            Err(error) => Err(error),
        }
    }

    /// Gives the lease back and waits until the backend confirms (Consul: the key is released and
    /// the session destroyed), at most [`RELEASE_BOUND`](crate::backend::RELEASE_BOUND). `is_held()` turns false before anything
    /// is sent.
    ///
    /// A lease that was lost before (even if nobody noticed yet, as after a pause past its
    /// fence deadline) is not released: this waits for the clean-up after the loss and returns
    /// `Err(Error::Lost(reason))`, so work that ran under it can be reported as unsafe.
    pub async fn release(mut self) -> Result<(), Error> {
        let Some(release_tx) = self.release_tx.take() else {
            return Ok(());
        };
        let (reply_tx, reply_rx) = oneshot::channel();
        if release_tx.send(Some(reply_tx)).is_ok() {
            if let Ok(result) = reply_rx.await {
                return result;
            }
        }
        // The holder task is gone (shut down with its backend or its runtime).
        match self.lost_reason() {
            Some(LostReason::Released) | None => Ok(()),
            Some(reason) => Err(Error::Lost(reason)),
        }
    }
}

impl Lease {
    /// Gives the lease back at `not_before`, not earlier, and returns at once: what a guarded
    /// call's [`min_hold`](crate::LeaseSpec::min_hold) does when the work ends early.
    ///
    /// Until `not_before` the lease stays held and watched by the backend's holder task (a loss
    /// meanwhile is handled as any loss); then it is released. If the holder task is stopped
    /// before then ([`Backend::shutdown`](crate::Backend::shutdown), the runtime shutting down as
    /// the process exits), a backend that can keep a lease on its server past its process leaves
    /// it held there until `not_before` instead of giving it back
    /// ([`Hold::keep_until`](crate::backend::Hold::keep_until): PostgreSQL, etcd, Consul); the
    /// others give it back then. A `not_before` already past is a plain release in the
    /// background.
    pub fn release_at(mut self, not_before: tokio::time::Instant) {
        self.state().release_not_before(not_before);
        if let Some(tx) = self.release_tx.take() {
            // A reply channel whose answer nobody reads: the holder task then never waits for a
            // second release request after a loss during the hold.
            let (reply_tx, _unread) = oneshot::channel();
            let _ = tx.send(Some(reply_tx));
        }
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

    /// See [`Lease::lost_reason`].
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.shared.state.lost_reason()
    }

    /// See [`Lease::lost`].
    pub fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        self.shared.state.lost_signal()
    }

    /// See [`Lease::run`]: the one body both share.
    pub async fn run<F: Future>(&self, work: F) -> Result<F::Output, LostReason> {
        let state = &*self.shared.state;
        let mut lost = pin!(state.lost_signal());
        let mut work = pin!(work);
        poll_fn(|cx| {
            if let Poll::Ready(reason) = lost.as_mut().poll(cx) {
                state.tally().cancelled();
                return Poll::Ready(Err(reason));
            }
            // The holder task may not have run since the deadline passed (a paused process):
            // the clock decides before the work is polled again.
            if !state.is_held() {
                state.tally().cancelled();
                return Poll::Ready(Err(state.lost_reason().unwrap_or(LostReason::Released)));
            }
            work.as_mut().poll(cx).map(Ok)
        })
        .await
    }
}

/// What a lease handle sends its holder task: release, with a reply channel if someone waits.
pub(crate) type ReleaseRequest = Option<oneshot::Sender<Result<(), Error>>>;

impl crate::metrics::Tallied for Lease {
    fn tally(&self) -> &crate::metrics::Tally {
        self.state().tally()
    }
}
