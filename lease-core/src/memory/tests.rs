//! The memory backend's own edge cases; the shared scenarios are in the conformance suite.

use std::time::Duration;

use super::*;
use crate::{Backend, LostReason, Wait};

fn spec(key: &str) -> LeaseSpec {
    LeaseSpec::leader(key)
        .ttl(Duration::from_secs(10))
        .lock_delay(Duration::from_secs(15))
}

#[tokio::test(start_paused = true)]
async fn lock_delay_bars_reacquisition_after_invalidation_but_not_after_release() {
    let memory = Memory::new();
    let first = memory.acquire(&spec("k")).await.expect("first acquire");
    assert!(memory.invalidate_session(first.sequencer().holder()));
    assert_eq!(first.lost().await, LostReason::SessionInvalidated);

    let started = Instant::now();
    let busy = memory
        .acquire(&spec("k").wait(Wait::UpTo(Duration::from_secs(14))))
        .await;
    assert!(busy.expect_err("lock-delay must bar it").is_busy());
    let second = memory.acquire(&spec("k")).await.expect("after lock-delay");
    assert!(started.elapsed() >= Duration::from_secs(15));
    assert_eq!(second.sequencer().index(), 2);

    let released_at = Instant::now();
    second.release().await.expect("release");
    let third = memory
        .acquire(&spec("k").wait(Wait::Never))
        .await
        .expect("no lock-delay");
    assert_eq!(released_at, Instant::now());
    assert_eq!(third.sequencer().index(), 3);
}

#[tokio::test(start_paused = true)]
async fn zero_lock_delay_means_zero() {
    let memory = Memory::new();
    let first = memory
        .acquire(&spec("k").lock_delay(Duration::ZERO))
        .await
        .expect("acquire");
    memory.invalidate_session(first.sequencer().holder());
    // "0 means 0" for a contender that does not settle (as `consul lock` does not).
    let second = memory
        .acquire(
            &spec("k")
                .lock_delay(Duration::ZERO)
                .settle(Duration::ZERO)
                .wait(Wait::Never),
        )
        .await
        .expect("at once");
    assert_eq!(second.sequencer().index(), 2);
}

#[tokio::test(start_paused = true)]
async fn contenders_settle_after_an_undelayed_loss_but_not_after_a_release() {
    let memory = Memory::new();
    let settle = LeaseSpec::DEFAULT_SETTLE;
    let spec = || spec("k").lock_delay(Duration::ZERO);
    for fault in ["invalidate", "delete"] {
        let holder = memory.acquire(&spec()).await.expect("acquire");
        let lost_at = Instant::now();
        match fault {
            "invalidate" => assert!(memory.invalidate_session(holder.sequencer().holder())),
            _ => assert!(memory.delete_key("k")),
        }
        let busy = memory.acquire(&spec().wait(Wait::Never)).await;
        assert!(busy.expect_err(fault).is_busy(), "{fault}: taken at once");
        let next = memory.acquire(&spec()).await.expect("after settling");
        assert_eq!(Instant::now() - lost_at, settle, "{fault}");
        next.release().await.expect("release");
    }
    // A clean release hands the key on at once.
    let holder = memory.acquire(&spec()).await.expect("acquire");
    holder.release().await.expect("release");
    let next = memory
        .acquire(&spec().wait(Wait::Never))
        .await
        .expect("at once after a release");
    next.release().await.expect("release");
}

#[tokio::test(start_paused = true)]
async fn an_unrenewed_session_expires_after_its_ttl_and_a_held_one_does_not() {
    let memory = Memory::new();
    let lease = memory.acquire(&spec("held")).await.expect("acquire");
    let orphan = memory.inner.create_session(&spec("orphan"));
    tokio::time::sleep(Duration::from_secs(9)).await;
    assert!(memory.sessions().contains(&orphan));
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!memory.sessions().contains(&orphan));
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert!(lease.is_held());
    lease
        .check()
        .await
        .expect("still held after an hour of renewals");
}

