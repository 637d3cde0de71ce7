//! The model's state and every change Consul makes to it: what the servers keep in their
//! Raft-replicated store (KV entries and their tombstones, sessions, the catalog's view of the
//! agent's checks, the table indexes) and what the local agent keeps (its TTL checks and the
//! services they belong to), plus the leader's own memory (session timers, lock-delays).
//!
//! Each function is one request or one timer of Consul, with the semantics of Consul 1.8's
//! `agent/consul/state` (`kvs.go`, `session.go`, `catalog.go`), `session_ttl.go` and the agent's
//! TTL checks. Time is passed in (`now`, a `tokio::time::Instant`), so the state machine is tested
//! without a clock. Every write takes the next Raft index; a change to the KV store or the
//! sessions stamps that index on what it changed and on the table index, exactly as Consul does,
//! because the client compares `ModifyIndex`, `LockIndex` and `X-Consul-Index` values.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use super::wire::{go_quote, parse_go_duration, parse_uuid, session_lookup_error};
use crate::rng::Rng;

/// The node check every session is tied to by default; always passing in the model.
pub(crate) const SERF_HEALTH: &str = "serfHealth";
/// Consul's `session_ttl_min` (default) and `structs.SessionTTLMax`.
const SESSION_TTL_MIN: Duration = Duration::from_secs(10);
const SESSION_TTL_MAX: Duration = Duration::from_secs(86_400);
/// `structs.MaxLockDelay`: a longer lock-delay is applied as this.
const MAX_LOCK_DELAY: Duration = Duration::from_secs(60);
/// The agent's `CheckDeregisterIntervalMin`: a shorter `DeregisterCriticalServiceAfter` is
/// raised to it.
const REAP_MIN: Duration = Duration::from_secs(60);
/// The agent's `CheckReapInterval`: how often it looks for services to reap.
const REAP_INTERVAL: Duration = Duration::from_secs(30);
/// What every server request answers while no server leads.
pub(crate) const NO_LEADER: &str = "No cluster leader";
/// The Raft index before the model's first write: a fresh dev agent has made a dozen writes of
/// its own before a client's first one, and 1 means "no index" in Consul's answers.
const FIRST_INDEX: u64 = 9;

/// One KV entry (`structs.DirEntry`).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Entry {
    /// The key.
    pub key: String,
    /// The flags its last writer set.
    pub flags: u64,
    /// The value (empty reads as `null`).
    pub value: Vec<u8>,
    /// The session holding it; empty if none.
    pub session: String,
    /// How many times it was acquired.
    pub lock_index: u64,
    /// The index of the write that created it.
    pub create_index: u64,
    /// The index of its last change.
    pub modify_index: u64,
}

impl Entry {
    pub(crate) fn new(key: &str, flags: u64, value: Vec<u8>) -> Entry {
        Entry {
            key: key.to_owned(),
            flags,
            value,
            session: String::new(),
            lock_index: 0,
            create_index: 0,
            modify_index: 0,
        }
    }

    /// `DirEntry.Equal`: a write of an equal entry changes nothing, not even the index.
    fn same_content(&self, other: &Entry) -> bool {
        self.lock_index == other.lock_index
            && self.key == other.key
            && self.flags == other.flags
            && self.value == other.value
            && self.session == other.session
    }

    /// The session holding the key, if any.
    pub fn holder(&self) -> Option<&str> {
        Some(self.session.as_str()).filter(|s| !s.is_empty())
    }
}

/// What happens to a session's keys when it is invalidated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Behavior {
    /// Its locks are released (the keys stay).
    Release,
    /// Its keys are deleted.
    Delete,
}

impl Behavior {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Behavior::Release => "release",
            Behavior::Delete => "delete",
        }
    }
}

