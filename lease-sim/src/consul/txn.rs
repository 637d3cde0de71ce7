//! `PUT /v1/txn`: Consul's transactions, as far as KV goes (`agent/txn_endpoint.go`,
//! `agent/consul/txn_endpoint.go`, `agent/consul/state/txn.go`).
//!
//! A transaction is checked first (a key given, no lock of a key under lock-delay: only those
//! errors are answered if any fails), then every operation runs in order against the state as
//! the previous ones left it, each failure recorded with its operation's index; if any failed,
//! everything is rolled back and the answer is 409 with the errors. A transaction of reads and
//! checks only takes Consul's read path, whose answer also carries the query metadata.

use base64::Engine as _;
use serde::Serialize;
use serde_json::Value;
use tokio::time::Instant;

use super::json::EntryJson;
use super::state::{Entry, State};
use super::wire::go_quote;

/// Consul's `maxTxnOps`.
const MAX_OPS: usize = 64;
/// Consul's default `kv_max_value_size`.
pub(crate) const MAX_VALUE_SIZE: usize = 512 * 1024;

/// A KV verb of a transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Verb {
    Set,
    Delete,
    DeleteCas,
    DeleteTree,
    Cas,
    Lock,
    Unlock,
    Get,
    GetOrEmpty,
    GetTree,
    CheckSession,
    CheckIndex,
    CheckNotExists,
    Unknown(String),
}

impl Verb {
    fn parse(text: &str) -> Verb {
        match text {
            "set" => Verb::Set,
            "delete" => Verb::Delete,
            "delete-cas" => Verb::DeleteCas,
            "delete-tree" => Verb::DeleteTree,
            "cas" => Verb::Cas,
            "lock" => Verb::Lock,
            "unlock" => Verb::Unlock,
            "get" => Verb::Get,
            "get-or-empty" => Verb::GetOrEmpty,
            "get-tree" => Verb::GetTree,
            "check-session" => Verb::CheckSession,
            "check-index" => Verb::CheckIndex,
            "check-not-exists" => Verb::CheckNotExists,
            other => Verb::Unknown(other.to_owned()),
        }
    }

    /// Consul's `isWrite`: a transaction with none takes the read path.
    fn is_write(&self) -> bool {
        matches!(
            self,
            Verb::Set
                | Verb::Delete
                | Verb::DeleteCas
                | Verb::DeleteTree
                | Verb::Cas
                | Verb::Lock
                | Verb::Unlock
        )
    }
}

/// One operation of a transaction: a KV one, or one of another kind (node, service, check,
/// which the model does not keep).
#[derive(Clone, Debug)]
enum Op {
    Kv {
        verb: Verb,
        key: String,
        value: Vec<u8>,
        flags: u64,
        index: u64,
        session: String,
    },
    Other,
}

/// Why a transaction body was refused before it ran: the status and Consul's text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Refused {
    pub(crate) status: u16,
    pub(crate) message: String,
}

fn refused(status: u16, message: impl Into<String>) -> Refused {
    Refused {
        status,
        message: message.into(),
    }
}

/// A field of a JSON object, matched without regard to case (as Go's decoders match them).
pub(crate) fn field<'a>(object: &'a Value, name: &str) -> Option<&'a Value> {
    object
        .as_object()?
        .iter()
        .find(|(key, _)| key.eq_ignore_ascii_case(name))
        .map(|(_, value)| value)
        .filter(|value| !value.is_null())
}

fn parse_failure(message: impl std::fmt::Display) -> Refused {
    refused(400, format!("Failed to parse body: {message}"))
}

