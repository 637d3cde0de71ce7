//! [`HeldLock`]: what one lease holds (a leader key, or a slot: its contender key and the
//! semaphore's `.lock`), named below the store that hands it out and the holder that verifies it.

/// What one lease holds, enough to verify it against the store.
#[derive(Clone)]
pub(super) enum HeldLock {
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

impl HeldLock {
    pub(super) fn session(&self) -> &str {
        match self {
            HeldLock::Leader { session, .. } | HeldLock::Slot { session, .. } => session,
        }
    }
}
