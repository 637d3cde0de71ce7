//! The process-wide default backend, used by guarded work that names no backend of its own.
//!
//! `#[leader_only]` and `#[semaphore]` without `backend = …` (and [`guarded_by_default`]) acquire
//! from the backend set here. A program sets it once at start-up, before the first guarded call;
//! if it never does, those calls fail with [`Error::NoDefaultBackend`] instead of running unguarded.
//!
//! [`guarded_by_default`]: crate::guarded_by_default

use std::sync::{Arc, PoisonError, RwLock};

use crate::{Backend, Error};

static DEFAULT_BACKEND: RwLock<Option<Arc<dyn Backend>>> = RwLock::new(None);

/// Sets the backend that guarded work uses when it names none, and returns the previous one.
///
/// `backend` is any backend: by value, in an `Arc`, or an `Arc<dyn Backend>` chosen at start-up
/// ([`into_shared`](crate::backend::into_shared)).
///
/// Call it once at start-up. Replacing it later affects only acquisitions that start afterwards:
/// leases already held stay with the backend that granted them.
///
/// # Examples
///
/// ```
/// # #[cfg(feature = "memory")]
/// # {
/// lease_core::set_default_backend(lease_core::memory::Memory::new());
/// assert!(lease_core::default_backend().is_ok());
/// # }
/// ```
pub fn set_default_backend(backend: impl Backend) -> Option<Arc<dyn Backend>> {
    let backend = crate::backend::into_shared(backend);
    // The lock guards a plain pointer swap, so a panic elsewhere cannot leave it half-written.
    let mut slot = DEFAULT_BACKEND
        .write()
        .unwrap_or_else(PoisonError::into_inner);
    slot.replace(backend)
}

/// The backend set by [`set_default_backend`], or [`Error::NoDefaultBackend`] if none was set.
pub fn default_backend() -> Result<Arc<dyn Backend>, Error> {
    DEFAULT_BACKEND
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
        .ok_or(Error::NoDefaultBackend)
}