/// A session (`structs.Session`) and the leader's timer of it.
#[derive(Clone, Debug)]
pub(crate) struct Session {
    pub(crate) id: String,
    pub(crate) name: String,
    pub(crate) node: String,
    /// Nanoseconds, as given (applied at most [`MAX_LOCK_DELAY`]).
    pub(crate) lock_delay: i64,
    pub(crate) behavior: Behavior,
    /// As given (`""`: none).
    pub(crate) ttl: String,
    ttl_duration: Option<Duration>,
    pub(crate) node_checks: Vec<String>,
    pub(crate) service_checks: Option<Vec<String>>,
    pub(crate) create_index: u64,
    pub(crate) modify_index: u64,
    /// When the leader's timer invalidates it: TTL × multiplier after the last renewal.
    expires: Option<Instant>,
}

impl Session {
    fn checks(&self) -> impl Iterator<Item = &String> {
        self.node_checks
            .iter()
            .chain(self.service_checks.iter().flatten())
    }
}

/// A session create request, as the HTTP endpoint decoded it.
#[derive(Clone, Debug, Default)]
pub(crate) struct NewSession {
    pub(crate) name: String,
    pub(crate) node: Option<String>,
    /// Nanoseconds.
    pub(crate) lock_delay: i64,
    /// As given; `""` is `release`.
    pub(crate) behavior: String,
    pub(crate) ttl: String,
    pub(crate) node_checks: Vec<String>,
    pub(crate) service_checks: Option<Vec<String>>,
}

/// A check's health.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckStatus {
    /// Passing.
    Passing,
    /// Warning (sessions tied to it stay valid).
    Warning,
    /// Critical: every session tied to it is invalidated.
    Critical,
}

impl CheckStatus {
    pub(crate) fn parse(text: &str) -> Option<CheckStatus> {
        match text {
            "passing" => Some(CheckStatus::Passing),
            "warning" => Some(CheckStatus::Warning),
            "critical" => Some(CheckStatus::Critical),
            _ => None,
        }
    }
}

/// A TTL check of the local agent.
#[derive(Clone, Debug)]
struct AgentCheck {
    service: String,
    ttl: Duration,
    status: CheckStatus,
    /// When it turns critical unless passed: TTL after its registration or last pass. The
    /// agent's timer is not re-armed by its expiry, only by the next pass.
    expires: Option<Instant>,
    critical_since: Option<Instant>,
    /// `DeregisterCriticalServiceAfter`, at least [`REAP_MIN`].
    reap_after: Option<Duration>,
}

/// A TTL check to register with a service.
#[derive(Clone, Debug)]
pub(crate) struct NewCheck {
    pub(crate) id: String,
    pub(crate) ttl: Duration,
    pub(crate) status: CheckStatus,
    pub(crate) reap_after: Option<Duration>,
}

/// What a session looks like to the checker.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SessionView {
    /// Its ID.
    pub id: String,
    /// Its name.
    pub name: String,
    /// Its behavior.
    pub behavior: Behavior,
    /// Its TTL, if it has one.
    pub ttl: Option<Duration>,
    /// Its lock-delay, as given.
    pub lock_delay: Duration,
    /// The checks it is tied to (node checks, then service checks).
    pub checks: Vec<String>,
    /// When its TTL invalidates it (if it has one and a leader runs its timer).
    pub expires: Option<Instant>,
    /// The keys it holds.
    pub holds: Vec<String>,
    /// The index that created it.
    pub create_index: u64,
}

/// What an agent check looks like to the checker.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct CheckView {
    /// The check's ID.
    pub id: String,
    /// The service it belongs to.
    pub service: String,
    /// Its status on the agent.
    pub status: CheckStatus,
    /// Its TTL.
    pub ttl: Duration,
    /// When it turns critical unless passed.
    pub expires: Option<Instant>,
}

