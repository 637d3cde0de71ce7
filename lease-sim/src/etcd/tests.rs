//! Unit tests of the state machine: the answers of etcd 3.4 to the calls lease-etcd makes, as
//! read in etcd's source (and checked against a real etcd by `tests/etcd_differential.rs`).

use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use lease_etcd::proto::{
    AuthenticateRequest, Compare, DeleteRangeRequest, KeyValue, LeaseGrantRequest, PutRequest,
    RangeRequest, RequestOp, TxnRequest, TxnResponse, WatchCancelRequest, WatchCreateRequest,
    WatchRequest, WatchRequestUnion, WatchResponse,
};
use tonic::Code;

use super::lessor::Renewal;
use super::state::State;
use super::{Config, Model};

fn state() -> State {
    State::new(Config::new(7).revoke_late(Duration::ZERO), Instant::now())
}

fn put(key: &str, value: &str, lease: i64) -> TxnRequest {
    TxnRequest {
        success: vec![RequestOp::put(PutRequest {
            key: key.into(),
            value: value.into(),
            lease,
            ..PutRequest::default()
        })],
        ..TxnRequest::default()
    }
}

fn txn(state: &mut State, request: &TxnRequest) -> TxnResponse {
    state
        .txn(request, None, Instant::now())
        .unwrap_or_else(|e| panic!("txn: {e}"))
}

fn write(state: &mut State, key: &str, value: &str) -> i64 {
    txn(state, &put(key, value, 0)).revision()
}

fn range(state: &mut State, request: &RangeRequest) -> Vec<KeyValue> {
    state
        .range(request, None, Instant::now())
        .unwrap_or_else(|e| panic!("range: {e}"))
        .kvs
}

fn keys(kvs: &[KeyValue]) -> Vec<String> {
    kvs.iter().map(KeyValue::key_str).collect()
}

fn grant(state: &mut State, ttl: i64, now: Instant) -> i64 {
    state
        .lease_grant(&LeaseGrantRequest { ttl }, 0, None, now)
        .unwrap_or_else(|e| panic!("grant: {e}"))
        .id
}

#[test]
fn writes_raise_the_revision_and_a_key_keeps_its_creation() {
    let mut s = state();
    assert_eq!(s.revision(), 1, "a new etcd is at revision 1");
    assert_eq!(write(&mut s, "a", "1"), 2);
    assert_eq!(write(&mut s, "a", "2"), 3);
    let kv = &range(&mut s, &RangeRequest::key("a"))[0];
    assert_eq!(
        (
            kv.create_revision,
            kv.mod_revision,
            kv.version,
            kv.value.as_slice()
        ),
        (2, 3, 2, b"2".as_slice())
    );
    // A transaction that changes nothing answers the current revision and keeps it.
    let nothing = TxnRequest {
        success: vec![RequestOp::delete("missing")],
        ..TxnRequest::default()
    };
    assert_eq!(txn(&mut s, &nothing).revision(), 3);
    assert_eq!(s.revision(), 3);
    let deleted = s
        .delete_range(
            &DeleteRangeRequest {
                key: b"a".to_vec(),
                range_end: Vec::new(),
            },
            None,
            Instant::now(),
        )
        .unwrap();
    assert_eq!((deleted.deleted, deleted.header.unwrap().revision), (1, 4));
    // Written again: a new generation, version 1.
    write(&mut s, "a", "3");
    let kv = &range(&mut s, &RangeRequest::key("a"))[0];
    assert_eq!((kv.create_revision, kv.version), (5, 1));
}

