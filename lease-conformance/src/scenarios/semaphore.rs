//! Semaphores: admission up to the limit, the refusal of the other kind of lock, and a slot
//! lost or kept when its holder's session goes.

use std::sync::Arc;
use std::time::Duration;

use lease_core::{Error, LostReason, Wait};

use super::common::{EVENT, leader, semaphore};
use crate::support::{assert_refined, within};
use crate::{Capability, Harness, Outcome};

/// A semaphore admits `limit` holders, answers `Busy` beyond it (and `LimitMismatch` to another
/// limit, with [`Capability::LimitAgreement`]), and admits a waiter when a holder drops out.
///
/// Needs [`Semaphores`](Capability::Semaphores).
pub async fn semaphore_admits_up_to_its_limit(h: &Harness) -> Outcome {
    if let Some(outcome) = h.not_applicable(&[Capability::Semaphores]).await {
        return outcome;
    }
    let prefix = h.key("semaphore");
    let a = h.backend().acquire(&semaphore(&prefix, 2)).await.unwrap();
    let b = h.backend().acquire(&semaphore(&prefix, 2)).await.unwrap();
    if h.has(Capability::ContenderKeys) {
        assert_eq!(
            a.sequencer().key(),
            format!("{prefix}/{}", a.sequencer().holder())
        );
    }
    let busy = h
        .backend()
        .acquire(&semaphore(&prefix, 2).wait(Wait::Never))
        .await;
    assert!(busy.unwrap_err().is_busy());
    if h.has(Capability::LimitAgreement) {
        let mismatch = h
            .backend()
            .acquire(&semaphore(&prefix, 3).wait(Wait::Never))
            .await;
        assert!(
            matches!(mismatch, Err(Error::LimitMismatch { .. })),
            "{mismatch:?}"
        );
    }

    let backend = Arc::clone(h.backend());
    let spec = semaphore(&prefix, 2);
    let waiting = lease_core::runtime::spawn(async move { backend.acquire(&spec).await });
    drop(a);
    let c = within(EVENT, "a slot after a holder dropped out", waiting)
        .await
        .unwrap()
        .unwrap();
    b.release().await.unwrap();
    c.release().await.unwrap();
    Outcome::Passed
}

/// A name held as one kind of lock refuses the other kind at once, both ways, with the same
/// permanent error ([`Error::FlagsConflict`], its `found` the kind in the way and its `expected`
/// the kind asked for, as [`Error::LEADER_FLAGS`] and [`Error::SEMAPHORE_FLAGS`]), not `Busy`
/// after the whole wait: no holder of the other kind will ever make room for it. The holder keeps
/// its lease.
///
/// Needs [`Semaphores`](Capability::Semaphores). Without
/// [`LockKinds`](Capability::LockKinds), a semaphore on a leader lock's name may be refused with
/// [`Error::LimitMismatch`] instead (where a leader lock is a one-slot semaphore): at once and for
/// good all the same.
pub async fn another_kind_of_lock_is_refused_at_once(h: &Harness) -> Outcome {
    if let Some(outcome) = h.not_applicable(&[Capability::Semaphores]).await {
        return outcome;
    }
    // Longer than the bound on the answer: an answer within it did not wait the wait out.
    let patient = Wait::UpTo(EVENT * 3);
    let refused = |what: &str, answer: Result<lease_core::Lease, Error>, found, expected| {
        let error = match answer {
            Err(Error::FlagsConflict {
                key,
                found: f,
                expected: e,
            }) => {
                assert_eq!((f, e), (found, expected), "{what}: the kinds, as flags");
                Error::FlagsConflict {
                    key,
                    found: f,
                    expected: e,
                }
            }
            Err(error @ Error::LimitMismatch { .. }) if !h.has(Capability::LockKinds) => error,
            other => panic!("{what}: expected FlagsConflict, got {other:?}"),
        };
        assert!(!error.is_transient() && !error.is_busy(), "{what}: {error}");
    };
    let (leader_flags, semaphore_flags) = (Error::LEADER_FLAGS, Error::SEMAPHORE_FLAGS);

    let key = h.key("kinds-leader-first");
    let leader_lease = h.backend().acquire(&leader(&key)).await.unwrap();
    let answer = within(
        EVENT,
        "a semaphore on a leader lock's key to be refused",
        h.backend().acquire(&semaphore(&key, 2).wait(patient)),
    )
    .await;
    let what = "a semaphore on a held leader key";
    refused(what, answer, leader_flags, semaphore_flags);
    leader_lease.check().await.unwrap();
    leader_lease.release().await.unwrap();

    let prefix = h.key("kinds-semaphore-first");
    let slot = h.backend().acquire(&semaphore(&prefix, 2)).await.unwrap();
    let answer = within(
        EVENT,
        "a leader lock on a semaphore's prefix to be refused",
        h.backend().acquire(&leader(&prefix).wait(patient)),
    )
    .await;
    let what = "a leader lock on a held semaphore prefix";
    refused(what, answer, semaphore_flags, leader_flags);
    slot.check().await.unwrap();
    slot.release().await.unwrap();
    Outcome::Passed
}

