//! Taking a leader key, waiting for it, and handing it over: contention, sequencers, the
//! two ways of not waiting, and observers of who leads.

use std::sync::Arc;
use std::time::Duration;

use lease_core::{Error, LostReason, Sequencer, Wait};

use super::common::{EVENT, leader};
use crate::support::within;
use crate::{Capability, Harness, Outcome};

/// A held key is `Busy` to others; a waiter takes it, with a new sequencer, once it is released.
pub async fn contention_then_handover_on_release(h: &Harness) -> Outcome {
    let key = h.key("contention");
    let a = h.backend().acquire(&leader(&key)).await.unwrap();
    let busy = h.backend().acquire(&leader(&key).wait(Wait::Never)).await;
    assert!(busy.unwrap_err().is_busy());

    let backend = Arc::clone(h.backend());
    let spec = leader(&key);
    let mut waiting = lease_core::runtime::spawn(async move { backend.acquire(&spec).await });
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