fn parse_ops(body: &[u8]) -> Result<Vec<Op>, Refused> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(parse_failure("EOF"));
    }
    let raw: Value = serde_json::from_slice(body).map_err(parse_failure)?;
    let Some(items) = raw.as_array() else {
        return Err(parse_failure(
            "expected a JSON array of operations (the model's wording)",
        ));
    };
    let mut ops = Vec::with_capacity(items.len());
    for item in items {
        let Some(kv) = field(item, "KV") else {
            ops.push(Op::Other);
            continue;
        };
        let text = |name: &str| -> Result<String, Refused> {
            match field(kv, name) {
                None => Ok(String::new()),
                Some(Value::String(s)) => Ok(s.clone()),
                Some(other) => Err(parse_failure(format!(
                    "'KV.{name}' expected type 'string', got {other} (the model's wording)"
                ))),
            }
        };
        let number = |name: &str| -> Result<u64, Refused> {
            match field(kv, name) {
                None => Ok(0),
                Some(value) => value.as_u64().ok_or_else(|| {
                    parse_failure(format!(
                        "'KV.{name}' expected type 'uint64', got {value} (the model's wording)"
                    ))
                }),
            }
        };
        let value = match field(kv, "Value") {
            None => Vec::new(),
            Some(Value::String(encoded)) => base64::engine::general_purpose::STANDARD
                .decode(encoded)
                .map_err(|e| parse_failure(format!("failed to decode value: {e}")))?,
            Some(other) => {
                return Err(parse_failure(format!(
                    "failed to decode value: unexpected value type: {other}"
                )));
            }
        };
        ops.push(Op::Kv {
            verb: Verb::parse(&text("Verb")?),
            key: text("Key")?,
            value,
            flags: number("Flags")?,
            index: number("Index")?,
            session: text("Session")?,
        });
    }
    Ok(ops)
}

/// One result: an entry, with its value (reads) or without (writes and checks).
struct TxnResult {
    entry: Entry,
    with_value: bool,
}

/// What a transaction answers: its status, and its JSON body.
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) body: Vec<u8>,
    /// Whether it took the read path (whose answers carry the query metadata headers).
    pub(crate) read_only: bool,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct ResultJson<'a> {
    #[serde(rename = "KV")]
    kv: EntryJson<'a>,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct ErrorJson<'a> {
    op_index: usize,
    what: &'a str,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct Reply<'a> {
    results: Option<Vec<ResultJson<'a>>>,
    errors: Option<Vec<ErrorJson<'a>>>,
}

/// The read path's reply: `structs.TxnReadResponse`, whose query metadata is serialized too.
#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct ReadReply<'a> {
    #[serde(flatten)]
    reply: Reply<'a>,
    index: u64,
    last_contact: u64,
    known_leader: bool,
    consistency_level: &'static str,
}

/// Runs the transaction in `body` against `state`. `Err` is an answer before any operation ran
/// (a 400 or 413 with Consul's text, or a 500 such as "No cluster leader").
pub(crate) fn run(state: &mut State, now: Instant, body: &[u8]) -> Result<Answer, Refused> {
    let ops = parse_ops(body)?;
    if ops.len() > MAX_OPS {
        return Err(refused(
            413,
            format!(
                "Transaction contains too many operations ({} > {MAX_OPS})",
                ops.len()
            ),
        ));
    }
    for op in &ops {
        if let Op::Kv { key, value, .. } = op {
            if value.len() > MAX_VALUE_SIZE {
                return Err(refused(
                    413,
                    format!(
                        "Value for key {} is too large ({} > {MAX_VALUE_SIZE} bytes)",
                        go_quote(key),
                        value.len()
                    ),
                ));
            }
        }
    }
    let read_only = !ops
        .iter()
        .any(|op| matches!(op, Op::Kv { verb, .. } if verb.is_write()));
    if !state.has_leader() {
        return Err(refused(500, super::state::NO_LEADER));
    }
    let mut errors = pre_check(state, now, &ops);
    let mut results = Vec::new();
    if errors.is_empty() {
        let index = if read_only {
            state.raft_index()
        } else {
            state.apply_index().map_err(|e| refused(500, e))?
        };
        state.begin();
        for (at, op) in ops.iter().enumerate() {
            match apply(state, index, op) {
                Ok(mut found) => results.append(&mut found),
                Err(what) => errors.push((at, what)),
            }
        }
        if errors.is_empty() {
            state.commit();
        } else {
            state.rollback();
        }
    }
    let failed = !errors.is_empty();
    let reply = Reply {
        results: (!failed).then(|| {
            results
                .iter()
                .map(|r| ResultJson {
                    kv: if r.with_value {
                        EntryJson::new(&r.entry)
                    } else {
                        EntryJson::without_value(&r.entry)
                    },
                })
                .collect()
        }),
        errors: failed.then(|| {
            errors
                .iter()
                .map(|(op_index, what)| ErrorJson {
                    op_index: *op_index,
                    what,
                })
                .collect()
        }),
    };
    let body = if read_only {
        serde_json::to_vec(&ReadReply {
            reply,
            index: 0,
            last_contact: 0,
            known_leader: true,
            consistency_level: "",
        })
    } else {
        serde_json::to_vec(&reply)
    };
    let body = body.map_err(|e| refused(500, e.to_string()))?;
    Ok(Answer {
        status: if failed { 409 } else { 200 },
        body,
        read_only,
    })
}

