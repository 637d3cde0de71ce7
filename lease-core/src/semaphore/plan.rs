//! Who holds a slot: the planner of a semaphore's rounds.
//!
//! A round takes a [`Snapshot`] of the prefix and the [`Queue`] of one process's takes and
//! give-backs, and decides:
//!
//! - which takes are answered without a write: refused (an unreadable lock key, another limit),
//!   found already recorded (a write whose answer was lost went through), or told the semaphore
//!   is full (a take that must not wait, on a fresh read);
//! - the holders after the round: the live recorded holders, and the dead ones still within the
//!   settle time since they were first seen dead, less those leaving, plus those admitted;
//! - whether admission waits because `.lock` was deleted under live contenders;
//! - the writes ([`Write`]): contender keys to delete, contender keys to lock, and the new holder
//!   set to write with CAS on the lock key's ModifyIndex.
//!
//! Between rounds a [`Planner`] remembers only when it first saw each dead holder and the
//! missing lock key, and the longest settle time it has served. It never reads a clock: the
//! caller passes `now`, and [`Planner::next_wake`] says when a round is due with no change.
//!
//! # Why dead holders keep their slots
//!
//! A holder whose session was invalidated behind its back, or whose contender key or `.lock`
//! was deleted, may still be running its work until it notices. Consul applies no lock-delay to
//! `.lock` (no session holds it), so the planner carries the lock-delay's promise over: a dead
//! holder counts against the limit until the settle time
//! ([`LeaseSpec::settle_after_removal`](crate::LeaseSpec::settle_after_removal)) has passed since
//! it was first seen dead, and a `.lock` deleted while other sessions still hold contender keys
//! admits nobody for that long, even once those sessions are gone (a holder cleans up as soon as
//! it learns the loss, which may be before its work has stopped). With lock-delay and settle 0,
//! dead holders are pruned at once, as `consul lock -n` does.
//!
//! A round that only gives back counts the settle times of its give-backs too, so a process
//! that only releases never prunes another process's dead holder early.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use tokio::time::Instant;

use super::queue::{Give, Queue, Take};
use super::value::{LockValue, Snapshot};
use crate::Error;

/// How many takes one round admits at most: a Consul 1.8 transaction takes at most 64
/// operations, and a take is up to 2 (unlock, lock), a give-back 1, plus the CAS.
const MAX_TAKES: usize = 20;
/// How many give-backs one round writes at most (see [`MAX_TAKES`]).
const MAX_GIVES: usize = 20;

/// The answer to a take.
#[derive(Debug, PartialEq, Eq)]
pub enum Taken {
    /// Admitted: the contender key's LockIndex, and an index from which to watch the prefix.
    Admitted {
        /// The contender key's LockIndex after this session locked it.
        lock_index: u64,
        /// The index of the read the admission was planned on.
        index: u64,
    },
    /// No slot is free, and the take asked not to wait.
    Full,
    /// The session cannot lock its contender key: the backend no longer has it.
    SessionGone,
}

/// What one round decided.
#[derive(Debug)]
pub struct Plan<T, G> {
    /// Takes answered without a write: refused, found recorded, or told the semaphore is full.
    pub answered: Vec<(Take, T, Result<Taken, Error>)>,
    /// Give-backs done without a write: their session held no slot and they delete nothing.
    pub given: Vec<(Give, G)>,
    /// What to do next.
    pub next: Next<T, G>,
}

/// What the caller does after answering a [`Plan`].
#[derive(Debug)]
pub enum Next<T, G> {
    /// Write this, as one atomic step, then plan again.
    Write(Write<T, G>),
    /// Read the prefix afresh, then plan again: a take that must not wait is refused only on
    /// a fresh read, not on a state derived from our own writes.
    Reread,
    /// Nothing to write and takes wait: plan again when the prefix changes, or at
    /// [`Planner::next_wake`].
    Wait,
    /// Nothing to write and nothing waits.
    Idle,
}

/// The writes of one round, all or nothing.
#[derive(Debug)]
pub struct Write<T, G> {
    /// Those leaving: delete the contender keys of those with `delete_contender`.
    pub gives: Vec<(Give, G)>,
    /// Those admitted: lock their contender keys.
    pub admits: Vec<Admit<T>>,
    /// The new value of the lock key, if it changes.
    pub lock: Option<LockWrite>,
}

