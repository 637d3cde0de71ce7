//! The scenarios, one `async fn` each, documented in one line.
//!
//! Each takes a fresh [`Harness`] and panics when the backend breaks the contract. A scenario
//! that needs a [`Capability`] the harness declares lacking does not run: it checks the refusal
//! instead and returns [`Outcome::NotApplicable`] (see [`Harness::not_applicable`]). Leases use a
//! 15 s TTL and lock-delay unless a scenario says otherwise, so a lease that leaks, or a hand-over
//! that waits for expiry instead of a release, shows up within one test.
//!
//! [`suite!`](crate::suite) generates one test per scenario, in this order;
//! [`SCENARIOS`](crate::SCENARIOS) lists them for a driver of one's own.

// A scenario is a test: an unwrap that fails is a test that fails loudly.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use lease_core::{Error, LeaseSpec, LostReason, Sequencer, Wait};

use crate::support::{assert_refined, release_lost, within};
use crate::{Capability, Harness, Outcome};

/// A bound on every wait for an event; generous, since only a broken lease takes this long.
const EVENT: Duration = Duration::from_secs(10);

fn leader(key: &str) -> LeaseSpec {
    LeaseSpec::leader(key)
        .ttl(Duration::from_secs(15))
        .lock_delay(Duration::from_secs(15))
}

fn semaphore(prefix: &str, limit: u32) -> LeaseSpec {
    LeaseSpec::semaphore(prefix, limit)
        .ttl(Duration::from_secs(15))
        .lock_delay(Duration::from_secs(15))
}

/// A held key is `Busy` to others; a waiter takes it, with a new sequencer, once it is released.
pub async fn contention_then_handover_on_release(h: &Harness) -> Outcome {
    let key = h.key("contention");
    let a = h.backend().acquire(&leader(&key)).await.unwrap();
    let busy = h.backend().acquire(&leader(&key).wait(Wait::Never)).await;
    assert!(busy.unwrap_err().is_busy());

    let backend = Arc::clone(h.backend());
    let spec = leader(&key);
    let mut waiting = tokio::spawn(async move { backend.acquire(&spec).await });
    assert!(
        tokio::time::timeout(Duration::from_millis(300), &mut waiting)
            .await
            .is_err(),
        "a second holder was admitted while the first held the lease"
    );
    let first = a.sequencer().clone();
    a.release().await.unwrap();
    let b = within(EVENT, "the waiter to acquire after release", waiting)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(b.sequencer().key(), key);
    if h.has(Capability::RisingIndex) {
        assert!(b.sequencer().index() > first.index());
    }
    assert_ne!(b.sequencer().holder(), first.holder());
    b.release().await.unwrap();
    Outcome::Passed
}

/// Destroying the holder's session cancels its work with `SessionInvalidated`; `check()` and
/// `release()` report the loss.
///
/// Needs [`DestroySession`](Capability::DestroySession).
pub async fn loss_on_session_destroy_cancels_work(h: &Harness) -> Outcome {
    if let Some(outcome) = h.not_applicable(&[Capability::DestroySession]).await {
        return outcome;
    }
    let key = h.key("destroy");
    let lease = h.backend().acquire(&leader(&key)).await.unwrap();
    lease.check().await.unwrap();
    let holder = lease.sequencer().holder().to_owned();
    let (work, ()) = within(EVENT, "the work to be cancelled after destroy", async {
        tokio::join!(lease.run(std::future::pending::<()>()), async {
            h.operator().destroy_session(&holder).await.unwrap();
        })
    })
    .await;
    assert_refined(&lease, &work.unwrap_err(), LostReason::SessionInvalidated).await;
    assert!(!lease.is_held());
    assert!(matches!(
        lease.check().await,
        Err(Error::Lost(LostReason::SessionInvalidated))
    ));
    // Releasing a lost lease reports the loss.
    release_lost(lease).await;
    Outcome::Passed
}

/// Deleting a held key loses the lease with `KeyDeleted`.
///
/// Needs [`DeleteKey`](Capability::DeleteKey).
pub async fn loss_on_key_delete(h: &Harness) -> Outcome {
    if let Some(outcome) = h.not_applicable(&[Capability::DeleteKey]).await {
        return outcome;
    }
    let key = h.key("delete");
    let lease = h.backend().acquire(&leader(&key)).await.unwrap();
    h.operator().delete_key(&key).await.unwrap();
    let reason = within(EVENT, "loss after the key was deleted", lease.lost()).await;
    assert_eq!(reason, LostReason::KeyDeleted);
    Outcome::Passed
}

