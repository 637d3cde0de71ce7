//! The in-process backend: Consul's lease semantics with no server, the embedded default.
//!
//! [`Memory`] keeps a small model of Consul's state in one process: sessions (TTL, lock-delay,
//! release or delete behaviour), KV entries with `LockIndex`/`ModifyIndex`, leader keys, and
//! semaphores built exactly like Consul's (seed 000): a contender key `<prefix>/<session>` per
//! contender and a `<prefix>/.lock` entry holding the limit and the holder set, pruned of dead
//! holders by the next contender. Clones share one store, like several clients of one Consul, so
//! "nodes" of a test or demo are tasks holding clones.
//!
//! Every change bumps a store-wide index published on a `tokio::sync::watch` channel; waiters and
//! holders sleep on it (the blocking query of this backend) and never poll. Time comes from
//! `tokio::time`, so tests can run it with paused time. The operator actions
//! ([`Memory::invalidate_session`], [`Memory::delete_key`], [`Memory::release_key`]) are what
//! `PUT /v1/session/destroy` and `DELETE`/`?release=` on `/v1/kv` do on Consul.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::{Instant, sleep_until};

use crate::backend::{Fence, Hold, Keepers};
use crate::leader::{Leader, LeaderObserver};
use crate::spec::validate_key;
use crate::{
    BackendKind, BoxFuture, Error, Lease, LeaseSpec, LostReason, MAX_LOCK_DELAY, Sequencer, Target,
};

/// The flags `consul lock` puts on a leader key; kept so a key is never used as two kinds of lock.
const LEADER_FLAGS: u64 = 0x2ddc_cbc0_58a5_0c18;
/// The flags `consul lock -n N` puts on a semaphore's `.lock` and contender keys.
const SEMAPHORE_FLAGS: u64 = 0xe0f6_9a2b_aa41_4de0;

/// Distinguishes the session IDs of separate stores, so a test's IDs never collide across stores.
static NEXT_STORE: AtomicU64 = AtomicU64::new(1);

/// The in-process backend. Clones share one store.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), lease_core::Error> {
/// use lease_core::memory::Memory;
/// use lease_core::{Backend, LeaseSpec, Wait};
///
/// let memory = Memory::new();
/// let lease = memory.acquire(&LeaseSpec::leader("service/leader")).await?;
/// let busy = memory
///     .acquire(&LeaseSpec::leader("service/leader").wait(Wait::Never))
///     .await;
/// assert!(busy.unwrap_err().is_busy());
///
/// // An operator destroys the holder's session: the lease is lost at once.
/// memory.invalidate_session(lease.sequencer().holder());
/// let reason = lease.lost().await;
/// assert_eq!(reason, lease_core::LostReason::SessionInvalidated);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Default)]
pub struct Memory {
    inner: Arc<Inner>,
}

impl fmt::Debug for Memory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.read(|state, _| {
            f.debug_struct("Memory")
                .field("sessions", &state.sessions.len())
                .field("keys", &state.kv.len())
                .field("index", &state.index)
                .finish()
        })
    }
}

impl Memory {
    /// A new, empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Invalidates a session, as `PUT /v1/session/destroy/<id>` does on Consul: the locks it held
    /// are released (leader keys) or deleted (semaphore contender keys), each such key cannot be
    /// acquired again for the session's lock-delay, and its holders learn the loss at once.
    ///
    /// Returns whether the session existed.
    pub fn invalidate_session(&self, session: &str) -> bool {
        self.inner
            .mutate(|state, now| state.invalidate(session, now))
    }

    /// Deletes a key, as `DELETE /v1/kv/<key>` does. Deleting a leader key or a contender key
    /// takes the lease from its holder; deleting a semaphore's `<prefix>/.lock` takes every slot.
    ///
    /// Returns whether the key existed.
    pub fn delete_key(&self, key: &str) -> bool {
        self.inner.mutate(|state, now| {
            let Some(entry) = state.kv.remove(key) else {
                return false;
            };
            // A lock taken away without lock-delay: contenders settle before taking it.
            if entry.session.is_some() || matches!(entry.value, Value::Semaphore { .. }) {
                state.vanished(key, Vanished::Deleted, now);
            }
            state.bump();
            true
        })
    }

