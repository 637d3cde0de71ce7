//! The differential test of the Consul model: seeded sequences of exactly the calls lease-consul
//! makes, with the arguments it makes them with (and an operator's actions beside them), sent
//! to the model and to a real Consul 1.8.7 dev agent, every answer compared.
//!
//! An answer is its status, its body (JSON compared as values; text as text), and the headers the
//! client reads or that tell the endpoint's path (`X-Consul-Index`, `Content-Type`,
//! `X-Consul-Knownleader`, `X-Consul-Lastcontact`). Consul's indexes and session IDs differ
//! between the two by nature, so each real one is mapped to the model's by order of appearance:
//! the same real index must always meet the same model index, and the two must rise together;
//! the same for session IDs, wherever they appear (IDs, keys, values, error texts). The leader's
//! address is compared for being there only. Listings whose order follows session IDs are
//! compared in the model's order.
//!
//! Timing: blocking queries are compared for their answer and for answering within
//! `[wait, wait + wait/16]` (plus slack) when nothing changes, and at once when a write under
//! the prefix comes; a few sequences let an agent check's 1 s TTL run out, or a 500 ms lock-delay,
//! and compare what follows. Not compared: session TTL expiry (Consul's minimum TTL is 10 s and
//! it expires at twice that), the reaping of critical checks (a minute at least), and blocking
//! queries on a prefix that never had a key (Consul answers those when its radix tree's watch
//! fires, which depends on unrelated keys; the model answers on any write, which the client
//! treats alike).
//!
//! Every disagreement is a bug in the model. One fails the test with the seed, the sequence, the
//! step, the request (as sent to each) and both answers. `LEASE_SIM_DIFF_SEED` and
//! `LEASE_SIM_DIFF_SEQUENCES` replay or widen a run; `LEASE_SIM_DIFF_ALL=1` reports every
//! sequence's first disagreement instead of stopping at the first.

mod support;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use base64::Engine as _;
use lease_sim::consul::{Config, Model};
use serde_json::{Value, json};
use tokio::time::Instant;

const LEADER_FLAGS: u64 = 0x2ddc_cbc0_58a5_0c18;
const SEMAPHORE_FLAGS: u64 = 0xe0f6_9a2b_aa41_4de0;
const DEFAULT_SEED: u64 = 0x35_c0_45_01;
const DEFAULT_SEQUENCES: usize = 160;
/// An ID no session has (the same on both sides).
const UNKNOWN_SESSION: &str = "00000000-0000-4000-8000-000000000035";
/// Slack for a blocking query's answer time on a loaded machine.
const SLACK: Duration = Duration::from_millis(250);
/// The wait of a blocking query a write is to answer (sent 30 ms into it).
const WATCH_WRITE_WAIT: Duration = Duration::from_millis(800);

// ---- A seeded generator ----

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> Option<&'a T> {
        (!items.is_empty()).then(|| &items[self.below(items.len())])
    }
}

// ---- Operations, in the model's terms ----

/// A session an operation names.
#[derive(Clone, Debug)]
enum Sess {
    /// One this sequence created (by the model's ID).
    Known(String),
    /// A well-formed ID no session has.
    Unknown,
    /// Not a UUID at all.
    Garbage,
}

/// A Raft index an operation names.
#[derive(Clone, Debug)]
enum Idx {
    Zero,
    /// The key's ModifyIndex as the model has it now (scripts only; resolved before sending).
    Current(String),
    /// One the model answered (mapped to the real one the agent answered with it).
    Model(u64),
}

/// A key: fixed, or a semaphore contender's (`<prefix>sem/<session>`).
#[derive(Clone, Debug)]
enum Key {
    Fixed(String),
    Contender(String, Sess),
}

#[derive(Clone, Debug)]
enum Val {
    Bytes(Vec<u8>),
    /// A semaphore's `.lock`: `{"Limit":n,"Holders":{...}}`.
    SemLock(u32, Vec<Sess>),
}

#[derive(Clone, Debug)]
enum TxnOp {
    Lock(Key, Sess, Val, u64),
    Unlock(Key, Sess, u64),
    Cas(Key, Val, u64, Idx),
    Delete(Key),
    CheckNotExists(Key),
    CheckIndex(Key, Idx),
}

#[derive(Clone, Debug)]
enum Life {
    Ttl(u64),
    Check(String),
}

#[derive(Clone, Debug)]
enum Op {
    StatusLeader,
    RegisterCheck {
        id: String,
        ttl_s: u64,
    },
    PassCheck(String),
    Deregister(String),
    SessionCreate {
        name: String,
        life: Life,
        lock_delay_ms: u64,
        behavior: &'static str,
        node_checks: Option<Vec<String>>,
    },
    SessionRenew(Sess),
    SessionInfo(Sess),
    SessionDestroy(Sess),
    SessionList,
    KvGet(Key),
    KvList(String),
    KvKeys(String),
    KvWatch {
        prefix: String,
        index: Idx,
        wait_ms: u64,
    },
    KvRelease {
        key: Key,
        session: Sess,
        flags: Option<u64>,
    },
    KvDelete {
        key: Key,
        cas: Option<Idx>,
        recurse: bool,
    },
    KvPut {
        key: Key,
        value: Vec<u8>,
        flags: u64,
        cas: Option<Idx>,
        acquire: Option<Sess>,
    },
    Txn(Vec<TxnOp>),
    Sleep(u64),
    /// The session's end (its check's TTL ran out), awaited on each side by polling its info,
    /// within [`SESSION_END_BOUND`]: how soon a Consul agent on a loaded machine syncs a critical
    /// check to its server is not a figure a sleep can rely on (1.6 s after a 1 s TTL was not).
    AwaitSessionEnd(Sess),
    /// A blocking query answered by a write under its prefix while it waits.
    WatchThenWrite {
        prefix: String,
        index: Idx,
        write: Box<Op>,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    Real,
    Model,
}

/// The mapping of real indexes and IDs to the model's, learnt by order of appearance.
#[derive(Default)]
struct Names {
    index_r2m: BTreeMap<u64, u64>,
    index_m2r: BTreeMap<u64, u64>,
    id_r2m: BTreeMap<String, String>,
    id_m2r: BTreeMap<String, String>,
    /// Every model index seen, for operations to name.
    seen: Vec<u64>,
    /// What the client's settings add to every URL (`dc=`, `ns=`), first, as its `url()` does.
    client_query: String,
    problems: Vec<String>,
}

impl Names {
    /// Pairs a real index with the model's at the same place of an answer; returns what the
    /// real one reads as in the model's terms.
    fn index(&mut self, real: u64, model: u64) -> u64 {
        if let Some(mapped) = self.index_r2m.get(&real) {
            if *mapped != model {
                self.problems.push(format!(
                    "real index {real} met model index {model}, but met {mapped} before"
                ));
            }
            return *mapped;
        }
        if let Some(other) = self.index_m2r.get(&model) {
            self.problems.push(format!(
                "model index {model} met real index {real}, but met {other} before"
            ));
            return model;
        }
        let below = self.index_r2m.range(..real).next_back().map(|(_, m)| *m);
        let above = self.index_r2m.range(real..).next().map(|(_, m)| *m);
        if below.is_some_and(|b| b >= model) || above.is_some_and(|a| a <= model) {
            self.problems.push(format!(
                "real index {real} and model index {model} do not rise together with the \
                 indexes seen before (model {below:?} below, {above:?} above)"
            ));
        }
        self.index_r2m.insert(real, model);
        self.index_m2r.insert(model, real);
        self.seen.push(model);
        model
    }

    fn id(&mut self, real: &str, model: &str) {
        if self.id_r2m.get(real).is_some_and(|m| m != model)
            || self.id_m2r.get(model).is_some_and(|r| r != real)
        {
            self.problems.push(format!(
                "session {real} met {model}, but met another before"
            ));
            return;
        }
        self.id_r2m.insert(real.to_owned(), model.to_owned());
        self.id_m2r.insert(model.to_owned(), real.to_owned());
    }