/// `Txn.preCheck`: a key must be given, and a lock must not fall in its key's lock-delay.
fn pre_check(state: &State, now: Instant, ops: &[Op]) -> Vec<(usize, String)> {
    let mut errors = Vec::new();
    for (at, op) in ops.iter().enumerate() {
        let Op::Kv { verb, key, .. } = op else {
            continue;
        };
        if key.is_empty() && *verb != Verb::DeleteTree {
            errors.push((at, "Must provide key".to_owned()));
        } else if *verb == Verb::Lock && state.lock_delayed(now, key) {
            errors.push((
                at,
                format!("failed to lock key {} due to lock delay", go_quote(key)),
            ));
        }
    }
    errors
}

/// `txnKVS`: one operation at `index`, with its results.
fn apply(state: &mut State, index: u64, op: &Op) -> Result<Vec<TxnResult>, String> {
    let Op::Kv {
        verb,
        key,
        value,
        flags,
        index: op_index,
        session,
    } = op
    else {
        return Err("no operation specified".to_owned());
    };
    let q = go_quote(key);
    let entry = || Entry {
        session: session.clone(),
        ..Entry::new(key, *flags, value.clone())
    };
    let written = |entry: Entry| {
        vec![TxnResult {
            entry,
            with_value: false,
        }]
    };
    Ok(match verb {
        Verb::Set => written(state.kv_set(index, entry(), false)),
        Verb::Delete => {
            state.kv_delete(index, key);
            Vec::new()
        }
        Verb::DeleteCas => {
            if !state.kv_delete_cas(index, *op_index, key) {
                return Err(format!("failed to delete key {q}, index is stale"));
            }
            Vec::new()
        }
        Verb::DeleteTree => {
            state.kv_delete_tree(index, key);
            Vec::new()
        }
        Verb::Cas => match state.kv_set_cas(index, entry(), *op_index) {
            Some(stored) => written(stored),
            None => return Err(format!("failed to set key {q}, index is stale")),
        },
        Verb::Lock => match state.kv_lock(index, entry())? {
            Some(stored) => written(stored),
            None => return Err(format!("failed to lock key {q}, lock is already held")),
        },
        Verb::Unlock => match state.kv_unlock(index, entry())? {
            Some(stored) => written(stored),
            None => {
                return Err(format!(
                    "failed to unlock key {q}, lock isn't held, or is held by another session"
                ));
            }
        },
        Verb::Get => match state.entry(key) {
            Some(found) => vec![TxnResult {
                entry: found.clone(),
                with_value: true,
            }],
            None => return Err(format!("key {q} doesn't exist")),
        },
        Verb::GetOrEmpty => vec![TxnResult {
            entry: state.entry(key).cloned().unwrap_or_else(|| Entry {
                value: Vec::new(),
                ..entry()
            }),
            with_value: true,
        }],
        Verb::GetTree => {
            let (_, entries) = state.kv_list(key)?;
            entries
                .into_iter()
                .map(|entry| TxnResult {
                    entry,
                    with_value: true,
                })
                .collect()
        }
        Verb::CheckSession => match state.entry(key) {
            None => return Err(format!("failed to check session, key {q} doesn't exist")),
            Some(found) if found.session != *session => {
                return Err(format!(
                    "failed session check for key {q}, current session {} != {}",
                    go_quote(&found.session),
                    go_quote(session)
                ));
            }
            Some(found) => written(found.clone()),
        },
        Verb::CheckIndex => match state.entry(key) {
            None => return Err(format!("failed to check index, key {q} doesn't exist")),
            Some(found) if found.modify_index != *op_index => {
                return Err(format!(
                    "failed index check for key {q}, current modify index {} != {op_index}",
                    found.modify_index
                ));
            }
            Some(found) => written(found.clone()),
        },
        Verb::CheckNotExists => {
            if state.entry(key).is_some() {
                return Err(format!("key {q} exists"));
            }
            Vec::new()
        }
        Verb::Unknown(verb) => return Err(format!("unknown KV verb {}", go_quote(verb))),
    })
}
