//! The KV store, as Consul's `state/kvs.go` and `KVS.Apply` keep it: sets, deletes, CAS, lock
//! and unlock with their indexes and tombstones, and the reads with the index each answers at.

use tokio::time::Instant;

use super::{Entry, KvWrite, State};
use crate::consul::wire::{go_quote, parse_uuid, session_lookup_error};

impl State {
    // ---- KV, as state/kvs.go ----

    pub(crate) fn entry(&self, key: &str) -> Option<&Entry> {
        self.kv.get(key)
    }

    /// `kvsSetTxn`: writes `entry` at `index`, keeping the existing session unless
    /// `update_session`; an equal entry is not written. Returns the entry as stored.
    pub(crate) fn kv_set(&mut self, index: u64, mut entry: Entry, update_session: bool) -> Entry {
        let existing = self.kv.get(&entry.key);
        entry.create_index = existing.map_or(index, |e| e.create_index);
        if !update_session {
            entry.session = existing.map(|e| e.session.clone()).unwrap_or_default();
        }
        if let Some(existing) = existing {
            if existing.same_content(&entry) {
                entry.modify_index = existing.modify_index;
                return entry;
            }
        }
        entry.modify_index = index;
        self.put_entry(entry.clone());
        self.set_kv_index(index);
        entry
    }

    /// `kvsDeleteTxn`: deletes `key` (leaving a tombstone) if it exists.
    pub(crate) fn kv_delete(&mut self, index: u64, key: &str) {
        if self.remove_entry(key).is_some() {
            self.bury(key, index);
            self.set_kv_index(index);
        }
    }

    /// `kvsDeleteCASTxn`: deletes `key` if its ModifyIndex is `cas`. True also when the key does
    /// not exist (Consul's answer).
    pub(crate) fn kv_delete_cas(&mut self, index: u64, cas: u64, key: &str) -> bool {
        match self.kv.get(key) {
            None => true,
            Some(e) if e.modify_index != cas => false,
            Some(_) => {
                self.kv_delete(index, key);
                true
            }
        }
    }

    /// `kvsDeleteTreeTxn`: deletes every key under `prefix`.
    pub(crate) fn kv_delete_tree(&mut self, index: u64, prefix: &str) {
        let keys: Vec<String> = self.keys_under(prefix).map(|e| e.key.clone()).collect();
        for key in keys {
            self.kv_delete(index, &key);
        }
    }

    /// `kvsSetCASTxn`: writes `entry` if the key's ModifyIndex is `cas` (0: if it does not exist).
    pub(crate) fn kv_set_cas(&mut self, index: u64, entry: Entry, cas: u64) -> Option<Entry> {
        match (self.kv.get(&entry.key), cas) {
            (Some(_), 0) | (None, 1..) => return None,
            (Some(e), cas) if e.modify_index != cas => return None,
            _ => {}
        }
        Some(self.kv_set(index, entry, false))
    }

    /// `kvsLockTxn`: acquires the key for `entry.session` (which must exist); `Ok(None)` if
    /// another session holds it.
    pub(crate) fn kv_lock(
        &mut self,
        index: u64,
        mut entry: Entry,
    ) -> Result<Option<Entry>, String> {
        if entry.session.is_empty() {
            return Err("missing session".to_owned());
        }
        let id = parse_uuid(&entry.session).map_err(|e| session_lookup_error(&e))?;
        if !self.sessions.contains_key(&id) {
            return Err(format!("invalid session {}", go_quote(&entry.session)));
        }
        match self.kv.get(&entry.key) {
            Some(e) if e.session == entry.session => {
                entry.create_index = e.create_index;
                entry.lock_index = e.lock_index;
            }
            Some(e) if !e.session.is_empty() => return Ok(None),
            Some(e) => {
                entry.create_index = e.create_index;
                entry.lock_index = e.lock_index + 1;
            }
            None => {
                entry.create_index = index;
                entry.lock_index = 1;
            }
        }
        entry.modify_index = index;
        Ok(Some(self.kv_set(index, entry, true)))
    }

    /// `kvsUnlockTxn`: releases the key if `entry.session` holds it.
    pub(crate) fn kv_unlock(
        &mut self,
        index: u64,
        mut entry: Entry,
    ) -> Result<Option<Entry>, String> {
        if entry.session.is_empty() {
            return Err("missing session".to_owned());
        }
        let Some(existing) = self.kv.get(&entry.key) else {
            return Ok(None);
        };
        if existing.session != entry.session {
            return Ok(None);
        }
        entry.session = String::new();
        entry.lock_index = existing.lock_index;
        entry.create_index = existing.create_index;
        entry.modify_index = index;
        Ok(Some(self.kv_set(index, entry, true)))
    }