#[test]
fn ranges_sort_limit_filter_and_read_the_past() {
    let mut s = state();
    for key in ["q/c", "q/a", "q/b", "r"] {
        write(&mut s, key, key);
    }
    // Created at 2 (q/c), 3 (q/a), 4 (q/b).
    assert_eq!(
        keys(&range(&mut s, &RangeRequest::under("q"))),
        ["q/a", "q/b", "q/c"]
    );
    let oldest = RangeRequest::under("q").by_creation(true).limit(2);
    assert_eq!(keys(&range(&mut s, &oldest)), ["q/c", "q/a"]);
    // A leader's key ahead: the newest older than the own key's creation.
    let ahead = RangeRequest::under("q")
        .by_creation(false)
        .limit(1)
        .created_by(3);
    assert_eq!(keys(&range(&mut s, &ahead)), ["q/a"]);
    let names = range(&mut s, &RangeRequest::under("q").keys_only());
    assert!(names.iter().all(|kv| kv.value.is_empty()));
    // Limited without sorting: the first keys in key order.
    assert_eq!(
        keys(&range(&mut s, &RangeRequest::under("q").limit(1))),
        ["q/a"]
    );
    // The past, until it is compacted.
    assert_eq!(
        keys(&range(&mut s, &RangeRequest::under("q").at_revision(3))),
        ["q/a", "q/c"]
    );
    let read = s
        .range(
            &RangeRequest::under("q").at_revision(3),
            None,
            Instant::now(),
        )
        .unwrap();
    assert_eq!(
        read.revision(),
        5,
        "the header carries the current revision"
    );
    s.compact(4).unwrap();
    let compacted = s
        .range(
            &RangeRequest::under("q").at_revision(3),
            None,
            Instant::now(),
        )
        .unwrap_err();
    assert_eq!(
        (compacted.code(), compacted.message()),
        (
            Code::OutOfRange,
            "etcdserver: mvcc: required revision has been compacted"
        )
    );
    assert_eq!(
        keys(&range(&mut s, &RangeRequest::under("q").at_revision(4))).len(),
        3
    );
    let future = s
        .range(&RangeRequest::key("q").at_revision(9), None, Instant::now())
        .unwrap_err();
    assert_eq!(
        future.message(),
        "etcdserver: mvcc: required revision is a future revision"
    );
    assert_eq!(
        s.range(&RangeRequest::default(), None, Instant::now())
            .unwrap_err()
            .message(),
        "etcdserver: key is not provided"
    );
}

#[test]
fn compaction_keeps_the_newest_version_of_each_key_and_no_deletion() {
    let mut s = state();
    write(&mut s, "a", "1"); // 2
    write(&mut s, "a", "2"); // 3
    write(&mut s, "b", "1"); // 4
    s.delete(&super::mvcc::Span::Key(b"b".to_vec())); // 5
    write(&mut s, "c", "1"); // 6
    s.compact(5).unwrap();
    assert_eq!(
        keys(&range(&mut s, &RangeRequest::under("").at_revision(5))),
        [] as [&str; 0]
    );
    let all = RangeRequest {
        key: vec![0],
        range_end: vec![0],
        revision: 5,
        ..RangeRequest::default()
    };
    assert_eq!(keys(&range(&mut s, &all)), ["a"]);
    assert_eq!(
        s.compact(5).unwrap_err().message(),
        "etcdserver: mvcc: required revision has been compacted"
    );
    assert_eq!(
        s.compact(7).unwrap_err().message(),
        "etcdserver: mvcc: required revision is a future revision"
    );
}

#[test]
fn a_join_puts_once_and_reads_the_key_otherwise() {
    let mut s = state();
    let lease = grant(&mut s, 10, Instant::now());
    let join = TxnRequest {
        compare: vec![Compare::absent("e/1")],
        success: vec![RequestOp::put(PutRequest {
            key: b"e/1".to_vec(),
            value: b"v".to_vec(),
            lease,
            ..PutRequest::default()
        })],
        failure: vec![RequestOp::range(RangeRequest::key("e/1"))],
    };
    let first = txn(&mut s, &join);
    assert!(first.succeeded);
    assert_eq!(first.revision(), 2);
    assert_eq!(
        first.range(0),
        Default::default(),
        "a put's answer reads as none"
    );
    let again = txn(&mut s, &join);
    assert!(!again.succeeded);
    assert_eq!(again.revision(), 2);
    assert_eq!(again.range(0).kvs[0].create_revision, 2);
    assert_eq!(again.range(0).kvs[0].lease, lease);
    assert_eq!(again.range(0).revision(), 2);
}