    /// Releases the lock on a key without being its holder, as an operator's `?release=` does.
    /// Not subject to lock-delay, like any release.
    ///
    /// Returns whether the key was locked.
    pub fn release_key(&self, key: &str) -> bool {
        self.inner.mutate(|state, _| {
            let index = state.index + 1;
            match state.kv.get_mut(key) {
                Some(entry) if entry.session.is_some() => {
                    entry.session = None;
                    entry.modify_index = index;
                    state.bump();
                    true
                }
                _ => false,
            }
        })
    }

    /// The IDs of the sessions that exist now, for "nothing left behind" assertions.
    pub fn sessions(&self) -> Vec<String> {
        self.inner
            .read(|state, _| state.sessions.keys().cloned().collect())
    }

    /// The keys that exist now, for "nothing left behind" assertions.
    pub fn keys(&self) -> Vec<String> {
        self.inner
            .read(|state, _| state.kv.keys().cloned().collect())
    }

    fn start_lease(&self, held: Held, sequencer: Sequencer, spec: &LeaseSpec) -> Lease {
        let ttl = spec.session_ttl();
        let fence = Fence::new(spec.fence_after(), Instant::now());
        let hold = MemoryHold {
            inner: Arc::clone(&self.inner),
            held,
            fence: fence.clone(),
            renew_every: ttl / 2,
            next_renewal: Instant::now() + ttl / 2,
        };
        self.inner
            .keepers
            .start(sequencer, fence, Arc::new(self.clone()), hold)
    }

    async fn acquire_inner(&self, spec: &LeaseSpec) -> Result<Lease, Error> {
        spec.validate()?;
        let started = Instant::now();
        let deadline = spec.wait_policy().deadline(started);
        let ttl = spec.session_ttl();
        let mut session = SessionGuard::create(&self.inner, spec);
        let mut next_renewal = Instant::now() + ttl / 2;
        loop {
            // Subscribed before looking, so a change between the look and the wait still wakes us.
            let mut changes = self.inner.changes.subscribe();
            let attempt = self
                .inner
                .mutate(|state, now| state.try_acquire(spec, &session.id, now))?;
            let until = match attempt {
                Attempt::Acquired(held, sequencer) => {
                    session.disarm();
                    return Ok(self.start_lease(held, sequencer, spec));
                }
                Attempt::SessionGone => {
                    // An operator destroyed the waiting session: carry on with a fresh one.
                    session = SessionGuard::create(&self.inner, spec);
                    next_renewal = Instant::now() + ttl / 2;
                    continue;
                }
                Attempt::Blocked { until } => until,
            };
            let now = Instant::now();
            if deadline.is_some_and(|deadline| now >= deadline) {
                return Err(Error::Busy {
                    key: spec.key().to_owned(),
                    waited: now - started,
                });
            }
            let wake = [until, deadline, Some(next_renewal)]
                .into_iter()
                .flatten()
                .min()
                .unwrap_or(next_renewal);
            tokio::select! {
                changed = changes.changed() => {
                    if changed.is_err() {
                        return Err(store_gone());
                    }
                }
                () = sleep_until(wake) => {}
            }
            if Instant::now() >= next_renewal {
                self.inner
                    .mutate(|state, now| state.renew(&session.id, now));
                next_renewal += ttl / 2;
            }
        }
    }

    async fn observe_inner(&self, key: &str) -> Result<LeaderObserver, Error> {
        validate_key(key)?;
        let current = self.inner.read(|state, _| state.leader_of(key));
        let (tx, rx) = watch::channel(current);
        let inner = Arc::clone(&self.inner);
        let owned_key = key.to_owned();
        tokio::spawn(async move {
            loop {
                let mut changes = inner.changes.subscribe();
                let leader = inner.read(|state, _| state.leader_of(&owned_key));
                tx.send_if_modified(|seen| {
                    let modified = *seen != leader;
                    *seen = leader;
                    modified
                });
                tokio::select! {
                    changed = changes.changed() => {
                        if changed.is_err() {
                            return;
                        }
                    }
                    () = tx.closed() => return,
                }
            }
        });
        Ok(LeaderObserver::new(key, rx))
    }
}

impl crate::Backend for Memory {
    fn acquire<'a>(&'a self, spec: &'a LeaseSpec) -> BoxFuture<'a, Result<Lease, Error>> {
        Box::pin(self.acquire_inner(spec))
    }

    fn observe_leader<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<LeaderObserver, Error>> {
        Box::pin(self.observe_inner(key))
    }

