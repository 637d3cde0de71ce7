//! The sessions a client released cleanly, lately ([`ReleasedSessions`]).

/// The sessions a client gave back with a clean release (the key released, then the session
/// destroyed), the most recent [`ReleasedSessions::KEPT`] of them.
///
/// A contender that sees a key released under a lock-delay shorter than its settle time asks
/// Consul whether the last holder's session still exists: gone, it was invalidated, and its
/// holder may still be stopping. But a clean release destroys the session right after, and the
/// contender's question often came after the destroy: every hand-off between the tasks of one
/// process settled (104 ms against 4 ms). A session this client released itself is known to have
/// gone cleanly, whatever Consul answers by then. (Between processes the question stays, and
/// its answer errs on the side of settling.)
#[derive(Debug, Default)]
pub(crate) struct ReleasedSessions(std::sync::Mutex<std::collections::VecDeque<String>>);

impl ReleasedSessions {
    /// How many are remembered: far more than a process hands over within one settle time.
    const KEPT: usize = 1024;

    pub(super) fn record(&self, session: &str) {
        let mut sessions = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if sessions.len() == Self::KEPT {
            sessions.pop_front();
        }
        sessions.push_back(session.to_owned());
    }

    /// Whether this client released `session`'s key cleanly.
    pub(crate) fn contains(&self, session: &str) -> bool {
        let sessions = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        sessions.iter().rev().any(|s| s == session)
    }
}