#[test]
fn a_release_touches_then_deletes_only_a_touched_key() {
    let mut s = state();
    write(&mut s, "e/1", "v");
    let mut delete = TxnRequest {
        compare: vec![Compare::created("e/1", 2), Compare::touched("e/1")],
        success: vec![RequestOp::delete("e/1")],
        ..TxnRequest::default()
    };
    assert!(!txn(&mut s, &delete).succeeded, "not touched yet");
    let touch = TxnRequest {
        compare: vec![Compare::created("e/1", 2)],
        success: vec![RequestOp::put(PutRequest::touch("e/1"))],
        ..TxnRequest::default()
    };
    assert!(txn(&mut s, &touch).succeeded);
    let kv = &range(&mut s, &RangeRequest::key("e/1"))[0];
    assert_eq!((kv.version, kv.value.as_slice()), (2, b"v".as_slice()));
    assert!(txn(&mut s, &delete).succeeded);
    assert!(range(&mut s, &RangeRequest::key("e/1")).is_empty());
    // A touch of a key that is gone fails its compare, without an error.
    assert!(!txn(&mut s, &touch).succeeded);
    delete.compare.clear();
    // With no compare a touch of a missing key is etcd's "key not found".
    let bare = TxnRequest {
        success: vec![RequestOp::put(PutRequest::touch("e/1"))],
        ..TxnRequest::default()
    };
    let error = s.txn(&bare, None, Instant::now()).unwrap_err();
    assert_eq!(
        (error.code(), error.message()),
        (Code::InvalidArgument, "etcdserver: key not found")
    );
}

#[test]
fn a_transaction_is_refused_as_etcd_refuses_it() {
    let mut s = state();
    let refused = |s: &mut State, request: TxnRequest| {
        s.txn(&request, None, Instant::now())
            .unwrap_err()
            .message()
            .to_owned()
    };
    assert_eq!(
        refused(&mut s, put("k", "v", 0x1234)),
        "etcdserver: requested lease not found"
    );
    let mut both = put("k", "v", 0);
    both.success.push(RequestOp::delete("k"));
    assert_eq!(
        refused(&mut s, both),
        "etcdserver: duplicate key given in txn request"
    );
    let empty_op = TxnRequest {
        success: vec![RequestOp { request: None }],
        ..TxnRequest::default()
    };
    assert_eq!(refused(&mut s, empty_op), "etcdserver: key not found");
    let mut valued = put("k", "v", 0);
    if let Some(lease_etcd::proto::Request::Put(p)) = &mut valued.success[0].request {
        p.ignore_value = true;
    }
    assert_eq!(refused(&mut s, valued), "etcdserver: value is provided");
    let many = TxnRequest {
        success: (0..129)
            .map(|i| RequestOp::range(RangeRequest::key(&i.to_string())))
            .collect(),
        ..TxnRequest::default()
    };
    assert_eq!(
        refused(&mut s, many),
        "etcdserver: too many operations in txn request"
    );
    // Only the branch taken is checked for leases.
    let mut untaken = put("k", "v", 0x1234);
    untaken.compare = vec![Compare::created("k", 5)];
    assert!(!txn(&mut s, &untaken).succeeded);
    assert_eq!(s.revision(), 1);
}

#[test]
fn lease_ids_rise_with_one_hex_length_and_ttls_have_a_floor() {
    let mut s = state();
    let now = Instant::now();
    let ids: Vec<i64> = (0..5).map(|_| grant(&mut s, 10, now)).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]));
    assert!(
        ids.iter()
            .all(|id| *id > 0 && format!("{id:x}").len() == 16)
    );
    let short = s
        .lease_grant(&LeaseGrantRequest { ttl: 1 }, 0, None, now)
        .unwrap();
    assert_eq!(short.ttl, 2, "raised to the minimum TTL");
    let long = s
        .lease_grant(&LeaseGrantRequest { ttl: 9_000_000_001 }, 0, None, now)
        .unwrap_err();
    assert_eq!(
        (long.code(), long.message()),
        (Code::OutOfRange, "etcdserver: too large lease TTL")
    );
    let taken = s
        .lease_grant(&LeaseGrantRequest { ttl: 5 }, ids[0], None, now)
        .unwrap_err();
    assert_eq!(taken.message(), "etcdserver: lease already exists");
}

