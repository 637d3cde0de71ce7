//! The default backend, used by guarded work that names no backend of its own.
//!
//! `#[leader_only]` and `#[semaphore]` without `backend = …` (and [`guarded_by_default`]) acquire
//! from the backend in scope ([`with_default_backend`]) or else from the process-wide one
//! ([`set_default_backend`]). A program sets the process-wide one once at start-up, before the
//! first guarded call; tests, which run in parallel in one process, scope theirs instead. With
//! neither, those calls fail with [`Error::NoDefaultBackend`] instead of running unguarded.
//!
//! [`guarded_by_default`]: crate::guarded_by_default

use std::future::Future;
use std::sync::{Arc, PoisonError, RwLock};

use crate::{Backend, Error};

static DEFAULT_BACKEND: RwLock<Option<Arc<dyn Backend>>> = RwLock::new(None);

tokio::task_local! {
    static SCOPED_DEFAULT_BACKEND: Arc<dyn Backend>;
}

/// Runs `work` with `backend` as the default backend of the guarded calls it makes, ahead of the
/// process-wide one, which it neither reads nor changes.
///
/// For parallel `#[tokio::test]`s, each with a backend of its own, and for a part of a program
/// that must use another backend than the rest. The scope is task-local, like tokio's
/// `task_local!`: it covers `work` and everything `work` awaits, but not tasks `work` spawns;
/// wrap their futures too. Scopes nest: the innermost wins.
///
/// `backend` is any backend: by value, in an `Arc`, or an `Arc<dyn Backend>`
/// ([`into_shared`](crate::backend::into_shared)).
///
/// # Examples
///
/// ```
/// # #[cfg(feature = "memory")]
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), lease_core::GuardError> {
/// use lease_core::{LeaseSpec, guarded_by_default, memory::Memory, with_default_backend};
///
/// let memory = Memory::new();
/// let spec = LeaseSpec::leader("jobs/compact");
/// let ran = with_default_backend(memory.clone(), async {
///     // Macros without `backend = …` and guarded_by_default acquire from `memory` here.
///     guarded_by_default(&spec, async { memory.sessions().len() }).await
/// })
/// .await?;
/// assert_eq!(ran, 1);
/// # Ok(())
/// # }
/// # #[cfg(not(feature = "memory"))]
/// # fn main() {}
/// ```
pub fn with_default_backend<F: Future>(
    backend: impl Backend,
    work: F,
) -> impl Future<Output = F::Output> {
    SCOPED_DEFAULT_BACKEND.scope(crate::backend::into_shared(backend), work)
}

/// Sets the backend that guarded work uses when it names none, and returns the previous one.
///
/// `backend` is any backend: by value, in an `Arc`, or an `Arc<dyn Backend>` chosen at start-up
/// ([`into_shared`](crate::backend::into_shared)).
///
/// Call it once at start-up. It is process-wide: tests that run in parallel should each scope a
/// backend of their own with [`with_default_backend`] instead, which takes precedence.
/// Replacing it later affects only acquisitions that start afterwards:
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

/// The default backend: the one in scope ([`with_default_backend`]), else the one set by
/// [`set_default_backend`], else [`Error::NoDefaultBackend`].
pub fn default_backend() -> Result<Arc<dyn Backend>, Error> {
    if let Ok(scoped) = SCOPED_DEFAULT_BACKEND.try_with(Arc::clone) {
        return Ok(scoped);
    }
    DEFAULT_BACKEND
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
        .ok_or(Error::NoDefaultBackend)
}