    /// A real string in the model's terms: every known real session ID replaced.
    fn text(&self, real: &str) -> String {
        if !real.contains('-') {
            return real.to_owned();
        }
        let mut out = real.to_owned();
        for (r, m) in &self.id_r2m {
            if out.contains(r.as_str()) {
                out = out.replace(r.as_str(), m);
            }
        }
        out
    }

    fn session(&self, side: Side, session: &Sess) -> String {
        match session {
            Sess::Known(id) if side == Side::Real => {
                self.id_m2r.get(id).cloned().unwrap_or_else(|| id.clone())
            }
            Sess::Known(id) => id.clone(),
            Sess::Unknown => UNKNOWN_SESSION.to_owned(),
            Sess::Garbage => "not-a-session".to_owned(),
        }
    }

    fn idx(&self, side: Side, index: &Idx) -> u64 {
        match *index {
            Idx::Zero | Idx::Current(_) => 0,
            Idx::Model(m) if side == Side::Real => self.index_m2r.get(&m).copied().unwrap_or(m),
            Idx::Model(m) => m,
        }
    }

    fn key(&self, side: Side, key: &Key) -> String {
        match key {
            Key::Fixed(key) => key.clone(),
            Key::Contender(prefix, session) => format!("{prefix}{}", self.session(side, session)),
        }
    }

    fn value(&self, side: Side, value: &Val) -> Vec<u8> {
        match value {
            Val::Bytes(bytes) => bytes.clone(),
            Val::SemLock(limit, holders) => {
                let holders: serde_json::Map<String, Value> = holders
                    .iter()
                    .map(|h| (self.session(side, h), Value::Bool(true)))
                    .collect();
                serde_json::to_vec(&json!({"Limit": limit, "Holders": holders})).unwrap_or_default()
            }
        }
    }
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// A request as sent to one side.
#[derive(Clone, Debug)]
struct Request {
    method: reqwest::Method,
    path: String,
    body: Option<Vec<u8>>,
}

impl Request {
    fn new(method: reqwest::Method, path: impl Into<String>) -> Request {
        Request {
            method,
            path: path.into(),
            body: None,
        }
    }

    fn body(mut self, body: Vec<u8>) -> Request {
        self.body = Some(body);
        self
    }

    fn json(self, body: &Value) -> Request {
        self.body(serde_json::to_vec(body).unwrap_or_default())
    }
}

/// The request `op` makes on `side` (none for a sleep or a compound operation), with the
/// client's `dc=` and `ns=`, if set, first in its query.
fn render(op: &Op, side: Side, names: &Names) -> Option<Request> {
    let mut request = render_call(op, side, names)?;
    if !names.client_query.is_empty() {
        request.path = match request.path.split_once('?') {
            Some((path, query)) => format!("{path}?{}&{query}", names.client_query),
            None => format!("{}?{}", request.path, names.client_query),
        };
    }
    Some(request)
}

/// `/v1/<segments>`, each segment percent-encoded as the client's `url()` encodes it.
fn client_path<'a>(segments: impl IntoIterator<Item = &'a str>) -> String {
    let mut url = reqwest::Url::parse("http://agent/").expect("a valid URL");
    if let Ok(mut path) = url.path_segments_mut() {
        path.clear().push("v1").extend(segments);
    }
    url.path().to_owned()
}

fn render_call(op: &Op, side: Side, names: &Names) -> Option<Request> {
    use reqwest::Method;
    let kv = |key: &str| client_path(std::iter::once("kv").chain(key.split('/')));
    Some(match op {
        Op::StatusLeader => Request::new(Method::GET, "/v1/status/leader"),
        Op::RegisterCheck { id, ttl_s } => Request::new(Method::PUT, "/v1/agent/service/register")
            .json(&json!({
                "ID": id,
                "Name": "lease",
                "Check": {
                    "CheckID": id,
                    "Name": "lease holder process alive",
                    "TTL": format!("{ttl_s}s"),
                    "Status": "passing",
                    "DeregisterCriticalServiceAfter": "60s",
                },
            })),
        Op::PassCheck(id) => Request::new(Method::PUT, format!("/v1/agent/check/pass/{id}")),
        Op::Deregister(id) => {
            Request::new(Method::PUT, format!("/v1/agent/service/deregister/{id}"))
        }
        Op::SessionCreate {
            name,
            life,
            lock_delay_ms,
            behavior,
            node_checks,
        } => {
            let mut body = json!({
                "Name": name,
                "LockDelay": format!("{lock_delay_ms}ms"),
                "Behavior": behavior,
            });
            match life {
                Life::Ttl(ttl) => {
                    body["TTL"] = json!(format!("{ttl}s"));
                    if let Some(checks) = node_checks {
                        body["NodeChecks"] = json!(checks);
                    }
                }
                Life::Check(check) => {
                    body["NodeChecks"] = match node_checks {
                        Some(checks) => json!(checks),
                        None => json!(["serfHealth"]),
                    };
                    body["ServiceChecks"] = json!([{ "ID": check }]);
                }
            }
            Request::new(Method::PUT, "/v1/session/create").json(&body)
        }
        Op::SessionRenew(s) => Request::new(
            Method::PUT,
            format!("/v1/session/renew/{}", names.session(side, s)),
        ),
        Op::SessionInfo(s) => Request::new(
            Method::GET,
            format!("/v1/session/info/{}?consistent", names.session(side, s)),
        ),
        Op::SessionDestroy(s) => Request::new(
            Method::PUT,
            format!("/v1/session/destroy/{}", names.session(side, s)),
        ),
        Op::SessionList => Request::new(Method::GET, "/v1/session/list?consistent"),
        Op::KvGet(key) => Request::new(
            Method::GET,
            format!("{}?consistent", kv(&names.key(side, key))),
        ),
        Op::KvList(prefix) => {
            Request::new(Method::GET, format!("{}?recurse&consistent", kv(prefix)))
        }
        Op::KvKeys(prefix) => Request::new(Method::GET, format!("{}?keys&consistent", kv(prefix))),
        Op::KvWatch {
            prefix,
            index,
            wait_ms,
        } => Request::new(
            Method::GET,
            format!(
                "{}?recurse&index={}&wait={wait_ms}ms",
                kv(prefix),
                names.idx(side, index)
            ),
        ),
        Op::KvRelease {
            key,
            session,
            flags,
        } => {
            let mut path = format!(
                "{}?release={}",
                kv(&names.key(side, key)),
                names.session(side, session)
            );
            if let Some(flags) = flags {
                let _ = write!(path, "&flags={flags}");
            }
            Request::new(Method::PUT, path).body(Vec::new())
        }
        Op::KvDelete { key, cas, recurse } => {
            let mut path = kv(&names.key(side, key));
            if *recurse {
                path.push_str("?recurse");
            } else if let Some(cas) = cas {
                let _ = write!(path, "?cas={}", names.idx(side, cas));
            }
            Request::new(Method::DELETE, path)
        }
        Op::KvPut {
            key,
            value,
            flags,
            cas,
            acquire,
        } => {
            let mut path = format!("{}?flags={flags}", kv(&names.key(side, key)));
            if let Some(cas) = cas {
                let _ = write!(path, "&cas={}", names.idx(side, cas));
            }
            if let Some(session) = acquire {
                let _ = write!(path, "&acquire={}", names.session(side, session));
            }
            Request::new(Method::PUT, path).body(value.clone())
        }
        Op::Txn(ops) => {
            let body: Vec<Value> = ops
                .iter()
                .map(|op| {
                    let kv = match op {
                        TxnOp::Lock(key, s, value, flags) => json!({
                            "Verb": "lock", "Key": names.key(side, key),
                            "Session": names.session(side, s),
                            "Value": b64(&names.value(side, value)), "Flags": flags,
                        }),
                        TxnOp::Unlock(key, s, flags) => json!({
                            "Verb": "unlock", "Key": names.key(side, key),
                            "Session": names.session(side, s), "Flags": flags,
                        }),
                        TxnOp::Cas(key, value, flags, index) => json!({
                            "Verb": "cas", "Key": names.key(side, key),
                            "Value": b64(&names.value(side, value)), "Flags": flags,
                            "Index": names.idx(side, index),
                        }),
                        TxnOp::Delete(key) => {
                            json!({"Verb": "delete", "Key": names.key(side, key)})
                        }
                        TxnOp::CheckNotExists(key) => {
                            json!({"Verb": "check-not-exists", "Key": names.key(side, key)})
                        }
                        TxnOp::CheckIndex(key, index) => json!({
                            "Verb": "check-index", "Key": names.key(side, key),
                            "Index": names.idx(side, index),
                        }),
                    };
                    json!({ "KV": kv })
                })
                .collect();
            Request::new(Method::PUT, "/v1/txn").json(&Value::Array(body))
        }
        Op::Sleep(_) | Op::AwaitSessionEnd(_) | Op::WatchThenWrite { .. } => return None,
    })
}

// ---- Answers ----

#[derive(Clone, Debug)]
struct Answer {
    status: u16,
    headers: BTreeMap<&'static str, String>,
    body: Vec<u8>,
    took: Duration,
}

impl Answer {
    /// What an operation that sends no request of its own answers (a sleep, a wait).
    fn none() -> Answer {
        Answer {
            status: 0,
            headers: BTreeMap::new(),
            body: Vec::new(),
            took: Duration::ZERO,
        }
    }

