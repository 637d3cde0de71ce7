//! Lock-delay: how long a key stays barred after its holder's session is invalidated.

use std::time::Duration;

use lease_core::Wait;

use super::common::{EVENT, leader};
use crate::support::within;
use crate::{Capability, Harness, Outcome};

/// After the holder's session is destroyed, its key stays barred for the lock-delay, then is free.
///
/// Needs [`DestroySession`](Capability::DestroySession) and [`LockDelay`](Capability::LockDelay).
pub async fn lock_delay_holds_off_the_next_holder(h: &Harness) -> Outcome {
    if let Some(outcome) = h
        .not_applicable(&[Capability::DestroySession, Capability::LockDelay])
        .await
    {
        return outcome;
    }
    let key = h.key("lock-delay");
    let spec = leader(&key).lock_delay(Duration::from_secs(2));
    let a = h.backend().acquire(&spec).await.unwrap();
    h.operator()
        .destroy_session(a.sequencer().holder())
        .await
        .unwrap();
    within(EVENT, "loss after destroy", a.lost()).await;
    let early = h
        .backend()
        .acquire(&spec.clone().wait(Wait::UpTo(Duration::from_millis(500))))
        .await;
    assert!(early.unwrap_err().is_busy(), "lock-delay was not honoured");
    let b = within(
        EVENT,
        "acquire after lock-delay",
        h.backend().acquire(&spec),
    )
    .await
    .unwrap();
    b.release().await.unwrap();
    Outcome::Passed
}

/// With lock-delay 0, the key is free right after the holder's session is destroyed.
///
/// Needs [`DestroySession`](Capability::DestroySession).
pub async fn zero_lock_delay_means_zero(h: &Harness) -> Outcome {
    if let Some(outcome) = h.not_applicable(&[Capability::DestroySession]).await {
        return outcome;
    }
    let key = h.key("no-lock-delay");
    let spec = leader(&key).lock_delay(Duration::ZERO);
    let a = h.backend().acquire(&spec).await.unwrap();
    h.operator()
        .destroy_session(a.sequencer().holder())
        .await
        .unwrap();
    let b = within(
        EVENT,
        "acquire right after destroy",
        h.backend()
            .acquire(&spec.clone().wait(Wait::UpTo(Duration::from_secs(1)))),
    )
    .await
    .unwrap();
    if h.has(Capability::RisingIndex) {
        assert!(b.sequencer().index() > a.sequencer().index());
    }
    b.release().await.unwrap();
    Outcome::Passed
}
