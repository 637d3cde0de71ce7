//! The Consul leader lease against a real `consul agent -dev`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lease_core::{Backend, Error, LeaseSpec, LostReason, Sequencer, Wait};
use lease_tests::consul::Agent;
use lease_tests::{assert_refined, init_tracing, release_lost, within};
use tokio::time::Instant;

const T: Duration = Duration::from_secs(20);

fn spec(key: &str) -> LeaseSpec {
    LeaseSpec::leader(key)
        .lock_delay(Duration::ZERO)
        .ttl(Duration::from_secs(10))
}

#[tokio::test]
async fn three_contenders_hold_one_at_a_time_and_each_runs() {
    init_tracing();
    let agent = Agent::start().await;
    let holding = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..3 {
        let backend = agent.backend();
        let holding = Arc::clone(&holding);
        tasks.push(tokio::spawn(async move {
            let lease = backend
                .acquire(&spec("contend/leader").value(format!("node-{i}")))
                .await
                .unwrap();
            let seq = lease.sequencer().clone();
            assert_eq!(
                holding.fetch_add(1, Ordering::SeqCst),
                0,
                "two holders at once"
            );
            // Hold for a moment so the others must really wait on the blocking query.
            lease
                .run(tokio::time::sleep(Duration::from_millis(100)))
                .await
                .unwrap();
            holding.fetch_sub(1, Ordering::SeqCst);
            lease.release().await.unwrap();
            seq
        }));
    }
    let mut indexes = Vec::new();
    for t in tasks {
        indexes.push(within(T, "each contender to run", t).await.unwrap().index());
    }
    indexes.sort_unstable();
    indexes.dedup();
    assert_eq!(indexes.len(), 3, "every acquisition has its own LockIndex");
    assert!(agent.sessions().await.is_empty(), "sessions left behind");
    let key = agent.key("contend/leader").await;
    assert!(key["Session"].is_null(), "key still held: {key}");
}

#[tokio::test]
async fn session_destroyed_by_operator_cancels_the_work() {
    init_tracing();
    let agent = Agent::start().await;
    let lease = agent.backend().acquire(&spec("ops/destroy")).await.unwrap();
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let dropped = Arc::new(AtomicUsize::new(0));
    let guard = DropFlag(Arc::clone(&dropped));
    let work = async move {
        let _guard = guard;
        let _ = started_tx.send(());
        std::future::pending::<()>().await
    };
    let session = lease.sequencer().holder().to_owned();
    let run = lease.run(work);
    let operator = async {
        started_rx.await.unwrap();
        agent.destroy_session(&session).await;
    };
    let (result, ()) = within(T, "the work to be cancelled", async {
        tokio::join!(run, operator)
    })
    .await;
    assert_refined(&lease, &result.unwrap_err(), LostReason::SessionInvalidated).await;
    assert_eq!(
        dropped.load(Ordering::SeqCst),
        1,
        "the work was not dropped"
    );
    assert!(!lease.is_held());
    assert_eq!(
        within(T, "lost()", lease.lost()).await,
        LostReason::SessionInvalidated
    );
}

#[tokio::test]
async fn key_deleted_or_released_by_operator_is_loss() {
    init_tracing();
    let agent = Agent::start().await;
    let backend = agent.backend();

    let lease = backend.acquire(&spec("ops/delete")).await.unwrap();
    agent.delete_key("ops/delete").await;
    assert_eq!(
        within(T, "loss on delete", lease.lost()).await,
        LostReason::KeyDeleted
    );
    assert!(
        lease.run(async {}).await.is_err(),
        "work must not start on a lost lease"
    );
    release_lost(lease).await;

    let lease = backend.acquire(&spec("ops/release")).await.unwrap();
    assert!(
        agent
            .release_key("ops/release", lease.sequencer().holder())
            .await
    );
    let result = within(
        T,
        "loss on release",
        lease.run(std::future::pending::<()>()),
    )
    .await;
    assert_eq!(result, Err(LostReason::KeyReleased));
    release_lost(lease).await;
    within(T, "sessions to be destroyed", async {
        while !agent.sessions().await.is_empty() {
            tokio::task::yield_now().await;
        }
    })
    .await;
}