    fn json(&self) -> Option<Value> {
        serde_json::from_slice(&self.body).ok()
    }

    fn show(&self) -> String {
        format!(
            "{} {:?} {}",
            self.status,
            self.headers,
            String::from_utf8_lossy(&self.body)
        )
    }
}

/// How long a session whose check's TTL ran out may take to end, on either side.
const SESSION_END_BOUND: Duration = Duration::from_secs(30);

/// Polls a session's info until it answers that the session is gone; its last answer, or none
/// within [`SESSION_END_BOUND`].
async fn await_session_end(http: &reqwest::Client, base: &str, info: &Request) -> Option<Answer> {
    let deadline = Instant::now() + SESSION_END_BOUND;
    loop {
        let answer = send(http, base, info).await;
        let gone = answer.status == 200
            && answer
                .json()
                .is_some_and(|v| v.is_null() || v.as_array().is_some_and(Vec::is_empty));
        if gone {
            return Some(answer);
        }
        if Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn send(http: &reqwest::Client, base: &str, request: &Request) -> Answer {
    let mut builder = http.request(request.method.clone(), format!("{base}{}", request.path));
    if let Some(body) = &request.body {
        builder = builder.body(body.clone());
    }
    let started = Instant::now();
    let response = builder.send().await.expect("the server answers");
    let status = response.status().as_u16();
    let mut headers = BTreeMap::new();
    for name in [
        "X-Consul-Index",
        "Content-Type",
        "X-Consul-Knownleader",
        "X-Consul-Lastcontact",
    ] {
        if let Some(value) = response.headers().get(name) {
            headers.insert(name, value.to_str().unwrap_or("<not text>").to_owned());
        }
    }
    let body = response.bytes().await.expect("a whole body").to_vec();
    Answer {
        status,
        headers,
        body,
        took: started.elapsed(),
    }
}

/// The key an element of a listing is ordered by.
fn identity(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o
            .get("Key")
            .or_else(|| o.get("ID"))
            .and_then(Value::as_str)
            .map(str::to_owned),
        _ => None,
    }
}

const INDEX_FIELDS: [&str; 3] = ["CreateIndex", "ModifyIndex", "Index"];

/// `real` rewritten in the model's terms, pairing its indexes with `model`'s at the same places.
fn unify(names: &mut Names, real: &Value, model: &Value, field: Option<&str>) -> Value {
    match (real, model) {
        (Value::Number(r), Value::Number(m))
            if field.is_some_and(|f| INDEX_FIELDS.contains(&f)) =>
        {
            match (r.as_u64(), m.as_u64()) {
                (Some(r), Some(m)) => json!(names.index(r, m)),
                _ => real.clone(),
            }
        }
        (Value::String(r), Value::String(_)) if field == Some("Value") => {
            let decode = |s: &str| base64::engine::general_purpose::STANDARD.decode(s).ok();
            match decode(r).map(|bytes| String::from_utf8(bytes).map(|s| names.text(&s))) {
                Some(Ok(text)) => json!(b64(text.as_bytes())),
                _ => real.clone(),
            }
        }
        (Value::String(r), Value::String(m)) => json!(unify_text(names, r, m)),
        (Value::Array(r), Value::Array(m)) => {
            let mut r: Vec<Value> = r.clone();
            let mut m: Vec<Value> = m.clone();
            let listing = r.iter().chain(&m).all(|v| identity(v).is_some()) && field.is_none();
            if listing {
                r.sort_by_key(|v| identity(v).map(|id| names.text(&id)));
                m.sort_by_key(identity);
            }
            let unified: Vec<Value> = r
                .iter()
                .enumerate()
                .map(|(i, rv)| match m.get(i) {
                    Some(mv) => unify(names, rv, mv, None),
                    None => unify(names, rv, &Value::Null, None),
                })
                .collect();
            if listing {
                // Compare against the model's sorted too.
                return json!({ "sorted": unified, "as": m });
            }
            Value::Array(unified)
        }
        (Value::Object(r), Value::Object(m)) => Value::Object(
            r.iter()
                .map(|(k, rv)| {
                    let mv = m.get(k).unwrap_or(&Value::Null);
                    (k.clone(), unify(names, rv, mv, Some(k)))
                })
                .collect(),
        ),
        (Value::String(r), _) => json!(names.text(r)),
        (Value::Object(_) | Value::Array(_), _) => {
            let mut copy = real.clone();
            translate_all(names, &mut copy);
            copy
        }
        _ => real.clone(),
    }
}

/// `value` with every `Value` field that holds base64 JSON (a semaphore's `.lock`) re-encoded
/// with its object keys in order, so that the two sides' holders compare by content.
fn canonical(mut value: Value) -> Value {
    fn walk(value: &mut Value, field: Option<&str>) {
        match value {
            Value::String(s) if field == Some("Value") => {
                let decoded = base64::engine::general_purpose::STANDARD.decode(s.as_bytes());
                if let Some(json) = decoded
                    .ok()
                    .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
                {
                    *s = b64(&serde_json::to_vec(&json).unwrap_or_default());
                }
            }
            Value::Array(items) => items.iter_mut().for_each(|v| walk(v, None)),
            Value::Object(o) => o.iter_mut().for_each(|(k, v)| walk(v, Some(k))),
            _ => {}
        }
    }
    walk(&mut value, None);
    value
}

fn translate_all(names: &Names, value: &mut Value) {
    match value {
        Value::String(s) => *s = names.text(s),
        Value::Array(items) => items.iter_mut().for_each(|v| translate_all(names, v)),
        Value::Object(o) => o.values_mut().for_each(|v| translate_all(names, v)),
        _ => {}
    }
}

/// A real text in the model's terms: session IDs replaced, and the indexes of
/// "current modify index A != B" paired with the model's.
fn unify_text(names: &mut Names, real: &str, model: &str) -> String {
    const MARK: &str = "current modify index ";
    let numbers = |text: &str| -> Option<(String, u64, u64)> {
        let at = text.find(MARK)?;
        let rest = &text[at + MARK.len()..];
        let (a, b) = rest.split_once(" != ")?;
        Some((
            text[..at].to_owned(),
            a.parse().ok()?,
            b.trim().parse().ok()?,
        ))
    };
    let text = names.text(real);
    match (numbers(&text), numbers(model)) {
        (Some((head, ra, rb)), Some((_, ma, mb))) => {
            let a = names.index(ra, ma);
            let b = names.index(rb, mb);
            format!("{head}{MARK}{a} != {b}")
        }
        _ => text,
    }
}

/// Compares the two answers to `op`; `Some(why)` if they disagree.
fn compare(names: &mut Names, op: &Op, real: &Answer, model: &Answer) -> Option<String> {
    names.problems.clear();
    let mut why = Vec::new();
    if real.status != model.status {
        why.push(format!("status {} against {}", real.status, model.status));
    }
    for (name, real_value) in &real.headers {
        let model_value = model.headers.get(name);
        let same = match (*name, model_value) {
            ("X-Consul-Index", Some(m)) => match (real_value.parse::<u64>(), m.parse::<u64>()) {
                (Ok(r), Ok(m)) => names.index(r, m) == m,
                _ => false,
            },
            (_, Some(m)) => m == real_value,
            (_, None) => false,
        };
        if !same {
            why.push(format!(
                "header {name}: {real_value:?} against {model_value:?}"
            ));
        }
    }
    for name in model.headers.keys() {
        if !real.headers.contains_key(name) {
            why.push(format!("header {name} only from the model"));
        }
    }
    match (real.json(), model.json()) {
        (Some(Value::String(r)), Some(Value::String(m))) if matches!(op, Op::StatusLeader) => {
            if r.is_empty() != m.is_empty() {
                why.push(format!("leader {r:?} against {m:?}"));
            }
        }
        (Some(r), Some(m)) => {
            if let (Op::SessionCreate { .. }, Some(rid), Some(mid)) =
                (op, r["ID"].as_str(), m["ID"].as_str())
            {
                names.id(rid, mid);
            }
            let unified = unify(names, &r, &m, None);
            let model_side = match &unified {
                Value::Object(o) if o.contains_key("sorted") => o.get("as").cloned(),
                _ => None,
            };
            let (real_side, model_side) = match model_side {
                Some(sorted) => (unified.get("sorted").cloned().unwrap_or_default(), sorted),
                None => (unified, m),
            };
            let (real_side, model_side) = (canonical(real_side), canonical(model_side));
            if real_side != model_side {
                why.push(format!(
                    "body\n  real (in model terms): {real_side}\n  model: {model_side}"
                ));
            }
        }
        (None, None) => {
            let r = String::from_utf8_lossy(&real.body);
            let m = String::from_utf8_lossy(&model.body);
            let r = unify_text(names, &r, &m);
            if r != m {
                why.push(format!("text {r:?} against {m:?}"));
            }
        }
        (r, m) => why.push(format!("body kinds differ: {r:?} against {m:?}")),
    }
    why.append(&mut names.problems);
    (!why.is_empty()).then(|| why.join("\n"))
}

// ---- Sequences ----

/// What a sequence knows, in the model's terms.
struct Sequence {
    prefix: String,
    sessions: Vec<String>,
    checks: Vec<String>,
    /// The last listing index of each prefix.
    listed: BTreeMap<String, u64>,
    lock_delays: Vec<u64>,
    check_ttl: u64,
}

impl Sequence {
    fn keys(&self) -> [String; 5] {
        let p = &self.prefix;
        [
            format!("{p}leader"),
            format!("{p}sem/.lock"),
            format!("{p}sem"),
            format!("{p}leader/.lock"),
            // Whatever lease-core lets a key hold, percent-encoded by the client's URL.
            format!("{p}odd key+%?#é"),
        ]
    }

    fn session(&self, rng: &mut Rng) -> Sess {
        match rng.below(25) {
            0 | 1 => Sess::Unknown,
            2 => Sess::Garbage,
            _ => match rng.pick(&self.sessions) {
                Some(id) => Sess::Known(id.clone()),
                None => Sess::Unknown,
            },
        }
    }

    fn key(&self, rng: &mut Rng) -> Key {
        if rng.chance(35) {
            return Key::Contender(format!("{}sem/", self.prefix), self.session(rng));
        }
        let keys = self.keys();
        Key::Fixed(keys[rng.below(keys.len())].clone())
    }

    /// A key the model has under this sequence's prefix (its contender keys by session).
    fn existing_key(&self, rng: &mut Rng, model: &Model) -> Option<Key> {
        let keys: Vec<String> = (model.keys().into_iter())
            .map(|e| e.key)
            .filter(|k| k.starts_with(&self.prefix))
            .collect();
        let key = rng.pick(&keys)?.clone();
        let contenders = format!("{}sem/", self.prefix);
        Some(match key.strip_prefix(&contenders) {
            Some(session) if self.sessions.iter().any(|s| s == session) => {
                Key::Contender(contenders, Sess::Known(session.to_owned()))
            }
            _ => Key::Fixed(key),
        })
    }

    /// A key: one that exists, mostly.
    fn some_key(&self, rng: &mut Rng, model: &Model) -> Key {
        match self.existing_key(rng, model) {
            Some(key) if rng.chance(60) => key,
            _ => self.key(rng),
        }
    }

    /// The session holding `key`, if this sequence made it (mostly), else any.
    fn holder(&self, rng: &mut Rng, model: &Model, names: &Names, key: &Key) -> Sess {
        let holder = model
            .entry(&model_key(names, key))
            .and_then(|e| e.holder().map(str::to_owned))
            .filter(|h| self.sessions.contains(h));
        match holder {
            Some(holder) if rng.chance(75) => Sess::Known(holder),
            _ => self.session(rng),
        }
    }

    fn value(rng: &mut Rng) -> Val {
        match rng.below(4) {
            0 => Val::Bytes(Vec::new()),
            1 => Val::Bytes(b"node-1".to_vec()),
            _ => Val::Bytes(format!("v{}", rng.below(1000)).into_bytes()),
        }
    }
}

/// An index to name for `key`: its current one (if the agent's is known), 0, or another seen.
fn index_for(model: &Model, names: &Names, rng: &mut Rng, key: &str) -> Idx {
    let current = model.entry(key).map(|e| e.modify_index);
    match rng.below(4) {
        0 | 1 => match current {
            Some(m) if names.index_m2r.contains_key(&m) => Idx::Model(m),
            Some(_) => names.seen.last().map_or(Idx::Zero, |m| Idx::Model(*m)),
            None => Idx::Zero,
        },
        2 => Idx::Zero,
        _ => names.seen.last().map_or(Idx::Zero, |m| Idx::Model(*m)),
    }
}

fn model_key(names: &Names, key: &Key) -> String {
    names.key(Side::Model, key)
}

fn generate(rng: &mut Rng, seq: &Sequence, model: &Model, names: &Names) -> Op {
    let p = &seq.prefix;
    let roll = rng.below(100);
    match roll {
        0..=2 => Op::StatusLeader,
        3..=6 => Op::RegisterCheck {
            id: format!(
                "lease-{:016x}{:016x}-{}s",
                rng.next(),
                rng.next(),
                seq.check_ttl
            ),
            ttl_s: seq.check_ttl,
        },
        7..=9 => Op::PassCheck(match rng.pick(&seq.checks) {
            Some(id) if !rng.chance(10) => id.clone(),
            _ => "lease-unknown-10s".to_owned(),
        }),
        10..=18 => {
            let life = match rng.pick(&seq.checks) {
                Some(check) if rng.chance(60) => Life::Check(check.clone()),
                _ if rng.chance(10) => Life::Check("lease-unknown-10s".to_owned()),
                _ => Life::Ttl([10, 15, 30][rng.below(3)]),
            };
            let node_checks = match rng.below(6) {
                0 => Some(Vec::new()),
                1 => Some(vec!["serfHealth".to_owned()]),
                _ => None,
            };
            Op::SessionCreate {
                name: if rng.chance(20) {
                    format!("{p}leader (min_hold)")
                } else {
                    format!("{p}leader")
                },
                life,
                lock_delay_ms: seq.lock_delays[rng.below(seq.lock_delays.len())],
                behavior: if rng.chance(50) { "release" } else { "delete" },
                node_checks,
            }
        }
        19..=21 => Op::SessionRenew(seq.session(rng)),
        22..=25 => Op::SessionInfo(seq.session(rng)),
        26..=28 => Op::SessionDestroy(seq.session(rng)),
        29 => Op::SessionList,
        30..=35 => Op::KvGet(seq.some_key(rng, model)),
        36..=40 => Op::KvList(
            [p.to_string(), format!("{p}sem/"), format!("{p}none/")][rng.below(3)].clone(),
        ),
        41 => Op::KvKeys([p.to_string(), format!("{p}none/")][rng.below(2)].clone()),
        42..=44 => {
            let prefix = [p.to_string(), format!("{p}sem/")][rng.below(2)].clone();
            match seq.listed.get(&prefix).copied() {
                // Blocking on a listing's own index waits it out (costly: rarely).
                Some(index) if rng.chance(25) => Op::KvWatch {
                    prefix,
                    index: Idx::Model(index),
                    wait_ms: [40, 80][rng.below(2)],
                },
                // An older index: answered at once.
                Some(index) => Op::KvWatch {
                    prefix,
                    index: (names.seen.iter().rev())
                        .find(|m| **m < index)
                        .map_or(Idx::Zero, |m| Idx::Model(*m)),
                    wait_ms: 5000,
                },
                None => Op::KvList(prefix),
            }
        }
        45 => {
            let prefix = p.to_string();
            match seq.listed.get(&prefix).copied() {
                Some(index) => Op::WatchThenWrite {
                    prefix,
                    index: Idx::Model(index),
                    write: Box::new(write_op(rng, seq, model, names)),
                },
                None => Op::KvList(prefix),
            }
        }
        46..=52 => {
            let key = seq.some_key(rng, model);
            Op::KvRelease {
                session: seq.holder(rng, model, names, &key),
                key,
                flags: Some(if rng.chance(70) {
                    LEADER_FLAGS
                } else {
                    SEMAPHORE_FLAGS
                }),
            }
        }
        53..=57 => {
            let key = seq.some_key(rng, model);
            let cas = rng
                .chance(75)
                .then(|| index_for(model, names, rng, &model_key(names, &key)));
            Op::KvDelete {
                key,
                cas,
                recurse: false,
            }
        }
        58..=62 => operator_op(rng, seq, model, names),
        63..=99 => write_op(rng, seq, model, names),
        _ => Op::StatusLeader,
    }
}

fn setup_check(rng: &mut Rng, seq: &Sequence) -> Op {
    Op::RegisterCheck {
        id: format!(
            "lease-{:016x}{:016x}-{}s",
            rng.next(),
            rng.next(),
            seq.check_ttl
        ),
        ttl_s: seq.check_ttl,
    }
}

fn setup_session(rng: &mut Rng, seq: &Sequence) -> Op {
    let life = match rng.pick(&seq.checks) {
        Some(check) if rng.chance(70) => Life::Check(check.clone()),
        _ => Life::Ttl([10, 15][rng.below(2)]),
    };
    Op::SessionCreate {
        name: format!("{}leader", seq.prefix),
        life,
        lock_delay_ms: seq.lock_delays[rng.below(seq.lock_delays.len())],
        behavior: if rng.chance(50) { "release" } else { "delete" },
        node_checks: None,
    }
}

/// An operator's action (beside the client's calls).
fn operator_op(rng: &mut Rng, seq: &Sequence, model: &Model, names: &Names) -> Op {
    let p = &seq.prefix;
    match rng.below(6) {
        0 => Op::SessionDestroy(seq.session(rng)),
        1 => Op::KvDelete {
            key: seq.some_key(rng, model),
            cas: None,
            recurse: false,
        },
        2 => Op::KvDelete {
            key: Key::Fixed([format!("{p}sem/"), format!("{p}leader")][rng.below(2)].clone()),
            cas: None,
            recurse: true,
        },
        3 => {
            let key = seq.some_key(rng, model);
            Op::KvRelease {
                session: seq.holder(rng, model, names, &key),
                key,
                flags: None,
            }
        }
        4 => {
            let key = seq.some_key(rng, model);
            let cas = rng
                .chance(30)
                .then(|| index_for(model, names, rng, &model_key(names, &key)));
            Op::KvPut {
                key,
                value: format!("op{}", rng.below(100)).into_bytes(),
                flags: [0, LEADER_FLAGS, SEMAPHORE_FLAGS][rng.below(3)],
                cas,
                acquire: None,
            }
        }
        _ => Op::KvPut {
            key: seq.key(rng),
            value: b"acquired".to_vec(),
            flags: LEADER_FLAGS,
            cas: None,
            acquire: Some(seq.session(rng)),
        },
    }
}

/// A transaction as the client makes them: a leader's acquisition, a `min_hold` hand-over, a
/// semaphore coordinator's round.
fn write_op(rng: &mut Rng, seq: &Sequence, model: &Model, names: &Names) -> Op {
    let p = &seq.prefix;
    let leader = if rng.chance(85) {
        Key::Fixed(format!("{p}leader"))
    } else {
        Key::Fixed(format!("{p}odd key+%?#é"))
    };
    match rng.below(3) {
        0 => {
            let lock_key = Key::Fixed(format!("{p}leader/.lock"));
            let check = match rng.below(4) {
                0 => None,
                1 => Some(TxnOp::CheckIndex(
                    lock_key.clone(),
                    index_for(model, names, rng, &model_key(names, &lock_key)),
                )),
                _ => Some(TxnOp::CheckNotExists(lock_key)),
            };
            let lock = TxnOp::Lock(leader, seq.session(rng), Sequence::value(rng), LEADER_FLAGS);
            Op::Txn(check.into_iter().chain([lock]).collect())
        }
        1 => {
            let index = index_for(model, names, rng, &model_key(names, &leader));
            Op::Txn(vec![
                TxnOp::CheckIndex(leader.clone(), index),
                TxnOp::Unlock(
                    leader.clone(),
                    seq.holder(rng, model, names, &leader),
                    LEADER_FLAGS,
                ),
                TxnOp::Lock(leader, seq.session(rng), Sequence::value(rng), LEADER_FLAGS),
            ])
        }
        _ => {
            let contender = |s: Sess| Key::Contender(format!("{p}sem/"), s);
            let lock_key = format!("{p}sem/.lock");
            let existing = model.entry(&lock_key).map(|e| e.modify_index);
            let cas = match existing {
                Some(_) if rng.chance(80) => index_for(model, names, rng, &lock_key),
                _ => Idx::Zero,
            };
            let mut ops = Vec::new();
            if matches!(cas, Idx::Zero) && rng.chance(80) {
                ops.push(TxnOp::CheckNotExists(Key::Fixed(format!("{p}sem"))));
            }
            for _ in 0..rng.below(2) {
                let key = match seq.existing_key(rng, model) {
                    Some(key @ Key::Contender(..)) => key,
                    _ => contender(seq.session(rng)),
                };
                ops.push(TxnOp::Delete(key));
            }
            let mut holders = Vec::new();
            for _ in 0..rng.below(3) {
                let s = seq.session(rng);
                if rng.chance(20) {
                    ops.push(TxnOp::Unlock(
                        contender(s.clone()),
                        s.clone(),
                        SEMAPHORE_FLAGS,
                    ));
                }
                ops.push(TxnOp::Lock(
                    contender(s.clone()),
                    s.clone(),
                    Val::Bytes(b"holder".to_vec()),
                    SEMAPHORE_FLAGS,
                ));
                holders.push(s);
            }
            ops.push(TxnOp::Cas(
                Key::Fixed(lock_key),
                Val::SemLock(2, holders),
                SEMAPHORE_FLAGS,
                cas,
            ));
            Op::Txn(ops)
        }
    }
}

/// The scripted sequences: what the random ones reach too rarely. `#n` names the n-th session
/// the sequence created; `Idx::Current` the key's index as the model has it (read just before).
fn scripts(p: &str) -> Vec<Vec<Op>> {
    let leader = Key::Fixed(format!("{p}leader"));
    let lock_key = Key::Fixed(format!("{p}sem/.lock"));
    let s = |n: usize| Sess::Known(format!("#{n}"));
    let contender = |n: usize| Key::Contender(format!("{p}sem/"), s(n));
    let ttl_session = |lock_delay_ms: u64, behavior: &'static str| Op::SessionCreate {
        name: format!("{p}leader"),
        life: Life::Ttl(10),
        lock_delay_ms,
        behavior,
        node_checks: None,
    };
    let checked_session = |check: &str, behavior: &'static str| Op::SessionCreate {
        name: format!("{p}leader"),
        life: Life::Check(check.to_owned()),
        lock_delay_ms: 0,
        behavior,
        node_checks: None,
    };
    let lock = |n: usize, value: &[u8]| {
        Op::Txn(vec![
            TxnOp::CheckNotExists(Key::Fixed(format!("{p}leader/.lock"))),
            TxnOp::Lock(
                leader.clone(),
                s(n),
                Val::Bytes(value.to_vec()),
                LEADER_FLAGS,
            ),
        ])
    };
    let release = |n: usize| Op::KvRelease {
        key: leader.clone(),
        session: s(n),
        flags: Some(LEADER_FLAGS),
    };
    let get = || Op::KvGet(leader.clone());
    let check = format!("lease-{:016x}0000000000000000-1s", p.len());
    let sem_round = |holders: Vec<usize>, admit: Vec<usize>, cas: Idx| {
        let mut ops = Vec::new();
        if matches!(cas, Idx::Zero) {
            ops.push(TxnOp::CheckNotExists(Key::Fixed(format!("{p}sem"))));
        }
        for n in &admit {
            ops.push(TxnOp::Lock(
                contender(*n),
                s(*n),
                Val::Bytes(b"h".to_vec()),
                SEMAPHORE_FLAGS,
            ));
        }
        let holders = holders.into_iter().map(s).collect();
        ops.push(TxnOp::Cas(
            lock_key.clone(),
            Val::SemLock(2, holders),
            SEMAPHORE_FLAGS,
            cas,
        ));
        Op::Txn(ops)
    };
    vec![
        // A heartbeat check's TTL runs out: its sessions go, their keys are released; a session
        // on the critical check is refused; a pass revives the check, not the sessions.
        vec![
            Op::RegisterCheck {
                id: check.clone(),
                ttl_s: 1,
            },
            checked_session(&check, "release"),
            lock(0, b"t"),
            get(),
            Op::AwaitSessionEnd(s(0)),
            get(),
            Op::SessionInfo(s(0)),
            checked_session(&check, "release"),
            Op::PassCheck(check.clone()),
            checked_session(&check, "delete"),
            lock(1, b""),
            get(),
            Op::Deregister(check.clone()),
            Op::KvList(p.to_owned()),
            Op::Deregister(check.clone()),
            Op::PassCheck(check),
        ],
        // A lock-delay of 500 ms: refused within it (transaction and ?acquire), taken after.
        vec![
            ttl_session(500, "release"),
            ttl_session(0, "release"),
            lock(0, b"a"),
            Op::SessionDestroy(s(0)),
            lock(1, b"b"),
            Op::KvPut {
                key: leader.clone(),
                value: b"c".to_vec(),
                flags: LEADER_FLAGS,
                cas: None,
                acquire: Some(s(1)),
            },
            get(),
            Op::Sleep(700),
            lock(1, b"b"),
            get(),
        ],
        // Hand-overs: released, taken by another (LockIndex 2), kept for a min_hold by a third
        // (3), the keeper destroyed (released, no delay), taken again (4), then deleted by its
        // holder's delete-behavior destroy.
        vec![
            ttl_session(0, "release"),
            ttl_session(15_000, "release"),
            ttl_session(0, "release"),
            ttl_session(0, "delete"),
            lock(0, b"one"),
            lock(1, b"two"),
            release(0),
            release(0),
            lock(1, b"two"),
            get(),
            Op::Txn(vec![
                TxnOp::CheckIndex(leader.clone(), Idx::Current(format!("{p}leader"))),
                TxnOp::Unlock(leader.clone(), s(1), LEADER_FLAGS),
                TxnOp::Lock(
                    leader.clone(),
                    s(2),
                    Val::Bytes(b"two".to_vec()),
                    LEADER_FLAGS,
                ),
            ]),
            get(),
            Op::SessionDestroy(s(2)),
            lock(3, b"four"),
            get(),
            Op::SessionDestroy(s(3)),
            get(),
            lock(0, b"five"),
            Op::KvList(p.to_owned()),
        ],
        // An operator's plain write to a held key, then its holder's release and a new lock.
        vec![
            ttl_session(0, "release"),
            lock(0, b"held"),
            Op::KvPut {
                key: leader.clone(),
                value: b"operator".to_vec(),
                flags: 0,
                cas: None,
                acquire: None,
            },
            get(),
            release(0),
            get(),
            lock(0, b"again"),
            get(),
            Op::KvRelease {
                key: leader.clone(),
                session: s(0),
                flags: None,
            },
            get(),
            Op::KvPut {
                key: leader.clone(),
                value: b"x".to_vec(),
                flags: 7,
                cas: Some(Idx::Current(format!("{p}leader"))),
                acquire: None,
            },
            get(),
        ],
        // A semaphore of two: .lock created, holders admitted, one holder's session destroyed
        // (its contender key goes with it), a stale round refused, the listing and its index.
        vec![
            ttl_session(0, "delete"),
            ttl_session(15_000, "delete"),
            ttl_session(0, "delete"),
            sem_round(vec![0], vec![0], Idx::Zero),
            Op::KvGet(lock_key.clone()),
            sem_round(vec![0, 1], vec![1], Idx::Current(format!("{p}sem/.lock"))),
            Op::KvList(format!("{p}sem/")),
            Op::SessionDestroy(s(1)),
            Op::KvList(format!("{p}sem/")),
            sem_round(vec![0, 2], vec![2], Idx::Zero),
            Op::KvGet(lock_key.clone()),
            Op::Txn(vec![
                TxnOp::Delete(contender(0)),
                TxnOp::Cas(
                    lock_key.clone(),
                    Val::SemLock(2, vec![s(2)]),
                    SEMAPHORE_FLAGS,
                    Idx::Current(format!("{p}sem/.lock")),
                ),
            ]),
            Op::KvList(format!("{p}sem/")),
            Op::KvKeys(p.to_owned()),
            Op::KvDelete {
                key: Key::Fixed(format!("{p}sem/")),
                cas: None,
                recurse: true,
            },
            Op::KvList(format!("{p}sem/")),
            Op::KvList(p.to_owned()),
        ],
        // A session's TTL (10 s): renewed after 12 s, still there 19 s after the renewal, gone
        // (its key released) by 21 s: Consul's 2 × TTL. Only with LEASE_SIM_DIFF_SLOW (35 s).
        vec![
            ttl_session(0, "release"),
            lock(0, b"ttl"),
            Op::Sleep(12_000),
            Op::SessionRenew(s(0)),
            Op::Sleep(19_000),
            Op::SessionInfo(s(0)),
            get(),
            Op::Sleep(2_000),
            Op::SessionInfo(s(0)),
            get(),
        ],
        // Renewals and the session endpoints' answers.
        vec![
            ttl_session(0, "release"),
            Op::SessionRenew(s(0)),
            Op::SessionInfo(s(0)),
            Op::SessionCreate {
                name: "n".into(),
                life: Life::Ttl(10),
                lock_delay_ms: 0,
                behavior: "release",
                node_checks: Some(vec!["nope".into()]),
            },
            Op::SessionCreate {
                name: "n".into(),
                life: Life::Ttl(10),
                lock_delay_ms: 0,
                behavior: "release",
                node_checks: Some(Vec::new()),
            },
            Op::SessionInfo(s(1)),
            Op::SessionDestroy(s(0)),
            Op::SessionRenew(s(0)),
            Op::SessionInfo(s(0)),
            Op::SessionList,
        ],
    ]
}