/// An admitted take.
#[derive(Debug)]
pub struct Admit<T> {
    /// The take admitted.
    pub take: Take,
    /// Its caller's reply.
    pub reply: T,
    /// The session already holds its contender key (a pooled session): unlock it first, so the
    /// LockIndex, and with it the sequencer, changes on every admission.
    pub relock: bool,
}

/// A compare-and-set of the lock key.
#[derive(Debug, PartialEq, Eq)]
pub struct LockWrite {
    /// The ModifyIndex the lock key must still have; 0: it must not exist.
    pub cas_index: u64,
    /// The value to write.
    pub value: LockValue,
}

impl<T, G> Write<T, G> {
    /// The snapshot this write leads to once it went through at index `written`, given the lock
    /// key's new ModifyIndex and the LockIndex of each admitted contender key (in the order of
    /// `admits`): the next round can plan on it without reading.
    pub fn applied_to(
        &self,
        snapshot: &Snapshot,
        written: u64,
        lock_modify_index: u64,
        lock_indexes: &[u64],
    ) -> Snapshot {
        let mut next = snapshot.clone();
        next.index = next.index.max(written);
        if let Some(lock) = &self.lock {
            next.lock = Ok(Some((lock_modify_index, lock.value.clone())));
            if lock.cas_index == 0 {
                // Created by this write.
                next.lock_created = Some(lock_modify_index);
            }
        }
        for (give, _) in self.gives.iter().filter(|(g, _)| g.delete_contender) {
            next.live.remove(&give.session);
            next.contenders.remove(&give.session);
        }
        for (admit, lock_index) in self.admits.iter().zip(lock_indexes) {
            let session = &admit.take.session;
            next.live.insert(session.clone());
            next.contenders.insert(session.clone(), *lock_index);
        }
        next
    }
}

/// What a semaphore's planner remembers between rounds.
#[derive(Debug, Default)]
pub struct Planner {
    /// Recorded holders whose sessions are gone, and when they were first seen so.
    dead_since: BTreeMap<String, Instant>,
    /// Since when the lock key has been missing, first seen while sessions other than waiting
    /// takes held contender keys: it was deleted under its holders, who may still be running
    /// even once their sessions (and contender keys) are gone.
    lock_gone_since: Option<Instant>,
    /// The lock key's creation index when last seen, and whether it recorded holders then: a
    /// lock key re-created by someone else between two reads was deleted meanwhile.
    lock_seen: Option<(u64, bool)>,
    /// The longest settle time of any request planned for.
    settle: Duration,
    /// When a dead holder may be pruned or a deleted lock key settles, if one waits for it.
    next_wake: Option<Instant>,
}

impl Planner {
    /// When the last round's answer changes with no change to the prefix: a dead holder's
    /// settle time ends, or a deleted lock key's.
    pub fn next_wake(&self) -> Option<Instant> {
        self.next_wake
    }

    /// Whether the planner remembers nothing a later round needs.
    pub fn at_rest(&self) -> bool {
        self.dead_since.is_empty() && self.lock_gone_since.is_none()
    }

