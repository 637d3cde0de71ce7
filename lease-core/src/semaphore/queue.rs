//! The requests a planner round serves: takes and give-backs, queued in arrival order with
//! their callers' replies, which the planner hands back untouched.

use std::collections::VecDeque;
use std::fmt;
use std::time::Duration;

/// A request for a slot. It is queued with the caller's reply (how to answer it, what to
/// write), which the planner hands back untouched.
pub struct Take {
    /// The session to admit.
    pub session: String,
    /// The limit the contender expects.
    pub limit: u64,
    /// How long a holder that lost its slot without a clean release keeps it before this take
    /// may have it: `LeaseSpec::settle_after_removal`.
    pub settle: Duration,
    /// Answer [`Taken::Full`](super::Taken::Full) after one fresh read instead of waiting.
    pub once: bool,
}

impl fmt::Debug for Take {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let once = if self.once { ", once" } else { "" };
        let (session, limit, settle) = (&self.session, self.limit, self.settle);
        write!(f, "take {session} (limit {limit}, settle {settle:?}{once})")
    }
}

/// A request to give a slot back (if the session has one), queued with the caller's reply.
#[derive(Debug)]
pub struct Give {
    /// The session giving its slot back.
    pub session: String,
    /// Delete the session's contender key too (a pooled session keeps it).
    pub delete_contender: bool,
    /// The settle time of the lease given back (see [`Take::settle`]): a round that only gives
    /// back prunes other holders no sooner than its takes would.
    pub settle: Duration,
}

/// The takes and give-backs waiting for a round, takes in arrival order.
#[derive(Debug)]
pub struct Queue<T, G> {
    pub(super) takes: VecDeque<(Take, T)>,
    pub(super) gives: VecDeque<(Give, G)>,
}

impl<T, G> Default for Queue<T, G> {
    fn default() -> Self {
        Queue {
            takes: VecDeque::new(),
            gives: VecDeque::new(),
        }
    }
}

impl<T, G> Queue<T, G> {
    /// Queues a take, answered through `reply`.
    pub fn push_take(&mut self, take: Take, reply: T) {
        self.takes.push_back((take, reply));
    }

    /// Queues a give-back, answered through `reply`.
    pub fn push_give(&mut self, give: Give, reply: G) {
        self.gives.push_back((give, reply));
    }

    /// Whether nothing waits for a round.
    pub fn is_empty(&self) -> bool {
        self.takes.is_empty() && self.gives.is_empty()
    }

    /// Keeps the takes whose reply `keep` says is still wanted.
    pub fn retain_takes(&mut self, mut keep: impl FnMut(&T) -> bool) {
        self.takes.retain(|(_, reply)| keep(reply));
    }

    /// The replies of the queued takes.
    pub fn take_replies_mut(&mut self) -> impl Iterator<Item = &mut T> {
        self.takes.iter_mut().map(|(_, reply)| reply)
    }

    /// Removes and returns the give-backs `pick` picks.
    pub fn drain_gives(&mut self, mut pick: impl FnMut(&G) -> bool) -> Vec<(Give, G)> {
        let (picked, kept): (VecDeque<_>, VecDeque<_>) =
            self.gives.drain(..).partition(|(_, reply)| pick(reply));
        self.gives = kept;
        picked.into()
    }

    /// Removes and returns every take.
    pub fn drain_takes(&mut self) -> Vec<(Take, T)> {
        self.takes.drain(..).collect()
    }

    /// Puts the requests of a write that did not go through back at the front, in their order:
    /// they keep their place.
    pub fn put_back(
        &mut self,
        takes: impl DoubleEndedIterator<Item = (Take, T)>,
        gives: impl DoubleEndedIterator<Item = (Give, G)>,
    ) {
        for take in takes.rev() {
            self.takes.push_front(take);
        }
        for give in gives.rev() {
            self.gives.push_front(give);
        }
    }

    /// Whether `session` waits for a slot.
    pub(super) fn waits(&self, session: &str) -> bool {
        self.takes.iter().any(|(t, _)| t.session == session)
    }
}