#[test]
fn a_revocation_deletes_its_keys_in_one_revision_in_key_order() {
    let mut s = state();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let stream = s.open_watch_stream(tx, None, Instant::now());
    s.watch_request(stream, &create(1, "", 0, true), Instant::now());
    let lease = grant(&mut s, 10, Instant::now());
    for key in ["k/b", "k/a", "k/c"] {
        txn(&mut s, &put(key, "v", lease));
    }
    write(&mut s, "other", "v");
    assert_eq!(s.revision(), 5);
    let _ = drain(&mut rx);
    assert!(s.lease_revoke(lease, None, Instant::now()).is_ok());
    assert_eq!(s.revision(), 6);
    let answers = drain(&mut rx);
    assert_eq!(answers.len(), 1, "one answer: one revision");
    let deleted: Vec<(String, i64)> = answers[0]
        .events
        .iter()
        .map(|e| (e.kv().key_str(), e.kv().mod_revision))
        .collect();
    assert_eq!(
        deleted,
        [("k/a".into(), 6), ("k/b".into(), 6), ("k/c".into(), 6)]
    );
    assert!(
        answers[0]
            .events
            .iter()
            .all(|e| e.is_delete() && e.prev_kv.is_some())
    );
    let gone = s.lease_revoke(lease, None, Instant::now()).unwrap_err();
    assert_eq!(
        (gone.code(), gone.message()),
        (Code::NotFound, "etcdserver: requested lease not found")
    );
    // A lease with no keys goes without a revision.
    let bare = grant(&mut s, 10, Instant::now());
    assert!(s.revoke(bare));
    assert_eq!(s.revision(), 6);
}

#[test]
fn a_lease_expires_its_ttl_after_the_last_keep_alive_and_is_revoked_late() {
    let t0 = Instant::now();
    let late = Duration::from_millis(300);
    let mut s = State::new(Config::new(1).revoke_late(late), t0);
    let lease = grant(&mut s, 10, t0);
    txn(&mut s, &put("k", "v", lease));
    assert_eq!(s.time_to_live(lease, t0 + Duration::from_millis(1)), 9);
    assert_eq!(
        s.renew(lease, t0 + Duration::from_secs(4)),
        Renewal::Renewed(10)
    );
    let expiry = t0 + Duration::from_secs(14);
    assert_eq!(
        s.next_deadline(t0 + Duration::from_secs(4)),
        Some(expiry + late)
    );
    // Expired, not revoked yet: its key is there, a keep-alive waits, TTL reads 0.
    let between = expiry + Duration::from_millis(100);
    s.run_due(between);
    assert_eq!(s.renew(lease, between), Renewal::Expired);
    assert_eq!(s.time_to_live(lease, between), 0);
    assert_eq!(range(&mut s, &RangeRequest::key("k")).len(), 1);
    s.run_due(expiry + late);
    assert!(!s.has_lease(lease));
    assert_eq!(s.time_to_live(lease, expiry + late), -1);
    assert_eq!(s.renew(lease, expiry + late), Renewal::Gone);
    assert!(range(&mut s, &RangeRequest::key("k")).is_empty());
}

#[test]
fn a_restart_extends_every_lease_and_ends_the_streams() {
    let t0 = Instant::now();
    let mut s = State::new(Config::new(1).revoke_late(Duration::ZERO), t0);
    let lease = grant(&mut s, 10, t0);
    let (tx, mut rx) = mpsc::unbounded_channel();
    let stream = s.open_watch_stream(tx, None, t0);
    s.watch_request(stream, &create(1, "k", 0, false), t0);
    let later = t0 + Duration::from_secs(30);
    s.restart(later);
    assert!(
        s.has_lease(lease),
        "an expired lease is extended, not revoked"
    );
    assert_eq!(
        s.time_to_live(lease, later),
        11,
        "TTL plus the election timeout"
    );
    assert_eq!(s.watch_count(), 0);
    let _ = drain(&mut rx);
    assert!(rx.is_closed());
}

