//! The store: a small model of Consul's state in one process.
//!
//! Sessions (TTL, lock-delay, release or delete behaviour) and KV entries with
//! `LockIndex`/`ModifyIndex`, behind one mutex, with a store-wide index that rises with every
//! change and is published on a `tokio::sync::watch` channel (the blocking query of this backend).
//! Here live what Consul's session and KV endpoints do: create, renew and invalidate sessions,
//! lock keys, release and delete. Leader keys are acquired here too; semaphores are in `slots`,
//! and what a held lease watches is in `hold`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::{Instant, sleep_until};

use super::held::HeldLock;
use crate::backend::Keepers;
use crate::observer::Leader;
use crate::semaphore::{LockValue, Planner, SEMAPHORE_FLAGS, lock_key};
use crate::{BackendKind, Error, LeaseSpec, MAX_LOCK_DELAY, Sequencer, Target};

/// The flags `consul lock` puts on a leader key; kept so a key is never used as two kinds of lock.
pub(super) const LEADER_FLAGS: u64 = Error::LEADER_FLAGS;

/// Distinguishes the session IDs of separate stores, so a test's IDs never collide across stores.
static NEXT_STORE: AtomicU64 = AtomicU64::new(1);

/// The shared store and the channel that announces its changes.
pub(super) struct Inner {
    store_id: u64,
    state: Mutex<State>,
    pub(super) changes: watch::Sender<u64>,
    pub(super) keepers: Keepers,
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
    pub(super) fn read<R>(&self, f: impl FnOnce(&State, Instant) -> R) -> R {
        crate::metrics::backend_request(BackendKind::Memory, false);
        // No code panics while holding the lock, so a poisoned lock still holds consistent state.
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        f(&state, Instant::now())
    }

    /// Runs `f` on the state and wakes every waiter if it changed anything.
    pub(super) fn mutate<R>(&self, f: impl FnOnce(&mut State, Instant) -> R) -> R {
        crate::metrics::backend_request(BackendKind::Memory, true);
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let before = state.index;
        let result = f(&mut state, Instant::now());
        if state.index != before {
            self.changes.send_replace(state.index);
        }
        result
    }