/// A waiter that settles after a deleted key keeps watching: a newcomer that takes the key during
/// the settle and loses it the same way is seen, and the waiter settles again from that second
/// deletion. (It used to sleep through its settle and then read the key afresh: gone, with no
/// holder it knew of, so it took the key at once while the newcomer could still be writing. The
/// chaos suite's short mode caught it.)
#[tokio::test]
async fn a_settling_waiter_sees_a_holder_that_came_and_went_meanwhile() {
    init_tracing();
    let agent = Agent::start().await;
    let settle = Duration::from_secs(3);
    let key = "settle/twice";
    let first = agent.backend().acquire(&spec(key)).await.unwrap();
    let waiting = agent.backend();
    let waiter = tokio::spawn(async move { waiting.acquire(&spec(key).settle(settle)).await });
    within(T, "the waiter's session", async {
        while agent.sessions().await.len() < 2 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    // Time for the waiter to read the key and see its holder (about a millisecond).
    tokio::time::sleep(Duration::from_millis(300)).await;
    agent.delete_key(key).await;
    within(T, "the first holder's loss", first.lost()).await;
    // A newcomer never saw a holder, so it takes the key at once; a second later, during the
    // waiter's settle, it loses it the same way.
    let second = agent
        .backend()
        .acquire(&spec(key).wait(Wait::Never))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let deleted_again = Instant::now();
    agent.delete_key(key).await;
    let next = within(T, "the waiter", waiter).await.unwrap().unwrap();
    let waited = deleted_again.elapsed();
    assert!(
        waited >= settle,
        "the waiter took the key {waited:?} after the newcomer's key was deleted, within its {settle:?} settle time"
    );
    within(T, "the newcomer's loss", second.lost()).await;
    release_lost(first).await;
    release_lost(second).await;
    next.release().await.unwrap();
}

#[tokio::test]
async fn reacquisition_increments_lock_index_and_old_sequencer_fails_check() {
    init_tracing();
    let agent = Agent::start().await;
    let backend = agent.backend();
    let first = backend.acquire(&spec("seq/leader")).await.unwrap();
    let old: Sequencer = first.sequencer().clone();
    first.check().await.unwrap();
    backend.check_sequencer(&old).await.unwrap();
    first.release().await.unwrap();

    let second = backend.acquire(&spec("seq/leader")).await.unwrap();
    assert!(
        second.sequencer().index() > old.index(),
        "{} !> {}",
        second.sequencer(),
        old
    );
    let err = backend.check_sequencer(&old).await.unwrap_err();
    assert!(
        matches!(err, Error::Lost(LostReason::KeyTaken { .. })),
        "{err}"
    );
    second.check().await.unwrap();
    // The sequencer survives its text form.
    let parsed: Sequencer = second.sequencer().to_string().parse().unwrap();
    backend.check_sequencer(&parsed).await.unwrap();
    second.release().await.unwrap();
}

#[tokio::test]
async fn check_marks_the_lease_lost() {
    init_tracing();
    let agent = Agent::start().await;
    let lease = agent
        .backend()
        .acquire(&spec("check/leader"))
        .await
        .unwrap();
    agent.delete_key("check/leader").await;
    // Whichever sees it first, check() or the watch, the lease ends up lost with that reason.
    let result = lease.check().await;
    assert!(
        matches!(result, Err(Error::Lost(LostReason::KeyDeleted))),
        "{result:?}"
    );
    assert!(!lease.is_held());
}

#[tokio::test]
async fn busy_when_not_waiting_or_wait_runs_out() {
    init_tracing();
    let agent = Agent::start().await;
    let backend = agent.backend();
    let held = backend.acquire(&spec("busy/leader")).await.unwrap();
    let err = backend
        .acquire(&spec("busy/leader").wait(Wait::Never))
        .await
        .unwrap_err();
    assert!(err.is_busy(), "{err}");
    let err = backend
        .acquire(&spec("busy/leader").wait(Wait::UpTo(Duration::from_millis(300))))
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::Busy { waited, .. } if waited >= Duration::from_millis(300)),
        "{err}"
    );
    held.release().await.unwrap();
    within(T, "only nothing left", async {
        while !agent.sessions().await.is_empty() {
            tokio::task::yield_now().await;
        }
    })
    .await;
}

#[tokio::test]
async fn drop_releases_in_the_background() {
    init_tracing();
    let agent = Agent::start().await;
    let backend = agent.backend();
    let lease = backend
        .acquire(&spec("drop/leader").lock_delay(Duration::from_secs(15)))
        .await
        .unwrap();
    drop(lease);
    // With lock-delay 15 s, only a real release (not a session invalidation) lets us in at once.
    let again = within(
        Duration::from_secs(5),
        "re-acquire after drop",
        backend.acquire(&spec("drop/leader").wait(Wait::UpTo(Duration::from_secs(5)))),
    )
    .await
    .unwrap();
    again.release().await.unwrap();
}

#[tokio::test]
async fn advertised_value_is_written() {
    init_tracing();
    let agent = Agent::start().await;
    let lease = agent
        .backend()
        .acquire(&spec("value/leader").value("10.1.2.3:8080"))
        .await
        .unwrap();
    let entry = agent.key("value/leader").await;
    assert_eq!(entry["Value"], "MTAuMS4yLjM6ODA4MA==");
    assert_eq!(entry["Flags"], 0x2ddc_cbc0_58a5_0c18_u64);
    lease.release().await.unwrap();
}

struct DropFlag(Arc<AtomicUsize>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}