fn create(id: i64, prefix: &str, start: i64, progress: bool) -> WatchRequest {
    let range = if prefix.is_empty() {
        RangeRequest {
            key: vec![0],
            range_end: vec![0],
            ..RangeRequest::default()
        }
    } else {
        RangeRequest::under(prefix)
    };
    WatchRequest {
        request_union: Some(WatchRequestUnion::Create(WatchCreateRequest {
            key: range.key,
            range_end: range.range_end,
            start_revision: start,
            progress_notify: progress,
            prev_kv: true,
            watch_id: id,
        })),
    }
}

fn drain(
    rx: &mut mpsc::UnboundedReceiver<Result<WatchResponse, tonic::Status>>,
) -> Vec<WatchResponse> {
    let mut answers = Vec::new();
    while let Ok(answer) = rx.try_recv() {
        answers.extend(answer.ok());
    }
    answers
}

#[test]
fn a_watch_from_the_past_waits_for_the_sync_loop_and_one_compacted_is_cancelled() {
    let t0 = Instant::now();
    let mut s = State::new(Config::new(3), t0);
    write(&mut s, "w/a", "1"); // 2
    write(&mut s, "w/a", "2"); // 3
    let (tx, mut rx) = mpsc::unbounded_channel();
    let stream = s.open_watch_stream(tx, None, t0);
    assert!(
        s.watch_request(stream, &create(5, "w", 2, false), t0),
        "unsynced"
    );
    let created = drain(&mut rx);
    assert_eq!(created.len(), 1);
    assert!(created[0].created && !created[0].canceled);
    assert_eq!((created[0].watch_id, created[0].revision()), (5, 3));
    write(&mut s, "w/b", "1"); // 4: not sent before the sync
    assert!(drain(&mut rx).is_empty());
    let sync = s.next_deadline(t0).expect("the sync loop's turn");
    assert!(sync <= t0 + Duration::from_millis(100));
    s.run_due(sync);
    let caught_up = drain(&mut rx);
    assert_eq!(caught_up.len(), 1, "one batch");
    let events: Vec<(String, i64, Option<i64>)> = caught_up[0]
        .events
        .iter()
        .map(|e| {
            (
                e.kv().key_str(),
                e.kv().mod_revision,
                e.prev_kv.as_ref().map(|p| p.mod_revision),
            )
        })
        .collect();
    assert_eq!(
        events,
        [
            ("w/a".into(), 2, None),
            ("w/a".into(), 3, Some(2)),
            ("w/b".into(), 4, None)
        ]
    );
    assert_eq!(caught_up[0].revision(), 4);
    // Synced now: the next write comes at once.
    write(&mut s, "w/b", "2");
    assert_eq!(drain(&mut rx)[0].events[0].kv().mod_revision, 5);
    // From a compacted revision: created, then cancelled at the sync with the compaction.
    s.compact(4).unwrap();
    s.watch_request(stream, &create(6, "w", 3, false), sync);
    assert!(drain(&mut rx)[0].created);
    s.run_due(sync + Duration::from_millis(100));
    let cancelled = drain(&mut rx);
    assert_eq!(cancelled.len(), 1);
    assert_eq!(
        (
            cancelled[0].watch_id,
            cancelled[0].canceled,
            cancelled[0].compact_revision,
            cancelled[0].revision()
        ),
        (6, true, 4, 0)
    );
    // Its ID stays taken until cancelled.
    s.watch_request(stream, &create(6, "w", 0, false), sync);
    let duplicate = drain(&mut rx);
    assert_eq!(
        (
            duplicate[0].watch_id,
            duplicate[0].canceled,
            duplicate[0].cancel_reason.as_str()
        ),
        (
            -1,
            true,
            "mvcc: duplicate watch ID provided on the WatchStream"
        )
    );
    let cancel = WatchRequest {
        request_union: Some(WatchRequestUnion::Cancel(WatchCancelRequest {
            watch_id: 6,
        })),
    };
    s.watch_request(stream, &cancel, sync);
    let answer = drain(&mut rx);
    assert_eq!((answer[0].watch_id, answer[0].canceled), (6, true));
    s.watch_request(stream, &cancel, sync);
    assert!(
        drain(&mut rx).is_empty(),
        "an unknown watch's cancel is not answered"
    );
}

