//! `#[leader_only]` without `backend = …` when no default backend was set: a clear error, and the
//! body does not run. A binary of its own, because the default backend is process-wide.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use lease_core::{Error, GuardError, leader_only};
use lease_tests::within;

static RAN: AtomicBool = AtomicBool::new(false);

#[leader_only(key = "macros/no-default")]
async fn needs_a_default() {
    RAN.store(true, Ordering::SeqCst);
}

#[tokio::test]
async fn without_a_default_backend_the_call_fails_clearly_and_the_body_does_not_run() {
    let outcome = within(Duration::from_secs(10), "the call", needs_a_default()).await;
    assert!(
        matches!(outcome, Err(GuardError::Backend(Error::NoDefaultBackend))),
        "{outcome:?}"
    );
    let message = outcome.map_err(|e| e.to_string()).err().unwrap_or_default();
    assert!(message.contains("set_default_backend"), "{message}");
    assert!(!RAN.load(Ordering::SeqCst));
}
