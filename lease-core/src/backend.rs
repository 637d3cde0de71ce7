//! The backend contract: the [`Backend`] trait every lease backend (Consul, etcd, AMQP, memory)
//! implements, and the parts a backend builds its [`Lease`]s from.
//!
//! A backend author writes two things:
//!
//! - an implementation of [`Backend`]: `acquire` wraps the backend's protocol in
//!   [`instrument_acquire`] (its span and metrics) and ends with [`Keepers::start`];
//!   `check_sequencer` verifies any sequencer the backend issues; `reachability` reads a
//!   [`ReachabilityTracker`] fed where the backend sends its requests; `shutdown` calls
//!   [`Keepers::shutdown`];
//! - a [`Hold`] for one held lease: watch it until it is lost, release it, clean up after a
//!   loss, and (optionally) give it back without a runtime when the process ends, and keep it
//!   on the server past its holder until a set time ([`Hold::keep_until`], what `min_hold`
//!   needs; the conformance suite's `KeepsPastHolder` tests it).
//!
//! The holder task that drives a [`Hold`] is the crate's, so every backend orders loss before
//! clean-up, turns `is_held()` false before releasing, bounds releases by [`RELEASE_BOUND`], and
//! self-fences on its [`Fence`] the same way. The backend crates of this repository (lease-consul,
//! lease-etcd, lease-amqp) are built on this module and the other public parts of lease-core,
//! and nothing else.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

mod keeper;

pub use crate::lease::{Fence, PAUSE_TOLERANCE};
pub use keeper::{ACQUIRE_SLACK, ATTEMPT_BOUND, Hold, Keepers, RELEASE_BOUND, instrument_acquire};

use crate::observer::LeaderObserver;
use crate::{BoxFuture, Error, Lease, LeaseSpec, Sequencer};

/// A place leases are acquired from.
///
/// The trait is dyn-compatible, so a process can hold an `Arc<dyn Backend>` chosen at start-up.
pub trait Backend: Send + Sync + fmt::Debug + 'static {
    /// Acquires the lease `spec` names, waiting as `spec` says.
    ///
    /// Returns [`Error::Busy`] when the lease is held elsewhere and the wait ran out (or was
    /// [`Wait::Never`](crate::Wait::Never)), a validation error for a spec that breaks
    /// [`LeaseSpec::validate`], or the backend's error.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: if the future is dropped, whatever it had created (a session, a half-taken
    /// slot) is given back in the background, and no lease is left held.
    fn acquire<'a>(&'a self, spec: &'a LeaseSpec) -> BoxFuture<'a, Result<Lease, Error>>;

    /// Watches who holds the leader key `key`, without campaigning for it.
    ///
    /// The observer's value is the current [`Leader`](crate::leader::Leader) (its sequencer and the
    /// value it advertises), or `None` while nobody holds the key; it is kept fresh by the
    /// backend's watch until the observer is dropped.
    ///
    /// The default body returns [`Error::Unsupported`], so a backend that cannot observe yet still
    /// implements the trait.
    fn observe_leader<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<LeaderObserver, Error>> {
        let _ = key;
        Box::pin(async {
            Err(Error::Unsupported {
                backend: std::any::type_name::<Self>(),
                operation: "observing a leader key",
            })
        })
    }

    /// Whether `sequencer` still names a current holder: of its leader key, or of a slot of its
    /// semaphore. One consistent read, for a service that receives work stamped with a sequencer
    /// and must refuse stale work; [`Lease::check`] asks the same question.
    ///
    /// Every backend answers it for every sequencer it issues. `Ok(())` if it is current,
    /// `Err(Error::Lost(_))` if not (released, deleted, pruned, or taken by a newer acquisition),
    /// another error if the backend could not tell. The default body returns
    /// [`Error::Unsupported`].
    fn check_sequencer<'a>(&'a self, sequencer: &'a Sequencer) -> BoxFuture<'a, Result<(), Error>> {
        let _ = sequencer;
        Box::pin(async {
            Err(Error::Unsupported {
                backend: std::any::type_name::<Self>(),
                operation: "checking a sequencer",
            })
        })
    }

    /// Whether this handle's server answered its last request: for a health check's readiness
    /// (`lease-tower`'s `health` module). No I/O of its own: it reports what the requests the
    /// backend sends anyway (renewals, watches, acquisitions) have found. A backend that reports
    /// [`Reachability::Unreachable`] should probe its server in the background until it answers
    /// (a cheap request about every second; lease-http's `Probe`), so that the report turns
    /// current again when the server is back even if nothing else is sent: the backends of this
    /// repository do.
    ///
    /// The default body returns [`Reachability::Unknown`].
    fn reachability(&self) -> Reachability {
        Reachability::Unknown
    }

    /// Releases every lease acquired through this backend handle (and its clones) that is still
    /// held, and waits until they and every pending release (a dropped lease, a cancelled
    /// acquire's session) are given back, at most about [`RELEASE_BOUND`].
    ///
    /// Await it before `main` returns, so the next holder takes over at once. A process that
    /// ends without it still gives its leases back, best effort, within about a second while
    /// the runtime shuts down. The default body does nothing.
    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

