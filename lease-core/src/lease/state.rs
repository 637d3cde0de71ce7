//! The state a lease handle, its watchers and its holder task share, and the fence deadline.
//!
//! Two facts decide whether a lease is held: nobody has declared it lost, and its [`Fence`]
//! deadline has not passed. The second needs no task to run: a process resumed after a pause
//! (SIGSTOP, a long GC-like stall, a suspended VM) reads the monotonic clock, finds the deadline
//! behind it and treats the lease as lost before it polls guarded work again, whatever the holder
//! task has had time to do.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio::time::Instant;

use crate::limits::far_future;
use crate::metrics::Tally;
use crate::{Error, ErrorKind, LostReason};

/// The self-fencing deadline of a lease: the instant past which this process must treat the
/// lease as lost because the backend may already have given it to someone else.
///
/// A backend creates one per lease with the time a confirmation stays good for (Consul: the
/// session TTL less a margin; AMQP: part of the heartbeat), and calls [`confirm`](Fence::confirm)
/// with the send time of every request the backend answered. The deadline is the last
/// confirmation plus that time. [`Lease::is_held`](crate::Lease::is_held) and
/// [`Lease::run`](crate::Lease::run) read it on the monotonic clock (tokio's, so paused-time
/// tests drive it), and the holder task declares [`LostReason::SelfFenced`] when it passes.
///
/// The holder task's timer fires at the deadline in a process that runs. Found passed by more
/// than [`PAUSE_TOLERANCE`] (or a tenth of `valid_for`, if longer) since it fell due, by that
/// timer or by a reader, the deadline says that this process did not run (it was stopped, or
/// its runtime was blocked): the loss is then [`LostReason::ProcessPaused`], naming the pause
/// rather than the backend.
///
/// A confirmation says the backend still knows the holder; it says nothing of whether this
/// process would *see* a loss. A backend that watches its leases through something that can
/// stop (a shared watch that failed, or that is being rebuilt) calls
/// [`suspend`](Fence::suspend) when it stops seeing a lease and [`resume`](Fence::resume) when
/// it sees it again: confirmations stop counting from that moment, so a lease nobody watches is
/// dropped one confirmation interval later at the latest, however well its session is kept.
///
/// Cloning is cheap; clones share the deadline.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use lease_core::backend::Fence;
/// use tokio::time::Instant;
///
/// let sent = Instant::now();
/// let fence = Fence::new(Duration::from_secs(9), sent); // confirmed when the session was created
/// assert!(!fence.is_past());
/// let renewed = Instant::now();
/// fence.confirm(renewed); // a renewal sent now succeeded: good for 9 s from now
/// assert_eq!(fence.deadline(), Some(renewed + Duration::from_secs(9)));
///
/// // The lease's watch failed: renewals go on, but count only up to the failure...
/// let unwatched = Instant::now();
/// fence.suspend(unwatched);
/// let later = unwatched + Duration::from_secs(1);
/// fence.confirm(later);
/// assert_eq!(fence.deadline(), Some(unwatched + Duration::from_secs(9)));
/// // ...until the backend watches the lease again.
/// fence.resume();
/// assert_eq!(fence.deadline(), Some(later + Duration::from_secs(9)));
/// ```
#[derive(Clone)]
pub struct Fence(Arc<FenceInner>);

struct FenceInner {
    /// Instants are kept as nanoseconds after this one, so the deadline fits one atomic.
    epoch: Instant,
    valid_for: Duration,
    /// Nanoseconds after `epoch` of the last confirmation; `u64::MAX` for an unbounded fence.
    confirmed: AtomicU64,
    /// `min(confirmed, suspended) + valid_for`, kept beside them so the check on every poll is
    /// one load and one clock read.
    deadline: AtomicU64,
    /// Writers (confirmations, suspensions) take turns, so the deadline is computed from one
    /// consistent pair of instants. Readers never take it.
    writer: Mutex<Writer>,
    /// Woken when the deadline moves earlier (a suspension), for [`Fence::expiry`].
    lowered: Notify,
    /// Nanoseconds after `epoch` of the last time the deadline was set earlier (or of the
    /// fence's creation): a timer set then fires at the deadline or at once, whichever is later.
    lowered_at: AtomicU64,
}

#[derive(Default)]
struct Writer {
    /// Nanoseconds after `epoch` from which confirmations stop counting.
    suspended: Option<u64>,
}