    fn check_sequencer<'a>(&'a self, sequencer: &'a Sequencer) -> BoxFuture<'a, Result<(), Error>> {
        let verdict = self
            .inner
            .read(|state, _| state.verify(&Held::from_sequencer(state, sequencer)));
        Box::pin(async move { verdict.map_err(Error::Lost) })
    }

    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(self.inner.keepers.shutdown())
    }
}

fn store_gone() -> Error {
    Error::Backend {
        backend: "memory",
        operation: "wait for a change".to_owned(),
        message: "the in-process store was dropped".to_owned(),
        transient: false,
    }
}

/// The shared store and the channel that announces its changes.
struct Inner {
    store_id: u64,
    state: Mutex<State>,
    changes: watch::Sender<u64>,
    keepers: Keepers,
}

impl Default for Inner {
    fn default() -> Self {
        Inner {
            store_id: NEXT_STORE.fetch_add(1, Ordering::Relaxed),
            state: Mutex::new(State::default()),
            changes: watch::channel(0).0,
            keepers: Keepers::new(),
        }
    }
}

impl Inner {
    fn read<R>(&self, f: impl FnOnce(&State, Instant) -> R) -> R {
        // No code panics while holding the lock, so a poisoned lock still holds consistent state.
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        f(&state, Instant::now())
    }

    /// Runs `f` on the state and wakes every waiter if it changed anything.
    fn mutate<R>(&self, f: impl FnOnce(&mut State, Instant) -> R) -> R {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let before = state.index;
        let result = f(&mut state, Instant::now());
        if state.index != before {
            self.changes.send_replace(state.index);
        }
        result
    }

    fn create_session(self: &Arc<Self>, spec: &LeaseSpec) -> String {
        let behavior = match spec.target() {
            Target::Leader { .. } => Behavior::Release,
            Target::Semaphore { .. } => Behavior::Delete,
        };
        let store_id = self.store_id;
        let id = self.mutate(|state, now| {
            state.next_session += 1;
            let id = format!("{store_id:08x}-0000-4000-8000-{:012x}", state.next_session);
            state.sessions.insert(
                id.clone(),
                Session {
                    ttl: spec.session_ttl(),
                    lock_delay: spec.session_lock_delay(),
                    behavior,
                    expires_at: now + spec.session_ttl(),
                },
            );
            state.bump();
            id
        });
        tokio::spawn(expire_when_due(Arc::downgrade(self), id.clone()));
        id
    }
}

/// Invalidates the session `id` once its TTL has run out without renewal, like Consul's TTL timer.
async fn expire_when_due(inner: Weak<Inner>, id: String) {
    loop {
        let Some(store) = inner.upgrade() else { return };
        let Some(expires_at) = store.read(|state, _| state.sessions.get(&id).map(|s| s.expires_at))
        else {
            return;
        };
        drop(store);
        sleep_until(expires_at).await;
        let Some(store) = inner.upgrade() else { return };
        let expired = store.mutate(|state, now| match state.sessions.get(&id) {
            None => Some(false),
            Some(session) if session.expires_at <= now => Some(state.invalidate(&id, now)),
            Some(_) => None,
        });
        match expired {
            Some(true) => {
                tracing::debug!(session = %id, "memory session expired (TTL ran out without renewal)");
                return;
            }
            Some(false) => return,
            // Renewed meanwhile: sleep until the new expiry.
            None => {}
        }
    }
}

/// Destroys a session created by `acquire` unless it was handed to a lease, so a cancelled or
/// failed acquire leaves nothing behind.
struct SessionGuard {
    inner: Arc<Inner>,
    id: String,
    armed: bool,
}

impl SessionGuard {
    fn create(inner: &Arc<Inner>, spec: &LeaseSpec) -> Self {
        SessionGuard {
            inner: Arc::clone(inner),
            id: inner.create_session(spec),
            armed: true,
        }
    }

    fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for SessionGuard {
    fn drop(&mut self) {
        if self.armed {
            self.inner.mutate(|state, _| state.end_cleanly(&self.id));
        }
    }
}

#[derive(Default)]
struct State {
    /// Like Consul's Raft index: rises with every change; entries' ModifyIndex values come from it.
    index: u64,
    next_session: u64,
    sessions: BTreeMap<String, Session>,
    kv: BTreeMap<String, Entry>,
    /// Keys that cannot be acquired until the given instant (lock-delay after an invalidation).
    lock_delays: HashMap<String, Instant>,
    /// When a lock was last taken from its holder without a clean release, and how: contenders
    /// settle after it (see `LeaseSpec::settle`).
    vanished: HashMap<String, (Instant, Vanished)>,
}

struct Session {
    ttl: Duration,
    lock_delay: Duration,
    behavior: Behavior,
    expires_at: Instant,
}

/// What happens to a session's locks when it is invalidated (Consul's `Behavior`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Behavior {
    Release,
    Delete,
}

