//! The sessions a client released cleanly, lately ([`ReleasedSessions`]).

/// A leader key as one of this client's sessions held it: the key's CreateIndex and the
/// LockIndex of the acquisition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Holding {
    pub(crate) key: String,
    pub(crate) create_index: u64,
    pub(crate) lock_index: u64,
}

/// The sessions a client gave back with a clean release (the key released, then the session
/// destroyed), the most recent [`ReleasedSessions::KEPT`] of them, with the holding each gave
/// back when it held one.
///
/// A contender that sees a key released under a lock-delay shorter than its settle time asks
/// Consul whether the last holder's session still exists: gone, it was invalidated, and its
/// holder may still be stopping. But a clean release destroys the session right after, and the
/// contender's question often came after the destroy: every hand-off between the tasks of one
/// process settled (104 ms against 4 ms). A session this client released itself is known to have
/// gone cleanly, whatever Consul answers by then. (Between processes the question stays, and
/// its answer errs on the side of settling.)
///
/// A contender that never saw the holder at all (taken and released between two of its reads)
/// cannot ask about its session, and settles, unless the holding (key, CreateIndex, LockIndex)
/// is one this client gave back: CI's hand-over between two tasks of one process took 100 ms
/// and more whenever the follower's reads straddled the leader's short tenure.
///
/// A give-back is recorded as it starts: its work has stopped, so whether the key is then
/// released or (the release failing) freed by the session's destroy, its holder is not one to
/// settle for.
#[derive(Debug, Default)]
pub(crate) struct ReleasedSessions(std::sync::Mutex<std::collections::VecDeque<Released>>);

#[derive(Debug)]
struct Released {
    session: String,
    holding: Option<Holding>,
}

impl ReleasedSessions {
    /// How many are remembered: far more than a process hands over within one settle time.
    const KEPT: usize = 1024;

    pub(super) fn record(&self, session: &str, holding: Option<&Holding>) {
        let mut released = self.lock();
        if released.len() == Self::KEPT {
            released.pop_front();
        }
        released.push_back(Released {
            session: session.to_owned(),
            holding: holding.cloned(),
        });
    }

    /// Whether this client released `session`'s key cleanly.
    pub(crate) fn contains(&self, session: &str) -> bool {
        self.lock().iter().rev().any(|r| r.session == session)
    }

    /// Whether this client gave back `holding`.
    pub(crate) fn gave_back(&self, holding: &Holding) -> bool {
        self.lock()
            .iter()
            .rev()
            .any(|r| r.holding.as_ref() == Some(holding))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::VecDeque<Released>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_sessions_and_their_holdings_up_to_its_bound() {
        let released = ReleasedSessions::default();
        let holding = |lock_index| Holding {
            key: "k".into(),
            create_index: 7,
            lock_index,
        };
        released.record("s0", Some(&holding(0)));
        for n in 1..=ReleasedSessions::KEPT {
            released.record(&format!("s{n}"), Some(&holding(n as u64)));
        }
        assert!(!released.contains("s0"));
        assert!(!released.gave_back(&holding(0)));
        assert!(released.contains("s1"));
        assert!(released.gave_back(&holding(1)));
        let elsewhere = Holding {
            create_index: 8,
            ..holding(1)
        };
        assert!(!released.gave_back(&elsewhere));
    }
}
