//! The semaphore's state as Consul stores it: the JSON form of `<prefix>/.lock`, and a
//! [`Snapshot`] from one read of the prefix. The shapes themselves are lease-core's
//! (`lease_core::semaphore`), shared with its memory store.

use std::collections::{BTreeMap, BTreeSet};

use crate::wire::KvEntry;
use lease_core::semaphore::{
    LockValue, SEMAPHORE_FLAGS, Snapshot, Unreadable, contender_key, lock_key,
};

/// `<prefix>/`: the directory every key of the semaphore at `prefix` is in.
pub(crate) fn directory(prefix: &str) -> String {
    format!("{prefix}/")
}

/// Reads `.lock` in Consul's map form or the list form of Consul's semaphore guide; anything else
/// is refused, never guessed.
pub(crate) fn parse_lock(bytes: &[u8]) -> Result<LockValue, String> {
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

/// `.lock` in Consul's own format, so `consul lock -n` reads what we write.
pub(crate) fn encode_lock(value: &LockValue) -> Vec<u8> {
    let holders: serde_json::Map<String, serde_json::Value> = value
        .holders
        .iter()
        .map(|s| (s.clone(), serde_json::Value::Bool(true)))
        .collect();
    serde_json::json!({"Limit": value.limit, "Holders": holders})
        .to_string()
        .into_bytes()
}

/// What one consistent read of the prefix (`entries`, answered at `index`) says. Only the
/// keys in the semaphore's directory count: a read of `jobs/a` also lists `jobs/ab/…`, whose
/// holders are another semaphore's (they once made `jobs/a` look like a `.lock` deleted under
/// live holders, and settle).
pub(super) fn read_snapshot(prefix: &str, entries: &[KvEntry], index: u64) -> Snapshot {
    let lock_key = lock_key(prefix);
    let directory = directory(prefix);
    let mut lock = Ok(None);
    let mut lock_created = None;
    let mut live = BTreeSet::new();
    let mut contenders = BTreeMap::new();
    for entry in entries.iter().filter(|e| e.key.starts_with(&directory)) {
        if entry.key == lock_key {
            lock = read_lock(entry).map(Some);
            lock_created = Some(entry.create_index);
        } else if let Some(holder) = entry.holder() {
            live.insert(holder.to_owned());
            if entry.key == contender_key(prefix, holder) {
                contenders.insert(holder.to_owned(), entry.lock_index);
            }
        }
    }
    let snapshot = Snapshot {
        lock,
        live,
        contenders,
        index,
        lock_created,
    };
    // Every look this process takes at the holder set passes here.
    lease_core::metrics::semaphore_slots_in_use(
        lease_core::BackendKind::Consul,
        prefix,
        snapshot.live_holders().len(),
    );
    snapshot
}

fn read_lock(entry: &KvEntry) -> Result<(u64, LockValue), Unreadable> {
    if entry.flags != SEMAPHORE_FLAGS {
        return Err(Unreadable::Flags(entry.flags));
    }
    let bytes = entry.decoded_value().map_err(Unreadable::Corrupt)?;
    let value = parse_lock(&bytes).map_err(Unreadable::Corrupt)?;
    Ok((entry.modify_index, value))
}

#[cfg(test)]
mod tests;
