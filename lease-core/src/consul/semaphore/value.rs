//! The semaphore's state in Consul: the format of `<prefix>/.lock`, and what one read of the
//! prefix says about it.

use std::collections::{BTreeSet, HashMap, HashSet};

use crate::Error;
use crate::consul::http::KvEntry;

/// The flags `consul lock -n` (and Consul's Go `api.Semaphore`) put on its keys.
pub(crate) const SEMAPHORE_FLAGS: u64 = 0xe0f6_9a2b_aa41_4de0;

pub(super) fn lock_key(prefix: &str) -> String {
    format!("{prefix}/.lock")
}

pub(super) fn contender_key(prefix: &str, session: &str) -> String {
    format!("{prefix}/{session}")
}

/// The decoded value of `<prefix>/.lock`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct LockValue {
    pub(super) limit: u64,
    pub(super) holders: BTreeSet<String>,
}

impl LockValue {
    /// Reads Consul's map form and the seed's list form; anything else is refused, never guessed.
    pub(super) fn parse(bytes: &[u8]) -> Result<LockValue, String> {
        let value: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|e| format!("not JSON: {e}"))?;
        let object = value.as_object().ok_or("not a JSON object")?;
        let limit = match object.get("Limit") {
            None => return Err("no \"Limit\"".into()),
            Some(l) if l.as_i64().is_some_and(|l| l < 0) => {
                return Err(format!("negative \"Limit\" {l}"));
            }
            Some(l) => l
                .as_u64()
                .ok_or_else(|| format!("\"Limit\" {l} is not a whole number"))?,
        };
        if limit == 0 {
            return Err("\"Limit\" is 0".into());
        }
        let holders = match object.get("Holders") {
            None | Some(serde_json::Value::Null) => BTreeSet::new(),
            Some(serde_json::Value::Object(map)) => {
                let mut holders = BTreeSet::new();
                for (session, held) in map {
                    match held.as_bool() {
                        Some(true) => {
                            holders.insert(session.clone());
                        }
                        Some(false) => {}
                        None => {
                            return Err(format!(
                                "\"Holders\" maps {session:?} to {held}, not a boolean"
                            ));
                        }
                    }
                }
                holders
            }
            Some(serde_json::Value::Array(list)) => list
                .iter()
                .map(|s| {
                    s.as_str()
                        .map(str::to_owned)
                        .ok_or_else(|| format!("\"Holders\" lists {s}, not a session ID"))
                })
                .collect::<Result<_, _>>()?,
            Some(other) => {
                return Err(format!("\"Holders\" is {other}, neither a map nor a list"));
            }
        };
        Ok(LockValue { limit, holders })
    }

    /// Consul's own format, so `consul lock -n` reads what we write.
    pub(super) fn encode(&self) -> Vec<u8> {
        let holders: serde_json::Map<String, serde_json::Value> = self
            .holders
            .iter()
            .map(|s| (s.clone(), serde_json::Value::Bool(true)))
            .collect();
        serde_json::json!({"Limit": self.limit, "Holders": holders})
            .to_string()
            .into_bytes()
    }
}

/// Why a lock key must be left alone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Unreadable {
    /// It carries another kind of lock's flags.
    Flags(u64),
    /// Its value cannot be parsed.
    Corrupt(String),
}

impl Unreadable {
    pub(super) fn to_error(&self, prefix: &str) -> Error {
        let key = lock_key(prefix);
        match self {
            Unreadable::Flags(found) => Error::FlagsConflict {
                key,
                found: *found,
                expected: SEMAPHORE_FLAGS,
            },
            Unreadable::Corrupt(reason) => Error::CorruptLockValue {
                key,
                reason: reason.clone(),
            },
        }
    }
}

/// The semaphore as one consistent read of its prefix showed it.
#[derive(Clone, Debug)]
pub(super) struct Snapshot {
    /// The lock key's ModifyIndex and value; `Ok(None)` if it does not exist.
    pub(super) lock: Result<Option<(u64, LockValue)>, Unreadable>,
    /// Sessions holding some key under the prefix: the holders still alive.
    pub(super) live: HashSet<String>,
    /// Sessions holding their own contender key, with its LockIndex.
    pub(super) contenders: HashMap<String, u64>,
    /// The index to block on for the next change.
    pub(super) index: u64,
}

impl Snapshot {
    pub(super) fn read(prefix: &str, entries: &[KvEntry], index: u64) -> Snapshot {
        let lock_key = lock_key(prefix);
        let mut lock = Ok(None);
        let mut live = HashSet::new();
        let mut contenders = HashMap::new();
        for entry in entries {
            if entry.key == lock_key {
                lock = read_lock(entry).map(Some);
            } else if let Some(holder) = entry.holder() {
                live.insert(holder.to_owned());
                if entry.key == contender_key(prefix, holder) {
                    contenders.insert(holder.to_owned(), entry.lock_index);
                }
            }
        }
        Snapshot {
            lock,
            live,
            contenders,
            index,
        }
    }

    /// The stored limit, if the lock key exists and is readable.
    pub(super) fn limit(&self) -> Option<u64> {
        match &self.lock {
            Ok(Some((_, value))) => Some(value.limit),
            _ => None,
        }
    }

    /// The recorded holders whose sessions still hold a key; the others are dead and pruned.
    pub(super) fn live_holders(&self) -> BTreeSet<String> {
        match &self.lock {
            Ok(Some((_, value))) => value
                .holders
                .iter()
                .filter(|h| self.live.contains(*h))
                .cloned()
                .collect(),
            _ => BTreeSet::new(),
        }
    }

    /// Whether `session` is recorded as a holder.
    pub(super) fn records_holder(&self, session: &str) -> bool {
        matches!(&self.lock, Ok(Some((_, value))) if value.holders.contains(session))
    }
}

fn read_lock(entry: &KvEntry) -> Result<(u64, LockValue), Unreadable> {
    if entry.flags != SEMAPHORE_FLAGS {
        return Err(Unreadable::Flags(entry.flags));
    }
    let bytes = entry.decoded_value().map_err(Unreadable::Corrupt)?;
    let value = LockValue::parse(&bytes).map_err(Unreadable::Corrupt)?;
    Ok((entry.modify_index, value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_both_holder_forms_and_writes_consuls() {
        let map = LockValue::parse(br#"{"Limit":3,"Holders":{"a":true,"b":true}}"#).unwrap();
        let list = LockValue::parse(br#"{"Limit":3,"Holders":["a","b"]}"#).unwrap();
        assert_eq!(map, list);
        assert_eq!(
            map.encode(),
            br#"{"Holders":{"a":true,"b":true},"Limit":3}"#.to_vec()
        );
        assert_eq!(LockValue::parse(&map.encode()).unwrap(), map);
        assert!(
            LockValue::parse(br#"{"Limit":1,"Holders":null}"#)
                .unwrap()
                .holders
                .is_empty()
        );
    }

    #[test]
    fn refuses_what_it_cannot_read() {
        for bad in [
            &b"\xff\x00garbage"[..],
            b"[1,2]",
            br#"{"Holders":{}}"#,
            br#"{"Limit":-2,"Holders":{}}"#,
            br#"{"Limit":0}"#,
            br#"{"Limit":2.5}"#,
            br#"{"Limit":"3"}"#,
            br#"{"Limit":3,"Holders":"a"}"#,
            br#"{"Limit":3,"Holders":[1]}"#,
            br#"{"Limit":3,"Holders":{"a":"yes"}}"#,
        ] {
            assert!(
                LockValue::parse(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