struct Entry {
    flags: u64,
    lock_index: u64,
    session: Option<String>,
    modify_index: u64,
    value: Value,
}

enum Value {
    Bytes(Vec<u8>),
    /// A semaphore's `.lock`: `{"Limit": N, "Holders": {...}}` on Consul.
    Semaphore {
        limit: u32,
        holders: BTreeSet<String>,
    },
}

/// What one lease holds, enough to verify it against the store.
#[derive(Clone)]
enum Held {
    Leader {
        key: String,
        session: String,
        lock_index: u64,
    },
    Slot {
        lock_key: String,
        contender_key: String,
        session: String,
        lock_index: u64,
    },
}

impl Held {
    fn session(&self) -> &str {
        match self {
            Held::Leader { session, .. } | Held::Slot { session, .. } => session,
        }
    }

    /// What a sequencer issued by this store claims to hold: a slot if its key is a semaphore's
    /// contender key, else a leader key.
    fn from_sequencer(state: &State, sequencer: &Sequencer) -> Held {
        let session = sequencer.holder().to_owned();
        let prefix = sequencer
            .key()
            .strip_suffix(sequencer.holder())
            .and_then(|p| p.strip_suffix('/'));
        let is_slot = state
            .kv
            .get(sequencer.key())
            .is_none_or(|entry| entry.flags == SEMAPHORE_FLAGS);
        match prefix {
            Some(prefix) if is_slot => Held::Slot {
                lock_key: format!("{prefix}/.lock"),
                contender_key: sequencer.key().to_owned(),
                session,
                lock_index: sequencer.index(),
            },
            _ => Held::Leader {
                key: sequencer.key().to_owned(),
                session,
                lock_index: sequencer.index(),
            },
        }
    }
}

/// How a lock was taken from its holder.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Vanished {
    /// Its session was invalidated; the session's lock-delay was this long.
    Invalidated(Duration),
    /// An operator deleted it.
    Deleted,
}

enum Attempt {
    Acquired(Held, Sequencer),
    Blocked { until: Option<Instant> },
    SessionGone,
}

impl State {
    fn bump(&mut self) -> u64 {
        self.index += 1;
        self.index
    }

    fn renew(&mut self, id: &str, now: Instant) -> bool {
        match self.sessions.get_mut(id) {
            Some(session) => {
                session.expires_at = now + session.ttl;
                true
            }
            None => false,
        }
    }

    /// Consul's session invalidation: locks are released or deleted per the behaviour, and each
    /// key the session held is barred from acquisition for the lock-delay.
    fn invalidate(&mut self, id: &str, now: Instant) -> bool {
        let Some(session) = self.sessions.remove(id) else {
            return false;
        };
        let held: Vec<String> = self
            .kv
            .iter()
            .filter(|(_, entry)| entry.session.as_deref() == Some(id))
            .map(|(key, _)| key.clone())
            .collect();
        let index = self.bump();
        self.lock_delays.retain(|_, until| *until > now);
        for key in held {
            if !session.lock_delay.is_zero() {
                self.lock_delays
                    .insert(key.clone(), now + session.lock_delay);
            }
            self.vanished(&key, Vanished::Invalidated(session.lock_delay), now);
            match session.behavior {
                Behavior::Delete => {
                    self.kv.remove(&key);
                }
                Behavior::Release => {
                    if let Some(entry) = self.kv.get_mut(&key) {
                        entry.session = None;
                        entry.modify_index = index;
                    }
                }
            }
        }
        true
    }

    /// A holder giving everything back: leave every semaphore's holder set, delete contender
    /// keys, release leader keys, destroy the session. Voluntary, so no lock-delay applies.
    fn end_cleanly(&mut self, id: &str) {
        let index = self.bump();
        for entry in self.kv.values_mut() {
            if let Value::Semaphore { holders, .. } = &mut entry.value {
                if holders.remove(id) {
                    entry.modify_index = index;
                }
            }
        }
        self.kv.retain(|_, entry| {
            if entry.session.as_deref() != Some(id) {
                return true;
            }
            if entry.flags == SEMAPHORE_FLAGS {
                return false;
            }
            entry.session = None;
            entry.modify_index = index;
            true
        });
        self.sessions.remove(id);
    }

