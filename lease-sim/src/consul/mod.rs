//! A model of the Consul agent and servers, as far as lease-consul uses them: sessions (TTL,
//! lock-delay, behaviors, the checks they are tied to), the agent's TTL checks, the KV store
//! with Consul's indexes, blocking queries, transactions and the leader status, served over
//! Consul's HTTP API (HTTP/1.1 and JSON) to the unmodified client.
//!
//! The semantics are Consul 1.8's, read from its source (`agent/consul/state`, the KV, session
//! and transaction endpoints, `session_ttl.go`, the agent's TTL checks) and held to the real
//! thing by `tests/consul_differential.rs`, which replays seeded sequences of the client's calls
//! against this model and a Consul 1.8.7 dev agent and compares every answer.
//!
//! Deterministic: state in `BTreeMap`s, one seeded generator for session IDs and the jitter of
//! blocking queries, time from `tokio::time` only, so under a paused clock a seed and a sequence
//! of requests give the same answers at the same instants. The state is one [`Mutex`] (never
//! held across an await); the timers (session TTLs, check TTLs, reaps) run in one task, started
//! through [`spawn`](crate::server::spawn) by the first connection or request served.
//!
//! Beside the protocol, the fault injector and the checker get operator actions (destroy a
//! session, delete or release a key, deregister a check), leader changes ([`Model::restart`])
//! and inspection ([`Model::sessions`], [`Model::keys`], [`Model::checks`]).
//!
//! # What is modelled
//!
//! Every call lease-consul makes (`lease-consul/src/wire/calls.rs`), and what an operator does
//! beside them:
//!
//! - `GET /v1/status/leader` (the leader's address, `""` without one);
//! - `PUT /v1/session/create` (`Name`, `LockDelay` as Consul reads it, `Behavior`, `TTL` within
//!   10 s–24 h, `NodeChecks`/`Checks` (default `serfHealth`), `ServiceChecks`, each check
//!   required to exist and not be critical), `renew/<id>`, `info/<id>`, `destroy/<id>`, `list`;
//! - `PUT /v1/agent/service/register` with one TTL check, `agent/check/pass/<id>`,
//!   `agent/service/deregister/<id>`: the check turns critical one TTL after its registration or
//!   last pass, invalidating the sessions tied to it; a critical check is reaped at the agent's
//!   first 30 s tick past its `DeregisterCriticalServiceAfter` (at least a minute);
//! - `GET /v1/kv/<key>` (one key, `?recurse`, `?keys` with `separator`, `?raw`), blocking on
//!   `?index=&wait=` (answered when the query's index passes the one given, or after the wait
//!   plus a seeded jitter below wait/16); `PUT` (plain, `?cas=`, `?acquire=`, `?release=`,
//!   `?flags=`); `DELETE` (`?cas=`, `?recurse`), with Consul's `CreateIndex`, `ModifyIndex`,
//!   `LockIndex`, tombstones and `X-Consul-Index` rules;
//! - `PUT /v1/txn` with every KV verb, Consul's pre-checks (lock-delay), rollback, 409 answers
//!   and its read-only path;
//! - session invalidation (destroy, TTL × multiplier after the last renewal, a critical or
//!   removed check) releasing or deleting the session's keys, which then refuse locks for the
//!   session's lock-delay (at most 60 s);
//! - `?dc=` (another one: "No path to datacenter"), `?ns=` (refused, as an open-source agent
//!   does), and "No cluster leader" while [`Model::lose_leader`] holds.
//!
//! # What is simplified, and why
//!
//! - ACLs: tokens are ignored (everything is allowed, as on a dev agent).
//! - A blocking query re-evaluates on every write, where Consul wakes on a change in its radix
//!   tree near the prefix; the answers are the same (both answer when the index passes), except
//!   for a prefix that never held a key, whose index is the whole table's: the model answers it
//!   on any write, Consul only on one its radix watch sees. The client treats either as a
//!   spurious wake-up.
//! - Tombstones are never reaped (Consul reaps them after 15 minutes), so a listing's index
//!   never falls back to the table's.
//! - The agent's checks are TTL checks only, one per service; their sync to the catalog is
//!   immediate (Consul's anti-entropy takes milliseconds).
//! - Lock-delays survive a leader change ([`Model::restart`]): every server applied the
//!   invalidation and set its own, at about the same time.
//! - One node (`serfHealth` always passing), one datacenter; no other endpoints.

