//! The real lease-consul client against the Consul model, served on a loopback port: leader
//! acquisition, release and hand-over, loss when an operator deletes the key or destroys the
//! session, a semaphore of two with three contenders; and nothing left behind after each.

mod support;

use std::time::Duration;

use lease_conformance::support::assert_refined;
use lease_core::{Backend, Error, LeaseSpec, LostReason, Wait};
use lease_sim::consul::{Config, Model};
use tokio::time::timeout;

/// Long enough for anything here on a loaded machine; nothing waits out a TTL.
const T: Duration = Duration::from_secs(20);
const LEADER_FLAGS: u64 = Error::LEADER_FLAGS;

fn leader(key: &str) -> LeaseSpec {
    LeaseSpec::leader(key)
        .ttl(Duration::from_secs(10))
        .lock_delay(Duration::ZERO)
}

async fn nothing_left(model: &Model) {
    // Releases and the heartbeat's deregistration run in the background: wait for them.
    timeout(T, async {
        loop {
            let held = model.keys().iter().any(|e| e.holder().is_some());
            if model.sessions().is_empty() && model.checks().is_empty() && !held {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "left behind: sessions {:?}, checks {:?}, keys {:?}",
            model.sessions(),
            model.checks(),
            model.keys()
        )
    });
}

#[tokio::test]
async fn a_leader_acquires_releases_and_hands_over_to_a_waiter() {
    let model = Model::new(Config::new(1));
    let url = support::serve(model.clone()).await;
    let (first, second) = (support::client(&url), support::client(&url));

    let lease = first
        .acquire(&leader("svc/leader").value("one"))
        .await
        .unwrap();
    assert!(lease.is_held());
    let held = model.entry("svc/leader").expect("the key exists");
    assert_eq!(held.holder(), Some(lease.sequencer().holder()));
    assert_eq!(held.flags, LEADER_FLAGS);
    assert_eq!(held.value, b"one");
    assert_eq!(held.lock_index, lease.sequencer().index());
    assert_eq!(
        model.checks().len(),
        1,
        "one heartbeat check for the process"
    );

    let busy = second
        .acquire(&leader("svc/leader").wait(Wait::Never))
        .await;
    assert!(matches!(busy, Err(Error::Busy { .. })), "{busy:?}");

    let waiter = tokio::spawn(async move {
        let lease = second.acquire(&leader("svc/leader").value("two")).await;
        (second, lease)
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!waiter.is_finished(), "the waiter took a held key");
    let first_index = lease.sequencer().index();
    lease.release().await.unwrap();
    let (second, next) = timeout(T, waiter).await.unwrap().unwrap();
    let next = next.unwrap();
    assert!(
        next.sequencer().index() > first_index,
        "LockIndex rises with each holder"
    );
    assert_eq!(model.entry("svc/leader").unwrap().value, b"two");
    next.release().await.unwrap();

    first.shutdown().await;
    second.shutdown().await;
    nothing_left(&model).await;
    let released = model.entry("svc/leader").expect("a released key stays");
    assert_eq!(released.holder(), None);
}

#[tokio::test]
async fn an_operator_deleting_the_key_or_destroying_the_session_is_loss() {
    let model = Model::new(Config::new(2));
    let url = support::serve(model.clone()).await;
    let consul = support::client(&url);

    let lease = consul.acquire(&leader("ops/delete")).await.unwrap();
    assert!(model.delete_key("ops/delete"));
    assert_eq!(
        timeout(T, lease.lost()).await.unwrap(),
        LostReason::KeyDeleted
    );
    assert!(!lease.is_held());
    assert!(lease.run(async {}).await.is_err());
    let _ = lease.release().await;

    let lease = consul.acquire(&leader("ops/destroy")).await.unwrap();
    let session = lease.sequencer().holder().to_owned();
    let work = lease.run(std::future::pending::<()>());
    let destroy = async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(model.destroy_session(&session));
    };
    let (ran, ()) = timeout(T, async { tokio::join!(work, destroy) })
        .await
        .unwrap();
    let reported = ran.expect_err("the work outlived its session");
    // Reported at once as what the key shows, then refined by a read of the session.
    assert_refined(&lease, &reported, LostReason::SessionInvalidated).await;
    let _ = lease.release().await;

    consul.shutdown().await;
    nothing_left(&model).await;
}

#[tokio::test]
async fn a_semaphore_of_two_admits_two_of_three_and_the_third_when_one_leaves() {
    let model = Model::new(Config::new(3));
    let url = support::serve(model.clone()).await;
    let spec = LeaseSpec::semaphore("jobs/sem", 2)
        .ttl(Duration::from_secs(10))
        .lock_delay(Duration::ZERO);
    let clients: Vec<_> = (0..3).map(|_| support::client(&url)).collect();

    let one = clients[0].acquire(&spec).await.unwrap();
    let two = clients[1].acquire(&spec).await.unwrap();
    let third = clients[2].clone();
    let waiting_spec = spec.clone();
    let waiter = tokio::spawn(async move { third.acquire(&waiting_spec).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !waiter.is_finished(),
        "a third holder of a semaphore of two"
    );
    let contenders: Vec<String> = model
        .keys()
        .into_iter()
        .filter(|e| e.key.starts_with("jobs/sem/") && !e.key.ends_with("/.lock"))
        .map(|e| e.key)
        .collect();
    assert_eq!(
        contenders.len(),
        2,
        "a contender key per holder: {contenders:?}"
    );

    one.release().await.unwrap();
    let three = timeout(T, waiter).await.unwrap().unwrap().unwrap();
    assert!(two.is_held() && three.is_held());
    two.release().await.unwrap();
    three.release().await.unwrap();

    for client in &clients {
        client.shutdown().await;
    }
    nothing_left(&model).await;
    let left: Vec<String> = model
        .keys()
        .into_iter()
        .filter(|e| !e.key.ends_with("/.lock"))
        .map(|e| e.key)
        .collect();
    assert!(left.is_empty(), "contender keys left behind: {left:?}");
}