    pub(super) fn keys_under<'a>(
        &'a self,
        prefix: &'a str,
    ) -> impl Iterator<Item = &'a Entry> + 'a {
        self.kv
            .range(prefix.to_owned()..)
            .take_while(move |(key, _)| key.starts_with(prefix))
            .map(|(_, entry)| entry)
    }

    /// `kvsListTxn`'s index: the highest index under `prefix` (entries and tombstones), or the
    /// table's when there is none or the prefix is empty.
    fn list_index(&self, prefix: &str) -> u64 {
        if prefix.is_empty() {
            return self.kv_index;
        }
        let entries = self.keys_under(prefix).map(|e| e.modify_index).max();
        let graves = (self.tombstones.range(prefix.to_owned()..))
            .take_while(|(key, _)| key.starts_with(prefix))
            .map(|(_, index)| *index)
            .max();
        match entries.max(graves) {
            Some(index) if index > 0 => index,
            _ => self.kv_index,
        }
    }

    /// `KVS.Get`: the entry and the index (its ModifyIndex, else the table's; at least 1).
    pub(crate) fn kv_get(&self, key: &str) -> Result<(u64, Option<Entry>), String> {
        self.leader()?;
        Ok(match self.kv.get(key) {
            Some(entry) => (entry.modify_index, Some(entry.clone())),
            None => (self.kv_index.max(1), None),
        })
    }

    /// `KVS.List`: the entries under `prefix`, in key order, and their index (at least 1).
    pub(crate) fn kv_list(&self, prefix: &str) -> Result<(u64, Vec<Entry>), String> {
        self.leader()?;
        let entries = self.keys_under(prefix).cloned().collect();
        Ok((self.list_index(prefix).max(1), entries))
    }

    /// `KVS.ListKeys`: the keys under `prefix`, cut after `separator` (if any) past the prefix.
    pub(crate) fn kv_keys(
        &self,
        prefix: &str,
        separator: &str,
    ) -> Result<(u64, Vec<String>), String> {
        self.leader()?;
        let mut keys: Vec<String> = Vec::new();
        for entry in self.keys_under(prefix) {
            let key = match entry.key[prefix.len()..].find(separator) {
                Some(at) if !separator.is_empty() => {
                    &entry.key[..prefix.len() + at + separator.len()]
                }
                _ => entry.key.as_str(),
            };
            if keys.last().is_none_or(|last| last != key) {
                keys.push(key.to_owned());
            }
        }
        Ok((self.list_index(prefix).max(1), keys))
    }

    /// Whether a lock of `key` is refused for its lock-delay.
    pub(crate) fn lock_delayed(&self, now: Instant, key: &str) -> bool {
        self.lock_delays.get(key).is_some_and(|until| *until > now)
    }

    /// Takes the Raft index of a write (a transaction's, whatever it does).
    pub(crate) fn apply_index(&mut self) -> Result<u64, String> {
        self.leader()?;
        Ok(self.next_index())
    }

    /// `KVS.Apply`: one KV write of the HTTP endpoint. `Ok(false)` for a refused CAS, lock or
    /// unlock (a lock under lock-delay is refused before it reaches Raft).
    pub(crate) fn kv_apply(&mut self, now: Instant, write: KvWrite) -> Result<bool, String> {
        self.leader()?;
        if let KvWrite::Lock { entry } = &write {
            if self.lock_delayed(now, &entry.key) {
                return Ok(false);
            }
        }
        let index = self.next_index();
        Ok(match write {
            KvWrite::Set { entry } => {
                self.kv_set(index, entry, false);
                true
            }
            KvWrite::Cas { entry, index: cas } => self.kv_set_cas(index, entry, cas).is_some(),
            KvWrite::Lock { entry } => self.kv_lock(index, entry)?.is_some(),
            KvWrite::Unlock { entry } => self.kv_unlock(index, entry)?.is_some(),
            KvWrite::Delete { key } => {
                self.kv_delete(index, &key);
                true
            }
            KvWrite::DeleteCas { key, index: cas } => self.kv_delete_cas(index, cas, &key),
            KvWrite::DeleteTree { prefix } => {
                self.kv_delete_tree(index, &prefix);
                true
            }
        })
    }
}