/// A KV write as `PUT`/`DELETE /v1/kv/<key>` makes it (`KVS.Apply`).
#[derive(Clone, Debug)]
pub(crate) enum KvWrite {
    Set { entry: Entry },
    Cas { entry: Entry, index: u64 },
    Lock { entry: Entry },
    Unlock { entry: Entry },
    Delete { key: String },
    DeleteCas { key: String, index: u64 },
    DeleteTree { prefix: String },
}

/// Undo records of a transaction in progress.
#[derive(Debug)]
enum Undo {
    Entry(String, Option<Entry>),
    Tombstone(String, Option<u64>),
    KvIndex(u64),
}

/// Everything the model remembers.
#[derive(Debug)]
pub(crate) struct State {
    node: String,
    multiplier: f64,
    pub(crate) rng: Rng,
    leader: bool,
    /// When the agent started (its reap ticks count from here).
    started: Instant,
    raft_index: u64,
    kv: BTreeMap<String, Entry>,
    /// The index at which each deleted key was deleted (Consul's graveyard), so that a listing's
    /// index never goes back when a key goes. Never reaped here (Consul reaps after 15 min).
    tombstones: BTreeMap<String, u64>,
    /// The `kvs` and `tombstones` tables' index.
    kv_index: u64,
    sessions: BTreeMap<String, Session>,
    sessions_index: u64,
    lock_delays: BTreeMap<String, Instant>,
    services: BTreeMap<String, String>,
    agent_checks: BTreeMap<String, AgentCheck>,
    /// The catalog's copy of the agent's checks (synced at once while a leader exists).
    catalog_checks: BTreeMap<String, CheckStatus>,
    undo: Option<Vec<Undo>>,
}

impl State {
    pub(crate) fn new(node: String, multiplier: f64, seed: u64, now: Instant) -> State {
        State {
            node,
            multiplier,
            rng: Rng::new(seed),
            leader: true,
            started: now,
            raft_index: FIRST_INDEX,
            kv: BTreeMap::new(),
            tombstones: BTreeMap::new(),
            kv_index: 0,
            sessions: BTreeMap::new(),
            sessions_index: 0,
            lock_delays: BTreeMap::new(),
            services: BTreeMap::new(),
            agent_checks: BTreeMap::new(),
            catalog_checks: BTreeMap::new(),
            undo: None,
        }
    }

    /// The last Raft index applied.
    pub(crate) fn raft_index(&self) -> u64 {
        self.raft_index
    }

    pub(crate) fn has_leader(&self) -> bool {
        self.leader
    }

    fn next_index(&mut self) -> u64 {
        self.raft_index += 1;
        self.raft_index
    }

    fn leader(&self) -> Result<(), String> {
        if self.leader {
            Ok(())
        } else {
            Err(NO_LEADER.to_owned())
        }
    }

    // ---- KV primitives (recording undo records inside a transaction) ----

    fn put_entry(&mut self, entry: Entry) {
        let previous = self.kv.insert(entry.key.clone(), entry.clone());
        if let Some(undo) = &mut self.undo {
            undo.push(Undo::Entry(entry.key, previous));
        }
    }

    fn remove_entry(&mut self, key: &str) -> Option<Entry> {
        let previous = self.kv.remove(key);
        if let (Some(undo), Some(_)) = (&mut self.undo, &previous) {
            undo.push(Undo::Entry(key.to_owned(), previous.clone()));
        }
        previous
    }

    fn bury(&mut self, key: &str, index: u64) {
        let previous = self.tombstones.insert(key.to_owned(), index);
        if let Some(undo) = &mut self.undo {
            undo.push(Undo::Tombstone(key.to_owned(), previous));
        }
    }

    fn set_kv_index(&mut self, index: u64) {
        if let Some(undo) = &mut self.undo {
            undo.push(Undo::KvIndex(self.kv_index));
        }
        self.kv_index = self.kv_index.max(index);
    }

    /// Starts a transaction: every KV change from here on can be rolled back.
    pub(crate) fn begin(&mut self) {
        self.undo = Some(Vec::new());
    }