    fn try_acquire(
        &mut self,
        spec: &LeaseSpec,
        session: &str,
        now: Instant,
    ) -> Result<Attempt, Error> {
        if !self.sessions.contains_key(session) {
            return Ok(Attempt::SessionGone);
        }
        match spec.target() {
            Target::Leader { key } => self.try_acquire_leader(key, session, spec, now),
            Target::Semaphore { prefix, limit } => {
                self.try_acquire_slot(prefix, *limit, session, spec, now)
            }
        }
    }

    /// Records that the lock on `key` was taken from its holder at `now` without a clean
    /// release, and forgets such records too old to matter to any contender.
    fn vanished(&mut self, key: &str, how: Vanished, now: Instant) {
        self.vanished
            .retain(|_, (at, _)| now.saturating_duration_since(*at) <= MAX_LOCK_DELAY);
        self.vanished.insert(key.to_owned(), (now, how));
    }

    /// Until when `key` is barred for the contender `spec`: the lock-delay of the session that
    /// last held it, and the contender's settle time after the lock was taken away without one.
    fn lock_delay_until(&self, key: &str, spec: &LeaseSpec, now: Instant) -> Option<Instant> {
        let lock_delay = self.lock_delays.get(key).copied();
        let settling = self.vanished.get(key).and_then(|(at, how)| match how {
            Vanished::Deleted => Some(*at + spec.settle_after_removal()),
            Vanished::Invalidated(delay) if *delay < spec.settle_time() => {
                Some(*at + spec.settle_time())
            }
            Vanished::Invalidated(_) => None,
        });
        lock_delay.max(settling).filter(|until| *until > now)
    }

    fn try_acquire_leader(
        &mut self,
        key: &str,
        session: &str,
        spec: &LeaseSpec,
        now: Instant,
    ) -> Result<Attempt, Error> {
        let value = spec.advertised_value();
        if let Some(entry) = self.kv.get(key) {
            check_flags(key, entry, LEADER_FLAGS)?;
            if entry.session.is_some() {
                return Ok(Attempt::Blocked { until: None });
            }
        }
        if let Some(until) = self.lock_delay_until(key, spec, now) {
            return Ok(Attempt::Blocked { until: Some(until) });
        }
        let lock_index = self.lock(key, LEADER_FLAGS, session, value);
        let held = Held::Leader {
            key: key.to_owned(),
            session: session.to_owned(),
            lock_index,
        };
        let sequencer = Sequencer::new(BackendKind::Memory, key, lock_index, session);
        Ok(Attempt::Acquired(held, sequencer))
    }

    /// Consul's `?acquire=` on a key that is free: `session` takes it, LockIndex rises, the value
    /// is written. Returns the new LockIndex.
    fn lock(&mut self, key: &str, flags: u64, session: &str, value: &[u8]) -> u64 {
        let index = self.bump();
        let entry = self.kv.entry(key.to_owned()).or_insert_with(|| Entry {
            flags,
            lock_index: 0,
            session: None,
            modify_index: index,
            value: Value::Bytes(Vec::new()),
        });
        entry.lock_index += 1;
        entry.session = Some(session.to_owned());
        entry.modify_index = index;
        entry.value = Value::Bytes(value.to_vec());
        entry.lock_index
    }