struct Run {
    http: reqwest::Client,
    real: String,
    model_url: String,
    model: Model,
    names: Names,
    seed: u64,
    steps: usize,
    reports: Vec<String>,
    /// Time spent waiting for Consul's answers and the model's.
    took: (Duration, Duration),
}

impl Run {
    /// Sends `op` to both and compares; `Err` with the report of a disagreement.
    async fn step(
        &mut self,
        sequence: usize,
        step: usize,
        op: &Op,
        history: &[String],
    ) -> Result<(Answer, Answer), String> {
        self.steps += 1;
        let report = |names: &Names, why: &str, real: &Answer, model: &Answer| {
            let show = |r: Option<Request>| {
                r.map_or_else(String::new, |r| {
                    let body = r
                        .body
                        .as_deref()
                        .map(String::from_utf8_lossy)
                        .unwrap_or_default();
                    format!("{} {} {body}", r.method, r.path)
                })
            };
            let sent_real = show(render(op, Side::Real, names));
            let sent_model = show(render(op, Side::Model, names));
            format!(
                "the model disagrees with Consul 1.8.7 (LEASE_SIM_DIFF_SEED={:#x}, sequence \
                 {sequence}, step {step}):\n{why}\noperation: {op:?}\nsent to Consul: \
                 {sent_real}\nsent to the model: {sent_model}\nConsul answered: {}\nthe \
                 model answered: {}\nthe sequence so far:\n  {}",
                self.seed,
                real.show(),
                model.show(),
                history.join("\n  ")
            )
        };
        match op {
            Op::Sleep(ms) => {
                tokio::time::sleep(Duration::from_millis(*ms)).await;
                Ok((Answer::none(), Answer::none()))
            }
            Op::AwaitSessionEnd(session) => {
                let info = Op::SessionInfo(session.clone());
                let (Some(real_info), Some(model_info)) = (
                    render(&info, Side::Real, &self.names),
                    render(&info, Side::Model, &self.names),
                ) else {
                    return Err("a session's info renders".to_owned());
                };
                let (real, model) = tokio::join!(
                    await_session_end(&self.http, &self.real, &real_info),
                    await_session_end(&self.http, &self.model_url, &model_info)
                );
                match (real, model) {
                    (Some(real), Some(model)) => Ok((real, model)),
                    (real, model) => {
                        let never =
                            |a: &Option<Answer>| if a.is_some() { "ended" } else { "never ended" };
                        let why = format!(
                            "within {SESSION_END_BOUND:?}, the session on Consul {}, on the model {}",
                            never(&real),
                            never(&model)
                        );
                        let none = Answer::none();
                        Err(report(
                            &self.names,
                            &why,
                            real.as_ref().unwrap_or(&none),
                            model.as_ref().unwrap_or(&none),
                        ))
                    }
                }
            }
            Op::WatchThenWrite {
                prefix,
                index,
                write,
            } => {
                let watch = Op::KvWatch {
                    prefix: prefix.clone(),
                    index: index.clone(),
                    wait_ms: WATCH_WRITE_WAIT.as_millis() as u64,
                };
                let (Some(real_watch), Some(model_watch)) = (
                    render(&watch, Side::Real, &self.names),
                    render(&watch, Side::Model, &self.names),
                ) else {
                    return Err("a watch renders".to_owned());
                };
                let (Some(real_write), Some(model_write)) = (
                    render(write, Side::Real, &self.names),
                    render(write, Side::Model, &self.names),
                ) else {
                    return Err("a write renders".to_owned());
                };
                let writes = async {
                    tokio::time::sleep(Duration::from_millis(30)).await;
                    tokio::join!(
                        send(&self.http, &self.real, &real_write),
                        send(&self.http, &self.model_url, &model_write)
                    )
                };
                let (real_answer, model_answer, (real_written, model_written)) = tokio::join!(
                    send(&self.http, &self.real, &real_watch),
                    send(&self.http, &self.model_url, &model_watch),
                    writes
                );
                if let Some(why) = compare(&mut self.names, write, &real_written, &model_written) {
                    return Err(report(&self.names, &why, &real_written, &model_written));
                }
                if let Some(why) = compare(&mut self.names, &watch, &real_answer, &model_answer) {
                    return Err(report(&self.names, &why, &real_answer, &model_answer));
                }
                // A write under the prefix answers at once; one that changed nothing waits.
                let woken = |a: &Answer| a.took < WATCH_WRITE_WAIT * 2 / 3;
                if woken(&real_answer) != woken(&model_answer) {
                    let why = format!(
                        "the real watch answered after {:?}, the model's after {:?}",
                        real_answer.took, model_answer.took
                    );
                    return Err(report(&self.names, &why, &real_answer, &model_answer));
                }
                Ok((real_answer, model_answer))
            }
            op => {
                let (Some(real_request), Some(model_request)) = (
                    render(op, Side::Real, &self.names),
                    render(op, Side::Model, &self.names),
                ) else {
                    return Err(format!("{op:?} renders"));
                };
                let (real, model) = tokio::join!(
                    send(&self.http, &self.real, &real_request),
                    send(&self.http, &self.model_url, &model_request)
                );
                self.took.0 += real.took;
                self.took.1 += model.took;
                if let Some(why) = compare(&mut self.names, op, &real, &model) {
                    return Err(report(&self.names, &why, &real, &model));
                }
                if let Op::KvWatch { wait_ms, index, .. } = op {
                    let wait = Duration::from_millis(*wait_ms);
                    let blocked = |a: &Answer| {
                        a.headers.get("X-Consul-Index").and_then(|i| i.parse().ok())
                            == Some(self.names.idx(Side::Real, index))
                    };
                    if blocked(&real) {
                        let bound = wait + wait / 16 + SLACK;
                        for (who, answer) in [("Consul", &real), ("the model", &model)] {
                            if answer.took < wait || answer.took > bound {
                                let why = format!(
                                    "{who} answered a blocking query that nothing changed after \
                                     {:?}, not within [{wait:?}, {bound:?}]",
                                    answer.took
                                );
                                return Err(report(&self.names, &why, &real, &model));
                            }
                        }
                    }
                }
                Ok((real, model))
            }
        }
    }
}