    /// Ends the transaction, keeping its changes.
    pub(crate) fn commit(&mut self) {
        self.undo = None;
    }

    /// Ends the transaction, undoing its changes.
    pub(crate) fn rollback(&mut self) {
        let Some(undo) = self.undo.take() else {
            return;
        };
        for record in undo.into_iter().rev() {
            match record {
                Undo::Entry(key, Some(entry)) => {
                    self.kv.insert(key, entry);
                }
                Undo::Entry(key, None) => {
                    self.kv.remove(&key);
                }
                Undo::Tombstone(key, Some(index)) => {
                    self.tombstones.insert(key, index);
                }
                Undo::Tombstone(key, None) => {
                    self.tombstones.remove(&key);
                }
                Undo::KvIndex(index) => self.kv_index = index,
            }
        }
    }

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

    fn keys_under<'a>(&'a self, prefix: &'a str) -> impl Iterator<Item = &'a Entry> + 'a {
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

    // ---- Sessions, as Session.Apply and state/session.go ----

    /// `Session.Apply` (create): validates, then creates the session and starts its timer.
    pub(crate) fn session_create(
        &mut self,
        now: Instant,
        new: NewSession,
    ) -> Result<String, String> {
        self.leader()?;
        let behavior = match new.behavior.as_str() {
            "" | "release" => Behavior::Release,
            "delete" => Behavior::Delete,
            other => return Err(format!("Invalid Behavior setting '{other}'")),
        };
        let mut ttl_duration = None;
        if !new.ttl.is_empty() {
            let ttl = parse_go_duration(&new.ttl)
                .map_err(|e| format!("Session TTL '{}' invalid: {e}", new.ttl))?;
            let in_range = u64::try_from(ttl).is_ok_and(|ns| {
                let ttl = Duration::from_nanos(ns);
                (SESSION_TTL_MIN..=SESSION_TTL_MAX).contains(&ttl)
            });
            if ttl != 0 && !in_range {
                return Err(format!(
                    "Invalid Session TTL '{ttl}', must be between [10s=24h0m0s]"
                ));
            }
            ttl_duration = u64::try_from(ttl)
                .ok()
                .filter(|ns| *ns > 0)
                .map(Duration::from_nanos);
        }
        let node = new.node.unwrap_or_else(|| self.node.clone());
        if node != self.node {
            return Err("Missing node registration".to_owned());
        }
        for check in new
            .node_checks
            .iter()
            .chain(new.service_checks.iter().flatten())
        {
            match self.check_status(check) {
                None => return Err(format!("Missing check '{check}' registration")),
                Some(CheckStatus::Critical) => {
                    return Err(format!("Check '{check}' is in critical state"));
                }
                Some(_) => {}
            }
        }
        let id = loop {
            let id = self.rng.uuid();
            if !self.sessions.contains_key(&id) {
                break id;
            }
        };
        let index = self.next_index();
        let expires = ttl_duration.map(|ttl| now + ttl.mul_f64(self.multiplier));
        self.sessions.insert(
            id.clone(),
            Session {
                id: id.clone(),
                name: new.name,
                node,
                lock_delay: new.lock_delay,
                behavior,
                ttl: new.ttl,
                ttl_duration,
                node_checks: new.node_checks,
                service_checks: new.service_checks,
                create_index: index,
                modify_index: index,
                expires,
            },
        );
        self.sessions_index = index;
        Ok(id)
    }

    fn check_status(&self, id: &str) -> Option<CheckStatus> {
        if id == SERF_HEALTH {
            return Some(CheckStatus::Passing);
        }
        self.catalog_checks.get(id).copied()
    }

    fn session_id(id: &str) -> Result<String, String> {
        parse_uuid(id).map_err(|e| session_lookup_error(&e))
    }

