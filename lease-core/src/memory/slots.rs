//! Semaphores in the store, built exactly like Consul's and decided by the same
//! planner as the Consul coordinator (`crate::semaphore`).
//!
//! A contender key `<prefix>/<session>` per holder, and `<prefix>/.lock` holding a
//! [`LockValue`]. Each acquisition attempt and each give-back is one planner round on a
//! [`Snapshot`] of the prefix, applied under the store's lock: nothing writes between the look
//! and the write, so the plan's CAS always holds. The store sees every change as it happens, so
//! the planner observes deaths and deletions at once (`observe_slots`), not at the next round.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tokio::time::Instant;

use super::held::HeldLock;
use super::store::{Attempt, Entry, LEADER_FLAGS, State, Value};
use crate::semaphore::{
    Give, LockValue, Next, Planner, Queue, SEMAPHORE_FLAGS, Snapshot, Take, Taken, Unreadable,
    Write, contender_key, lock_key,
};
use crate::{BackendKind, Error, LeaseSpec, Sequencer};

impl State {
    /// Joins the semaphore at `prefix` if the planner finds room.
    pub(super) fn try_acquire_slot(
        &mut self,
        prefix: &str,
        limit: u32,
        session: &str,
        spec: &LeaseSpec,
        now: Instant,
    ) -> Result<Attempt, Error> {
        self.refuse_other_kind(prefix, LEADER_FLAGS, SEMAPHORE_FLAGS)?;
        let mut queue = Queue::default();
        let take = Take {
            session: session.to_owned(),
            limit: u64::from(limit),
            settle: spec.settle_after_removal(),
            // The store is always read fresh: each attempt is one look, and a full semaphore
            // is waited for by the caller, on the store's changes.
            once: true,
        };
        queue.push_take(take, spec.advertised_value());
        let (answer, wake) = self.slot_round(prefix, &mut queue, now);
        match answer {
            Some(Ok(Taken::Admitted { lock_index, .. })) => {
                let contender_key = contender_key(prefix, session);
                let sequencer =
                    Sequencer::new(BackendKind::Memory, &contender_key, lock_index, session);
                let held = HeldLock::Slot {
                    lock_key: lock_key(prefix),
                    contender_key,
                    session: session.to_owned(),
                    lock_index,
                };
                Ok(Attempt::Acquired(held, sequencer))
            }
            Some(Ok(Taken::SessionGone)) => Ok(Attempt::SessionGone),
            Some(Ok(Taken::Full)) | None => Ok(Attempt::Blocked { until: wake }),
            Some(Err(refused)) => Err(refused),
        }
    }

    /// Gives `session`'s slot of `prefix` back and deletes its contender key.
    pub(super) fn give_slot(
        &mut self,
        prefix: &str,
        session: &str,
        settle: Duration,
        now: Instant,
    ) {
        let mut queue = Queue::<&[u8], ()>::default();
        let give = Give {
            session: session.to_owned(),
            delete_contender: true,
            settle,
        };
        queue.push_give(give, ());
        self.slot_round(prefix, &mut queue, now);
    }

    /// Lets the planner of `prefix` see a change as it happens (a holder's session or contender
    /// key gone, `.lock` deleted), so settle times count from the change itself.
    pub(super) fn observe_slots(&mut self, prefix: &str, now: Instant) {
        let snapshot = self.slot_snapshot(prefix);
        let planner = self.planners.entry(prefix.to_owned()).or_default();
        planner.observe(&snapshot, |_| false, now);
        self.forget_if_at_rest(prefix);
    }

