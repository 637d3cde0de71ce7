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

use crate::rng::Rng;

mod kv;
mod session;

/// The node check every session is tied to by default; always passing in the model.
pub(crate) const SERF_HEALTH: &str = "serfHealth";
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