    /// `Session.Renew`: restarts the session's timer; `None` if it does not exist.
    pub(crate) fn session_renew(
        &mut self,
        now: Instant,
        id: &str,
    ) -> Result<Option<Session>, String> {
        self.leader()?;
        let id = Self::session_id(id)?;
        let multiplier = self.multiplier;
        Ok(self.sessions.get_mut(&id).map(|session| {
            if let Some(ttl) = session.ttl_duration {
                session.expires = Some(now + ttl.mul_f64(multiplier));
            }
            session.clone()
        }))
    }

    /// `Session.Get`: the session (if any) and the sessions table's index.
    pub(crate) fn session_info(&self, id: &str) -> Result<(u64, Option<Session>), String> {
        self.leader()?;
        let id = Self::session_id(id)?;
        Ok((self.sessions_index.max(1), self.sessions.get(&id).cloned()))
    }

    /// `Session.List`: every session, in ID order.
    pub(crate) fn session_list(&self) -> Result<(u64, Vec<Session>), String> {
        self.leader()?;
        Ok((
            self.sessions_index.max(1),
            self.sessions.values().cloned().collect(),
        ))
    }

    /// `Session.Apply` (destroy): invalidates the session if it exists.
    pub(crate) fn session_destroy(&mut self, now: Instant, id: &str) -> Result<(), String> {
        self.leader()?;
        let id = Self::session_id(id)?;
        let index = self.next_index();
        self.invalidate(now, index, &id);
        Ok(())
    }

    /// `deleteSessionTxn`: removes the session and, as its behavior says, releases or deletes the
    /// keys it holds, each then under its lock-delay.
    fn invalidate(&mut self, now: Instant, index: u64, id: &str) -> bool {
        let Some(session) = self.sessions.remove(id) else {
            return false;
        };
        self.sessions_index = index;
        let delay = u64::try_from(session.lock_delay)
            .map(Duration::from_nanos)
            .unwrap_or_default()
            .min(MAX_LOCK_DELAY);
        let held: Vec<Entry> = (self.kv.values())
            .filter(|e| e.session == session.id)
            .cloned()
            .collect();
        for mut entry in held {
            let key = entry.key.clone();
            match session.behavior {
                Behavior::Release => {
                    entry.session = String::new();
                    self.kv_set(index, entry, true);
                }
                Behavior::Delete => self.kv_delete(index, &key),
            }
            if !delay.is_zero() {
                self.lock_delays.insert(key, now + delay);
            }
        }
        true
    }

    // ---- The agent's checks and their sync to the catalog ----

    /// `PUT /v1/agent/service/register`: the service and its TTL check (started now).
    pub(crate) fn register_service(
        &mut self,
        now: Instant,
        service: &str,
        check: Option<NewCheck>,
    ) {
        self.services.insert(service.to_owned(), service.to_owned());
        if let Some(check) = check {
            let critical = check.status == CheckStatus::Critical;
            self.agent_checks.insert(
                check.id,
                AgentCheck {
                    service: service.to_owned(),
                    ttl: check.ttl,
                    status: check.status,
                    expires: now.checked_add(check.ttl),
                    critical_since: critical.then_some(now),
                    reap_after: check.reap_after.map(|after| after.max(REAP_MIN)),
                },
            );
        }
        self.sync(now);
    }

    /// `PUT /v1/agent/check/pass/<id>`: the check passes and its timer restarts.
    pub(crate) fn check_pass(&mut self, now: Instant, id: &str) -> Result<(), String> {
        let Some(check) = self.agent_checks.get_mut(id) else {
            return Err(format!(
                "CheckID {} does not have associated TTL",
                go_quote(id)
            ));
        };
        check.status = CheckStatus::Passing;
        check.expires = now.checked_add(check.ttl);
        check.critical_since = None;
        self.sync(now);
        Ok(())
    }

    /// `PUT /v1/agent/service/deregister/<id>`: the service and its checks go (a service the
    /// agent does not know is no error).
    pub(crate) fn deregister_service(&mut self, now: Instant, service: &str) {
        if self.services.remove(service).is_none() {
            return;
        }
        self.agent_checks
            .retain(|_, check| check.service != service);
        self.sync(now);
    }