    pub(super) fn create_session(self: &Arc<Self>, spec: &LeaseSpec) -> String {
        let behavior = match spec.target() {
            Target::Leader { .. } => Behavior::Release,
            Target::Semaphore { prefix, .. } => Behavior::Delete {
                prefix: prefix.clone(),
                settle: spec.settle_after_removal(),
            },
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
        crate::runtime::spawn(expire_when_due(Arc::downgrade(self), id.clone()));
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
pub(super) struct SessionGuard {
    inner: Arc<Inner>,
    pub(super) id: String,
    armed: bool,
}

impl SessionGuard {
    pub(super) fn create(inner: &Arc<Inner>, spec: &LeaseSpec) -> Self {
        SessionGuard {
            inner: Arc::clone(inner),
            id: inner.create_session(spec),
            armed: true,
        }
    }

    pub(super) fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for SessionGuard {
    fn drop(&mut self) {
        if self.armed {
            self.inner
                .mutate(|state, now| state.end_cleanly(&self.id, now));
        }
    }
}

#[derive(Default)]
pub(super) struct State {
    /// Like Consul's Raft index: rises with every change; entries' ModifyIndex values come from it.
    pub(super) index: u64,
    next_session: u64,
    pub(super) sessions: BTreeMap<String, Session>,
    pub(super) kv: BTreeMap<String, Entry>,
    /// Keys that cannot be acquired until the given instant (lock-delay after an invalidation).
    lock_delays: BTreeMap<String, Instant>,
    /// When a leader key was last taken from its holder without a clean release, and how:
    /// contenders settle after it (see `LeaseSpec::settle`).
    vanished: BTreeMap<String, (Instant, Vanished)>,
    /// The planners of the semaphores that remember something (a dead holder, a deleted
    /// `.lock`); a planner at rest is dropped.
    pub(super) planners: BTreeMap<String, Planner>,
}

pub(super) struct Session {
    ttl: Duration,
    lock_delay: Duration,
    pub(super) behavior: Behavior,
    expires_at: Instant,
}

/// What happens to a session's locks when it is invalidated (Consul's `Behavior`).
#[derive(Clone)]
pub(super) enum Behavior {
    /// A leader's session: its keys are released.
    Release,
    /// A semaphore contender's session: its contender key is deleted. It contends for the
    /// semaphore at `prefix`, with `LeaseSpec::settle_after_removal` `settle`.
    Delete { prefix: String, settle: Duration },
}

pub(super) struct Entry {
    pub(super) flags: u64,
    pub(super) lock_index: u64,
    pub(super) session: Option<String>,
    pub(super) modify_index: u64,
    pub(super) value: Value,
}

pub(super) enum Value {
    Bytes(Vec<u8>),
    /// A semaphore's `.lock`: `{"Limit": N, "Holders": {...}}` on Consul.
    Semaphore(LockValue),
}

/// How a leader key was taken from its holder.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Vanished {
    /// Its session was invalidated; the session's lock-delay was this long.
    Invalidated(Duration),
    /// An operator deleted it.
    Deleted,
}

/// The outcome of one attempt to acquire.
pub(super) enum Attempt {
    Acquired(HeldLock, Sequencer),
    /// HeldLock elsewhere: try again after the next change, or at `until`.
    Blocked {
        until: Option<Instant>,
    },
    SessionGone,
}

impl State {
    pub(super) fn bump(&mut self) -> u64 {
        self.index += 1;
        self.index
    }

    pub(super) fn renew(&mut self, id: &str, now: Instant) -> bool {
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
    pub(super) fn invalidate(&mut self, id: &str, now: Instant) -> bool {
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
            match &session.behavior {
                Behavior::Delete { .. } => {
                    self.kv.remove(&key);
                }
                Behavior::Release => {
                    self.vanished(&key, Vanished::Invalidated(session.lock_delay), now);
                    if let Some(entry) = self.kv.get_mut(&key) {
                        entry.session = None;
                        entry.modify_index = index;
                    }
                }
            }
        }
        if let Behavior::Delete { prefix, .. } = &session.behavior {
            self.observe_slots(prefix, now);
        }
        true
    }

    /// Deletes `key` as an operator does; a lock taken away without lock-delay, so contenders
    /// settle before taking it. Returns whether the key existed.
    pub(super) fn delete(&mut self, key: &str, now: Instant) -> bool {
        let Some(entry) = self.kv.remove(key) else {
            return false;
        };
        if entry.flags == SEMAPHORE_FLAGS {
            if let Some((prefix, _)) = key.rsplit_once('/') {
                self.observe_slots(prefix, now);
            }
        } else if entry.session.is_some() {
            self.vanished(key, Vanished::Deleted, now);
        }
        self.bump();
        true
    }

    /// A holder giving everything back: its slot (with its contender key), its leader keys, its
    /// session. Voluntary, so no lock-delay applies.
    pub(super) fn end_cleanly(&mut self, id: &str, now: Instant) {
        if let Some(Behavior::Delete { prefix, settle }) =
            self.sessions.get(id).map(|s| s.behavior.clone())
        {
            self.give_slot(&prefix, id, settle, now);
        }
        let index = self.bump();
        for entry in self.kv.values_mut() {
            if entry.session.as_deref() == Some(id) {
                entry.session = None;
                entry.modify_index = index;
            }
        }
        self.sessions.remove(id);
    }

    pub(super) fn try_acquire(
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

    /// Until when the leader key `key` is barred for the contender `spec`: the lock-delay of the
    /// session that last held it, and the contender's settle time after the lock was taken away
    /// without one.
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
        self.refuse_other_kind(&lock_key(key), SEMAPHORE_FLAGS, LEADER_FLAGS)?;
        if let Some(until) = self.lock_delay_until(key, spec, now) {
            return Ok(Attempt::Blocked { until: Some(until) });
        }
        let lock_index = self.lock(key, LEADER_FLAGS, session, value);
        let held = HeldLock::Leader {
            key: key.to_owned(),
            session: session.to_owned(),
            lock_index,
        };
        let sequencer = Sequencer::new(BackendKind::Memory, key, lock_index, session);
        Ok(Attempt::Acquired(held, sequencer))
    }

    /// Refuses a lock of the kind `expected` if `key`, the key the other kind would use on the
    /// same name, exists with that kind's flags `other`: a semaphore's `<prefix>/.lock` for a
    /// leader on `prefix`, a leader key for a semaphore on it. As on Consul, the key records the
    /// kind whether or not anyone holds it now. One map lookup, under the store's lock with the
    /// acquisition itself, so two first acquisitions of both kinds cannot race.
    pub(super) fn refuse_other_kind(
        &self,
        key: &str,
        other: u64,
        expected: u64,
    ) -> Result<(), Error> {
        match self.kv.get(key) {
            Some(entry) if entry.flags == other => Err(Error::FlagsConflict {
                key: key.to_owned(),
                found: other,
                expected,
            }),
            _ => Ok(()),
        }
    }

    /// Whether Consul's `?acquire=` of `key` by `session` would succeed now: the session exists,
    /// nobody else holds the key, and no lock-delay bars it.
    pub(super) fn can_lock(&self, key: &str, session: &str, now: Instant) -> bool {
        self.sessions.contains_key(session)
            && self
                .kv
                .get(key)
                .is_none_or(|entry| entry.session.as_deref().is_none_or(|s| s == session))
            && self.lock_delays.get(key).is_none_or(|until| *until <= now)
    }

    /// Consul's `?acquire=` on a key that is free: `session` takes it, LockIndex rises, the value
    /// is written. Returns the new LockIndex.
    pub(super) fn lock(&mut self, key: &str, flags: u64, session: &str, value: &[u8]) -> u64 {
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

    pub(super) fn leader_of(&self, key: &str) -> Option<Leader> {
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