impl fmt::Debug for Fence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fence")
            .field("valid_for", &self.0.valid_for)
            .field("deadline", &self.deadline())
            .field("suspended", &self.suspended_since())
            .finish()
    }
}

const UNBOUNDED: u64 = u64::MAX;

/// How late a fence deadline may be found passed, after it fell due, before the lateness is
/// taken for a process that did not run (see [`Fence`]); a tenth of the fence's `valid_for` if
/// that is longer. A running process's timers fire within milliseconds, even on a loaded machine.
pub const PAUSE_TOLERANCE: Duration = Duration::from_secs(1);

impl Fence {
    /// A fence confirmed at `confirmed_at` (the send time of the request that created the lease's
    /// session or connection), each confirmation good for `valid_for`.
    pub fn new(valid_for: Duration, confirmed_at: Instant) -> Fence {
        Fence(Arc::new(FenceInner {
            epoch: confirmed_at,
            valid_for,
            confirmed: AtomicU64::new(0),
            deadline: AtomicU64::new(saturating_nanos(valid_for)),
            writer: Mutex::default(),
            lowered: Notify::new(),
            lowered_at: AtomicU64::new(nanos_between(confirmed_at, Instant::now())),
        }))
    }

    /// A fence that never passes, for a backend whose lease cannot outlive its holder (one
    /// process, or a lock the operating system frees when the process dies).
    pub fn unbounded() -> Fence {
        Fence(Arc::new(FenceInner {
            epoch: Instant::now(),
            valid_for: Duration::ZERO,
            confirmed: AtomicU64::new(UNBOUNDED),
            deadline: AtomicU64::new(UNBOUNDED),
            writer: Mutex::default(),
            lowered: Notify::new(),
            lowered_at: AtomicU64::new(0),
        }))
    }

    /// Records that the backend answered a request sent at `sent`: the lease is safe until
    /// `sent + valid_for` (unless [suspended](Fence::suspend)). A confirmation older than the
    /// last one changes nothing.
    pub fn confirm(&self, sent: Instant) {
        let nanos = nanos_between(self.0.epoch, sent).min(UNBOUNDED - 1);
        let writer = self.writer();
        if self.0.confirmed.load(Ordering::Acquire) == UNBOUNDED {
            return;
        }
        self.0.confirmed.fetch_max(nanos, Ordering::AcqRel);
        self.store_deadline(&writer);
    }

    /// Confirmations stop counting from `since`: until [`resume`](Fence::resume), the deadline
    /// is at most `since + valid_for`, whatever is confirmed meanwhile.
    ///
    /// For a backend that stopped seeing the lease (its watch failed, or is being rebuilt) while
    /// the lease itself is still confirmed: the lease must not outlive what the process can no
    /// longer see. A second suspension keeps the earlier instant. Does nothing to an unbounded
    /// fence.
    pub fn suspend(&self, since: Instant) {
        let since = nanos_between(self.0.epoch, since).min(UNBOUNDED - 1);
        let mut writer = self.writer();
        if self.0.confirmed.load(Ordering::Acquire) == UNBOUNDED {
            return;
        }
        let since = writer.suspended.map_or(since, |earlier| earlier.min(since));
        writer.suspended = Some(since);
        if self.store_deadline(&writer) {
            self.0.lowered.notify_waiters();
        }
    }

    /// Confirmations count again (the backend sees the lease again): the deadline is the last
    /// confirmation plus `valid_for`. A deadline that already passed stays passed: the holder
    /// task has declared the loss.
    pub fn resume(&self) {
        let mut writer = self.writer();
        if writer.suspended.take().is_some() {
            self.store_deadline(&writer);
        }
    }

    /// Since when confirmations do not count, if they are [suspended](Fence::suspend).
    pub fn suspended_since(&self) -> Option<Instant> {
        let writer = self.writer();
        writer
            .suspended
            .map(|nanos| self.0.epoch + Duration::from_nanos(nanos))
    }

    fn writer(&self) -> std::sync::MutexGuard<'_, Writer> {
        self.0.writer.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Stores `min(confirmed, suspended) + valid_for`; returns whether it moved earlier. The
    /// caller holds the writer lock.
    fn store_deadline(&self, writer: &Writer) -> bool {
        let confirmed = self.0.confirmed.load(Ordering::Acquire);
        let counted = writer.suspended.map_or(confirmed, |s| s.min(confirmed));
        let deadline = counted
            .saturating_add(saturating_nanos(self.0.valid_for))
            .min(UNBOUNDED - 1);
        let lowered = self.0.deadline.swap(deadline, Ordering::AcqRel) > deadline;
        if lowered {
            let now = nanos_between(self.0.epoch, Instant::now());
            self.0.lowered_at.fetch_max(now, Ordering::AcqRel);
        }
        lowered
    }

