//! Retrying brief trouble: one backoff and one retry loop for every Consul call that needs them.
//!
//! DESIGN rule 3: a 500 or a leader election inside Consul is not loss. Reads, releases and
//! destroys are retried with a growing pause; whether the trouble has lasted too long is decided
//! by the caller's deadline (for a held lease, by the session's self-fencing deadline).

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use super::http::ApiError;
use crate::backoff::Backoff;

/// The backoff of Consul calls: 50 ms doubling up to 1 s, jittered.
pub(crate) fn backoff() -> Backoff {
    Backoff::new(Duration::from_millis(50), Duration::from_secs(1))
}

/// How long past the caller's deadline one attempt may still run: the round trip of an answer
/// that was on its way. (Blocking reads ask for at most 15/16 of the time left, so Consul's
/// jitter of up to a sixteenth still answers them in time.)
const ATTEMPT_SLACK: Duration = Duration::from_millis(500);

/// Runs `op` until it succeeds, fails in a way retrying cannot help, or the next attempt would
/// start after `give_up` (never, if `None`). Each attempt is bounded too: one that has not
/// answered shortly after `give_up` ends with [`ApiError::TimedOut`], so the total is bounded
/// whatever the request timeout.
pub(crate) async fn retry_transient<T, F, Fut>(
    give_up: Option<Instant>,
    mut op: F,
) -> Result<T, ApiError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, ApiError>>,
{
    let mut backoff = backoff();
    loop {
        let attempt = match give_up {
            Some(give_up) => tokio::time::timeout_at(give_up + ATTEMPT_SLACK, op())
                .await
                .unwrap_or(Err(ApiError::TimedOut)),
            None => op().await,
        };
        match attempt {
            Err(e) if e.is_transient() => {
                let pause = backoff.next_pause();
                if give_up.is_some_and(|g| Instant::now() + pause >= g) {
                    return Err(e);
                }
                tracing::debug!(error = %e, ?pause, "Consul request failed; retrying");
                tokio::time::sleep(pause).await;
            }
            other => return other,
        }
    }
}

/// A deadline `after` from now, for clean-up calls that must not hang forever.
pub(crate) fn within(after: Duration) -> Option<Instant> {
    Some(Instant::now() + after)
}
