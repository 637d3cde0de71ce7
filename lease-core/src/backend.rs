//! The [`Backend`] trait: what every lease backend (Consul, AMQP, memory) offers.

use std::fmt;
use std::sync::Arc;

use crate::{BoxFuture, Error, Lease, LeaseSpec};

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
}

impl<B: Backend + ?Sized> Backend for Arc<B> {
    fn acquire<'a>(&'a self, spec: &'a LeaseSpec) -> BoxFuture<'a, Result<Lease, Error>> {
        (**self).acquire(spec)
    }
}

impl<B: Backend + ?Sized> Backend for Box<B> {
    fn acquire<'a>(&'a self, spec: &'a LeaseSpec) -> BoxFuture<'a, Result<Lease, Error>> {
        (**self).acquire(spec)
    }
}