    /// Seed 000: hold a contender key, prune dead holders from `.lock`, join if there is room.
    fn try_acquire_slot(
        &mut self,
        prefix: &str,
        limit: u32,
        session: &str,
        spec: &LeaseSpec,
        now: Instant,
    ) -> Result<Attempt, Error> {
        let value = spec.advertised_value();
        let contender_key = format!("{prefix}/{session}");
        let lock_key = format!("{prefix}/.lock");
        if let Some(entry) = self.kv.get(&lock_key) {
            check_flags(&lock_key, entry, SEMAPHORE_FLAGS)?;
            if let Value::Semaphore { limit: stored, .. } = entry.value {
                if stored != limit {
                    return Err(Error::LimitMismatch {
                        key: prefix.to_owned(),
                        stored: u64::from(stored),
                        requested: u64::from(limit),
                    });
                }
            }
        }
        if let Some(entry) = self.kv.get(&contender_key) {
            check_flags(&contender_key, entry, SEMAPHORE_FLAGS)?;
        }
        if self
            .lock_delays
            .get(&contender_key)
            .is_some_and(|until| *until > now)
        {
            // Only reachable if an operator reused a session ID; treat the session as gone.
            return Ok(Attempt::SessionGone);
        }
        let contender_held = self
            .kv
            .get(&contender_key)
            .is_some_and(|entry| entry.session.as_deref() == Some(session));
        if !contender_held {
            self.lock(&contender_key, SEMAPHORE_FLAGS, session, value);
        }
        let live: BTreeSet<String> = self
            .kv
            .range(format!("{prefix}/")..)
            .take_while(|(key, _)| key.starts_with(&format!("{prefix}/")))
            .filter_map(|(key, entry)| {
                let holder = key.strip_prefix(&format!("{prefix}/"))?;
                (entry.session.as_deref() == Some(holder)).then(|| holder.to_owned())
            })
            .collect();
        let contender_index = self
            .kv
            .get(&contender_key)
            .map_or(0, |entry| entry.lock_index);
        // A deleted `.lock` took every slot from its holders at once: they are still stopping.
        if !self.kv.contains_key(&lock_key) {
            if let Some(until) = self.lock_delay_until(&lock_key, spec, now) {
                return Ok(Attempt::Blocked { until: Some(until) });
            }
        }
        let mut holders = match self.kv.get(&lock_key).map(|entry| &entry.value) {
            Some(Value::Semaphore { holders, .. }) => holders.clone(),
            _ => BTreeSet::new(),
        };
        // A dead holder keeps its slot for its session's lock-delay, so that a holder invalidated
        // behind its back can stop its work before anyone else is admitted (as for a leader key).
        let mut blocked_until: Option<Instant> = None;
        holders.retain(|holder| {
            if live.contains(holder) {
                return true;
            }
            match self.lock_delay_until(&format!("{prefix}/{holder}"), spec, now) {
                Some(until) => {
                    blocked_until = Some(blocked_until.map_or(until, |b| b.min(until)));
                    true
                }
                None => false,
            }
        });
        if holders.len() >= limit as usize && !holders.contains(session) {
            return Ok(Attempt::Blocked {
                until: blocked_until,
            });
        }
        holders.insert(session.to_owned());
        let index = self.bump();
        let entry = self.kv.entry(lock_key.clone()).or_insert_with(|| Entry {
            flags: SEMAPHORE_FLAGS,
            lock_index: 0,
            session: None,
            modify_index: index,
            value: Value::Bytes(Vec::new()),
        });
        entry.value = Value::Semaphore { limit, holders };
        entry.modify_index = index;
        let sequencer = Sequencer::new(
            BackendKind::Memory,
            contender_key.clone(),
            contender_index,
            session,
        );
        let held = Held::Slot {
            lock_key,
            contender_key,
            session: session.to_owned(),
            lock_index: contender_index,
        };
        Ok(Attempt::Acquired(held, sequencer))
    }

    /// One consistent look at whether `held` is still held; the single rule behind both the
    /// holder's watch and `Lease::check`.
    fn verify(&self, held: &Held) -> Result<(), LostReason> {
        if !self.sessions.contains_key(held.session()) {
            return Err(LostReason::SessionInvalidated);
        }
        match held {
            Held::Leader {
                key,
                session,
                lock_index,
            } => {
                let entry = self.kv.get(key).ok_or(LostReason::KeyDeleted)?;
                match &entry.session {
                    None => Err(LostReason::KeyReleased),
                    Some(holder) if holder == session && entry.lock_index == *lock_index => Ok(()),
                    Some(holder) => Err(LostReason::KeyTaken {
                        lock_index: entry.lock_index,
                        session: holder.clone(),
                    }),
                }
            }
            Held::Slot {
                lock_key,
                contender_key,
                session,
                lock_index,
            } => {
                let contender = self.kv.get(contender_key).ok_or(LostReason::KeyDeleted)?;
                match &contender.session {
                    Some(holder) if holder == session && contender.lock_index == *lock_index => {}
                    Some(holder) => {
                        return Err(LostReason::KeyTaken {
                            lock_index: contender.lock_index,
                            session: holder.clone(),
                        });
                    }
                    None => return Err(LostReason::KeyReleased),
                }
                let lock = self.kv.get(lock_key).ok_or(LostReason::KeyDeleted)?;
                match &lock.value {
                    Value::Semaphore { holders, .. } if holders.contains(session) => Ok(()),
                    _ => Err(LostReason::HolderPruned),
                }
            }
        }
    }