    /// The agent's anti-entropy: the catalog takes each check's status from the agent (every
    /// session tied to a check that turns critical or goes is invalidated), while a leader exists.
    fn sync(&mut self, now: Instant) {
        if !self.leader {
            return;
        }
        let changed: Vec<(String, CheckStatus)> = (self.agent_checks.iter())
            .filter(|(id, check)| self.catalog_checks.get(*id) != Some(&check.status))
            .map(|(id, check)| (id.clone(), check.status))
            .collect();
        for (id, status) in changed {
            let index = self.next_index();
            self.catalog_checks.insert(id.clone(), status);
            if status == CheckStatus::Critical {
                self.invalidate_tied(now, index, &id);
            }
        }
        let gone: Vec<String> = (self.catalog_checks.keys())
            .filter(|id| !self.agent_checks.contains_key(*id))
            .cloned()
            .collect();
        for id in gone {
            let index = self.next_index();
            self.catalog_checks.remove(&id);
            self.invalidate_tied(now, index, &id);
        }
    }

    fn invalidate_tied(&mut self, now: Instant, index: u64, check: &str) {
        let tied: Vec<String> = (self.sessions.values())
            .filter(|s| s.checks().any(|c| c == check))
            .map(|s| s.id.clone())
            .collect();
        for id in tied {
            self.invalidate(now, index, &id);
        }
    }

    // ---- Timers ----

    /// When an agent check with `critical_since` is reaped: at the first reap tick past its
    /// `reap_after`.
    fn reap_at(&self, check: &AgentCheck) -> Option<Instant> {
        let since = check.critical_since?;
        let after = check.reap_after?;
        let base = since.checked_add(after)?;
        let elapsed = base.saturating_duration_since(self.started);
        let ticks = u32::try_from(elapsed.as_nanos() / REAP_INTERVAL.as_nanos()).ok()?;
        let tick = REAP_INTERVAL.checked_mul(ticks.checked_add(1)?)?;
        self.started.checked_add(tick)
    }

