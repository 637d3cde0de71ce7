//! What a held lease is, and how its holder watches, renews and gives it back.
//!
//! A [`HeldLock`] names what one lease holds (a leader key, or a slot: its contender key and the
//! semaphore's `.lock`); [`State::verify`] is the one rule that says whether it still holds it,
//! for the holder's watch and for `check_sequencer` alike. [`MemoryHold`] is the backend's part
//! of the holder task (`crate::backend::Hold`).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::{Instant, sleep_until};

use super::held::HeldLock;
use super::store::{Inner, State, Value};
use crate::backend::{Fence, Hold};
use crate::semaphore::{SEMAPHORE_FLAGS, lock_key, prefix_of};
use crate::{BoxFuture, Error, LostReason, Sequencer};

impl HeldLock {
    /// What a sequencer issued by this store claims to hold: a slot if its key is a semaphore's
    /// contender key, else a leader key.
    pub(super) fn from_sequencer(state: &State, sequencer: &Sequencer) -> HeldLock {
        let session = sequencer.holder().to_owned();
        let prefix = prefix_of(sequencer);
        let is_slot = state
            .kv
            .get(sequencer.key())
            .is_none_or(|entry| entry.flags == SEMAPHORE_FLAGS);
        match prefix {
            Some(prefix) if is_slot => HeldLock::Slot {
                lock_key: lock_key(prefix),
                contender_key: sequencer.key().to_owned(),
                session,
                lock_index: sequencer.index(),
            },
            _ => HeldLock::Leader {
                key: sequencer.key().to_owned(),
                session,
                lock_index: sequencer.index(),
            },
        }
    }
}

impl State {
    /// One consistent look at whether `held` is still held; the single rule behind both the
    /// holder's watch and `Lease::check`.
    pub(super) fn verify(&self, held: &HeldLock) -> Result<(), LostReason> {
        if !self.sessions.contains_key(held.session()) {
            return Err(LostReason::SessionInvalidated);
        }
        match held {
            HeldLock::Leader {
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
            HeldLock::Slot {
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
                    Value::Semaphore(value) if value.holders.contains(session) => Ok(()),
                    _ => Err(LostReason::HolderPruned),
                }
            }
        }
    }
}

pub(super) struct MemoryHold {
    pub(super) inner: Arc<Inner>,
    pub(super) held: HeldLock,
    pub(super) fence: Fence,
    pub(super) renew_every: Duration,
    pub(super) next_renewal: Instant,
}

impl Hold for MemoryHold {
    async fn watch(&mut self) -> LostReason {
        loop {
            let mut changes = self.inner.changes.subscribe();
            if let Err(reason) = self.inner.read(|state, _| state.verify(&self.held)) {
                return reason;
            }
            tokio::select! {
                biased;
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
        self.inner
            .mutate(|state, now| state.end_cleanly(&session, now));
        Ok(())
    }

    async fn clean_up(&mut self, _reason: &LostReason) {
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
        self.inner
            .mutate(|state, now| state.end_cleanly(&session, now));
        None
    }
}
