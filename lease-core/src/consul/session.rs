//! Consul sessions: created per lease, renewed while it lives, destroyed when it ends.
//!
//! The renew loop is also where this crate keeps DESIGN rule 2 (self-fencing). Consul promises
//! not to invalidate a session before its TTL has passed since the last renewal the servers
//! processed. A renewal we *sent* at time T and saw succeed was processed after T, so the session
//! is safe until at least T + TTL. If no renewal succeeds, the loop gives the session up at
//! T + TTL − margin on our own clock, whatever the network does, so the work is cancelled before
//! Consul could hand the lease to someone else.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::http::{Behavior, Blocking, ConsulHttp};
use super::retry::{Backoff, retry_transient, within};
use crate::{Error, LeaseSpec, LostReason};

/// How long before the TTL runs out the client gives up on an unconfirmed session: a tenth of
/// the TTL, at least a second, to cover request latency and clock drift between us and Consul.
pub(crate) fn fence_margin(ttl: Duration) -> Duration {
    (ttl / 10).max(Duration::from_secs(1))
}

/// How a session's life ended, as seen by its renew loop.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum SessionEnd {
    /// Consul no longer knows the session (destroyed, expired, checks failed).
    Invalidated,
    /// No renewal succeeded for TTL − margin: the session must be treated as lost.
    Fenced {
        unconfirmed_for: Duration,
        last_error: Option<String>,
    },
}

impl From<SessionEnd> for LostReason {
    fn from(end: SessionEnd) -> Self {
        match end {
            SessionEnd::Invalidated => LostReason::SessionInvalidated,
            SessionEnd::Fenced {
                unconfirmed_for, ..
            } => LostReason::SelfFenced { unconfirmed_for },
        }
    }
}

/// The renew loop of a session, boxed so acquire can poll it while waiting and then hand it to
/// the holder task.
pub(crate) type KeepAlive = Pin<Box<dyn Future<Output = SessionEnd> + Send>>;

/// A session this process created. Dropping it destroys the session in the background.
#[derive(Debug)]
pub(crate) struct Session {
    http: Arc<ConsulHttp>,
    id: String,
    destroyed: bool,
}

impl Session {
    /// Creates a session for `spec` and starts its renew loop (returned, to be polled).
    pub(crate) async fn create(
        http: &Arc<ConsulHttp>,
        spec: &LeaseSpec,
        behavior: Behavior,
    ) -> Result<(Session, KeepAlive), Error> {
        let ttl = spec.session_ttl();
        let sent = Instant::now();
        let id = http
            .session_create(
                &spec.session_name_or_default(),
                ttl,
                spec.session_lock_delay(),
                behavior,
            )
            .await
            .map_err(|e| {
                e.into_error(http, format_args!("create a session for {:?}", spec.key()))
            })?;
        tracing::debug!(session = %id, ?ttl, "session created");
        let keep_alive = Box::pin(keep_alive(Arc::clone(http), id.clone(), ttl, sent));
        Ok((
            Session {
                http: Arc::clone(http),
                id,
                destroyed: false,
            },
            keep_alive,
        ))
    }

    pub(crate) fn id(&self) -> &str {
        &self.id
    }

    pub(crate) fn http(&self) -> &Arc<ConsulHttp> {
        &self.http
    }

    /// Destroys the session (releasing or deleting what it holds), retrying brief trouble.
    pub(crate) async fn destroy(mut self) -> Result<(), Error> {
        self.destroyed = true;
        destroy(&self.http, &self.id).await
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if self.destroyed {
            return;
        }
        // An acquire that was cancelled, or a holder task torn down with its runtime: give the
        // session back if a runtime is still there, else its TTL frees it.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let http = Arc::clone(&self.http);
            let id = std::mem::take(&mut self.id);
            runtime.spawn(async move {
                if let Err(error) = destroy(&http, &id).await {
                    tracing::warn!(session = %id, %error, "could not destroy session; it expires with its TTL");
                }
            });
        }
    }
}

/// Destroys a session, retrying transient failures for a few seconds.
async fn destroy(http: &ConsulHttp, id: &str) -> Result<(), Error> {
    retry_transient(within(Duration::from_secs(5)), || http.session_destroy(id))
        .await
        .map_err(|e| e.into_error(http, format_args!("destroy session {id}")))?;
    tracing::debug!(session = %id, "session destroyed");
    Ok(())
}

/// Renews `id` every TTL/2 until Consul says it is gone, or until it could not be confirmed for
/// TTL − margin (then it returns `Fenced`, at that deadline, not later).
async fn keep_alive(
    http: Arc<ConsulHttp>,
    id: String,
    ttl: Duration,
    created_sent: Instant,
) -> SessionEnd {
    let fence_after = ttl - fence_margin(ttl);
    let retry_every = (ttl / 20).clamp(Duration::from_millis(100), Duration::from_secs(1));
    let mut confirmed = created_sent;
    let mut next = confirmed + ttl / 2;
    let mut last_error = None;
    loop {
        let deadline = confirmed + fence_after;
        tokio::time::sleep_until(next.min(deadline)).await;
        let sent = Instant::now();
        if sent >= deadline {
            return SessionEnd::Fenced {
                unconfirmed_for: sent - confirmed,
                last_error,
            };
        }
        match tokio::time::timeout_at(deadline, http.session_renew(&id)).await {
            Ok(Ok(true)) => {
                confirmed = sent;
                next = sent + ttl / 2;
                last_error = None;
            }
            Ok(Ok(false)) => return SessionEnd::Invalidated,
            Ok(Err(error)) => {
                tracing::debug!(session = %id, %error, "session renew failed; retrying");
                last_error = Some(error.to_string());
                next = Instant::now() + retry_every;
            }
            Err(_) => {
                return SessionEnd::Fenced {
                    unconfirmed_for: Instant::now() - confirmed,
                    last_error: Some("the renew request did not complete".into()),
                };
            }
        }
    }
}

/// Blocks on the session until Consul no longer knows it; returns only then.
///
/// Watching the session beside the key lets a holder name the reason for a loss without a
/// further read: when an operator destroys the session, this answers `SessionInvalidated` while
/// the key's watch only sees the lock released. Failures are retried; the renew loop is what
/// self-fences when they last.
pub(crate) async fn watch_invalidation(http: &ConsulHttp, id: &str) -> SessionEnd {
    let mut index = 0;
    let mut backoff = Backoff::new();
    loop {
        let blocking = Blocking {
            index,
            wait: Duration::from_secs(300),
        };
        match http.session_watch(id, blocking).await {
            Ok((false, _)) => return SessionEnd::Invalidated,
            Ok((true, new_index)) => {
                backoff.reset();
                index = if new_index < index { 0 } else { new_index };
            }
            Err(error) => {
                tracing::debug!(session = %id, %error, "watching the session failed; retrying");
                backoff.wait().await;
            }
        }
    }
}