    /// Notes what `snapshot` shows at `now`: holders first seen dead, and a lock key missing
    /// under live contenders other than those `waiting` for a slot. Every round does this
    /// first; a backend that sees each change as it happens may do it then too.
    pub fn observe(&mut self, snapshot: &Snapshot, waiting: impl Fn(&str) -> bool, now: Instant) {
        let dead = |s: &String| !snapshot.live.contains(s);
        self.dead_since
            .retain(|s, _| snapshot.records_holder(s) && dead(s));
        for session in snapshot.recorded().filter(|s| dead(s)) {
            self.dead_since.entry(session.clone()).or_insert(now);
        }
        match &snapshot.lock {
            Ok(Some((_, value))) => {
                // A lock key with holders, deleted and created again (by `consul lock -n`,
                // which does not settle) between two reads: the deletion was missed, not the
                // holders it stopped.
                if let Some(created) = snapshot.lock_created {
                    if (self.lock_seen)
                        .is_some_and(|(seen, had_holders)| seen != created && had_holders)
                    {
                        self.lock_gone_since = Some(now);
                    }
                    self.lock_seen = Some((created, !value.holders.is_empty()));
                }
                // Re-created (by us after the settle, or at once by another library): the
                // holders it was deleted under may still be stopping, whoever wrote the new
                // one, so the settle runs its course.
                self.forget_settled_deletion(now);
            }
            Ok(None) => {
                // Seen since the last deletion: this is a new one, whose holders' settle starts
                // now, however recently an earlier settle ran out.
                let last_seen = self.lock_seen.take();
                let deleted_anew = last_seen.is_some();
                // Deleted under holders we saw (they may have cleaned up before this read, as a
                // holder does the moment it learns the loss, before its work has stopped), or
                // under live contenders of others.
                let had_holders = last_seen.is_some_and(|(_, had_holders)| had_holders);
                if had_holders || snapshot.live.iter().any(|s| !waiting(s)) {
                    if deleted_anew {
                        self.lock_gone_since = Some(now);
                    } else {
                        self.lock_gone_since.get_or_insert(now);
                    }
                }
                // Otherwise its holders may have cleaned up before they stopped: still settling.
            }
            Err(_) => self.forget_settled_deletion(now),
        }
    }

    /// Forgets a deletion whose settle has run out.
    fn forget_settled_deletion(&mut self, now: Instant) {
        if (self.lock_gone_since).is_some_and(|since| since + self.settle <= now) {
            self.lock_gone_since = None;
        }
    }

    /// Plans one round for the semaphore at `prefix`: answers what needs no write, and takes
    /// the requests of the write (if any) out of `queue`. `fresh`: `snapshot` was read from the
    /// backend, not derived from our own writes.
    pub fn plan<T, G>(
        &mut self,
        prefix: &str,
        snapshot: &Snapshot,
        queue: &mut Queue<T, G>,
        fresh: bool,
        now: Instant,
    ) -> Plan<T, G> {
        let settles = queue.takes.iter().map(|(t, _)| t.settle);
        self.settle = settles
            .chain(queue.gives.iter().map(|(g, _)| g.settle))
            .fold(self.settle, Duration::max);
        self.observe(snapshot, |s| queue.waits(s), now);
        let mut answered = refuse_unservable(prefix, snapshot, queue);
        let gives: Vec<(Give, G)> = {
            let n = queue.gives.len().min(MAX_GIVES);
            queue.gives.drain(..n).collect()
        };
        let mut holders = self.unpruned_holders(snapshot, now);
        let pruning = snapshot.recorded().any(|h| !holders.contains(h));
        for (give, _) in &gives {
            holders.remove(&give.session);
        }

        // A take already recorded as a holder: our write went through, but its answer was lost.
        // Not if a give-back of the same session still waits beyond this round's batch: that
        // give would take the slot away from the take right after.
        let giving_later: BTreeSet<&str> = (queue.gives.iter())
            .map(|(g, _)| g.session.as_str())
            .collect();
        let (recorded, waiting): (VecDeque<_>, VecDeque<_>) =
            queue.takes.drain(..).partition(|(t, _)| {
                holders.contains(&t.session)
                    && snapshot.contenders.contains_key(&t.session)
                    && !giving_later.contains(t.session.as_str())
            });
        queue.takes = waiting;
        for (take, reply) in recorded {
            let lock_index = snapshot.contenders.get(&take.session).copied();
            let taken = Taken::Admitted {
                lock_index: lock_index.unwrap_or_default(),
                index: snapshot.index,
            };
            answered.push((take, reply, Ok(taken)));
        }

        let limit = snapshot
            .limit()
            .or(queue.takes.front().map(|(t, _)| t.limit));
        let free = match limit {
            Some(limit) if !self.lock_settling(now) => usize::try_from(limit)
                .unwrap_or(usize::MAX)
                .saturating_sub(holders.len()),
            _ => 0,
        };
        let admit_count = queue
            .takes
            .iter()
            .take_while(|(t, _)| Some(t.limit) == limit)
            .count()
            .min(free)
            .min(MAX_TAKES);
        let admits: Vec<(Take, T)> = queue.takes.drain(..admit_count).collect();

        if queue.takes.iter().any(|(t, _)| t.once) {
            if !fresh {
                queue.put_back(admits.into_iter(), gives.into_iter());
                return Plan {
                    answered,
                    given: Vec::new(),
                    next: Next::Reread,
                };
            }
            let (once, waiting): (VecDeque<_>, VecDeque<_>) =
                queue.takes.drain(..).partition(|(t, _)| t.once);
            queue.takes = waiting;
            let full = once
                .into_iter()
                .map(|(t, reply)| (t, reply, Ok(Taken::Full)));
            answered.extend(full);
        }

        let leaving_recorded = (gives.iter()).any(|(g, _)| snapshot.records_holder(&g.session));
        let deleting = gives.iter().any(|(g, _)| g.delete_contender);
        if admits.is_empty() && !leaving_recorded && !deleting && !pruning {
            let next = if queue.takes.is_empty() {
                Next::Idle
            } else {
                Next::Wait
            };
            return Plan {
                answered,
                given: gives,
                next,
            };
        }
        holders.extend(admits.iter().map(|(t, _)| t.session.clone()));
        // An unreadable lock key is never rewritten: deleting contender keys is all we do then.
        let lock = match (&snapshot.lock, limit) {
            (Ok(current), Some(limit)) if !admits.is_empty() || leaving_recorded || pruning => {
                Some(LockWrite {
                    cas_index: current.as_ref().map_or(0, |(index, _)| *index),
                    value: LockValue { limit, holders },
                })
            }
            _ => None,
        };
        let admits = admits
            .into_iter()
            .map(|(take, reply)| Admit {
                relock: snapshot.contenders.contains_key(&take.session),
                take,
                reply,
            })
            .collect();
        Plan {
            answered,
            given: Vec::new(),
            next: Next::Write(Write {
                gives,
                admits,
                lock,
            }),
        }
    }