#[tokio::test(start_paused = true)]
async fn semaphore_prunes_a_dead_holder_and_nothing_is_left_behind() {
    let memory = Memory::new();
    let sem = |wait| {
        LeaseSpec::semaphore("jobs", 2)
            .lock_delay(Duration::ZERO)
            .settle(Duration::ZERO)
            .wait(wait)
    };
    let a = memory.acquire(&sem(Wait::Never)).await.expect("a");
    let b = memory.acquire(&sem(Wait::Never)).await.expect("b");
    assert!(
        memory
            .acquire(&sem(Wait::Never))
            .await
            .expect_err("full")
            .is_busy()
    );
    assert_eq!(
        a.sequencer().key(),
        format!("jobs/{}", a.sequencer().holder())
    );
    memory.invalidate_session(a.sequencer().holder());
    assert_eq!(a.lost().await, LostReason::SessionInvalidated);
    let c = memory
        .acquire(&sem(Wait::Never))
        .await
        .expect("a was pruned");
    let limit = memory
        .acquire(&LeaseSpec::semaphore("jobs", 3).wait(Wait::Never))
        .await;
    assert!(matches!(
        limit,
        Err(Error::LimitMismatch {
            stored: 2,
            requested: 3,
            ..
        })
    ));
    drop(a);
    b.release().await.expect("release b");
    c.release().await.expect("release c");
    assert!(memory.sessions().is_empty(), "{:?}", memory.sessions());
    assert_eq!(memory.keys(), vec!["jobs/.lock".to_owned()]);
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_acquire_leaves_no_session() {
    let memory = Memory::new();
    let held = memory.acquire(&spec("k")).await.expect("acquire");
    let waiting = tokio::time::timeout(Duration::from_secs(1), memory.acquire(&spec("k"))).await;
    assert!(waiting.is_err());
    assert_eq!(
        memory.sessions(),
        vec![held.sequencer().holder().to_owned()]
    );
}

#[tokio::test(start_paused = true)]
async fn operator_release_and_delete_are_reported_as_such() {
    let memory = Memory::new();
    let a = memory.acquire(&spec("k")).await.expect("a");
    assert!(memory.release_key("k"));
    assert_eq!(a.lost().await, LostReason::KeyReleased);
    let b = memory
        .acquire(&spec("k").wait(Wait::Never))
        .await
        .expect("released: no delay");
    assert!(memory.delete_key("k"));
    assert_eq!(b.lost().await, LostReason::KeyDeleted);
    let clash = memory.acquire(&LeaseSpec::semaphore("k", 1)).await;
    assert!(clash.is_ok());
    let clash = memory.acquire(&spec("k/.lock").wait(Wait::Never)).await;
    assert!(matches!(clash, Err(Error::FlagsConflict { .. })));
}

#[tokio::test(start_paused = true)]
async fn a_name_is_used_by_one_kind_of_lock_at_a_time_and_the_other_is_refused_at_once() {
    let memory = Memory::new();
    let patient = Wait::UpTo(Duration::from_secs(60));
    let semaphore = |wait| LeaseSpec::semaphore("k", 2).wait(wait);
    let is_conflict = |answer: Result<Lease, Error>, at: &str, found, expected| match answer {
        Err(Error::FlagsConflict {
            key,
            found: f,
            expected: e,
        }) => key == at && f == found && e == expected,
        _ => false,
    };

    let leader = memory.acquire(&spec("k")).await.expect("leader");
    let started = Instant::now();
    let refused = memory.acquire(&semaphore(patient)).await;
    assert_eq!(started.elapsed(), Duration::ZERO, "waited");
    let (leader_flags, semaphore_flags) = (Error::LEADER_FLAGS, Error::SEMAPHORE_FLAGS);
    assert!(is_conflict(refused, "k", leader_flags, semaphore_flags));
    // The key records its kind after its holder has gone, as on Consul.
    leader.release().await.expect("release");
    let refused = memory.acquire(&semaphore(Wait::Never)).await;
    assert!(is_conflict(refused, "k", leader_flags, semaphore_flags));
    assert!(memory.delete_key("k"));

    let slot = memory.acquire(&semaphore(Wait::Never)).await.expect("slot");
    let refused = memory.acquire(&spec("k").wait(patient)).await;
    assert_eq!(started.elapsed(), Duration::ZERO, "waited");
    assert!(is_conflict(
        refused,
        "k/.lock",
        semaphore_flags,
        leader_flags
    ));
    slot.release().await.expect("release");
    let refused = memory.acquire(&spec("k").wait(Wait::Never)).await;
    assert!(is_conflict(
        refused,
        "k/.lock",
        semaphore_flags,
        leader_flags
    ));
    assert!(memory.sessions().is_empty(), "{:?}", memory.sessions());
    assert_eq!(memory.keys(), vec!["k/.lock".to_owned()]);
}

fn slots(limit: u32) -> LeaseSpec {
    LeaseSpec::semaphore("jobs", limit)
        .ttl(Duration::from_secs(10))
        .lock_delay(Duration::ZERO)
        .settle(Duration::from_secs(2))
}

/// Asserts that no slot of `limit` is free now, and that one is free exactly the settle time
/// after `lost_at`; releases it.
async fn admitted_only_after_settling(memory: &Memory, limit: u32, lost_at: Instant) {
    let busy = memory.acquire(&slots(limit).wait(Wait::Never)).await;
    assert!(busy.expect_err("a slot while settling").is_busy());
    let next = memory.acquire(&slots(limit)).await.expect("after settling");
    assert_eq!(lost_at.elapsed(), Duration::from_secs(2));
    next.release().await.expect("release");
}

#[tokio::test(start_paused = true)]
async fn a_dead_holder_keeps_its_slot_for_the_settle_time_from_its_death() {
    let memory = Memory::new();
    let a = memory.acquire(&slots(1)).await.expect("a");
    let died = Instant::now();
    assert!(memory.invalidate_session(a.sequencer().holder()));
    assert_eq!(a.lost().await, LostReason::SessionInvalidated);
    // Nobody contends meanwhile; the store saw the death as it happened all the same.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    admitted_only_after_settling(&memory, 1, died).await;
    assert_eq!(memory.keys(), vec!["jobs/.lock".to_owned()]);
}

#[tokio::test(start_paused = true)]
async fn a_deleted_lock_admits_nobody_until_its_holders_had_time_to_stop() {
    let memory = Memory::new();
    let a = memory.acquire(&slots(2)).await.expect("a");
    let b = memory.acquire(&slots(2)).await.expect("b");
    let deleted = Instant::now();
    assert!(memory.delete_key("jobs/.lock"));
    assert_eq!(a.lost().await, LostReason::KeyDeleted);
    assert_eq!(b.lost().await, LostReason::KeyDeleted);
    // Both have cleaned up (their sessions are gone), but their work may still be stopping.
    tokio::task::yield_now().await;
    assert!(memory.sessions().is_empty(), "{:?}", memory.sessions());
    admitted_only_after_settling(&memory, 2, deleted).await;
}

#[tokio::test(start_paused = true)]
async fn a_released_slot_is_handed_on_at_once_and_the_limit_holds() {
    let memory = Memory::new();
    let a = memory.acquire(&slots(1)).await.expect("a");
    let waiting = tokio::spawn({
        let memory = memory.clone();
        async move { memory.acquire(&slots(1)).await }
    });
    tokio::task::yield_now().await;
    let released = Instant::now();
    let first = a.sequencer().clone();
    a.release().await.expect("release");
    let b = waiting.await.expect("task").expect("b");
    assert_eq!(released.elapsed(), Duration::ZERO);
    assert!(b.is_held());
    b.check().await.expect("b holds a slot");
    assert!(memory.check_sequencer(&first).await.is_err());
}