/// An operator releasing a held key loses the lease with `KeyReleased`.
///
/// Needs [`ReleaseKey`](Capability::ReleaseKey).
pub async fn loss_on_key_release(h: &Harness) -> Outcome {
    if let Some(outcome) = h.not_applicable(&[Capability::ReleaseKey]).await {
        return outcome;
    }
    let key = h.key("release");
    let lease = h.backend().acquire(&leader(&key)).await.unwrap();
    h.operator()
        .release_key(&key, lease.sequencer().holder())
        .await
        .unwrap();
    let reason = within(EVENT, "loss after the key was released", lease.lost()).await;
    assert_eq!(reason, LostReason::KeyReleased);
    release_lost(lease).await;
    Outcome::Passed
}

/// The operator's [`revoke`](crate::Operator::revoke) cancels the holder's work with a loss other
/// than `Released`.
pub async fn revoke_cancels_work(h: &Harness) -> Outcome {
    let key = h.key("revoke");
    let lease = h.backend().acquire(&leader(&key)).await.unwrap();
    let (work, ()) = within(EVENT, "the work to be cancelled after revoke", async {
        tokio::join!(lease.run(std::future::pending::<()>()), async {
            h.operator().revoke(lease.sequencer()).await.unwrap();
        })
    })
    .await;
    let reason = work.unwrap_err();
    assert_ne!(reason, LostReason::Released, "a revoked lease was not lost");
    assert!(!lease.is_held());
    assert!(matches!(lease.check().await, Err(Error::Lost(_))));
    release_lost(lease).await;
    Outcome::Passed
}

/// Every acquisition of a key has a new sequencer (a higher index, with
/// [`Capability::RisingIndex`]) whose text parses back to it.
pub async fn sequencer_changes_on_every_acquisition(h: &Harness) -> Outcome {
    let key = h.key("sequencer");
    let mut seen = Vec::new();
    for _ in 0..3 {
        let lease = h.backend().acquire(&leader(&key)).await.unwrap();
        seen.push(lease.sequencer().clone());
        lease.release().await.unwrap();
    }
    for pair in seen.windows(2) {
        if h.has(Capability::RisingIndex) {
            assert!(pair[1].index() > pair[0].index(), "{seen:?}");
        }
        assert_ne!(pair[1], pair[0]);
    }
    for seq in &seen {
        assert_eq!(seq.to_string().parse::<Sequencer>().unwrap(), *seq);
    }
    Outcome::Passed
}

/// `check_sequencer` accepts the current holder and refuses a released one, also once the key is
/// held again.
pub async fn check_sequencer_refuses_a_released_acquisition(h: &Harness) -> Outcome {
    let key = h.key("check");
    let first = h.backend().acquire(&leader(&key)).await.unwrap();
    let stale = first.sequencer().clone();
    h.backend().check_sequencer(&stale).await.unwrap();
    first.release().await.unwrap();
    let answer = h.backend().check_sequencer(&stale).await;
    assert!(matches!(answer, Err(Error::Lost(_))), "{answer:?}");

    let second = h.backend().acquire(&leader(&key)).await.unwrap();
    let answer = h.backend().check_sequencer(&stale).await;
    assert!(
        matches!(answer, Err(Error::Lost(_))),
        "a released acquisition passed the check while the key was held again: {answer:?}"
    );
    h.backend()
        .check_sequencer(second.sequencer())
        .await
        .unwrap();
    second.release().await.unwrap();
    Outcome::Passed
}

/// Dropping a lease releases it: the next holder gets it at once, not after the TTL or lock-delay.
pub async fn drop_releases_without_lock_delay(h: &Harness) -> Outcome {
    let key = h.key("drop");
    let a = h.backend().acquire(&leader(&key)).await.unwrap();
    let watcher = a.watcher();
    drop(a);
    assert_eq!(
        within(EVENT, "the dropped lease to report release", watcher.lost()).await,
        LostReason::Released
    );
    // Lock-delay and TTL are 15 s: acquiring well within that proves a release, not expiry.
    let b = within(
        Duration::from_secs(5),
        "acquire after the holder dropped its lease",
        h.backend().acquire(&leader(&key)),
    )
    .await
    .unwrap();
    b.release().await.unwrap();
    Outcome::Passed
}

/// `Wait::UpTo` gives up with `Busy` after at least the wait, naming the key.
pub async fn wait_up_to_gives_up_with_busy(h: &Harness) -> Outcome {
    let key = h.key("wait-up-to");
    let a = h.backend().acquire(&leader(&key)).await.unwrap();
    let wait = Duration::from_millis(300);
    let err = within(
        EVENT,
        "a bounded acquire to give up",
        h.backend().acquire(&leader(&key).wait(Wait::UpTo(wait))),
    )
    .await
    .unwrap_err();
    match err {
        Error::Busy { key: busy, waited } => {
            assert_eq!(busy, key);
            assert!(waited >= wait, "gave up after {waited:?}, asked {wait:?}");
        }
        other => panic!("expected Busy, got {other}"),
    }
    assert!(a.is_held());
    a.release().await.unwrap();
    Outcome::Passed
}

