//! [`AdvanceOnAcquire`]: a backend whose every leader acquisition registers the new holder with
//! the fence before `acquire` returns, so that nothing of an older holder commits after it.

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use lease_core::backend::{Reachability, into_shared};
use lease_core::leader::LeaderObserver;
use lease_core::{Backend, BackendError, BoxFuture, ErrorKind, Lease, LeaseSpec, Sequencer};

use super::{Error, Token};

/// How the wrapper advances the fence: one [`ADVANCE_CALL`](super::ADVANCE_CALL) in a
/// transaction of its own, with a client the integration holds.
type Advance = Arc<dyn Fn(Sequencer) -> BoxFuture<'static, Result<(), Error>> + Send + Sync>;

/// A [`Backend`] that registers every new leader holder with the fence when it acquires the
/// lease: `acquire` returns once [`ADVANCE_CALL`](super::ADVANCE_CALL) has committed, so from
/// then on every fenced transaction of an older holder of the key is refused
/// ([`Error::Stale`]), even if this holder has not written yet (a leader loading its state, a job
/// between runs).
///
/// Use it wherever a backend goes: a [`Campaign`](lease_core::leader::Campaign), the default
/// backend of guards and macros, a tower layer. Build it with
/// `fence::tokio_postgres::advance_on_acquire` or `fence::sqlx::advance_on_acquire`, or
/// [`AdvanceOnAcquire::new`] for another client.
///
/// - Leader leases of backends the fence accepts ([`Token::new`]) are advanced; other leases
///   (semaphore holders, RabbitMQ) are returned as the backend gave them.
/// - If the advance fails, the lease is released (waiting at most the release bound) and
///   `acquire` fails with [`lease_core::Error::Other`], whose
///   [`backend_error`](lease_core::Error::backend_error) downcasts to [`Error`]: transient
///   (a [`Campaign`](lease_core::leader::Campaign) tries again) for a refusal (a newer holder
///   advanced first: [`ErrorKind::Lost`]) and for a connection failure, not for a missing fence
///   or privileges ([`ErrorKind::Usage`], [`ErrorKind::PermissionDenied`]).
/// - The advance waits for an older holder's fenced transaction that is open on the key
///   (`idle_in_transaction_session_timeout` on the sessions that fence bounds that wait).
///
/// Every other call (`check_sequencer`, `observe_leader`, `reachability`, `shutdown`) goes to
/// the wrapped backend.
///
/// # Cancel safety
///
/// As the wrapped backend's `acquire`: dropped during the advance, the lease is dropped too,
/// and given back in the background.
#[derive(Clone)]
pub struct AdvanceOnAcquire {
    inner: Arc<dyn Backend>,
    advance: Advance,
}

impl fmt::Debug for AdvanceOnAcquire {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdvanceOnAcquire")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl AdvanceOnAcquire {
    /// Wraps `backend`; `advance` registers a sequencer with the fence, in a transaction of its
    /// own (run [`ADVANCE_CALL`](super::ADVANCE_CALL) with the parameters of its [`Token`], and
    /// report a failure with [`Error::from_fence_call`]).
    pub fn new<B, F, Fut>(backend: B, advance: F) -> AdvanceOnAcquire
    where
        B: Backend,
        F: Fn(Sequencer) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), Error>> + Send + 'static,
    {
        AdvanceOnAcquire {
            inner: into_shared(backend),
            advance: Arc::new(move |sequencer| Box::pin(advance(sequencer))),
        }
    }

    /// The wrapped backend.
    pub fn get_ref(&self) -> &Arc<dyn Backend> {
        &self.inner
    }

    async fn acquire_and_advance(&self, spec: &LeaseSpec) -> Result<Lease, lease_core::Error> {
        let lease = self.inner.acquire(spec).await?;
        if Token::new(lease.sequencer()).is_err() {
            return Ok(lease);
        }
        match (self.advance)(lease.sequencer().clone()).await {
            Ok(()) => Ok(lease),
            Err(error) => {
                // Not held through the fence, so not held: the next contender may take it now.
                let _ = lease.release().await;
                Err(into_lease_error(error))
            }
        }
    }
}

/// The lease error for a failed advance, classified for a campaign's retries.
fn into_lease_error(error: Error) -> lease_core::Error {
    let privileges = error.sqlstate().is_some_and(|s| s == "42501");
    let (kind, transient) = match &error {
        Error::Stale { .. } | Error::IndexReused { .. } => (ErrorKind::Lost, true),
        Error::NotInstalled { .. } | Error::Unsupported { .. } | Error::Install { .. } => {
            (ErrorKind::Usage, false)
        }
        Error::Database { .. } if privileges => (ErrorKind::PermissionDenied, false),
        Error::Database { .. } => (ErrorKind::Backend, true),
    };
    lease_core::Error::Other(BackendError::new(
        "PostgreSQL fence",
        kind,
        transient,
        error,
    ))
}

impl Backend for AdvanceOnAcquire {
    fn acquire<'a>(
        &'a self,
        spec: &'a LeaseSpec,
    ) -> BoxFuture<'a, Result<Lease, lease_core::Error>> {
        Box::pin(self.acquire_and_advance(spec))
    }

    fn observe_leader<'a>(
        &'a self,
        key: &'a str,
    ) -> BoxFuture<'a, Result<LeaderObserver, lease_core::Error>> {
        self.inner.observe_leader(key)
    }

    fn check_sequencer<'a>(
        &'a self,
        sequencer: &'a Sequencer,
    ) -> BoxFuture<'a, Result<(), lease_core::Error>> {
        self.inner.check_sequencer(sequencer)
    }

    fn reachability(&self) -> Reachability {
        self.inner.reachability()
    }

    fn shutdown(&self) -> BoxFuture<'_, ()> {
        self.inner.shutdown()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_and_connection_failures_are_retried_a_missing_fence_is_not() {
        let seq = Sequencer::new(lease_core::BackendKind::Consul, "k", 3, "h");
        let token = Token::new(&seq).unwrap();
        let err = |code: Option<&str>| {
            into_lease_error(Error::from_fence_call(token, code, None, "db".into()))
        };
        let stale = err(Some("LF001"));
        assert_eq!(
            (stale.kind(), stale.is_transient()),
            (ErrorKind::Lost, true)
        );
        assert!(
            stale
                .backend_error()
                .and_then(|e| e.downcast_ref::<Error>())
                .is_some_and(Error::is_refused)
        );
        let closed = err(None);
        assert_eq!(
            (closed.kind(), closed.is_transient()),
            (ErrorKind::Backend, true)
        );
        let missing = err(Some("42883"));
        assert_eq!(
            (missing.kind(), missing.is_transient()),
            (ErrorKind::Usage, false)
        );
        let denied = err(Some("42501"));
        assert_eq!(
            (denied.kind(), denied.is_transient()),
            (ErrorKind::PermissionDenied, false)
        );
    }
}