/// Learns from an answer what later operations may name.
fn learn(seq: &mut Sequence, op: &Op, model: &Answer) {
    match op {
        Op::SessionCreate { .. } if model.status == 200 => {
            if let Some(id) = model
                .json()
                .and_then(|v| v["ID"].as_str().map(str::to_owned))
            {
                seq.sessions.push(id);
            }
        }
        Op::RegisterCheck { id, .. } if model.status == 200 => seq.checks.push(id.clone()),
        Op::KvList(prefix) | Op::KvWatch { prefix, .. } => {
            if let Some(index) = model
                .headers
                .get("X-Consul-Index")
                .and_then(|i| i.parse().ok())
            {
                seq.listed.insert(prefix.clone(), index);
            }
        }
        _ => {}
    }
}

/// A scripted operation with its `#n` sessions and current indexes named.
fn resolve(op: &Op, sessions: &[String], model: &Model, names: &Names) -> Op {
    let sess = |s: &Sess| match s {
        Sess::Known(name) if name.starts_with('#') => name[1..]
            .parse::<usize>()
            .ok()
            .and_then(|n| sessions.get(n))
            .map_or(Sess::Unknown, |id| Sess::Known(id.clone())),
        other => other.clone(),
    };
    let key = |k: &Key| match k {
        Key::Contender(prefix, s) => Key::Contender(prefix.clone(), sess(s)),
        fixed => fixed.clone(),
    };
    let idx = |i: &Idx| match i {
        Idx::Current(key) => model
            .entry(key)
            .map(|e| e.modify_index)
            .filter(|m| names.index_m2r.contains_key(m))
            .map_or(Idx::Zero, Idx::Model),
        other => other.clone(),
    };
    let val = |v: &Val| match v {
        Val::SemLock(limit, holders) => Val::SemLock(*limit, holders.iter().map(sess).collect()),
        bytes => bytes.clone(),
    };
    match op {
        Op::SessionRenew(s) => Op::SessionRenew(sess(s)),
        Op::SessionInfo(s) => Op::SessionInfo(sess(s)),
        Op::AwaitSessionEnd(s) => Op::AwaitSessionEnd(sess(s)),
        Op::SessionDestroy(s) => Op::SessionDestroy(sess(s)),
        Op::KvGet(k) => Op::KvGet(key(k)),
        Op::KvRelease {
            key: k,
            session,
            flags,
        } => Op::KvRelease {
            key: key(k),
            session: sess(session),
            flags: *flags,
        },
        Op::KvPut {
            key: k,
            value,
            flags,
            cas,
            acquire,
        } => Op::KvPut {
            key: key(k),
            value: value.clone(),
            flags: *flags,
            cas: cas.as_ref().map(idx),
            acquire: acquire.as_ref().map(sess),
        },
        Op::KvDelete {
            key: k,
            cas,
            recurse,
        } => Op::KvDelete {
            key: key(k),
            cas: cas.as_ref().map(idx),
            recurse: *recurse,
        },
        Op::Txn(ops) => Op::Txn(
            ops.iter()
                .map(|t| match t {
                    TxnOp::Lock(k, s, v, f) => TxnOp::Lock(key(k), sess(s), val(v), *f),
                    TxnOp::Unlock(k, s, f) => TxnOp::Unlock(key(k), sess(s), *f),
                    TxnOp::Cas(k, v, f, i) => TxnOp::Cas(key(k), val(v), *f, idx(i)),
                    TxnOp::Delete(k) => TxnOp::Delete(key(k)),
                    TxnOp::CheckNotExists(k) => TxnOp::CheckNotExists(key(k)),
                    TxnOp::CheckIndex(k, i) => TxnOp::CheckIndex(key(k), idx(i)),
                })
                .collect(),
        ),
        other => other.clone(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_model_answers_as_consul_1_8_does() {
    let seed = std::env::var("LEASE_SIM_DIFF_SEED")
        .ok()
        .and_then(|s| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok())
        .unwrap_or(DEFAULT_SEED);
    let sequences = std::env::var("LEASE_SIM_DIFF_SEQUENCES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(DEFAULT_SEQUENCES);
    let keep_going = std::env::var_os("LEASE_SIM_DIFF_ALL").is_some();
    let trace = std::env::var_os("LEASE_SIM_DIFF_TRACE").is_some();

    let agent = lease_tests::consul::Agent::start().await;
    let http = reqwest::Client::new();
    let this = http
        .get(format!("{}/v1/agent/self", agent.url()))
        .send()
        .await
        .expect("the agent answers")
        .bytes()
        .await
        .expect("agent/self answers");
    let this: Value = serde_json::from_slice(&this).expect("agent/self is JSON");
    let node = this["Config"]["NodeName"].as_str().unwrap_or_default();
    let model = Model::new(Config::new(seed).node_name(node));
    let model_url = support::serve(model.clone()).await;
    let mut run = Run {
        http,
        real: agent.url(),
        model_url,
        model,
        names: Names::default(),
        seed,
        steps: 0,
        reports: Vec::new(),
        took: (Duration::ZERO, Duration::ZERO),
    };
    let started = Instant::now();
    let mut rng = Rng(seed);
    let slow = std::env::var_os("LEASE_SIM_DIFF_SLOW").is_some();
    let scripted_count = scripts("").len() - usize::from(!slow);
    let mut ran = 0;
    for sequence in 0..sequences + scripted_count {
        ran += 1;
        // A client configured with a datacenter (its own), or a namespace (which an
        // open-source agent refuses), in some sequences.
        run.names.client_query = match rng.below(10) {
            0 | 1 => "dc=dc1".to_owned(),
            2 => "ns=team".to_owned(),
            _ => String::new(),
        };
        if sequence >= sequences {
            run.names.client_query.clear();
        }
        let mut seq = Sequence {
            prefix: format!("diff/{sequence}/"),
            sessions: Vec::new(),
            checks: Vec::new(),
            listed: BTreeMap::new(),
            lock_delays: if rng.chance(50) {
                vec![0]
            } else {
                vec![0, 15_000]
            },
            check_ttl: [10, 15][rng.below(2)],
        };
        let scripted = (sequence >= sequences).then(|| {
            let mut scripts = scripts(&seq.prefix);
            if !slow {
                scripts.retain(|ops| {
                    !ops.iter()
                        .any(|op| matches!(op, Op::Sleep(ms) if *ms > 10_000))
                });
            }
            scripts.swap_remove(sequence - sequences)
        });
        let length = scripted.as_ref().map_or(6 + rng.below(14), Vec::len);
        let mut history = Vec::new();
        let mut failed = false;
        for step in 0..length + 1 {
            let op = match &scripted {
                Some(ops) if step < ops.len() => {
                    resolve(&ops[step], &seq.sessions, &run.model, &run.names)
                }
                Some(_) => Op::SessionList,
                // A client's first calls: its heartbeat check (sometimes), a session or three.
                None if step == 0 && rng.chance(60) => setup_check(&mut rng, &seq),
                None if step < 3 && seq.sessions.len() < 2 => setup_session(&mut rng, &seq),
                None if step < length => generate(&mut rng, &seq, &run.model, &run.names),
                None => Op::SessionList,
            };
            history.push(format!("{step}: {op:?}"));
            match run.step(sequence, step, &op, &history).await {
                Ok((real_answer, model_answer)) => {
                    if trace {
                        eprintln!(
                            "{sequence}.{step} {op:?}\n   real  {}\n   model {}",
                            real_answer.show(),
                            model_answer.show()
                        );
                    }
                    learn(&mut seq, &op, &model_answer)
                }
                Err(report) => {
                    run.reports.push(report);
                    failed = true;
                    break;
                }
            }
        }
        // Clean up (compared too): what a client's shutdown gives back.
        if !failed {
            let mut cleanup: Vec<Op> = (seq.sessions.iter())
                .map(|s| Op::SessionDestroy(Sess::Known(s.clone())))
                .collect();
            cleanup.extend(seq.checks.iter().map(|c| Op::Deregister(c.clone())));
            for (i, op) in cleanup.iter().enumerate() {
                if let Err(report) = run.step(sequence, length + 1 + i, op, &history).await {
                    run.reports.push(report);
                    break;
                }
            }
        }
        if !run.reports.is_empty() && !keep_going {
            break;
        }
    }
    eprintln!(
        "consul differential: seed {seed:#x}, {} sequences, {} operations, {:?} (answers: \
         Consul {:?}, the model {:?}), {} disagreement(s)",
        ran,
        run.steps,
        started.elapsed(),
        run.took.0,
        run.took.1,
        run.reports.len()
    );
    assert!(run.reports.is_empty(), "{}", run.reports.join("\n\n"));
}