mod api;
mod decode;
mod json;
mod server;
mod sim;
mod state;
mod txn;
mod wire;

#[cfg(test)]
mod tests;

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio::time::Instant;

pub use sim::for_schedule;
pub use state::{Behavior, CheckStatus, CheckView, Entry, SessionView};
use state::{KvWrite, State};

/// How a [`Model`] is set up: its seed, and the knobs the simulation draws.
#[derive(Clone, Debug)]
pub struct Config {
    seed: u64,
    ttl_multiplier: f64,
    node_name: String,
    datacenter: String,
    leader_address: String,
    client_connections: Option<usize>,
}

impl Config {
    /// Consul's defaults (a TTL multiplier of 2, the node `lease-sim` in `dc1`), with `seed` for
    /// session IDs and jitter.
    pub fn new(seed: u64) -> Config {
        Config {
            seed,
            ttl_multiplier: 2.0,
            node_name: "lease-sim".to_owned(),
            datacenter: "dc1".to_owned(),
            leader_address: "127.0.0.1:8300".to_owned(),
            client_connections: None,
        }
    }

    /// How many TTLs after its last renewal a session is invalidated: Consul's
    /// `SessionTTLMultiplier` is 2; the model takes any value in `[1, 2]` (clamped), since
    /// Consul promises only "not before one TTL".
    #[must_use]
    pub fn ttl_multiplier(mut self, multiplier: f64) -> Config {
        self.ttl_multiplier = if multiplier.is_nan() {
            2.0
        } else {
            multiplier.clamp(1.0, 2.0)
        };
        self
    }

    /// The agent's node name (sessions name it; a session for another node is refused).
    #[must_use]
    pub fn node_name(mut self, name: impl Into<String>) -> Config {
        self.node_name = name.into();
        self
    }

    /// The datacenter (a request naming another one is refused, "No path to datacenter").
    #[must_use]
    pub fn datacenter(mut self, datacenter: impl Into<String>) -> Config {
        self.datacenter = datacenter.into();
        self
    }

    /// The connection budget ([`ConsulBuilder::max_connections`](lease_consul::ConsulBuilder::max_connections))
    /// of the clients the simulation builds for this model; `None`, the client's default.
    #[must_use]
    pub fn client_connections(mut self, budget: Option<usize>) -> Config {
        self.client_connections = budget;
        self
    }
}

impl Default for Config {
    fn default() -> Config {
        Config::new(0)
    }
}

/// A modelled Consul agent and its servers. Clones share one state; it is the
/// [`hyper::service::Service`] that answers Consul's HTTP API.
#[derive(Clone)]
pub struct Model {
    shared: Arc<Shared>,
}

struct Shared {
    config: Config,
    inner: Mutex<Inner>,
    /// The last Raft index applied, sent after every write: what blocking queries wait on.
    applied: watch::Sender<u64>,
    /// Wakes the timer task when a timer is due earlier than it sleeps.
    timers: Arc<Notify>,
    timers_started: AtomicBool,
}

struct Inner {
    state: State,
    /// Until when the timer task sleeps (`None`: until woken).
    timer_at: Option<Instant>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        // The timer task holds only a weak reference: let it see the model is gone.
        self.timers.notify_one();
    }
}

impl fmt::Debug for Model {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = self.lock();
        f.debug_struct("Model")
            .field("config", &self.shared.config)
            .field("index", &inner.state.raft_index())
            .finish_non_exhaustive()
    }
}

/// A blocking query's parameters: answer once the index passes `index`, or after `wait`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Blocking {
    pub(crate) index: u64,
    pub(crate) wait: Option<Duration>,
}

