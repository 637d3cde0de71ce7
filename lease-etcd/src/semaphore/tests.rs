use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::*;
use crate::queue::tests::{contender, put, semaphore_contender, started};
use crate::wire::proto::RangeRequest;
use lease_core::{Backend, LeaseSpec};

/// Only our semaphore format is a semaphore contender: `etcdctl lock`'s empty value and any
/// `etcdctl elect` proposal (text, other JSON, a near miss of ours) are leader contenders.
#[test]
fn only_our_exact_format_is_a_semaphore_contender() {
    assert!(SemaphoreValue::parse(&semaphore_contender("a", 3)).is_some());
    assert!(SemaphoreValue::parse(&contender("a", br#"{"limit":1,"value":""}"#)).is_some());
    for proposal in [
        &b""[..],
        b"10.0.0.7:8080",
        br#"{"limit":2}"#,
        br#"{"limit":0,"value":""}"#,
        br#"{"limit":2,"value":"not base64!"}"#,
        br#"{"limit":2,"value":"","node":"a"}"#,
        br#"{"limit":-1,"value":""}"#,
        b"[2]",
    ] {
        let kv = contender("a", proposal);
        let text = String::from_utf8_lossy(proposal);
        assert!(SemaphoreValue::parse(&kv).is_none(), "{text}");
    }
}

/// A leader contender that joined behind a semaphore holder (and is about to be refused)
/// is never let in beside a semaphore contender behind it: that one waits for it to go.
#[test]
fn a_semaphore_contender_waits_for_a_leader_contender_ahead_of_it_to_go() {
    let semaphore = Semaphore { limit: 3 };
    let ahead = [
        semaphore_contender("holder", 3),
        contender("leader", b"node-1"),
        semaphore_contender("own", 3),
    ];
    let turn = semaphore.judge("q", "q/own", &ahead);
    assert!(matches!(turn, Ok(Turn::WaitFor(_))));
    let turn = semaphore.judge("q", "q/own", &[ahead[0].clone(), ahead[2].clone()]);
    assert!(matches!(turn, Ok(Turn::Mine)));
}

/// The deletion of `q/<key>` (created at `created`, at `version`), at revision 1000 +
/// `created`.
fn deletion(key: &str, created: i64, version: i64) -> Event {
    let key = format!("q/{key}").into_bytes();
    Event {
        kind: 1,
        kv: Some(KeyValue {
            key: key.clone(),
            mod_revision: 1000 + created,
            ..KeyValue::default()
        }),
        prev_kv: Some(KeyValue {
            key,
            create_revision: created,
            version,
            ..KeyValue::default()
        }),
    }
}

/// A waiter with four keys ahead at a semaphore of limit 2 reads again only once two of them
/// went; a key behind it changes nothing; an unannounced removal of a key that may hold by
/// then is remembered for its settle; the deletion of its own key sends it to read at once.
#[test]
fn a_semaphore_waiter_counts_down_to_its_turn() {
    let older: Vec<KeyValue> = ["a", "b", "c", "d"]
        .into_iter()
        .map(|name| semaphore_contender(name, 2))
        .collect();
    let waiter = || CountDown::of("q/own", 100, 2, (&older[..2], &older[..]), 50);
    let mut count = waiter();
    // A waiter between the holders and us goes (cancelled: no touch): not a holder's.
    assert!(!count.deleted(&deletion("c", 30, 1)));
    assert_eq!(count.take_worst(), Removal::Released);
    // Behind us: not counted.
    assert!(!count.deleted(&deletion("later", 200, 1)));
    // A holder releases: the waiter of then behind it holds now.
    assert!(!count.deleted(&deletion("a", 10, 2)));
    assert_eq!(count.take_worst(), Removal::Released);
    assert_eq!(count.turn_at(), None);
    // That waiter's key deleted without a release: settled for, and our turn has come.
    assert!(count.deleted(&deletion("d", 40, 1)));
    assert!(count.take_worst().is_unannounced());
    assert_eq!(
        count.turn_at(),
        Some(1200),
        "at the latest deletion's revision"
    );

    // A holder deleted without a release while we are still far back: remembered.
    let mut count = waiter();
    assert!(!count.deleted(&deletion("b", 20, 1)));
    assert!(!count.deleted(&deletion("a", 10, 2)));
    assert!(count.deleted(&deletion("c", 30, 2)));
    assert!(count.take_worst().is_unannounced());

    // A deletion etcd gives without the key as it was (its revision compacted): read at once,
    // settle, and never take the turn from the count.
    let mut count = waiter();
    let mut unknown = deletion("a", 10, 2);
    unknown.prev_kv = None;
    assert!(count.deleted(&unknown));
    assert!(count.take_worst().is_unannounced());
    assert!(!count.deleted(&deletion("b", 20, 2)));
    assert!(!count.deleted(&deletion("c", 30, 2)));
    assert!(
        count.deleted(&deletion("d", 40, 2)),
        "the rest still counted down"
    );
    assert_eq!(count.turn_at(), None);

    // Our own key went: read at once, nothing to settle for.
    let mut count = waiter();
    let mut own = deletion("own", 100, 1);
    own.prev_kv = None;
    assert!(count.deleted(&own));
    assert_eq!(count.take_worst(), Removal::Released);
    assert_eq!(count.turn_at(), None);

    // Ahead of us, a leader contender (refused by its own judgment, not yet gone), or a
    // contender that asks for another limit: only a read may let us in.
    for stranger in [contender("b", b"10.0.0.7"), semaphore_contender("b", 3)] {
        let older = [older[0].clone(), stranger];
        let mut count = CountDown::of("q/own", 100, 2, (&older[..], &older[..]), 50);
        assert!(count.deleted(&deletion("a", 10, 2)));
        assert_eq!(count.turn_at(), None);
    }
}

/// Waiters of one semaphore in one process share one etcd watch of its prefix, take their
/// turns in arrival order, and leave no watch behind.
#[tokio::test]
async fn the_waiters_of_a_semaphore_share_one_watch() {
    let (_server, etcd) = started().await;
    let spec = LeaseSpec::semaphore("shared", 1);
    let holder = etcd.acquire(&spec).await.unwrap();
    let (order, mut turns) = tokio::sync::mpsc::unbounded_channel();
    let in_flight = Arc::new(AtomicUsize::new(0));
    let mut waiters = Vec::new();
    for i in 0..5 {
        let (backend, spec, order) = (etcd.clone(), spec.clone(), order.clone());
        let in_flight = Arc::clone(&in_flight);
        waiters.push(tokio::spawn(async move {
            let lease = backend.acquire(&spec).await.unwrap();
            let holding = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            assert_eq!(holding, 1, "waiter {i} held beside another");
            order.send(i).unwrap();
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            in_flight.fetch_sub(1, Ordering::SeqCst);
            lease.release().await.unwrap();
        }));
        // Joined before the next one starts: arrival order is known.
        let joined = 2 + i;
        let deadline = Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let keys = etcd
                .http
                .wire()
                .range(&RangeRequest::under("shared"))
                .await
                .unwrap();
            if keys.kvs.len() == joined {
                break;
            }
            assert!(Instant::now() < deadline, "waiter {i} did not join");
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }
    // The holder's watch of its own key, and one watch of the prefix for five waiters.
    let deadline = Instant::now() + std::time::Duration::from_secs(10);
    while etcd.http.watches().counts() != (2, 6) {
        assert!(
            Instant::now() < deadline,
            "watches: {:?}",
            etcd.http.watches().counts()
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    holder.release().await.unwrap();
    for waiter in waiters {
        tokio::time::timeout(std::time::Duration::from_secs(10), waiter)
            .await
            .unwrap()
            .unwrap();
    }
    let mut taken = Vec::new();
    while let Ok(i) = turns.try_recv() {
        taken.push(i);
    }
    assert_eq!(taken, [0, 1, 2, 3, 4], "FIFO");
    assert_eq!(etcd.http.watches().counts(), (0, 0), "a watch left behind");
}

/// The read after a waiter was woken saw holders gone that the watch had not shown yet: the
/// waiter takes them from the watch before it judges, and settles if one went without a
/// release.
#[tokio::test]
async fn holders_gone_before_a_read_are_taken_from_the_watch() {
    let (_server, etcd) = started().await;
    let http = &etcd.http;
    for second_released in [true, false] {
        put(http, "q/a", true).await;
        put(http, "q/b", second_released).await;
        let created = put(http, "q/own", false).await;
        let read_at = http
            .wire()
            .range(&RangeRequest::key("q/own"))
            .await
            .unwrap()
            .revision();
        let ahead = http
            .wire()
            .range(&Semaphore { limit: 2 }.ahead("q", created))
            .await
            .unwrap()
            .kvs;
        let count = CountDown::of("q/own", created, 2, (&ahead[..2], &ahead[..2]), read_at);
        let stream = http
            .watch_shared(&RangeRequest::under("q"), read_at + 1)
            .await;
        let mut kept = Some(KeptWatch {
            range: RangeRequest::under("q"),
            stream: stream.unwrap(),
        });
        http.wire().delete("q/a", false).await.unwrap();
        http.wire().delete("q/b", false).await.unwrap();
        let read = http
            .wire()
            .range(&RangeRequest::key("q/own"))
            .await
            .unwrap()
            .revision();
        // The read found both gone (0 ahead) before the watch showed either.
        let removal = count.catch_up(&mut kept, read, 0).await;
        assert_eq!(
            removal.is_unannounced(),
            !second_released,
            "second released: {second_released}"
        );
        http.wire().delete("q", true).await.unwrap();
    }
}
