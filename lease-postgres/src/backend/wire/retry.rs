//! How a failed request is retried: through transient trouble only, paused by a backoff from
//! 50 ms to 1 s, until the caller's deadline (and at least five seconds, so that a caller who
//! does not wait still gets one real answer through brief trouble).

use std::time::Duration;

use lease_core::backoff::Backoff;
use tokio::time::Instant;

use super::error::PgError;

/// The least time a request is retried for, whatever the caller's deadline, so that
/// `Wait::Never` still gets one real answer through brief trouble.
const RETRY_GRACE: Duration = Duration::from_secs(5);

/// How a failed request is retried: through transient trouble, paused by [`retry_backoff`],
/// until a deadline (at least [`RETRY_GRACE`] from the start; none: for ever).
pub(crate) struct Retry {
    give_up: Option<Instant>,
    pause: Backoff,
}

impl Retry {
    pub(crate) fn until(deadline: Option<Instant>) -> Retry {
        Retry {
            give_up: deadline.map(|d| d.max(Instant::now() + RETRY_GRACE)),
            pause: retry_backoff(),
        }
    }

    /// After `error`: pauses and answers true if the request is worth sending again.
    pub(crate) async fn again(&mut self, error: &PgError) -> bool {
        if !error.is_transient() {
            return false;
        }
        let wait = self.pause.next_pause();
        if self.give_up.is_some_and(|g| Instant::now() + wait >= g) {
            return false;
        }
        tracing::debug!(%error, "PostgreSQL request failed; retrying");
        tokio::time::sleep(wait).await;
        true
    }
}

/// The pause between retries of a failed request.
pub(crate) fn retry_backoff() -> Backoff {
    Backoff::new(Duration::from_millis(50), Duration::from_secs(1))
}
