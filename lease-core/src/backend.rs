//! The [`Backend`] trait: what every lease backend (Consul, AMQP, memory) offers.

use std::fmt;
use std::sync::Arc;

use crate::leader::LeaderObserver;
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

    /// Whether `sequencer` still names the current holder of its leader key: one consistent read,
    /// for a service that receives work stamped with a sequencer and must refuse stale work.
    ///
    /// `Ok(())` if it does, `Err(Error::Lost(_))` if not (released, deleted, or taken by a newer
    /// acquisition), another error if the backend could not tell. The default body returns
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
}

impl<B: Backend + ?Sized> Backend for Arc<B> {
    fn acquire<'a>(&'a self, spec: &'a LeaseSpec) -> BoxFuture<'a, Result<Lease, Error>> {
        (**self).acquire(spec)
    }

    fn observe_leader<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<LeaderObserver, Error>> {
        (**self).observe_leader(key)
    }

    fn check_sequencer<'a>(&'a self, sequencer: &'a Sequencer) -> BoxFuture<'a, Result<(), Error>> {
        (**self).check_sequencer(sequencer)
    }
}

impl<B: Backend + ?Sized> Backend for Box<B> {
    fn acquire<'a>(&'a self, spec: &'a LeaseSpec) -> BoxFuture<'a, Result<Lease, Error>> {
        (**self).acquire(spec)
    }

    fn observe_leader<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<LeaderObserver, Error>> {
        (**self).observe_leader(key)
    }

    fn check_sequencer<'a>(&'a self, sequencer: &'a Sequencer) -> BoxFuture<'a, Result<(), Error>> {
        (**self).check_sequencer(sequencer)
    }
}