    fn leader_of(&self, key: &str) -> Option<Leader> {
        let entry = self.kv.get(key)?;
        if entry.flags != LEADER_FLAGS {
            return None;
        }
        let session = entry.session.as_ref()?;
        let Value::Bytes(value) = &entry.value else {
            return None;
        };
        Some(Leader::new(
            Sequencer::new(BackendKind::Memory, key, entry.lock_index, session.clone()),
            value.clone(),
        ))
    }
}

fn check_flags(key: &str, entry: &Entry, expected: u64) -> Result<(), Error> {
    if entry.flags == expected {
        Ok(())
    } else {
        Err(Error::FlagsConflict {
            key: key.to_owned(),
            found: entry.flags,
            expected,
        })
    }
}

struct MemoryHold {
    inner: Arc<Inner>,
    held: Held,
    fence: Fence,
    renew_every: Duration,
    next_renewal: Instant,
}

impl Hold for MemoryHold {
    async fn watch(&mut self) -> LostReason {
        loop {
            let mut changes = self.inner.changes.subscribe();
            if let Err(reason) = self.inner.read(|state, _| state.verify(&self.held)) {
                return reason;
            }
            tokio::select! {
                changed = changes.changed() => {
                    if changed.is_err() {
                        return LostReason::ConnectionClosed;
                    }
                }
                () = sleep_until(self.next_renewal) => {
                    // A failed renewal means the session is gone; the next look reports it.
                    let session = self.held.session().to_owned();
                    let sent = Instant::now();
                    if self.inner.mutate(|state, now| state.renew(&session, now)) {
                        self.fence.confirm(sent);
                    }
                    self.next_renewal += self.renew_every;
                }
            }
        }
    }

    async fn release(&mut self) -> Result<(), Error> {
        let session = self.held.session().to_owned();
        self.inner.mutate(|state, _| state.end_cleanly(&session));
        Ok(())
    }

    async fn clean_up(&mut self) {
        // After a loss the work may still be stopping: destroy the session like Consul's
        // `session/destroy` (lock-delay applies to whatever it still holds), never hand the lease
        // on faster than that.
        let session = self.held.session().to_owned();
        self.inner
            .mutate(|state, now| state.invalidate(&session, now));
    }

