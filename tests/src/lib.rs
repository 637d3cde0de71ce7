//! Support code for the integration tests: real services, started and faulted on demand.
//!
//! - [`amqp`]: the RabbitMQ the AMQP tests use (URL, unique names, closing a connection with
//!   `rabbitmqctl`).
//! - [`consul`]: a `consul agent -dev` per test on free ports, stopped when dropped, and the
//!   operator actions tests perform on it (destroy a session, delete a key, list sessions).
//! - [`body`]: a response body the test feeds chunk by chunk, for streaming responses.
//! - [`stats`]: percentiles for the benchmarks.
//! - [`history`]: the histories `lease-worker` processes write, and verdicts judged from them.
//! - [`proxy`]: a TCP proxy between a client and a service that can stop forwarding, cut every
//!   connection, or answer HTTP requests with 500 — the faults the leases must survive or detect.
//!
//! Helpers here panic with a message that says how to fix the environment: a test that cannot
//! reach its service fails; it never passes by skipping.
#![allow(clippy::unwrap_used, clippy::missing_panics_doc)]

pub mod amqp;
pub mod body;
pub mod consul;
pub mod history;
pub mod overlap;
pub mod proxy;
pub mod stats;

use std::time::Duration;

/// Awaits `fut` for at most `limit`, panicking with `what` if it does not complete in time.
pub async fn within<F: std::future::Future>(limit: Duration, what: &str, fut: F) -> F::Output {
    match tokio::time::timeout(limit, fut).await {
        Ok(out) => out,
        Err(_) => panic!("timed out after {limit:?} waiting for {what}"),
    }
}

/// Installs a tracing subscriber for test output (`RUST_LOG` filters it); safe to call repeatedly.
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "lease_core=debug".into()),
        )
        .with_test_writer()
        .try_init();
}

/// Releases a lease that was lost, asserting that the release reports the loss (work that ran
/// under it must be reportable as unsafe).
pub async fn release_lost(lease: lease_core::Lease) {
    match lease.release().await {
        Err(lease_core::Error::Lost(_)) => {}
        other => panic!("releasing a lost lease must report the loss, got {other:?}"),
    }
}

/// Whether `reported` (what `run` or `lost()` answered at the moment of loss) is `expected` or
/// the coarser reason the backend publishes first, and waits (bounded) until the lease's reason
/// is refined to `expected`. Loss is published the moment a watch shows it; whether a released
/// key's (or a deleted contender key's) session was invalidated takes one more read.
pub async fn assert_refined(
    lease: &lease_core::Lease,
    reported: &lease_core::LostReason,
    expected: lease_core::LostReason,
) {
    use lease_core::LostReason::{KeyDeleted, KeyReleased, SessionInvalidated};
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