    /// The recorded holders that still count against the limit: the live ones, and the dead
    /// ones until the settle time has passed since they were first seen dead.
    fn unpruned_holders(&mut self, snapshot: &Snapshot, now: Instant) -> BTreeSet<String> {
        self.next_wake = None;
        let mut holders = BTreeSet::new();
        for session in snapshot.recorded() {
            if !snapshot.live.contains(session) {
                let seen = self.dead_since.get(session).copied().unwrap_or(now);
                let prunable_at = seen + self.settle;
                if prunable_at <= now {
                    continue;
                }
                self.wake_at(prunable_at);
            }
            holders.insert(session.clone());
        }
        holders
    }

    /// Whether a lock key deleted under live contenders is still settling: its holders lost
    /// their slots all at once and may still be stopping, so recreating it with a fresh holder
    /// set at once would let more than the limit run.
    fn lock_settling(&mut self, now: Instant) -> bool {
        let Some(since) = self.lock_gone_since else {
            return false;
        };
        let until = since + self.settle;
        if until <= now {
            return false;
        }
        self.wake_at(until);
        true
    }

    fn wake_at(&mut self, at: Instant) {
        self.next_wake = Some(self.next_wake.map_or(at, |w| w.min(at)));
    }
}

/// Refuses the takes this semaphore can never serve: an unreadable lock key, another limit.
fn refuse_unservable<T, G>(
    prefix: &str,
    snapshot: &Snapshot,
    queue: &mut Queue<T, G>,
) -> Vec<(Take, T, Result<Taken, Error>)> {
    if let Err(unreadable) = &snapshot.lock {
        return queue
            .takes
            .drain(..)
            .map(|(take, reply)| (take, reply, Err(unreadable.to_error(prefix))))
            .collect();
    }
    let Some(stored) = snapshot.limit() else {
        return Vec::new();
    };
    let (fits, mismatched): (VecDeque<_>, VecDeque<_>) =
        queue.takes.drain(..).partition(|(t, _)| t.limit == stored);
    queue.takes = fits;
    mismatched
        .into_iter()
        .map(|(take, reply)| {
            let refusal = Error::LimitMismatch {
                key: prefix.to_owned(),
                stored,
                requested: take.limit,
            };
            (take, reply, Err(refusal))
        })
        .collect()
}

#[cfg(test)]
mod tests;