    fn abandon(self) -> Option<BoxFuture<'static, ()>> {
        // The store is in this process: give the lease back synchronously, no runtime needed.
        let session = self.held.session().to_owned();
        self.inner.mutate(|state, _| state.end_cleanly(&session));
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Backend, Wait};

    fn spec(key: &str) -> LeaseSpec {
        LeaseSpec::leader(key)
            .ttl(Duration::from_secs(10))
            .lock_delay(Duration::from_secs(15))
    }

    #[tokio::test(start_paused = true)]
    async fn lock_delay_bars_reacquisition_after_invalidation_but_not_after_release() {
        let memory = Memory::new();
        let first = memory.acquire(&spec("k")).await.expect("first acquire");
        assert!(memory.invalidate_session(first.sequencer().holder()));
        assert_eq!(first.lost().await, LostReason::SessionInvalidated);

        let started = Instant::now();
        let busy = memory
            .acquire(&spec("k").wait(Wait::UpTo(Duration::from_secs(14))))
            .await;
        assert!(busy.expect_err("lock-delay must bar it").is_busy());
        let second = memory.acquire(&spec("k")).await.expect("after lock-delay");
        assert!(started.elapsed() >= Duration::from_secs(15));
        assert_eq!(second.sequencer().index(), 2);

        let released_at = Instant::now();
        second.release().await.expect("release");
        let third = memory
            .acquire(&spec("k").wait(Wait::Never))
            .await
            .expect("no lock-delay");
        assert_eq!(released_at, Instant::now());
        assert_eq!(third.sequencer().index(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn zero_lock_delay_means_zero() {
        let memory = Memory::new();
        let first = memory
            .acquire(&spec("k").lock_delay(Duration::ZERO))
            .await
            .expect("acquire");
        memory.invalidate_session(first.sequencer().holder());
        // "0 means 0" for a contender that does not settle (as `consul lock` does not).
        let second = memory
            .acquire(
                &spec("k")
                    .lock_delay(Duration::ZERO)
                    .settle(Duration::ZERO)
                    .wait(Wait::Never),
            )
            .await
            .expect("at once");
        assert_eq!(second.sequencer().index(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn contenders_settle_after_an_undelayed_loss_but_not_after_a_release() {
        let memory = Memory::new();
        let settle = LeaseSpec::DEFAULT_SETTLE;
        let spec = || spec("k").lock_delay(Duration::ZERO);
        for fault in ["invalidate", "delete"] {
            let holder = memory.acquire(&spec()).await.expect("acquire");
            let lost_at = Instant::now();
            match fault {
                "invalidate" => assert!(memory.invalidate_session(holder.sequencer().holder())),
                _ => assert!(memory.delete_key("k")),
            }
            let busy = memory.acquire(&spec().wait(Wait::Never)).await;
            assert!(busy.expect_err(fault).is_busy(), "{fault}: taken at once");
            let next = memory.acquire(&spec()).await.expect("after settling");
            assert_eq!(Instant::now() - lost_at, settle, "{fault}");
            next.release().await.expect("release");
        }
        // A clean release hands the key on at once.
        let holder = memory.acquire(&spec()).await.expect("acquire");
        holder.release().await.expect("release");
        let next = memory
            .acquire(&spec().wait(Wait::Never))
            .await
            .expect("at once after a release");
        next.release().await.expect("release");
    }

    #[tokio::test(start_paused = true)]
    async fn an_unrenewed_session_expires_after_its_ttl_and_a_held_one_does_not() {
        let memory = Memory::new();
        let lease = memory.acquire(&spec("held")).await.expect("acquire");
        let orphan = memory.inner.create_session(&spec("orphan"));
        tokio::time::sleep(Duration::from_secs(9)).await;
        assert!(memory.sessions().contains(&orphan));
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(!memory.sessions().contains(&orphan));
        tokio::time::sleep(Duration::from_secs(3600)).await;
        assert!(lease.is_held());
        lease
            .check()
            .await
            .expect("still held after an hour of renewals");
    }

    #[tokio::test(start_paused = true)]
    async fn semaphore_prunes_a_dead_holder_and_nothing_is_left_behind() {
        let memory = Memory::new();
        let sem = |wait| {
            LeaseSpec::semaphore("jobs", 2)
                .lock_delay(Duration::ZERO)
                .settle(Duration::ZERO)
                .wait(wait)
        };
        let a = memory.acquire(&sem(Wait::Never)).await.expect("a");
        let b = memory.acquire(&sem(Wait::Never)).await.expect("b");
        assert!(
            memory
                .acquire(&sem(Wait::Never))
                .await
                .expect_err("full")
                .is_busy()
        );
        assert_eq!(
            a.sequencer().key(),
            format!("jobs/{}", a.sequencer().holder())
        );
        memory.invalidate_session(a.sequencer().holder());
        assert_eq!(a.lost().await, LostReason::SessionInvalidated);
        let c = memory
            .acquire(&sem(Wait::Never))
            .await
            .expect("a was pruned");
        let limit = memory
            .acquire(&LeaseSpec::semaphore("jobs", 3).wait(Wait::Never))
            .await;
        assert!(matches!(
            limit,
            Err(Error::LimitMismatch {
                stored: 2,
                requested: 3,
                ..
            })
        ));
        drop(a);
        b.release().await.expect("release b");
        c.release().await.expect("release c");
        assert!(memory.sessions().is_empty(), "{:?}", memory.sessions());
        assert_eq!(memory.keys(), vec!["jobs/.lock".to_owned()]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancelled_acquire_leaves_no_session() {
        let memory = Memory::new();
        let held = memory.acquire(&spec("k")).await.expect("acquire");
        let waiting =
            tokio::time::timeout(Duration::from_secs(1), memory.acquire(&spec("k"))).await;
        assert!(waiting.is_err());
        assert_eq!(
            memory.sessions(),
            vec![held.sequencer().holder().to_owned()]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn operator_release_and_delete_are_reported_as_such() {
        let memory = Memory::new();
        let a = memory.acquire(&spec("k")).await.expect("a");
        assert!(memory.release_key("k"));
        assert_eq!(a.lost().await, LostReason::KeyReleased);
        let b = memory
            .acquire(&spec("k").wait(Wait::Never))
            .await
            .expect("released: no delay");
        assert!(memory.delete_key("k"));
        assert_eq!(b.lost().await, LostReason::KeyDeleted);
        let clash = memory.acquire(&LeaseSpec::semaphore("k", 1)).await;
        assert!(clash.is_ok());
        let clash = memory.acquire(&spec("k/.lock").wait(Wait::Never)).await;
        assert!(matches!(clash, Err(Error::FlagsConflict { .. })));
    }
}
