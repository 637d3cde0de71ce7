//! The values the Consul HTTP API exchanges: KV entries, session behaviours, blocking-query
//! parameters and transaction operations.

use base64::Engine as _;
use serde::Deserialize;
use std::time::Duration;

/// One KV entry as `GET /v1/kv/<key>` returns it.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct KvEntry {
    pub(crate) key: String,
    #[serde(default)]
    pub(crate) flags: u64,
    #[serde(default)]
    pub(crate) value: Option<String>,
    #[serde(default)]
    pub(crate) session: Option<String>,
    #[serde(default)]
    pub(crate) lock_index: u64,
    #[serde(default)]
    pub(crate) modify_index: u64,
    /// When the key was last created: a key deleted and created again between two reads has a
    /// new one.
    #[serde(default)]
    pub(crate) create_index: u64,
}

impl KvEntry {
    /// The holder session, with Consul's empty string read as none.
    pub(crate) fn holder(&self) -> Option<&str> {
        self.session.as_deref().filter(|s| !s.is_empty())
    }

    /// The decoded value (Consul sends it base64-encoded; `null` for an empty value).
    pub(crate) fn decoded_value(&self) -> Result<Vec<u8>, String> {
        match &self.value {
            None => Ok(Vec::new()),
            Some(v) => base64::engine::general_purpose::STANDARD
                .decode(v)
                .map_err(|e| format!("the value is not valid base64: {e}")),
        }
    }
}

/// A session's behaviour when it is invalidated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Behavior {
    /// Locks are released (leader locks, as `consul lock` does).
    Release,
    /// Keys are deleted (semaphore contender keys, as `consul lock -n` does).
    Delete,
}

/// One KV operation of a transaction.
#[derive(Clone, Copy, Debug)]
pub(crate) enum TxnOp<'a> {
    /// Acquire `key` with `session` (the `lock` verb), setting value and flags.
    Lock {
        key: &'a str,
        session: &'a str,
        value: &'a [u8],
        flags: u64,
    },
    /// Release `key` held by `session` (the `unlock` verb).
    Unlock {
        key: &'a str,
        session: &'a str,
        flags: u64,
    },
    /// Set `key` if its ModifyIndex is still `index` (0: if it does not exist).
    Cas {
        key: &'a str,
        value: &'a [u8],
        flags: u64,
        index: u64,
    },
    /// Delete `key`.
    Delete { key: &'a str },
    /// Fail the transaction if `key` exists (the `check-not-exists` verb).
    CheckNotExists { key: &'a str },
    /// Fail the transaction unless `key` exists with ModifyIndex `index` (the `check-index`
    /// verb).
    CheckIndex { key: &'a str, index: u64 },
}

impl TxnOp<'_> {
    pub(crate) fn to_json(self) -> serde_json::Value {
        let b64 = |v: &[u8]| base64::engine::general_purpose::STANDARD.encode(v);
        let kv = match self {
            TxnOp::Lock {
                key,
                session,
                value,
                flags,
            } => {
                serde_json::json!({"Verb": "lock", "Key": key, "Session": session, "Value": b64(value), "Flags": flags})
            }
            TxnOp::Unlock {
                key,
                session,
                flags,
            } => {
                serde_json::json!({"Verb": "unlock", "Key": key, "Session": session, "Flags": flags})
            }
            TxnOp::Cas {
                key,
                value,
                flags,
                index,
            } => {
                serde_json::json!({"Verb": "cas", "Key": key, "Value": b64(value), "Flags": flags, "Index": index})
            }
            TxnOp::Delete { key } => serde_json::json!({"Verb": "delete", "Key": key}),
            TxnOp::CheckNotExists { key } => {
                serde_json::json!({"Verb": "check-not-exists", "Key": key})
            }
            TxnOp::CheckIndex { key, index } => {
                serde_json::json!({"Verb": "check-index", "Key": key, "Index": index})
            }
        };
        serde_json::json!({ "KV": kv })
    }
}

/// A blocking query: wait until the index moves past `index`, at most `wait`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Blocking {
    pub(crate) index: u64,
    pub(crate) wait: Duration,
}
