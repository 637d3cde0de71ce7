//! The waits and loss assertions the scenarios are written with, for a backend's own tests too.
//!
//! Each panics with a message that says what did not happen: a conformance test fails loudly,
//! never by hanging.

use std::future::Future;
use std::time::Duration;

use lease_core::{Error, Lease, LostReason};

/// Awaits `fut` for at most `limit`, panicking with `what` if it does not complete in time.
///
/// # Panics
///
/// When `limit` passes first.
pub async fn within<F: Future>(limit: Duration, what: &str, fut: F) -> F::Output {
    match tokio::time::timeout(limit, fut).await {
        Ok(out) => out,
        Err(_) => panic!("timed out after {limit:?} waiting for {what}"),
    }
}

/// Releases a lease that was lost, asserting that the release reports the loss (work that ran
/// under it must be reportable as unsafe).
///
/// # Panics
///
/// When the release answers anything but [`Error::Lost`].
pub async fn release_lost(lease: Lease) {
    match lease.release().await {
        Err(Error::Lost(_)) => {}
        other => panic!("releasing a lost lease must report the loss, got {other:?}"),
    }
}

/// Asserts that `reported` (what `run` or `lost()` answered at the moment of loss) is `expected`
/// or the coarser reason a backend may publish first, and waits (bounded) until the lease's
/// reason is refined to `expected`.
///
/// Loss is published the moment a watch shows it; whether a released key's (or a deleted
/// contender key's) session was invalidated can take one more read
/// ([`Hold::refine`](lease_core::backend::Hold::refine)).
///
/// # Panics
///
/// When `reported` is neither, or the reason is not refined within ten seconds.
pub async fn assert_refined(lease: &Lease, reported: &LostReason, expected: LostReason) {
    use LostReason::{KeyDeleted, KeyReleased, SessionInvalidated};
    let coarse = match expected {
        SessionInvalidated => matches!(reported, KeyReleased | KeyDeleted),
        _ => false,
    };
    assert!(
        *reported == expected || coarse,
        "lost with {reported:?}, expected {expected:?}"
    );
    within(
        Duration::from_secs(10),
        "the loss reason to be refined",
        async {
            while lease.lost_reason().as_ref() != Some(&expected) {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        },
    )
    .await;
}
