//! The in-process backend: Consul's lease semantics with no server, the embedded default.
//!
//! [`Memory`] keeps a small model of Consul's state in one process (`store`): sessions (TTL,
//! lock-delay, release or delete behaviour), KV entries with `LockIndex`/`ModifyIndex`, leader
//! keys, and semaphores built exactly like Consul's (`slots`): a contender key
//! `<prefix>/<session>` per holder and a `<prefix>/.lock` entry holding the limit and the holder
//! set, admitted and pruned by the same planner as the Consul coordinator. Clones share one
//! store, like several clients of one Consul, so "nodes" of a test or demo are tasks holding
//! clones. A held lease is watched by `hold`.
//!
//! A name is used by one kind of lock at a time, as on Consul, and the keys say which: a leader
//! lock on `p` is refused while `p/.lock` carries the semaphore's flags, and a semaphore on `k`
//! while the leader key `k` exists (held or not, until [`Memory::delete_key`]), both at once with
//! [`Error::FlagsConflict`]. The check is one lookup under the store's lock, in the same step as
//! the acquisition, so not even two first acquisitions of both kinds can race.
//!
//! Every change bumps a store-wide index published on a `tokio::sync::watch` channel; waiters and
//! holders sleep on it (the blocking query of this backend) and never poll. Time comes from
//! `tokio::time`, so tests can run it with paused time. The operator actions
//! ([`Memory::invalidate_session`], [`Memory::delete_key`], [`Memory::release_key`]) are what
//! `PUT /v1/session/destroy` and `DELETE`/`?release=` on `/v1/kv` do on Consul: this is how the
//! demo, the conformance suite and the unit tests inject faults without a server.

mod held;
mod hold;
mod slots;
mod store;
#[cfg(test)]
mod tests;

use std::fmt;
use std::sync::Arc;

use tokio::sync::watch;
use tokio::time::{Instant, sleep_until};

use self::held::HeldLock;
use self::hold::MemoryHold;
use self::store::{Attempt, Inner, SessionGuard};
use crate::backend::{Fence, Reachability};
use crate::observer::LeaderObserver;
use crate::spec::validate_key;
use crate::{BackendKind, BoxFuture, Error, Lease, LeaseSpec, Sequencer};

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
        self.inner.mutate(|state, now| state.delete(key, now))
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

    fn start_lease(&self, held: HeldLock, sequencer: Sequencer, spec: &LeaseSpec) -> Lease {
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
                biased;
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
        crate::runtime::spawn(async move {
            loop {
                let mut changes = inner.changes.subscribe();
                let leader = inner.read(|state, _| state.leader_of(&owned_key));
                tx.send_if_modified(|seen| {
                    let modified = *seen != leader;
                    *seen = leader;
                    modified
                });
                tokio::select! {
                    biased;
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
        crate::backend::instrument_acquire(BackendKind::Memory, spec, self.acquire_inner(spec))
    }

    fn observe_leader<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<LeaderObserver, Error>> {
        Box::pin(self.observe_inner(key))
    }

    fn check_sequencer<'a>(&'a self, sequencer: &'a Sequencer) -> BoxFuture<'a, Result<(), Error>> {
        let verdict = self
            .inner
            .read(|state, _| state.verify(&HeldLock::from_sequencer(state, sequencer)));
        Box::pin(async move { verdict.map_err(Error::Lost) })
    }

    /// Always [`Reachable`](Reachability::Reachable): the store is in this process.
    fn reachability(&self) -> Reachability {
        Reachability::Reachable
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
