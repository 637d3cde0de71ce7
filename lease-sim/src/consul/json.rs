//! The JSON shapes of Consul's answers: a KV entry and a session as Consul 1.8 writes them.

use base64::Engine as _;
use serde::Serialize;

use super::state::{Entry, Session};

/// A KV entry as Consul's JSON shows it (`structs.DirEntry`).
#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct EntryJson<'a> {
    lock_index: u64,
    key: &'a str,
    flags: u64,
    /// Base64; `null` for an empty value.
    value: Option<String>,
    #[serde(skip_serializing_if = "str::is_empty")]
    session: &'a str,
    create_index: u64,
    modify_index: u64,
}

impl<'a> EntryJson<'a> {
    /// `entry` as a read shows it.
    pub(crate) fn new(entry: &'a Entry) -> Self {
        EntryJson {
            lock_index: entry.lock_index,
            key: &entry.key,
            flags: entry.flags,
            value: (!entry.value.is_empty())
                .then(|| base64::engine::general_purpose::STANDARD.encode(&entry.value)),
            session: &entry.session,
            create_index: entry.create_index,
            modify_index: entry.modify_index,
        }
    }

    /// `entry` as a transaction's result shows it: the value blanked out.
    pub(crate) fn without_value(entry: &'a Entry) -> Self {
        EntryJson {
            value: None,
            ..EntryJson::new(entry)
        }
    }
}

/// A session as Consul 1.8's JSON shows it (`structs.Session`).
#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct SessionJson<'a> {
    #[serde(rename = "ID")]
    id: &'a str,
    name: &'a str,
    node: &'a str,
    /// Nanoseconds.
    lock_delay: i64,
    behavior: &'static str,
    #[serde(rename = "TTL")]
    ttl: &'a str,
    node_checks: &'a [String],
    service_checks: Option<Vec<ServiceCheckJson<'a>>>,
    create_index: u64,
    modify_index: u64,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct ServiceCheckJson<'a> {
    #[serde(rename = "ID")]
    id: &'a str,
    namespace: &'static str,
}

impl<'a> SessionJson<'a> {
    pub(crate) fn new(session: &'a Session) -> Self {
        SessionJson {
            id: &session.id,
            name: &session.name,
            node: &session.node,
            lock_delay: session.lock_delay,
            behavior: session.behavior.as_str(),
            ttl: &session.ttl,
            node_checks: &session.node_checks,
            service_checks: session.service_checks.as_ref().map(|checks| {
                checks
                    .iter()
                    .map(|id| ServiceCheckJson { id, namespace: "" })
                    .collect()
            }),
            create_index: session.create_index,
            modify_index: session.modify_index,
        }
    }
}