#[test]
fn an_idle_watch_gets_progress_notifications() {
    let t0 = Instant::now();
    let mut s = State::new(
        Config::new(3).progress_interval(Duration::from_secs(60)),
        t0,
    );
    let (tx, mut rx) = mpsc::unbounded_channel();
    let stream = s.open_watch_stream(tx, None, t0);
    s.watch_request(stream, &create(1, "p", 0, true), t0);
    s.watch_request(stream, &create(2, "busy", 0, true), t0);
    let _ = drain(&mut rx);
    let tick = s.next_deadline(t0).expect("a progress tick");
    assert!(tick >= t0 + Duration::from_secs(60) && tick <= t0 + Duration::from_secs(66));
    write(&mut s, "busy/1", "v");
    let _ = drain(&mut rx);
    s.run_due(tick);
    let progress = drain(&mut rx);
    assert_eq!(progress.len(), 1, "only the idle watch");
    assert_eq!((progress[0].watch_id, progress[0].revision()), (1, 2));
    assert!(progress[0].events.is_empty() && !progress[0].created);
}

#[test]
fn authentication_gives_tokens_and_refuses_calls_without_a_valid_one() {
    let t0 = Instant::now();
    let mut off = state();
    let refused = off
        .authenticate(
            &AuthenticateRequest {
                name: "root".into(),
                password: "pw".into(),
            },
            t0,
        )
        .unwrap_err();
    assert_eq!(
        refused.message(),
        "etcdserver: authentication is not enabled"
    );
    let mut s = State::new(Config::new(1).auth("root", "pw"), t0);
    let wrong = s
        .authenticate(
            &AuthenticateRequest {
                name: "root".into(),
                password: "no".into(),
            },
            t0,
        )
        .unwrap_err();
    assert_eq!(
        wrong.message(),
        "etcdserver: authentication failed, invalid user ID or password"
    );
    let token = s
        .authenticate(
            &AuthenticateRequest {
                name: "root".into(),
                password: "pw".into(),
            },
            t0,
        )
        .unwrap()
        .token;
    assert!(s.range(&RangeRequest::key("k"), Some(&token), t0).is_ok());
    let none = s.range(&RangeRequest::key("k"), None, t0).unwrap_err();
    assert_eq!(none.message(), "etcdserver: user name is empty");
    let bad = s
        .range(&RangeRequest::key("k"), Some("x.1"), t0)
        .unwrap_err();
    assert_eq!(
        (bad.code(), bad.message()),
        (Code::Unauthenticated, "etcdserver: invalid auth token")
    );
    // Unused for its TTL, a token expires.
    let idle = t0 + Duration::from_secs(301);
    assert_eq!(
        s.range(&RangeRequest::key("k"), Some(&token), idle)
            .unwrap_err()
            .code(),
        Code::Unauthenticated
    );
}

/// The background task revokes an expired lease `revoke_late` after its expiry, on the clock it
/// runs on (paused here), and ends with the model.
#[tokio::test(start_paused = true)]
async fn the_background_task_revokes_expired_leases_on_time() {
    let late = Duration::from_millis(250);
    let model = Model::new(Config::new(9).revoke_late(late));
    let _service = model.service();
    let t0 = Instant::now();
    let lease = model.state(|s| grant(s, 3, t0));
    model.state(|s| txn(s, &put("k", "v", lease)));
    tokio::time::sleep_until(t0 + Duration::from_secs(3) + late - Duration::from_millis(1)).await;
    assert_eq!(model.leases().len(), 1);
    tokio::time::sleep(Duration::from_millis(2)).await;
    assert!(model.leases().is_empty());
    assert!(model.keys().is_empty());
    assert_eq!(model.revision(), 3);
}