    /// One planner round for `prefix`, applied. Returns the answer to the take queued (if one
    /// was), and when the answer may change with no change to the store.
    fn slot_round(
        &mut self,
        prefix: &str,
        queue: &mut Queue<&[u8], ()>,
        now: Instant,
    ) -> (Option<Result<Taken, Error>>, Option<Instant>) {
        let snapshot = self.slot_snapshot(prefix);
        let planner = self.planners.entry(prefix.to_owned()).or_default();
        let plan = planner.plan(prefix, &snapshot, queue, true, now);
        let wake = planner.next_wake();
        self.forget_if_at_rest(prefix);
        let mut answer = plan
            .answered
            .into_iter()
            .next()
            .map(|(_, _, answer)| answer);
        if let Next::Write(write) = plan.next {
            answer = self.apply(prefix, write, now).or(answer);
        }
        (answer, wake)
    }

    fn forget_if_at_rest(&mut self, prefix: &str) {
        if self.planners.get(prefix).is_some_and(Planner::at_rest) {
            self.planners.remove(prefix);
        }
    }

    /// Applies a planned write as Consul applies a transaction: all or nothing. Returns the
    /// answer to the take admitted, if one was.
    fn apply(
        &mut self,
        prefix: &str,
        write: Write<&[u8], ()>,
        now: Instant,
    ) -> Option<Result<Taken, Error>> {
        let Write {
            gives,
            admits,
            lock,
        } = write;
        let locks_fail = admits.iter().any(|admit| {
            let session = &admit.take.session;
            !self.can_lock(&contender_key(prefix, session), session, now)
        });
        if locks_fail {
            return Some(Ok(Taken::SessionGone));
        }
        for (give, ()) in gives.iter().filter(|(g, ())| g.delete_contender) {
            self.kv.remove(&contender_key(prefix, &give.session));
        }
        let mut admitted = None;
        for admit in admits {
            let key = contender_key(prefix, &admit.take.session);
            let (session, value) = (&admit.take.session, admit.reply);
            admitted = Some(self.lock(&key, SEMAPHORE_FLAGS, session, value));
        }
        let index = self.bump();
        if let Some(lock) = lock {
            let entry = self.kv.entry(lock_key(prefix)).or_insert_with(|| Entry {
                flags: SEMAPHORE_FLAGS,
                lock_index: 0,
                session: None,
                modify_index: index,
                value: Value::Bytes(Vec::new()),
            });
            entry.value = Value::Semaphore(lock.value);
            entry.modify_index = index;
        }
        admitted.map(|lock_index| Ok(Taken::Admitted { lock_index, index }))
    }

    /// One consistent look at the semaphore at `prefix`, as a recursive read on Consul shows it.
    fn slot_snapshot(&self, prefix: &str) -> Snapshot {
        let lock_key = lock_key(prefix);
        let under = format!("{prefix}/");
        let mut lock = Ok(None);
        let mut live = BTreeSet::new();
        let mut contenders = BTreeMap::new();
        let entries = self.kv.range(under.clone()..);
        for (key, entry) in entries.take_while(|(key, _)| key.starts_with(&under)) {
            if *key == lock_key {
                lock = read_lock(entry).map(Some);
            } else if let Some(holder) = &entry.session {
                live.insert(holder.clone());
                if *key == contender_key(prefix, holder) {
                    contenders.insert(holder.clone(), entry.lock_index);
                }
            }
        }
        // The store sees every deletion as it happens (`observe_slots`): no creation index needed.
        let snapshot = Snapshot {
            lock,
            live,
            contenders,
            index: self.index,
            lock_created: None,
        };
        // Every look at the holder set passes here.
        crate::metrics::semaphore_slots_in_use(
            BackendKind::Memory,
            prefix,
            snapshot.live_holders().len(),
        );
        snapshot
    }
}

fn read_lock(entry: &Entry) -> Result<(u64, LockValue), Unreadable> {
    if entry.flags != SEMAPHORE_FLAGS {
        return Err(Unreadable::Flags(entry.flags));
    }
    match &entry.value {
        Value::Semaphore(value) => Ok((entry.modify_index, value.clone())),
        Value::Bytes(_) => Err(Unreadable::Corrupt("not a semaphore's lock value".into())),
    }
}