    /// How long one confirmation is good for.
    pub fn valid_for(&self) -> Duration {
        self.0.valid_for
    }

    /// When the last confirmation was sent; `None` for an unbounded fence. (While the fence is
    /// [suspended](Fence::suspend), the deadline may be earlier than this plus `valid_for`.)
    pub fn confirmed_at(&self) -> Option<Instant> {
        match self.0.confirmed.load(Ordering::Acquire) {
            UNBOUNDED => None,
            nanos => Some(self.0.epoch + Duration::from_nanos(nanos)),
        }
    }

    /// The instant the lease must be treated as lost by; `None` for an unbounded fence.
    pub fn deadline(&self) -> Option<Instant> {
        match self.0.deadline.load(Ordering::Acquire) {
            UNBOUNDED => None,
            nanos => Some(
                self.0
                    .epoch
                    .checked_add(Duration::from_nanos(nanos))
                    .unwrap_or_else(far_future),
            ),
        }
    }

    /// Whether the deadline has passed.
    pub fn is_past(&self) -> bool {
        self.overdue().is_some()
    }

    /// How long the lease has gone unconfirmed (or unseen), once that is past the deadline;
    /// `None` before.
    pub fn overdue(&self) -> Option<Duration> {
        self.passed().map(|passed| passed.unconfirmed_for)
    }

    /// The deadline as found passed now; `None` before it.
    fn passed(&self) -> Option<Passed> {
        // The fast path of every poll: nothing to compute while the deadline is ahead.
        let deadline = self.0.deadline.load(Ordering::Acquire);
        let now = nanos_between(self.0.epoch, Instant::now());
        if deadline == UNBOUNDED || now < deadline {
            return None;
        }
        let counted = deadline.saturating_sub(saturating_nanos(self.0.valid_for));
        let due = deadline.max(self.0.lowered_at.load(Ordering::Acquire));
        Some(Passed {
            unconfirmed_for: Duration::from_nanos(now.saturating_sub(counted)),
            late: Duration::from_nanos(now.saturating_sub(due)),
        })
    }

    /// The loss to declare when the deadline has passed, `None` before:
    /// [`LostReason::ProcessPaused`] if it was found passed too late for a process that runs
    /// (see [`Fence`]), else [`LostReason::SelfFenced`].
    ///
    /// What the holder task declares; a backend that runs a fence of its own (a waiter's
    /// session, a pooled lease) declares the same with it.
    pub fn expired(&self) -> Option<LostReason> {
        let Passed {
            unconfirmed_for,
            late,
        } = self.passed()?;
        let tolerance = PAUSE_TOLERANCE.max(self.0.valid_for / 10);
        Some(if late > tolerance {
            LostReason::ProcessPaused {
                paused_for: late,
                unconfirmed_for,
            }
        } else {
            LostReason::SelfFenced { unconfirmed_for }
        })
    }

    /// `error`, met by a backend call while waiting or holding under this fence, or the loss
    /// that explains it: once the fence has passed because this process was paused
    /// ([`LostReason::ProcessPaused`]), a call whose timer ran out in the pause (an error of kind
    /// [`TimedOut`](ErrorKind::TimedOut) or [`Unreachable`](ErrorKind::Unreachable)) fails
    /// beside the fence's own timer, in either order, and the pause, not the server, is the
    /// cause to report. Any other error (a permission denied, a conflicting key: what a retry
    /// cannot cure), and any error before the fence passed, is returned as it is.
    ///
    /// ```
    /// use std::time::Duration;
    /// use lease_core::backend::Fence;
    /// use lease_core::Error;
    ///
    /// let fence = Fence::new(Duration::from_secs(9), tokio::time::Instant::now());
    /// let timed_out = || Error::Unreachable {
    ///     backend: "etcd",
    ///     address: "http://127.0.0.1:2379".into(),
    ///     hint: "etcd or the network is overloaded",
    ///     source: "Timeout expired".into(),
    /// };
    /// // The fence has not passed: the call's error is the one to report.
    /// assert!(matches!(fence.explain(timed_out()), Error::Unreachable { .. }));
    /// ```
    pub fn explain(&self, error: Error) -> Error {
        if !matches!(error.kind(), ErrorKind::TimedOut | ErrorKind::Unreachable) {
            return error;
        }
        match self.expired() {
            Some(reason @ LostReason::ProcessPaused { .. }) => Error::Lost(reason),
            _ => error,
        }
    }