/// `Wait::Never` answers `Busy` at once while the key is held, and acquires once it is free.
pub async fn never_waiting_answers_at_once(h: &Harness) -> Outcome {
    let key = h.key("never");
    let a = h.backend().acquire(&leader(&key)).await.unwrap();
    let err = within(
        EVENT,
        "a non-waiting acquire to answer",
        h.backend().acquire(&leader(&key).wait(Wait::Never)),
    )
    .await
    .unwrap_err();
    assert!(err.is_busy(), "{err}");
    a.release().await.unwrap();
    let b = h
        .backend()
        .acquire(&leader(&key).wait(Wait::Never))
        .await
        .unwrap();
    b.release().await.unwrap();
    Outcome::Passed
}

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

/// `observe_leader` sees nobody, then the holder's sequencer and value, then nobody once it
/// releases.
///
/// Needs [`ObserveLeader`](Capability::ObserveLeader).
pub async fn observers_follow_the_leader(h: &Harness) -> Outcome {
    if let Some(outcome) = h.not_applicable(&[Capability::ObserveLeader]).await {
        return outcome;
    }
    let key = h.key("observe");
    let mut observer = h.backend().observe_leader(&key).await.unwrap();
    assert_eq!(observer.key(), key);
    assert_eq!(observer.leader(), None, "nobody holds the key yet");

    let lease = h
        .backend()
        .acquire(&leader(&key).value("node-a"))
        .await
        .unwrap();
    let seen = within(
        EVENT,
        "the observer to see the leader",
        observer.wait_for(|leader| leader.is_some()),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(seen.sequencer, *lease.sequencer());
    assert_eq!(seen.value_str(), Some("node-a"));

    lease.release().await.unwrap();
    within(
        EVENT,
        "the observer to see the key released",
        observer.wait_for(|leader| leader.is_none()),
    )
    .await
    .unwrap();
    Outcome::Passed
}

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
    let waiting = tokio::spawn(async move { backend.acquire(&spec).await });
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

/// `Backend::shutdown` releases the leases still held, so the next holder gets them at once.
pub async fn shutdown_releases_every_lease(h: &Harness) -> Outcome {
    let key = h.key("shutdown");
    let lease = h.backend().acquire(&leader(&key)).await.unwrap();
    within(EVENT, "Backend::shutdown to finish", h.backend().shutdown()).await;
    assert!(!lease.is_held());
    assert_eq!(lease.lost_reason(), Some(LostReason::Released));
    // Lock-delay and TTL are 15 s: acquiring at once proves the lease was given back.
    let next = within(
        Duration::from_secs(5),
        "acquire after shutdown",
        h.backend().acquire(&leader(&key).wait(Wait::Never)),
    )
    .await
    .unwrap();
    next.release().await.unwrap();
    Outcome::Passed
}

/// A lease given back at a set time (`Lease::release_at`, what `min_hold` uses) stays held on the
/// server until then, although its holder's backend shuts down first; then it is free again,
/// within two TTLs.
///
/// Needs [`KeepsPastHolder`](Capability::KeepsPastHolder).
pub async fn release_at_outlives_the_holders_shutdown(h: &Harness) -> Outcome {
    if let Some(outcome) = h.not_applicable(&[Capability::KeepsPastHolder]).await {
        return outcome;
    }
    const KEPT: Duration = Duration::from_secs(3);
    let key = h.key("release-at");
    let spec = LeaseSpec::leader(&key)
        .ttl(Duration::from_secs(10))
        .lock_delay(Duration::ZERO);
    let lease = h.backend().acquire(&spec).await.unwrap();
    let until = tokio::time::Instant::now() + KEPT;
    let watcher = lease.watcher();
    lease.release_at(until);
    within(EVENT, "Backend::shutdown to finish", h.backend().shutdown()).await;
    assert_eq!(watcher.lost_reason(), Some(LostReason::Released));
    // Held until `until`: a contender that waits until shortly before it is refused.
    let short_of_it = until.saturating_duration_since(tokio::time::Instant::now());
    let refused = h
        .backend()
        .acquire(&spec.clone().wait(Wait::UpTo(
            short_of_it.saturating_sub(Duration::from_millis(300)),
        )))
        .await;
    assert!(
        refused.as_ref().is_err_and(Error::is_busy),
        "the lease was given back before its release time: {refused:?}"
    );
    // Then free again without anyone releasing it: within two TTLs (a TTL is at least that long
    // on the servers that bound it from below, Consul).
    let next = within(
        KEPT + Duration::from_secs(25),
        "the lease to be free after its release time",
        h.backend()
            .acquire(&spec.clone().wait(Wait::UpTo(Duration::from_secs(24)))),
    )
    .await
    .unwrap();
    assert!(
        tokio::time::Instant::now() >= until,
        "acquired before the release time"
    );
    next.release().await.unwrap();
    Outcome::Passed
}
