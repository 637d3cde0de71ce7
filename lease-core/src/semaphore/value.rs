//! The shapes of a semaphore's state: the keys, the decoded value of `<prefix>/.lock`, and what
//! one consistent look at the prefix says about it.
//!
//! The JSON form of the value is Consul's concern (`consul::semaphore::value`); the memory store
//! keeps a [`LockValue`] as it is.

use std::collections::{BTreeMap, BTreeSet};

use crate::{Error, Sequencer};

/// The flags `consul lock -n` (and Consul's Go `api.Semaphore`) put on its keys; ours carry them
/// too, so a key is never used as two kinds of lock.
pub const SEMAPHORE_FLAGS: u64 = Error::SEMAPHORE_FLAGS;

/// The coordinating key of the semaphore at `prefix`.
pub fn lock_key(prefix: &str) -> String {
    format!("{prefix}/.lock")
}

/// The contender key of `session` in the semaphore at `prefix`.
pub fn contender_key(prefix: &str, session: &str) -> String {
    format!("{prefix}/{session}")
}

/// The prefix of a semaphore sequencer's contender key, if its key is one.
pub fn prefix_of(sequencer: &Sequencer) -> Option<&str> {
    sequencer
        .key()
        .strip_suffix(sequencer.holder())
        .and_then(|p| p.strip_suffix('/'))
}

/// The decoded value of `<prefix>/.lock`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockValue {
    /// The semaphore's limit, which every contender must ask for.
    pub limit: u64,
    /// The sessions holding a slot.
    pub holders: BTreeSet<String>,
}

/// Why a lock key must be left alone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unreadable {
    /// It carries another kind of lock's flags.
    Flags(u64),
    /// Its value cannot be parsed.
    Corrupt(String),
}

impl Unreadable {
    /// The error a take on `prefix` is refused with.
    pub fn to_error(&self, prefix: &str) -> Error {
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
pub struct Snapshot {
    /// The lock key's ModifyIndex and value; `Ok(None)` if it does not exist.
    pub lock: Result<Option<(u64, LockValue)>, Unreadable>,
    /// Sessions holding some key under the prefix: the holders still alive.
    pub live: BTreeSet<String>,
    /// Sessions holding their own contender key, with its LockIndex.
    pub contenders: BTreeMap<String, u64>,
    /// The index to block on for the next change.
    pub index: u64,
    /// When the lock key was created, where the backend says (Consul's CreateIndex): another
    /// value than the last one seen means it was deleted and created again between two reads.
    pub lock_created: Option<u64>,
}

impl Snapshot {
    /// The stored limit, if the lock key exists and is readable.
    pub fn limit(&self) -> Option<u64> {
        self.value().map(|value| value.limit)
    }

    /// The recorded holders whose sessions still hold a key; the others are dead.
    pub fn live_holders(&self) -> BTreeSet<String> {
        self.recorded()
            .filter(|h| self.live.contains(*h))
            .cloned()
            .collect()
    }

    /// Whether `session` is recorded as a holder.
    pub fn records_holder(&self, session: &str) -> bool {
        self.value()
            .is_some_and(|value| value.holders.contains(session))
    }

    /// The holders the lock key records, alive or not; none if it is missing or unreadable.
    pub fn recorded(&self) -> impl Iterator<Item = &String> {
        self.value().into_iter().flat_map(|value| &value.holders)
    }

    fn value(&self) -> Option<&LockValue> {
        match &self.lock {
            Ok(Some((_, value))) => Some(value),
            _ => None,
        }
    }
}