    /// Completes when the deadline passes, following every later confirmation and suspension.
    pub(crate) async fn expiry(&self) -> LostReason {
        loop {
            let lowered = self.0.lowered.notified();
            tokio::pin!(lowered);
            // Registered before the deadline is read, so a suspension in between still wakes us.
            lowered.as_mut().enable();
            let Some(deadline) = self.deadline() else {
                return std::future::pending().await;
            };
            tokio::select! {
                biased;
                () = tokio::time::sleep_until(deadline) => {}
                () = lowered => {}
            }
            if let Some(reason) = self.expired() {
                return reason;
            }
        }
    }
}

/// A passed deadline: how long the lease went unconfirmed, and how long after the deadline fell
/// due (for a timer set when it was) it was found passed.
struct Passed {
    unconfirmed_for: Duration,
    late: Duration,
}

fn saturating_nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(UNBOUNDED - 1)
}

fn nanos_between(earlier: Instant, later: Instant) -> u64 {
    u64::try_from(later.saturating_duration_since(earlier).as_nanos()).unwrap_or(UNBOUNDED - 1)
}

/// The state shared by a lease handle, its watchers and its holder task.
pub(crate) struct LeaseState {
    held: AtomicBool,
    /// The reason, once lost; published in the same step as `held` turns false.
    lost: watch::Sender<Option<LostReason>>,
    fence: Fence,
    /// What the metrics have recorded about this lease.
    tally: Tally,
    /// The earliest time a release may give the lease back ([`Lease::release_at`](crate::Lease::release_at)).
    release_not_before: Mutex<Option<Instant>>,
}

impl LeaseState {
    pub(crate) fn new(fence: Fence) -> Self {
        LeaseState {
            held: AtomicBool::new(true),
            lost: watch::channel(None).0,
            fence,
            tally: Tally::default(),
            release_not_before: Mutex::new(None),
        }
    }

    /// Sets the earliest time a release may give the lease back.
    pub(crate) fn release_not_before(&self, not_before: Instant) {
        *self
            .release_not_before
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(not_before);
    }

    /// The earliest time a release may give the lease back, if it is still ahead.
    pub(crate) fn release_due_at(&self) -> Option<Instant> {
        self.release_not_before
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .filter(|not_before| *not_before > Instant::now())
    }

    /// Held: not declared lost, and the fence deadline not passed. Past the deadline this
    /// declares the loss itself, so every reader agrees from then on.
    pub(crate) fn is_held(&self) -> bool {
        self.held.load(Ordering::Acquire) && self.fence_holds()
    }

    /// Whether the fence deadline is still ahead; declares `SelfFenced` if it is not.
    fn fence_holds(&self) -> bool {
        match self.fence.expired() {
            None => true,
            Some(reason) => {
                self.lose(reason);
                false
            }
        }
    }

    /// The reason the lease is lost, checking the fence first; `None` while it is held.
    pub(crate) fn lost_reason(&self) -> Option<LostReason> {
        self.fence_holds();
        self.lost.borrow().clone()
    }

    pub(crate) fn fence(&self) -> &Fence {
        &self.fence
    }

    pub(crate) fn tally(&self) -> &Tally {
        &self.tally
    }

    /// Marks the lease lost; the first reason wins. The reason is readable by the time `held`
    /// turns false, and both change before any waiter wakes. Returns whether this call marked it.
    pub(crate) fn lose(&self, reason: LostReason) -> bool {
        self.lost.send_if_modified(|current| {
            if current.is_some() {
                return false;
            }
            self.tally.declared(&reason);
            *current = Some(reason);
            self.held.store(false, Ordering::Release);
            true
        })
    }

    /// Replaces the reason of a loss with a more precise one found after it was published.
    pub(crate) fn refine(&self, reason: LostReason) {
        self.lost.send_if_modified(|current| match current {
            Some(old) if *old != LostReason::Released && *old != reason => {
                *old = reason;
                true
            }
            _ => false,
        });
    }

    pub(crate) fn lost_signal(&self) -> impl Future<Output = LostReason> + Send + 'static {
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

#[cfg(test)]
mod tests;