/// Destroying a semaphore holder's session loses its slot, and with lock-delay 0 the next contender
/// gets it.
///
/// Needs [`Semaphores`](Capability::Semaphores) and
/// [`DestroySession`](Capability::DestroySession).
pub async fn semaphore_holder_loses_on_session_destroy(h: &Harness) -> Outcome {
    if let Some(outcome) = h
        .not_applicable(&[Capability::Semaphores, Capability::DestroySession])
        .await
    {
        return outcome;
    }
    let prefix = h.key("semaphore-destroy");
    let spec = semaphore(&prefix, 1).lock_delay(Duration::ZERO);
    let a = h.backend().acquire(&spec).await.unwrap();
    h.operator()
        .destroy_session(a.sequencer().holder())
        .await
        .unwrap();
    let reported = within(EVENT, "semaphore loss after destroy", a.lost()).await;
    assert_refined(&a, &reported, LostReason::SessionInvalidated).await;
    // The dead holder is pruned by the next contender.
    let b = within(EVENT, "the freed slot", h.backend().acquire(&spec))
        .await
        .unwrap();
    b.check().await.unwrap();
    b.release().await.unwrap();
    Outcome::Passed
}

/// A semaphore holder whose session was destroyed keeps its slot for the lock-delay, then it is
/// handed on.
///
/// Needs [`Semaphores`](Capability::Semaphores),
/// [`DestroySession`](Capability::DestroySession) and [`LockDelay`](Capability::LockDelay).
pub async fn semaphore_dead_holder_keeps_its_slot_for_the_lock_delay(h: &Harness) -> Outcome {
    if let Some(outcome) = h
        .not_applicable(&[
            Capability::Semaphores,
            Capability::DestroySession,
            Capability::LockDelay,
        ])
        .await
    {
        return outcome;
    }
    let prefix = h.key("semaphore-lock-delay");
    let spec = semaphore(&prefix, 1).lock_delay(Duration::from_secs(2));
    let a = h.backend().acquire(&spec).await.unwrap();
    h.operator()
        .destroy_session(a.sequencer().holder())
        .await
        .unwrap();
    within(EVENT, "semaphore loss after destroy", a.lost()).await;
    // The dead holder may still be finishing its work: its slot is not handed on yet.
    let early = h
        .backend()
        .acquire(&spec.clone().wait(Wait::UpTo(Duration::from_millis(500))))
        .await;
    assert!(
        early.unwrap_err().is_busy(),
        "a dead holder's slot was handed on inside its lock-delay"
    );
    let b = within(
        EVENT,
        "the slot after the lock-delay",
        h.backend().acquire(&spec),
    )
    .await
    .unwrap();
    b.check().await.unwrap();
    b.release().await.unwrap();
    Outcome::Passed
}