/// Shares `backend` as the `Arc<dyn Backend>` that campaigns, layers and the default backend
/// keep: every API that keeps a backend takes `impl Backend` and calls this.
///
/// Any backend is accepted the same way: a backend by value (`Memory::new()`,
/// `Consul::from_env()?`), an `Arc` of one (`Arc<Consul>`), or an `Arc<dyn Backend>` chosen at
/// start-up. An `Arc<dyn Backend>` is returned as it is, not wrapped in a second `Arc`, so
/// clones of it keep pointing at the same backend.
///
/// # Examples
///
/// ```
/// # #[cfg(feature = "memory")]
/// # {
/// use std::sync::Arc;
/// use lease_core::{Backend, backend::into_shared, memory::Memory};
///
/// let chosen: Arc<dyn Backend> = Arc::new(Memory::new());
/// assert!(Arc::ptr_eq(&into_shared(Arc::clone(&chosen)), &chosen));
/// let _by_value: Arc<dyn Backend> = into_shared(Memory::new());
/// # }
/// ```
pub fn into_shared<B: Backend>(backend: B) -> Arc<dyn Backend> {
    // Without specialization, the one case to unwrap is told apart at run time; `B: 'static`
    // (every backend is) makes it an `Any`.
    if let Some(shared) = (&backend as &dyn Any).downcast_ref::<Arc<dyn Backend>>() {
        return Arc::clone(shared);
    }
    Arc::new(backend)
}

/// A backend behind a smart pointer is the backend: `Arc<dyn Backend>`, `Box<dyn Backend>`.
macro_rules! forward_backend {
    ($($pointer:ident),*) => {$(
        impl<B: Backend + ?Sized> Backend for $pointer<B> {
            fn acquire<'a>(&'a self, spec: &'a LeaseSpec) -> BoxFuture<'a, Result<Lease, Error>> {
                (**self).acquire(spec)
            }

            fn observe_leader<'a>(
                &'a self,
                key: &'a str,
            ) -> BoxFuture<'a, Result<LeaderObserver, Error>> {
                (**self).observe_leader(key)
            }

            fn check_sequencer<'a>(
                &'a self,
                sequencer: &'a Sequencer,
            ) -> BoxFuture<'a, Result<(), Error>> {
                (**self).check_sequencer(sequencer)
            }

            fn reachability(&self) -> Reachability {
                (**self).reachability()
            }

            fn shutdown(&self) -> BoxFuture<'_, ()> {
                (**self).shutdown()
            }
        }
    )*};
}

forward_backend!(Arc, Box);

/// What a backend handle knows about reaching its server, from the requests it has sent
/// ([`Backend::reachability`]).
///
/// # Examples
///
/// ```
/// # #[cfg(feature = "memory")] {
/// use lease_core::Backend;
/// use lease_core::backend::Reachability;
///
/// // The in-process backend is always there.
/// assert_eq!(lease_core::memory::Memory::new().reachability(), Reachability::Reachable);
/// # }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Reachability {
    /// Nothing is known: no request has been answered or has failed yet, or the backend does not
    /// track it.
    Unknown,
    /// The last request was answered (an error answer counts: the server is there).
    Reachable,
    /// Every request sent since `since` went unanswered (refused, reset, timed out).
    Unreachable {
        /// When the first of those requests failed.
        since: tokio::time::Instant,
    },
}

