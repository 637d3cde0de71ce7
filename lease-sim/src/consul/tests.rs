//! The model's state machine, through its HTTP API (as the client sees it) and its operator
//! actions, on a paused clock.

use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::Service as _;
use serde_json::{Value, json};
use tokio::time::Instant;

use super::{Config, Model};

const LEADER_FLAGS: u64 = 0x2ddc_cbc0_58a5_0c18;

struct Answer {
    status: u16,
    index: Option<u64>,
    body: Vec<u8>,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

async fn call(model: &Model, method: &str, uri: &str, body: impl Into<Bytes>) -> Answer {
    let request = http::Request::builder()
        .method(method)
        .uri(uri)
        .body(Full::new(body.into()))
        .expect("a valid request");
    let Ok(response) = model.call(request).await;
    let status = response.status().as_u16();
    let index = response
        .headers()
        .get("X-Consul-Index")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    let body = response
        .into_body()
        .collect()
        .await
        .map(|c| c.to_bytes().to_vec())
        .unwrap_or_default();
    Answer {
        status,
        index,
        body,
    }
}

async fn get(model: &Model, uri: &str) -> Answer {
    call(model, "GET", uri, Bytes::new()).await
}

async fn put(model: &Model, uri: &str, body: impl Into<Bytes>) -> Answer {
    call(model, "PUT", uri, body).await
}

async fn session(model: &Model, body: Value) -> String {
    let created = put(model, "/v1/session/create", body.to_string()).await;
    assert_eq!(created.status, 200, "{}", created.text());
    created.json()["ID"].as_str().unwrap_or_default().to_owned()
}

fn b64(value: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(value)
}

fn lock_op(key: &str, session: &str) -> Value {
    json!({"KV": {"Verb": "lock", "Key": key, "Session": session, "Value": b64("v"), "Flags": LEADER_FLAGS}})
}

async fn txn(model: &Model, ops: Value) -> Answer {
    put(model, "/v1/txn", ops.to_string()).await
}

async fn entry(model: &Model, key: &str) -> Value {
    let read = get(model, &format!("/v1/kv/{key}?consistent")).await;
    read.json().get(0).cloned().unwrap_or(Value::Null)
}

fn model() -> Model {
    Model::new(Config::new(42))
}

#[tokio::test(start_paused = true)]
async fn kv_indexes_are_consuls() {
    let model = model();
    let missing = get(&model, "/v1/kv/a/b").await;
    assert_eq!((missing.status, missing.index), (404, Some(1)));
    assert_eq!(
        put(&model, "/v1/kv/a/b?flags=5", "hello").await.json(),
        json!(true)
    );
    let written = entry(&model, "a/b").await;
    let index = written["ModifyIndex"].as_u64().unwrap_or_default();
    assert_eq!(written["CreateIndex"], json!(index));
    assert_eq!(written["Value"], json!(b64("hello")));
    assert_eq!(written["Flags"], json!(5));
    assert!(written.get("Session").is_none(), "{written}");

    // Writing the same entry again changes nothing, not even the index.
    put(&model, "/v1/kv/a/b?flags=5", "hello").await;
    assert_eq!(entry(&model, "a/b").await["ModifyIndex"], json!(index));

    // An empty value reads as null; a missing key answers the table's index.
    put(&model, "/v1/kv/a/c", "").await;
    let c = entry(&model, "a/c").await;
    assert_eq!(c["Value"], Value::Null);
    let c_index = c["ModifyIndex"].as_u64().unwrap_or_default();
    assert_eq!(get(&model, "/v1/kv/zzz").await.index, Some(c_index));

    // A listing's index is its prefix's, and a deletion under it raises it (a tombstone).
    let list = get(&model, "/v1/kv/a/?recurse").await;
    assert_eq!(list.index, Some(c_index));
    assert_eq!(list.json().as_array().map(Vec::len), Some(2));
    put(&model, "/v1/kv/b", "x").await;
    assert_eq!(get(&model, "/v1/kv/a/?recurse").await.index, Some(c_index));
    assert_eq!(
        call(&model, "DELETE", "/v1/kv/a/c", Bytes::new())
            .await
            .json(),
        json!(true)
    );
    let after = get(&model, "/v1/kv/a/?recurse").await;
    assert!(after.index > Some(c_index + 1), "{:?}", after.index);
    assert_eq!(after.json().as_array().map(Vec::len), Some(1));

    // CAS deletes and writes.
    let b = entry(&model, "b").await["ModifyIndex"]
        .as_u64()
        .unwrap_or_default();
    let stale = call(
        &model,
        "DELETE",
        &format!("/v1/kv/b?cas={}", b - 1),
        Bytes::new(),
    )
    .await;
    assert_eq!(stale.json(), json!(false));
    let missing = call(&model, "DELETE", "/v1/kv/nothing?cas=7", Bytes::new()).await;
    assert_eq!(
        missing.json(),
        json!(true),
        "Consul answers true for a missing key"
    );
    assert_eq!(
        put(&model, "/v1/kv/b?cas=0", "y").await.json(),
        json!(false)
    );
    assert_eq!(
        put(&model, &format!("/v1/kv/b?cas={b}"), "y").await.json(),
        json!(true)
    );
    assert_eq!(
        put(&model, "/v1/kv/new?cas=0", "y").await.json(),
        json!(true)
    );

    let keys = get(&model, "/v1/kv/?keys&separator=/").await;
    assert_eq!(keys.json(), json!(["a/", "b", "new"]));
    assert_eq!(get(&model, "/v1/kv/none/?keys").await.status, 404);
}

#[tokio::test(start_paused = true)]
async fn locks_count_their_holders_and_session_behaviors_apply() {
    let model = model();
    let one = session(
        &model,
        json!({"Name": "one", "LockDelay": "0s", "TTL": "10s"}),
    )
    .await;
    let two = session(
        &model,
        json!({"Name": "two", "LockDelay": "1s", "Behavior": "release"}),
    )
    .await;

    let taken = txn(
        &model,
        json!([{"KV": {"Verb": "check-not-exists", "Key": "k/.lock"}}, lock_op("k", &one)]),
    )
    .await;
    assert_eq!(taken.status, 200, "{}", taken.text());
    let result = &taken.json()["Results"][0]["KV"];
    assert_eq!(result["LockIndex"], json!(1));
    assert_eq!(result["Session"], json!(one));
    assert_eq!(
        result["Value"],
        Value::Null,
        "a transaction blanks values out"
    );
    let index = result["ModifyIndex"].clone();

    // Taking it again with the same session changes nothing.
    let again = txn(&model, json!([lock_op("k", &one)])).await;
    assert_eq!(again.json()["Results"][0]["KV"]["ModifyIndex"], index);

    let refused = txn(&model, json!([lock_op("k", &two)])).await;
    assert_eq!(refused.status, 409);
    assert_eq!(
        refused.json()["Errors"][0]["What"],
        json!("failed to lock key \"k\", lock is already held")
    );

    // Released: the value emptied, the flags set, LockIndex kept; taken by another: it rises.
    let released = put(
        &model,
        &format!("/v1/kv/k?release={one}&flags={LEADER_FLAGS}"),
        "",
    )
    .await;
    assert_eq!(released.json(), json!(true));
    let k = entry(&model, "k").await;
    assert_eq!(
        (k["LockIndex"].clone(), k["Value"].clone()),
        (json!(1), Value::Null)
    );
    let taken = txn(&model, json!([lock_op("k", &two)])).await;
    assert_eq!(taken.json()["Results"][0]["KV"]["LockIndex"], json!(2));

    // Destroying the holder releases the key under its lock-delay (1 s).
    assert_eq!(
        put(&model, &format!("/v1/session/destroy/{two}"), "")
            .await
            .json(),
        json!(true)
    );
    let k = entry(&model, "k").await;
    assert!(k.get("Session").is_none(), "{k}");
    assert_eq!(k["LockIndex"], json!(2));
    let delayed = txn(&model, json!([lock_op("k", &one)])).await;
    assert_eq!(
        delayed.json()["Errors"],
        json!([{"OpIndex": 0, "What": "failed to lock key \"k\" due to lock delay"}])
    );
    assert_eq!(
        put(&model, &format!("/v1/kv/k?acquire={one}"), "")
            .await
            .json(),
        json!(false)
    );
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(txn(&model, json!([lock_op("k", &one)])).await.status, 200);

    // A delete-behavior session's keys go with it.
    let three = session(
        &model,
        json!({"Name": "three", "Behavior": "delete", "LockDelay": "0ms"}),
    )
    .await;
    assert_eq!(
        txn(&model, json!([lock_op("s/three", &three)]))
            .await
            .status,
        200
    );
    assert!(model.destroy_session(&three));
    assert_eq!(get(&model, "/v1/kv/s/three").await.status, 404);
    assert!(!model.destroy_session(&three));
}

#[tokio::test(start_paused = true)]
async fn a_failed_transaction_changes_nothing_and_names_every_failure() {
    let model = model();
    put(&model, "/v1/kv/t/a", "1").await;
    let before = model.keys();
    let index = before.first().map(|e| e.modify_index).unwrap_or_default();
    let answer = txn(
        &model,
        json!([
            {"KV": {"Verb": "delete", "Key": "t/a"}},
            {"KV": {"Verb": "cas", "Key": "t/b", "Value": b64("x"), "Index": 0}},
            {"KV": {"Verb": "check-index", "Key": "t/c", "Index": 3}},
            {"KV": {"Verb": "lock", "Key": "t/d", "Session": "00000000-0000-0000-0000-000000000000"}},
            {"KV": {"Verb": "lock", "Key": "t/d", "Session": "nope"}},
            {"KV": {"Verb": "unlock", "Key": "t/b", "Session": "nope"}},
        ]),
    )
    .await;
    assert_eq!(answer.status, 409);
    assert_eq!(answer.json()["Results"], Value::Null);
    let whats: Vec<Value> = answer.json()["Errors"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        whats,
        vec![
            json!({"OpIndex": 2, "What": "failed to check index, key \"t/c\" doesn't exist"}),
            json!({"OpIndex": 3, "What": "invalid session \"00000000-0000-0000-0000-000000000000\""}),
            json!({"OpIndex": 4, "What": "failed session lookup: index error: UUID must be 36 characters"}),
            json!({"OpIndex": 5, "What": "failed to unlock key \"t/b\", lock isn't held, or is held by another session"}),
        ],
        "every operation runs, each on the state the ones before it left"
    );
    assert_eq!(model.keys(), before, "rolled back");
    assert_eq!(get(&model, "/v1/kv/t/?recurse").await.index, Some(index));

    let read_only = txn(
        &model,
        json!([{"KV": {"Verb": "check-not-exists", "Key": "t/x"}}]),
    )
    .await;
    assert_eq!(read_only.status, 200);
    assert_eq!(read_only.json()["KnownLeader"], json!(true));
    assert_eq!(read_only.json()["Results"], json!([]));
    let too_many: Vec<Value> = (0..65)
        .map(|i| json!({"KV": {"Verb": "get", "Key": format!("k{i}")}}))
        .collect();
    assert_eq!(txn(&model, Value::Array(too_many)).await.status, 413);
    assert_eq!(put(&model, "/v1/txn", "[{\"KV\":").await.status, 400);
}

#[tokio::test(start_paused = true)]
async fn a_session_ttl_expires_at_ttl_times_the_multiplier_after_its_last_renewal() {
    let model = Model::new(Config::new(1).ttl_multiplier(1.5));
    model.start();
    let id = session(
        &model,
        json!({"Name": "t", "TTL": "10s", "LockDelay": "0s"}),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(14)).await;
    assert_eq!(
        put(&model, &format!("/v1/session/renew/{id}"), "")
            .await
            .status,
        200
    );
    let renewed = Instant::now();
    tokio::time::sleep_until(renewed + Duration::from_millis(14_999)).await;
    assert_eq!(model.sessions().len(), 1, "invalidated before TTL × 1.5");
    tokio::time::sleep_until(renewed + Duration::from_secs(15)).await;
    tokio::task::yield_now().await;
    assert!(model.sessions().is_empty(), "still valid at TTL × 1.5");
    let renew = put(&model, &format!("/v1/session/renew/{id}"), "").await;
    assert_eq!(
        (renew.status, renew.text()),
        (404, format!("Session id '{id}' not found"))
    );
    let info = get(&model, &format!("/v1/session/info/{id}")).await;
    assert_eq!(info.json(), json!([]));

    // A new leader restarts every timer from its election.
    let id = session(&model, json!({"Name": "t", "TTL": "10s"})).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    model.restart();
    tokio::time::sleep(Duration::from_secs(14)).await;
    assert_eq!(
        model.sessions().len(),
        1,
        "the restart did not reset the timer"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(model.sessions().iter().all(|s| s.id != id));
}

#[tokio::test(start_paused = true)]
async fn a_check_turning_critical_invalidates_its_sessions_and_is_reaped() {
    let model = model();
    model.start();
    let register = json!({"ID": "lease-1", "Name": "lease", "Check": {
        "CheckID": "lease-1", "Name": "alive", "TTL": "10s", "Status": "passing",
        "DeregisterCriticalServiceAfter": "60s"}});
    let registered = put(&model, "/v1/agent/service/register", register.to_string()).await;
    assert_eq!(registered.status, 200, "{}", registered.text());
    let tied = json!({"Name": "s", "LockDelay": "0ms", "Behavior": "release",
        "NodeChecks": ["serfHealth"], "ServiceChecks": [{"ID": "lease-1"}]});
    let id = session(&model, tied.clone()).await;
    let info = get(&model, &format!("/v1/session/info/{id}")).await.json();
    assert_eq!(
        info[0]["ServiceChecks"],
        json!([{"ID": "lease-1", "Namespace": ""}])
    );
    assert_eq!(info[0]["NodeChecks"], json!(["serfHealth"]));
    assert_eq!(info[0]["TTL"], json!(""));
    assert_eq!(txn(&model, json!([lock_op("held", &id)])).await.status, 200);

    tokio::time::sleep(Duration::from_secs(9)).await;
    assert_eq!(
        put(&model, "/v1/agent/check/pass/lease-1", "").await.status,
        200
    );
    tokio::time::sleep(Duration::from_millis(9_999)).await;
    assert_eq!(model.sessions().len(), 1);
    tokio::time::sleep(Duration::from_millis(1)).await;
    tokio::task::yield_now().await;
    assert!(
        model.sessions().is_empty(),
        "the check's expiry left its session"
    );
    assert!(entry(&model, "held").await.get("Session").is_none());
    let refused = put(&model, "/v1/session/create", tied.to_string()).await;
    assert_eq!(
        (refused.status, refused.text()),
        (500, "Check 'lease-1' is in critical state".to_owned())
    );

    // Passing again revives the check, not its sessions.
    assert_eq!(
        put(&model, "/v1/agent/check/pass/lease-1", "").await.status,
        200
    );
    let id = session(&model, tied.clone()).await;
    // Deregistering invalidates what is tied to the check.
    assert_eq!(
        put(&model, "/v1/agent/service/deregister/lease-1", "")
            .await
            .status,
        200
    );
    assert!(model.sessions().iter().all(|s| s.id != id));
    let gone = put(&model, "/v1/agent/check/pass/lease-1", "").await;
    assert_eq!(
        (gone.status, gone.text()),
        (
            500,
            "CheckID \"lease-1\" does not have associated TTL".to_owned()
        )
    );
    let missing = put(&model, "/v1/session/create", tied.to_string()).await;
    assert_eq!(missing.text(), "Missing check 'lease-1' registration");

    // A critical check is reaped at the first reap tick (every 30 s) a minute after it turned.
    put(&model, "/v1/agent/service/register", register.to_string()).await;
    let start = Instant::now();
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(model.checks().len(), 1);
    tokio::time::sleep(Duration::from_secs(60)).await;
    let critical_for = start.elapsed();
    tokio::time::sleep(Duration::from_secs(31)).await;
    assert!(
        model.checks().is_empty(),
        "not reaped {critical_for:?} after registration"
    );
}

#[tokio::test(start_paused = true)]
async fn sessions_are_validated_as_consul_validates_them() {
    let model = model();
    let cases = [
        (
            json!({"TTL": "5s"}),
            "Invalid Session TTL '5000000000', must be between [10s=24h0m0s]",
        ),
        (
            json!({"TTL": "bogus"}),
            "Session TTL 'bogus' invalid: time: invalid duration \"bogus\"",
        ),
        (json!({"Behavior": "x"}), "Invalid Behavior setting 'x'"),
        (
            json!({"NodeChecks": ["nope"]}),
            "Missing check 'nope' registration",
        ),
        (json!({"Node": "other"}), "Missing node registration"),
    ];
    for (body, error) in cases {
        let answer = put(&model, "/v1/session/create", body.to_string()).await;
        assert_eq!(
            (answer.status, answer.text()),
            (500, error.to_owned()),
            "{body}"
        );
    }
    let bad = put(&model, "/v1/session/create", "{\"Name\":").await;
    assert_eq!(bad.status, 400);
    assert!(
        bad.text().starts_with("Request decode failed: "),
        "{}",
        bad.text()
    );
    let id = session(&model, json!({"LockDelay": 5})).await;
    let info = get(&model, &format!("/v1/session/info/{id}")).await.json();
    assert_eq!(
        info[0]["LockDelay"],
        json!(5_000_000_000_u64),
        "a small number is seconds"
    );
    assert_eq!(info[0]["Behavior"], json!("release"));
    let garbage = get(&model, "/v1/session/info/garbage").await;
    assert_eq!(
        (garbage.status, garbage.index, garbage.text()),
        (
            500,
            Some(1),
            "failed session lookup: index error: UUID must be 36 characters".to_owned()
        )
    );
    assert_eq!(
        put(&model, "/v1/session/destroy/garbage", "").await.status,
        500
    );
    let unknown = "00000000-0000-0000-0000-000000000000";
    assert_eq!(
        put(&model, &format!("/v1/session/destroy/{unknown}"), "")
            .await
            .json(),
        json!(true)
    );
    let list = get(&model, "/v1/session/list").await.json();
    assert_eq!(list.as_array().map(Vec::len), Some(1));
}

#[tokio::test(start_paused = true)]
async fn a_blocking_query_answers_on_a_change_under_its_prefix_or_after_its_wait() {
    let model = model();
    put(&model, "/v1/kv/w/a", "1").await;
    let index = get(&model, "/v1/kv/w/?recurse")
        .await
        .index
        .unwrap_or_default();

    // Nothing changes under the prefix: answered after the wait and under a sixteenth more.
    let started = Instant::now();
    let blocked = get(
        &model,
        &format!("/v1/kv/w/?recurse&index={index}&wait=1600ms"),
    )
    .await;
    let took = started.elapsed();
    assert_eq!(blocked.index, Some(index));
    assert!(
        took >= Duration::from_millis(1600) && took < Duration::from_millis(1700),
        "{took:?}"
    );

    // A write elsewhere does not answer it; one under the prefix does, at once.
    let watcher = {
        let model = model.clone();
        tokio::spawn(async move {
            let at = Instant::now();
            let answer = get(&model, &format!("/v1/kv/w/?recurse&index={index}&wait=30s")).await;
            (at.elapsed(), answer.index, answer.json())
        })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    put(&model, "/v1/kv/elsewhere", "x").await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    put(&model, "/v1/kv/w/b", "2").await;
    let Ok((took, new_index, entries)) = watcher.await else {
        panic!("the watcher panicked");
    };
    assert_eq!(took, Duration::from_secs(2));
    assert!(new_index > Some(index));
    assert_eq!(entries.as_array().map(Vec::len), Some(2));

    // An index from the future waits it out; 0 never blocks.
    let started = Instant::now();
    get(&model, "/v1/kv/w/?recurse&index=999999&wait=100ms").await;
    assert!(started.elapsed() >= Duration::from_millis(100));
    let started = Instant::now();
    get(&model, "/v1/kv/w/?recurse&index=0&wait=100ms").await;
    assert_eq!(started.elapsed(), Duration::ZERO);
    assert_eq!(
        get(&model, "/v1/kv/w/?recurse&index=x").await.text(),
        "Invalid index"
    );
    assert_eq!(
        get(&model, "/v1/kv/w/?recurse&index=1&wait=x").await.text(),
        "Invalid wait time"
    );
}

#[tokio::test(start_paused = true)]
async fn the_same_seed_gives_the_same_ids_and_the_same_jitter() {
    async fn run(seed: u64) -> (Vec<String>, Duration) {
        let model = Model::new(Config::new(seed));
        let ids = vec![
            session(&model, json!({"Name": "a"})).await,
            session(&model, json!({"Name": "b"})).await,
        ];
        put(&model, "/v1/kv/j", "1").await;
        let index = get(&model, "/v1/kv/j").await.index.unwrap_or_default();
        let started = Instant::now();
        get(&model, &format!("/v1/kv/j?index={index}&wait=16s")).await;
        (ids, started.elapsed())
    }
    let (ids, jitter) = run(5).await;
    assert_eq!(run(5).await, (ids.clone(), jitter));
    let (other_ids, other_jitter) = run(6).await;
    assert_ne!(ids, other_ids);
    assert_ne!(jitter, other_jitter);
}

#[tokio::test(start_paused = true)]
async fn without_a_leader_the_servers_answer_no_cluster_leader() {
    let model = model();
    model.start();
    let id = session(&model, json!({"Name": "t", "TTL": "10s"})).await;
    model.lose_leader();
    assert_eq!(get(&model, "/v1/status/leader").await.json(), json!(""));
    for (method, uri, body) in [
        ("GET", "/v1/kv/x".to_owned(), ""),
        ("PUT", "/v1/kv/x".to_owned(), ""),
        ("PUT", "/v1/txn".to_owned(), "[]"),
        ("PUT", format!("/v1/session/renew/{id}"), ""),
        ("PUT", "/v1/session/create".to_owned(), "{}"),
    ] {
        let answer = call(&model, method, &uri, body).await;
        assert_eq!(
            (answer.status, answer.text()),
            (500, "No cluster leader".to_owned()),
            "{uri}"
        );
    }
    // No timer runs without a leader; the new one starts them from its election.
    tokio::time::sleep(Duration::from_secs(60)).await;
    model.elect_leader();
    assert_eq!(model.sessions().len(), 1);
    tokio::time::sleep(Duration::from_secs(19)).await;
    assert_eq!(model.sessions().len(), 1);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(model.sessions().is_empty());
    assert_eq!(
        get(&model, "/v1/status/leader").await.json(),
        json!("127.0.0.1:8300")
    );
}

#[tokio::test(start_paused = true)]
async fn bad_requests_are_refused_as_consul_refuses_them() {
    let model = model();
    let cases = [
        (
            "GET",
            "/v1/kv/a?ns=x",
            400,
            "Bad request: Invalid query parameter: \"ns\" - Namespaces are a Consul Enterprise feature",
        ),
        ("GET", "/v1/kv/a?dc=dc2", 500, "No path to datacenter"),
        ("GET", "/v1/kv/", 400, "Missing key name"),
        ("PUT", "/v1/kv/", 400, "Missing key name"),
        (
            "PUT",
            "/v1/kv/a?cas=1&acquire=x",
            400,
            "Conflicting flags: acquire=x&cas=1\n",
        ),
        (
            "PUT",
            "/v1/kv/a?flags=x",
            500,
            "strconv.ParseUint: parsing \"x\": invalid syntax",
        ),
        ("PUT", "/v1/kv/a?acquire=", 500, "missing session"),
        (
            "PUT",
            "/v1/kv/a?acquire=nope",
            500,
            "failed session lookup: index error: UUID must be 36 characters",
        ),
        ("PUT", "/v1/session/renew/", 400, "Missing session"),
        (
            "GET",
            "/v1/kv/a?stale&consistent",
            400,
            "Cannot specify ?stale with ?consistent, conflicting semantics.",
        ),
    ];
    for (method, uri, status, text) in cases {
        let answer = call(&model, method, uri, Bytes::new()).await;
        assert_eq!(
            (answer.status, answer.text().as_str()),
            (status, text),
            "{method} {uri}"
        );
    }
    assert_eq!(
        put(&model, "/v1/kv/a?release=nope", "").await.json(),
        json!(false)
    );
    // Nothing a client sends makes the model panic.
    let bodies: [&[u8]; 6] = [
        b"",
        b"null",
        b"[]",
        b"{}",
        b"[{\"KV\":{\"Verb\":7}}]",
        &[0xff, 0x00, 0x7b],
    ];
    for body in bodies {
        for uri in [
            "/v1/txn",
            "/v1/session/create",
            "/v1/agent/service/register",
            "/v1/kv/x?cas=99999999999999999999",
        ] {
            let answer = put(&model, uri, Bytes::copy_from_slice(body)).await;
            assert!(answer.status < 600);
        }
    }
}
