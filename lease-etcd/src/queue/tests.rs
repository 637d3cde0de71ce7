use super::*;
use crate::client::EtcdClient;
use crate::leader::Leader;
use crate::semaphore::{Semaphore, SemaphoreValue};
use lease_tests::etcd::Server;

/// A contender key under `q/` as a range returns it.
pub(crate) fn contender(name: &str, value: &[u8]) -> KeyValue {
    KeyValue {
        key: format!("q/{name}").into_bytes(),
        value: value.to_vec(),
        ..KeyValue::default()
    }
}

pub(crate) fn semaphore_contender(name: &str, limit: u32) -> KeyValue {
    contender(name, &SemaphoreValue::encode(limit, b"10.0.0.7"))
}

fn refused(turn: Result<Turn, Error>, found: u64, expected: u64) -> bool {
    matches!(turn, Err(Error::FlagsConflict { key, found: f, expected: e })
        if key == "q" && f == found && e == expected)
}

#[test]
fn each_kind_refuses_a_name_the_other_kind_holds() {
    let (leader_flags, semaphore_flags) = (Error::LEADER_FLAGS, Error::SEMAPHORE_FLAGS);
    let semaphore = Semaphore { limit: 2 };
    // A leader (ours, `etcdctl elect`'s, `etcdctl lock`'s) holds: a semaphore is refused,
    // whether or not it is among the `limit` oldest.
    for value in [&b"node-1"[..], b""] {
        let ahead = [contender("leader", value), contender("own", b"")];
        let turn = semaphore.judge("q", "q/own", &ahead);
        assert!(refused(turn, leader_flags, semaphore_flags));
        let turn = semaphore.judge("q", "q/own", &ahead[..1]);
        assert!(refused(turn, leader_flags, semaphore_flags));
    }
    // A semaphore holds: a leader behind it is refused; behind a leader, it waits.
    let holder = semaphore_contender("holder", 2);
    let turn = Leader.judge("q", "q/own", std::slice::from_ref(&holder));
    assert!(refused(turn, semaphore_flags, leader_flags));
    let turn = Leader.judge("q", "q/own", &[contender("leader", b"")]);
    assert!(matches!(turn, Ok(Turn::WaitFor(_))));
    assert!(matches!(Leader.judge("q", "q/own", &[]), Ok(Turn::Mine)));
    // Semaphore contenders only: the limit decides.
    let ahead = [holder.clone(), semaphore_contender("own", 2)];
    assert!(matches!(
        semaphore.judge("q", "q/own", &ahead),
        Ok(Turn::Mine)
    ));
    let turn = semaphore.judge("q", "q/own", &[holder.clone(), semaphore_contender("b", 2)]);
    assert!(matches!(turn, Ok(Turn::WaitFor(_))));
    let turn = Semaphore { limit: 3 }.judge("q", "q/own", &ahead);
    assert!(matches!(
        turn,
        Err(Error::LimitMismatch {
            stored: 2,
            requested: 3,
            ..
        })
    ));
}

/// An etcd server of its own, and a client of it (this crate's, not `lease_tests`'s).
pub(crate) async fn started() -> (Server, crate::Etcd) {
    let server = Server::start().await;
    let etcd = crate::Etcd::builder()
        .endpoints([server.url()])
        .build()
        .unwrap();
    (server, etcd)
}

/// Writes `key` (touched once more if `touched`, as a release does) and returns its create
/// revision.
pub(crate) async fn put(http: &EtcdClient, key: &str, touched: bool) -> i64 {
    let put = |touch| TxnRequest {
        success: vec![RequestOp::put(if touch {
            PutRequest::touch(key)
        } else {
            PutRequest {
                key: key.as_bytes().to_vec(),
                value: b"v".to_vec(),
                ..PutRequest::default()
            }
        })],
        ..TxnRequest::default()
    };
    let created = http.wire().txn(&put(false)).await.unwrap().revision();
    if touched {
        http.wire().txn(&put(true)).await.unwrap();
    }
    created
}

/// The keys ahead at the join, as the first read's history range reads them.
async fn ahead_at(http: &EtcdClient, rule: impl Recipe, created: i64) -> Vec<KeyValue> {
    let range = rule.ahead("q", created).at_revision(created);
    http.wire().range(&range).await.unwrap().kvs
}

/// A holder ahead of a waiter when it joined, removed before the waiter's first read: gone
/// without a release, the waiter must settle; released (touched first), it need not. The
/// deletion falls between the join and the read here by construction, whatever the timing.
#[tokio::test]
async fn a_holder_removed_between_a_join_and_the_first_read_is_judged_from_history() {
    let (_server, etcd) = started().await;
    let http = &etcd.http;
    for released in [false, true] {
        judged_from_history(http, Leader, released).await;
    }
    for released in [false, true] {
        judged_from_history(http, Semaphore { limit: 1 }, released).await;
    }
}

async fn judged_from_history(http: &EtcdClient, rule: impl Recipe, released: bool) {
    let holder = "q/holder";
    put(http, holder, released).await;
    let joined = put(http, "q/waiter", false).await;
    let then = ahead_at(http, rule, joined).await;
    assert_eq!(then.len(), 1, "{rule:?}: the holder was ahead at the join");
    http.wire().delete(holder, false).await.unwrap();
    let mut pause = lease_http::backoff();
    let removal = removed_since(http, joined, &then, &[], &mut pause).await;
    assert_eq!(
        removal.is_unannounced(),
        !released,
        "{rule:?}, released: {released}"
    );
    // Nothing gone since the join: nothing to settle for.
    let still = removed_since(http, joined, &[], &[], &mut pause).await;
    assert_eq!(still, Removal::Released);
    http.wire().delete("q", true).await.unwrap();
}