impl Reachability {
    /// How long the server has been unreachable; `None` unless it is.
    pub fn unreachable_for(&self) -> Option<std::time::Duration> {
        match self {
            Reachability::Unreachable { since } => Some(since.elapsed()),
            _ => None,
        }
    }
}

/// Whether a client's requests have lately been answered: what [`Backend::reachability`]
/// reports. Fed by the one place each backend sends its requests (or, for RabbitMQ, opens and
/// loses its connections).
///
/// A server that hangs is unreachable too, and from the moment it stopped answering, not from
/// the moment a request's timeout ran out: while a request sent at `t` is unanswered and the
/// server has answered nothing for [`HANG_AFTER`], the server is reported unreachable since `t`
/// (or since its last answer, if that came after `t`). (A partitioned agent once showed as reachable for the whole 10 s timeout of a
/// hung request, and readiness lagged the self-fence by as much.)
///
/// [`Backend::reachability`]: crate::Backend::reachability
#[derive(Debug, Default)]
pub struct ReachabilityTracker(std::sync::Mutex<Tracked>);

/// How long a request that answers at once may go unanswered before the server counts as
/// hanging: far above a healthy answer (milliseconds; tens of them for a large listing), far
/// below any request timeout.
pub const HANG_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

#[derive(Debug)]
struct Tracked {
    /// What the answers and failures said.
    seen: Reachability,
    /// When the last answer came.
    last_answer: Option<tokio::time::Instant>,
    /// The send times of the requests in flight, with how many were sent at each.
    in_flight: std::collections::BTreeMap<tokio::time::Instant, usize>,
}

impl Default for Tracked {
    fn default() -> Self {
        Tracked {
            seen: Reachability::Unknown,
            last_answer: None,
            in_flight: std::collections::BTreeMap::new(),
        }
    }
}

/// A request in flight, from [`ReachabilityTracker::sending`]; forgotten when dropped, except
/// that one dropped unanswered after hanging (its caller gave up on it: a timeout, or a lease
/// that ended meanwhile) leaves the outage it showed on record, dated from its send time, until
/// something answers. (RabbitMQ tracks its connections, not its requests.)
#[derive(Debug)]
pub struct InFlight<'a> {
    tracker: &'a ReachabilityTracker,
    sent: tokio::time::Instant,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let mut tracked = self.tracker.lock();
        if let Some(count) = tracked.in_flight.get_mut(&self.sent) {
            *count -= 1;
            if *count == 0 {
                tracked.in_flight.remove(&self.sent);
            }
        }
        let silent_since = tracked.silent_since(self.sent);
        if silent_since.elapsed() >= HANG_AFTER {
            tracked.seen = match tracked.seen {
                Reachability::Unreachable { since } => Reachability::Unreachable {
                    since: since.min(silent_since),
                },
                _ => Reachability::Unreachable {
                    since: silent_since,
                },
            };
        }
    }
}

impl Tracked {
    /// Since when the server has said nothing to a request sent at `sent` that is still
    /// unanswered: from the send, or from a later answer to an earlier request (an answer on its
    /// way when the server stopped must not hide the hang that follows).
    fn silent_since(&self, sent: tokio::time::Instant) -> tokio::time::Instant {
        self.last_answer.map_or(sent, |answer| answer.max(sent))
    }
}

