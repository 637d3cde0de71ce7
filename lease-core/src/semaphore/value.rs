//! The shapes of a semaphore's state: the keys, the decoded value of `<prefix>/.lock`, and what
//! one consistent look at the prefix says about it.
//!
//! The JSON form of the value is Consul's concern (`consul::semaphore::value`); the memory store
//! keeps a [`LockValue`] as it is.

use std::collections::{BTreeSet, HashMap, HashSet};

use crate::{Error, Sequencer};

/// The flags `consul lock -n` (and Consul's Go `api.Semaphore`) put on its keys; ours carry them
/// too, so a key is never used as two kinds of lock.
pub(crate) const SEMAPHORE_FLAGS: u64 = Error::SEMAPHORE_FLAGS;

/// The coordinating key of the semaphore at `prefix`.
pub(crate) fn lock_key(prefix: &str) -> String {
    format!("{prefix}/.lock")
}

/// The contender key of `session` in the semaphore at `prefix`.
pub(crate) fn contender_key(prefix: &str, session: &str) -> String {
    format!("{prefix}/{session}")
}

/// The prefix of a semaphore sequencer's contender key, if its key is one.
pub(crate) fn prefix_of(sequencer: &Sequencer) -> Option<&str> {
    sequencer
        .key()
        .strip_suffix(sequencer.holder())
        .and_then(|p| p.strip_suffix('/'))
}

/// The decoded value of `<prefix>/.lock`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LockValue {
    pub(crate) limit: u64,
    pub(crate) holders: BTreeSet<String>,
}

/// Why a lock key must be left alone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Unreadable {
    /// It carries another kind of lock's flags.
    Flags(u64),
    /// Its value cannot be parsed.
    Corrupt(String),
}

impl Unreadable {
    pub(crate) fn to_error(&self, prefix: &str) -> Error {
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
pub(crate) struct Snapshot {
    /// The lock key's ModifyIndex and value; `Ok(None)` if it does not exist.
    pub(crate) lock: Result<Option<(u64, LockValue)>, Unreadable>,
    /// Sessions holding some key under the prefix: the holders still alive.
    pub(crate) live: HashSet<String>,
    /// Sessions holding their own contender key, with its LockIndex.
    pub(crate) contenders: HashMap<String, u64>,
    /// The index to block on for the next change.
    pub(crate) index: u64,
    /// When the lock key was created, where the backend says (Consul's CreateIndex): another
    /// value than the last one seen means it was deleted and created again between two reads.
    pub(crate) lock_created: Option<u64>,
}

impl Snapshot {
    /// The stored limit, if the lock key exists and is readable.
    pub(crate) fn limit(&self) -> Option<u64> {
        self.value().map(|value| value.limit)
    }

    /// The recorded holders whose sessions still hold a key; the others are dead.
    pub(crate) fn live_holders(&self) -> BTreeSet<String> {
        self.recorded()
            .filter(|h| self.live.contains(*h))
            .cloned()
            .collect()
    }

    /// Whether `session` is recorded as a holder.
    pub(crate) fn records_holder(&self, session: &str) -> bool {
        self.value()
            .is_some_and(|value| value.holders.contains(session))
    }

    /// The holders the lock key records, alive or not; none if it is missing or unreadable.
    pub(crate) fn recorded(&self) -> impl Iterator<Item = &String> {
        self.value().into_iter().flat_map(|value| &value.holders)
    }

    fn value(&self) -> Option<&LockValue> {
        match &self.lock {
            Ok(Some((_, value))) => Some(value),
            _ => None,
        }
    }
}