    /// The next instant a timer fires: a session's TTL (while a leader runs the timers), an agent
    /// check's TTL, a reap.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        let sessions = (self.sessions.values())
            .filter_map(|s| s.expires)
            .filter(|_| self.leader);
        let checks = self.agent_checks.values().filter_map(|c| c.expires);
        let reaps = (self.agent_checks.values()).filter_map(|c| self.reap_at(c));
        sessions.chain(checks).chain(reaps).min()
    }

    /// Fires every timer due at `now`, in the order they fell due.
    pub(crate) fn fire_timers(&mut self, now: Instant) {
        #[derive(PartialEq, Eq, PartialOrd, Ord)]
        enum Timer {
            Session(String),
            Check(String),
            Reap(String),
        }
        let mut due: Vec<(Instant, Timer)> = Vec::new();
        if self.leader {
            for session in self.sessions.values() {
                if let Some(at) = session.expires.filter(|at| *at <= now) {
                    due.push((at, Timer::Session(session.id.clone())));
                }
            }
        }
        for (id, check) in &self.agent_checks {
            if let Some(at) = check.expires.filter(|at| *at <= now) {
                due.push((at, Timer::Check(id.clone())));
            }
            if let Some(at) = self.reap_at(check).filter(|at| *at <= now) {
                due.push((at, Timer::Reap(id.clone())));
            }
        }
        due.sort();
        for (at, timer) in due {
            match timer {
                Timer::Session(id) => {
                    let still_due = self.sessions.get(&id).and_then(|s| s.expires) == Some(at);
                    if still_due && self.leader {
                        let index = self.next_index();
                        self.invalidate(now, index, &id);
                    }
                }
                Timer::Check(id) => {
                    if let Some(check) = self.agent_checks.get_mut(&id) {
                        if check.expires == Some(at) {
                            check.status = CheckStatus::Critical;
                            check.expires = None;
                            check.critical_since = Some(at);
                            self.sync(now);
                        }
                    }
                }
                Timer::Reap(id) => {
                    let reap = self.agent_checks.get(&id).and_then(|c| self.reap_at(c));
                    if reap == Some(at) {
                        if let Some(service) = self.agent_checks.get(&id).map(|c| c.service.clone())
                        {
                            self.deregister_service(now, &service);
                        }
                    }
                }
            }
        }
    }

    // ---- Leadership ----

    /// The servers lose their leader: server requests answer "No cluster leader", session timers
    /// stop, the agent's check changes wait for a leader to sync to.
    pub(crate) fn lose_leader(&mut self) {
        self.leader = false;
    }

    /// A (new) leader takes over: every TTL session's timer restarts from now
    /// (`initializeSessionTimers`), and the agent syncs what changed meanwhile.
    pub(crate) fn elect_leader(&mut self, now: Instant) {
        self.leader = true;
        let multiplier = self.multiplier;
        for session in self.sessions.values_mut() {
            if let Some(ttl) = session.ttl_duration {
                session.expires = Some(now + ttl.mul_f64(multiplier));
            }
        }
        self.sync(now);
    }

    // ---- Operator actions and inspection ----

    /// An operator's session destroy; whether the session existed.
    pub(crate) fn operator_destroy(&mut self, now: Instant, id: &str) -> bool {
        let existed = self.sessions.contains_key(id);
        existed && self.session_destroy(now, id).is_ok()
    }

    /// An operator's delete of one key; whether it existed.
    pub(crate) fn operator_delete(&mut self, now: Instant, key: &str) -> bool {
        let existed = self.kv.contains_key(key);
        let key = key.to_owned();
        existed && self.kv_apply(now, KvWrite::Delete { key }).is_ok()
    }

    /// An operator's recursive delete; how many keys went.
    pub(crate) fn operator_delete_prefix(&mut self, now: Instant, prefix: &str) -> usize {
        let count = self.keys_under(prefix).count();
        let prefix = prefix.to_owned();
        match self.kv_apply(now, KvWrite::DeleteTree { prefix }) {
            Ok(_) => count,
            Err(_) => 0,
        }
    }

    /// An operator deregisters a check's service on the agent (as an agent restart that lost it
    /// would): the sessions tied to it are invalidated.
    pub(crate) fn operator_deregister_check(&mut self, now: Instant, check: &str) -> bool {
        let Some(service) = self.agent_checks.get(check).map(|c| c.service.clone()) else {
            return false;
        };
        self.deregister_service(now, &service);
        true
    }

    pub(crate) fn sessions_view(&self) -> Vec<SessionView> {
        (self.sessions.values())
            .map(|s| SessionView {
                id: s.id.clone(),
                name: s.name.clone(),
                behavior: s.behavior,
                ttl: s.ttl_duration,
                lock_delay: u64::try_from(s.lock_delay)
                    .map(Duration::from_nanos)
                    .unwrap_or_default(),
                checks: s.checks().cloned().collect(),
                expires: s.expires.filter(|_| self.leader),
                holds: (self.kv.values())
                    .filter(|e| e.session == s.id)
                    .map(|e| e.key.clone())
                    .collect(),
                create_index: s.create_index,
            })
            .collect()
    }

    pub(crate) fn keys_view(&self) -> Vec<Entry> {
        self.kv.values().cloned().collect()
    }

    pub(crate) fn checks_view(&self) -> Vec<CheckView> {
        (self.agent_checks.iter())
            .map(|(id, c)| CheckView {
                id: id.clone(),
                service: c.service.clone(),
                status: c.status,
                ttl: c.ttl,
                expires: c.expires,
            })
            .collect()
    }
}