/// Consul's `maxQueryTime` and `defaultQueryTime`.
const MAX_QUERY_TIME: Duration = Duration::from_secs(600);
const DEFAULT_QUERY_TIME: Duration = Duration::from_secs(300);

impl Model {
    /// A model with nothing in it but the node and its `serfHealth` check, led by its server.
    pub fn new(config: Config) -> Model {
        let state = State::new(
            config.node_name.clone(),
            config.ttl_multiplier,
            config.seed,
            Instant::now(),
        );
        let (applied, _) = watch::channel(state.raft_index());
        Model {
            shared: Arc::new(Shared {
                config,
                inner: Mutex::new(Inner {
                    state,
                    timer_at: None,
                }),
                applied,
                timers: Arc::new(Notify::new()),
                timers_started: AtomicBool::new(false),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.shared
            .inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn config(&self) -> &Config {
        &self.shared.config
    }

    /// Runs `change` on the state, then tells blocking queries of a new index and the timer task
    /// of a timer due sooner than it sleeps.
    pub(crate) fn write<R>(&self, change: impl FnOnce(&mut State, Instant) -> R) -> R {
        let now = Instant::now();
        let (result, index, wake) = {
            let mut inner = self.lock();
            let result = change(&mut inner.state, now);
            let sooner = inner.state.next_deadline();
            let wake = sooner.is_some_and(|at| inner.timer_at.is_none_or(|sleeps| at < sleeps));
            (result, inner.state.raft_index(), wake)
        };
        self.publish(index);
        if wake {
            self.shared.timers.notify_one();
        }
        result
    }

    /// Reads the state.
    pub(crate) fn read<R>(&self, look: impl FnOnce(&State) -> R) -> R {
        look(&self.lock().state)
    }

    fn publish(&self, index: u64) {
        self.shared.applied.send_if_modified(|applied| {
            let changed = *applied != index;
            *applied = index;
            changed
        });
    }

    /// Consul's `blockingQuery`: evaluates `query` at once, or, for a blocking query, again
    /// after every write until its index passes the one asked for or the wait (plus Consul's
    /// jitter of up to a sixteenth of it) runs out, then answers the last evaluation.
    pub(crate) async fn query<T>(
        &self,
        blocking: Option<Blocking>,
        query: impl Fn(&State) -> Result<(u64, T), String>,
    ) -> Result<(u64, T), String> {
        let Some(blocking) = blocking.filter(|b| b.index > 0) else {
            return self.read(&query);
        };
        let mut wait = match blocking.wait {
            Some(wait) if wait > MAX_QUERY_TIME => MAX_QUERY_TIME,
            Some(wait) if !wait.is_zero() => wait,
            _ => DEFAULT_QUERY_TIME,
        };
        wait += self.write(|state, _| state.rng.stagger(wait / 16));
        let deadline = Instant::now() + wait;
        let mut applied = self.shared.applied.subscribe();
        loop {
            applied.borrow_and_update();
            let answer = self.read(&query)?;
            if answer.0 > blocking.index {
                return Ok(answer);
            }
            tokio::select! {
                biased;
                changed = applied.changed() => {
                    if changed.is_err() {
                        return Ok(answer);
                    }
                }
                () = tokio::time::sleep_until(deadline) => return Ok(answer),
            }
        }
    }

    /// Starts the timer task (session and check TTLs, reaps) if it is not running: serving a
    /// connection or a request does, so it runs in the runtime that serves the model. Call it
    /// when the model is driven by operator actions alone.
    pub fn start(&self) {
        if self.shared.timers_started.swap(true, Ordering::SeqCst) {
            return;
        }
        let shared = Arc::downgrade(&self.shared);
        let notify = Arc::clone(&self.shared.timers);
        drop(crate::server::spawn(run_timers(shared, notify)));
    }

    // ---- Operator actions ----

    /// Destroys a session as an operator's `PUT /v1/session/destroy/<id>` does (its keys are
    /// released or deleted, under its lock-delay); whether it existed.
    pub fn destroy_session(&self, id: &str) -> bool {
        self.write(|state, now| state.operator_destroy(now, id))
    }

    /// Deletes a key (`DELETE /v1/kv/<key>`; no lock-delay follows); whether it existed.
    pub fn delete_key(&self, key: &str) -> bool {
        self.write(|state, now| state.operator_delete(now, key))
    }

    /// Deletes every key under `prefix` (`DELETE /v1/kv/<prefix>?recurse`); how many there were.
    pub fn delete_prefix(&self, prefix: &str) -> usize {
        self.write(|state, now| state.operator_delete_prefix(now, prefix))
    }

    /// Releases `key` held by `session`, as an operator's `PUT /v1/kv/<key>?release=<session>`
    /// does (which also empties the value and sets the flags to 0); whether it was held so.
    pub fn release_key(&self, key: &str, session: &str) -> bool {
        let entry = Entry {
            session: session.to_owned(),
            ..Entry::new(key, 0, Vec::new())
        };
        self.write(|state, now| state.kv_apply(now, KvWrite::Unlock { entry }))
            .unwrap_or(false)
    }

    /// Writes `key` as a plain `PUT /v1/kv/<key>?flags=<flags>` does (a session holding it
    /// keeps it; its LockIndex is reset to 0, as Consul does); false while no server leads.
    pub fn put_key(&self, key: &str, value: &[u8], flags: u64) -> bool {
        let entry = Entry::new(key, flags, value.to_vec());
        self.write(|state, now| state.kv_apply(now, KvWrite::Set { entry }))
            .is_ok()
    }

    /// Deregisters the service of an agent check (as an operator, or an agent that lost its
    /// registrations, would): every session tied to it is invalidated. Whether it existed.
    pub fn deregister_check(&self, check: &str) -> bool {
        self.write(|state, now| state.operator_deregister_check(now, check))
    }

    /// A leader change (a server restart, an election): KV, sessions and lock-delays persist;
    /// every session's TTL timer starts again from now, as a new leader's
    /// `initializeSessionTimers` does.
    pub fn restart(&self) {
        self.write(|state, now| {
            state.lose_leader();
            state.elect_leader(now);
        });
    }

    /// The servers lose their leader until [`Model::elect_leader`]: every server request answers
    /// 500 "No cluster leader", `/v1/status/leader` answers `""`, no session timer runs, and the
    /// agent's check changes wait to be synced.
    pub fn lose_leader(&self) {
        self.write(|state, _| state.lose_leader());
    }

    /// A leader is elected: as [`Model::restart`], after a time without one.
    pub fn elect_leader(&self) {
        self.write(|state, now| state.elect_leader(now));
    }

    // ---- Inspection ----

    /// Every session, in ID order, with the keys it holds.
    pub fn sessions(&self) -> Vec<SessionView> {
        self.read(State::sessions_view)
    }

    /// Every KV entry, in key order.
    pub fn keys(&self) -> Vec<Entry> {
        self.read(State::keys_view)
    }

    /// The entry of `key`, if any.
    pub fn entry(&self, key: &str) -> Option<Entry> {
        self.read(|state| state.entry(key).cloned())
    }

    /// The agent's checks, in ID order.
    pub fn checks(&self) -> Vec<CheckView> {
        self.read(State::checks_view)
    }

    /// The last Raft index applied.
    pub fn index(&self) -> u64 {
        self.read(State::raft_index)
    }
}

/// The timer task: fires what is due, sleeps until the next timer or until woken, and ends when
/// the model is gone.
async fn run_timers(shared: Weak<Shared>, notify: Arc<Notify>) {
    loop {
        let next = {
            let Some(shared) = shared.upgrade() else {
                return;
            };
            let model = Model { shared };
            let now = Instant::now();
            let (index, next) = {
                let mut inner = model.lock();
                inner.state.fire_timers(now);
                let next = inner.state.next_deadline();
                inner.timer_at = next;
                (inner.state.raft_index(), next)
            };
            model.publish(index);
            next
        };
        match next {
            Some(at) => {
                tokio::select! {
                    biased;
                    () = notify.notified() => {}
                    () = tokio::time::sleep_until(at) => {}
                }
            }
            None => notify.notified().await,
        }
    }
}