impl ReachabilityTracker {
    fn lock(&self) -> std::sync::MutexGuard<'_, Tracked> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A request that should answer at once is being sent: until the returned guard is
    /// dropped, it counts towards a hang.
    pub fn sending(&self) -> InFlight<'_> {
        let sent = tokio::time::Instant::now();
        *self.lock().in_flight.entry(sent).or_default() += 1;
        InFlight {
            tracker: self,
            sent,
        }
    }

    /// A request was `answered` (any answer), or went unanswered.
    pub fn answered(&self, answered: bool) {
        let mut tracked = self.lock();
        let now = tokio::time::Instant::now();
        if answered {
            tracked.last_answer = Some(now);
        }
        tracked.seen = match (tracked.seen, answered) {
            (_, true) => Reachability::Reachable,
            // The outage started with its first failure.
            (outage @ Reachability::Unreachable { .. }, false) => outage,
            (_, false) => Reachability::Unreachable { since: now },
        };
    }

    /// What the tracked requests say now: what [`Backend::reachability`] reports.
    pub fn get(&self) -> Reachability {
        let tracked = self.lock();
        let hung_since = tracked
            .in_flight
            .keys()
            .next()
            .map(|oldest| tracked.silent_since(*oldest))
            .filter(|silent| silent.elapsed() >= HANG_AFTER);
        match (tracked.seen, hung_since) {
            (seen, None) => seen,
            (Reachability::Unreachable { since }, Some(hung)) => Reachability::Unreachable {
                since: since.min(hung),
            },
            (_, Some(hung)) => Reachability::Unreachable { since: hung },
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::time::Instant;

    use super::*;

    /// A request that hangs makes the server unreachable from when it was sent, once it has hung
    /// for `HANG_AFTER`, unless something sent later was answered; a refusal counts at once.
    #[tokio::test(start_paused = true)]
    async fn a_hanging_server_is_unreachable_from_its_first_unanswered_request() {
        let tracker = ReachabilityTracker::default();
        tracker.answered(true);
        tokio::time::sleep(Duration::from_millis(1)).await;
        let sent = Instant::now();
        let hung = tracker.sending();
        tokio::time::sleep(HANG_AFTER / 2).await;
        assert_eq!(tracker.get(), Reachability::Reachable, "not yet a hang");
        tokio::time::sleep(HANG_AFTER).await;
        assert_eq!(tracker.get(), Reachability::Unreachable { since: sent });
        assert!(tracker.get().unreachable_for() >= Some(HANG_AFTER));

        // A later request answered: the server talks, the one request is just slow.
        let other = tracker.sending();
        tracker.answered(true);
        drop(other);
        assert_eq!(tracker.get(), Reachability::Reachable);
        drop(hung);

        // A refusal counts at once, and an earlier hang dates the outage.
        tokio::time::sleep(Duration::from_millis(1)).await;
        let hung = tracker.sending();
        let hung_at = Instant::now();
        tokio::time::sleep(Duration::from_secs(2)).await;
        tracker.answered(false);
        assert_eq!(tracker.get(), Reachability::Unreachable { since: hung_at });
        drop(hung);
        tracker.answered(true);
        assert_eq!(tracker.get(), Reachability::Reachable);

        // A hung request given up on (dropped unanswered) leaves its outage on record until
        // something answers; one dropped before it counted as a hang leaves nothing.
        tokio::time::sleep(Duration::from_millis(1)).await;
        drop(tracker.sending());
        assert_eq!(tracker.get(), Reachability::Reachable);
        let hung_at = Instant::now();
        let hung = tracker.sending();
        tokio::time::sleep(HANG_AFTER * 2).await;
        drop(hung);
        assert_eq!(tracker.get(), Reachability::Unreachable { since: hung_at });
        tracker.answered(true);
        assert_eq!(tracker.get(), Reachability::Reachable);
    }

    /// An answer to an earlier request that lands after a request was sent (the server stopped
    /// just after sending it) does not hide that request's hang: the server is unreachable once
    /// it has said nothing for `HANG_AFTER`, from that answer. (Such a request, given up on, was
    /// once forgotten, and a Consul agent frozen at that moment stayed "reachable" for good.)
    #[tokio::test(start_paused = true)]
    async fn an_answer_landing_after_a_send_dates_the_hang_from_itself() {
        let tracker = ReachabilityTracker::default();
        let earlier = tracker.sending();
        tokio::time::sleep(Duration::from_millis(1)).await;
        let hung = tracker.sending();
        tokio::time::sleep(Duration::from_millis(1)).await;
        tracker.answered(true);
        drop(earlier);
        let answered_at = Instant::now();
        tokio::time::sleep(HANG_AFTER / 2).await;
        assert_eq!(tracker.get(), Reachability::Reachable);
        tokio::time::sleep(HANG_AFTER).await;
        let outage = Reachability::Unreachable { since: answered_at };
        assert_eq!(tracker.get(), outage);
        // Given up on, it leaves the outage on record.
        drop(hung);
        assert_eq!(tracker.get(), outage);
    }
}
