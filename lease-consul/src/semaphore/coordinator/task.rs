//! The coordinator task: reads the prefix, plans a round, writes the plan as one transaction,
//! answers; watches the prefix (through the client's shared watches) while the semaphore is
//! full or idle (see the parent module).

use std::collections::BTreeSet;
use std::future::{Future, poll_fn};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::request::{GiveReply, Request, TakeReply};
use crate::kind::{LEADER_FLAGS, OtherKind, Verdict};
use crate::semaphore::value::{directory, encode_lock, read_snapshot};
use crate::watch::{Interest, Watched, Watches};
use crate::wire::{ApiError, ConsulHttp, KvEntry, TxnOp};
use lease_core::Error;
use lease_core::backoff::Backoff;
use lease_core::semaphore::{
    Give, Next, Planner, Queue, SEMAPHORE_FLAGS, Snapshot, Take, Taken, Write, contender_key,
    lock_key,
};
use lease_http::backoff;

/// A coordinator with nothing to do for this long stops; the next request starts another.
const IDLE_STOP: Duration = Duration::from_secs(30);

/// What a round achieved.
enum Round {
    /// Something was written, answered or learned: plan again at once.
    Progress,
    /// Nothing can be admitted and nothing is given back until the semaphore changes.
    Full,
}

struct Coordinator {
    http: Arc<ConsulHttp>,
    prefix: String,
    queue: Queue<TakeReply, GiveReply>,
    planner: Planner,
    snapshot: Option<Snapshot>,
    /// The snapshot was read from Consul, not derived from our own writes.
    fresh: bool,
    backoff: Backoff,
    /// What the transaction that creates `.lock` asserts of the key `prefix`, where a leader
    /// lock on the name would be (see `consul::kind`).
    leader: OtherKind,
}

pub(super) async fn run(
    http: Arc<ConsulHttp>,
    watches: Watches,
    prefix: String,
    mut requests: mpsc::Receiver<Request>,
) {
    let mut coordinator = Coordinator {
        http,
        prefix,
        queue: Queue::default(),
        planner: Planner::default(),
        snapshot: None,
        fresh: false,
        backoff: backoff(),
        leader: OtherKind::Absent,
    };
    let directory = directory(&coordinator.prefix);
    let mut watched = watches.watch(Interest::Prefix(directory.clone()), true, None);
    let mut open = true;
    let mut idle_since: Option<Instant> = None;
    loop {
        // A dead holder still to prune keeps the coordinator until it is pruned, so a semaphore
        // whose last event was a loss is not left with its entry.
        let next_wake = coordinator.planner.next_wake();
        let prune_due = next_wake.is_some_and(|at| at <= Instant::now());
        if coordinator.queue.is_empty() && !prune_due {
            if !open {
                return;
            }
            // Idle: wait for a request, and watch the prefix meanwhile, so a holder that dies
            // after our own writes (its contender key goes with its session) is seen and pruned
            // once its settle time is over, without a read on every turn of a busy semaphore.
            let stop_at = *idle_since.get_or_insert_with(Instant::now) + IDLE_STOP;
            let after = coordinator.known_index();
            // A change of the directory first: a flood of requests (thousands of acquisitions
            // at once) must not keep a loss from being seen.
            tokio::select! {
                biased;
                answer = changed(&mut watched, &directory, after, coordinator.fresh) => {
                    coordinator.observe(answer).await;
                }
                request = requests.recv() => match request {
                    Some(request) => {
                        idle_since = None;
                        coordinator.push(request);
                    }
                    None => return,
                },
                () = tokio::time::sleep_until(next_wake.map_or(stop_at, |at| at.min(stop_at))) => {
                    if next_wake.is_none_or(|at| at > Instant::now()) {
                        return;
                    }
                }
            }
        } else {
            idle_since = None;
        }
        while let Ok(request) = requests.try_recv() {
            coordinator.push(request);
        }
        coordinator
            .queue
            .retain_takes(|reply| !reply.answer.is_closed());
        if let Round::Full = coordinator.round().await {
            let after = coordinator.known_index();
            // Wake up in time to prune a dead holder whose settle time runs out: with a fresh
            // read, the next round prunes it.
            let prune_at = coordinator.planner.next_wake();
            tokio::select! {
                biased;
                answer = changed(&mut watched, &directory, after, coordinator.fresh) => {
                    coordinator.observe(answer).await;
                }
                request = requests.recv(), if open => match request {
                    Some(request) => coordinator.push(request),
                    None => open = false,
                },
                () = tokio::time::sleep_until(prune_at.unwrap_or_else(far_future)), if prune_at.is_some() => {
                    coordinator.snapshot = None;
                }
                // Dropped at the top of the loop.
                () = abandoned(&mut coordinator.queue) => {}
            }
        }
    }
}

/// The next listing newer than `after`, as the entries under `directory` (the semaphore's); or,
/// when what the coordinator knows at `after` was derived from its own write (`fresh` false), a
/// listing of that index too. A write to `.lock` says nothing of the contender keys: one deleted
/// with its session just before our write is in the listing of the write's index, and in no later
/// one, so waiting for a newer listing would never show that holder dead, and it would never be
/// pruned.
async fn changed(
    watched: &mut Watched,
    directory: &str,
    after: u64,
    fresh: bool,
) -> Result<(Vec<KvEntry>, u64), ApiError> {
    let listing = watched.next(if fresh { after + 1 } else { after }).await?;
    let entries = listing.under(directory).to_vec();
    Ok((entries, listing.index))
}

fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(86_400)
}

/// Completes when the caller of some queued take has gone away.
fn abandoned(queue: &mut Queue<TakeReply, GiveReply>) -> impl Future<Output = ()> + '_ {
    poll_fn(move |cx| {
        let mut replies = queue.take_replies_mut();
        if replies.any(|reply| reply.answer.poll_closed(cx).is_ready()) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
}

impl Coordinator {
    fn push(&mut self, request: Request) {
        match request {
            Request::Take(take, reply) => self.queue.push_take(take, reply),
            Request::Give(give, reply) => self.queue.push_give(give, reply),
        }
    }

    /// The index of the state the coordinator knows (read or written), 0 if none.
    fn known_index(&self) -> u64 {
        self.snapshot.as_ref().map_or(0, |s| s.index)
    }

    /// Takes in a read of the prefix, unless our own writes already know a later state.
    async fn observe(&mut self, answer: Result<(Vec<KvEntry>, u64), ApiError>) {
        match answer {
            Ok((entries, index)) => {
                if self.snapshot.as_ref().is_none_or(|s| index >= s.index) {
                    self.snapshot = Some(read_snapshot(&self.prefix, &entries, index));
                    self.fresh = true;
                }
                self.backoff.reset();
            }
            Err(error) => self.trouble(error).await,
        }
    }

    /// Brief trouble waits and retries (give-backs until their deadline); anything else fails
    /// every pending request. Either way the next round re-reads: a write whose answer was lost
    /// may have gone through.
    async fn trouble(&mut self, error: ApiError) {
        self.snapshot = None;
        let failed = || error.to_error(&self.http, format!("update semaphore {:?}", self.prefix));
        if error.is_transient() {
            tracing::debug!(%error, prefix = %self.prefix, "semaphore coordinator: Consul trouble; retrying");
            let now = Instant::now();
            for (_, reply) in self.queue.drain_gives(|reply| reply.give_up <= now) {
                reply.send(Err(failed()));
            }
            self.backoff.wait().await;
            return;
        }
        for (_, reply) in self.queue.drain_gives(|_| true) {
            reply.send(Err(failed()));
        }
        for (_, reply) in self.queue.drain_takes() {
            let _ = reply.answer.send(Err(failed()));
        }
    }

    /// One round: read if needed, answer what can be answered, write one transaction.
    async fn round(&mut self) -> Round {
        if self.snapshot.is_none() {
            match self.http.kv_list(&directory(&self.prefix)).await {
                Ok((entries, index)) => {
                    self.snapshot = Some(read_snapshot(&self.prefix, &entries, index));
                    self.fresh = true;
                    self.backoff.reset();
                }
                Err(error) => {
                    self.trouble(error).await;
                    return Round::Progress;
                }
            }
        }
        let Some(snapshot) = self.snapshot.clone() else {
            return Round::Progress;
        };
        let now = Instant::now();
        let plan = self
            .planner
            .plan(&self.prefix, &snapshot, &mut self.queue, self.fresh, now);
        for (take, reply, answer) in plan.answered {
            self.answer_take(take, reply, answer);
        }
        for (_, reply) in plan.given {
            reply.send(Ok(()));
        }
        match plan.next {
            Next::Write(write) => {
                self.write(&snapshot, write).await;
                Round::Progress
            }
            Next::Reread => {
                self.snapshot = None;
                Round::Progress
            }
            Next::Wait => Round::Full,
            Next::Idle => Round::Progress,
        }
    }

    /// Writes one round's plan as one transaction and answers its requests.
    async fn write(&mut self, snapshot: &Snapshot, write: Write<TakeReply, GiveReply>) {
        let lock_key = lock_key(&self.prefix);
        let encoded = write.lock.as_ref().map(|lock| encode_lock(&lock.value));
        let give_keys: Vec<String> = (write.gives.iter())
            .map(|(g, _)| contender_key(&self.prefix, &g.session))
            .collect();
        let take_keys: Vec<String> = (write.admits.iter())
            .map(|a| contender_key(&self.prefix, &a.take.session))
            .collect();
        let mut ops = Vec::new();
        let mut owners = Vec::new();
        let creating = write.lock.as_ref().is_some_and(|lock| lock.cas_index == 0);
        // Creating `.lock` makes the name a semaphore's: not if a leader lock has it.
        if let Some(check) = self.leader.check(&self.prefix).filter(|_| creating) {
            ops.push(check);
            owners.push(Owner::LeaderKey);
        }
        for ((give, _), key) in write.gives.iter().zip(&give_keys) {
            if give.delete_contender {
                ops.push(TxnOp::Delete { key });
                owners.push(Owner::Give);
            }
        }
        for (i, (admit, key)) in write.admits.iter().zip(&take_keys).enumerate() {
            let session = &admit.take.session;
            if admit.relock {
                let flags = SEMAPHORE_FLAGS;
                ops.push(TxnOp::Unlock {
                    key,
                    session,
                    flags,
                });
                owners.push(Owner::Take(i));
            }
            ops.push(TxnOp::Lock {
                key,
                session,
                value: &admit.reply.value,
                flags: SEMAPHORE_FLAGS,
            });
            owners.push(Owner::Take(i));
        }
        if let (Some(lock), Some(value)) = (&write.lock, &encoded) {
            ops.push(TxnOp::Cas {
                key: &lock_key,
                value,
                flags: SEMAPHORE_FLAGS,
                index: lock.cas_index,
            });
            owners.push(Owner::Lock);
        }

        let answer = self.http.txn(&ops).await;
        drop(ops);
        match answer {
            Ok(Ok(results)) => {
                self.backoff.reset();
                let written = results.iter().map(|e| e.modify_index).max();
                let written = written.unwrap_or(snapshot.index);
                let lock_modify_index = (results.iter().find(|e| e.key == lock_key))
                    .map_or(written, |e| e.modify_index);
                let lock_indexes: Vec<u64> = (write.admits.iter().zip(&take_keys))
                    .map(|(admit, key)| {
                        let session = Some(admit.take.session.as_str());
                        (results.iter().rev())
                            .find(|e| &e.key == key && e.holder() == session)
                            .map_or(0, |e| e.lock_index)
                    })
                    .collect();
                let next = write.applied_to(snapshot, written, lock_modify_index, &lock_indexes);
                self.snapshot = Some(next);
                self.fresh = false;
                for (_, reply) in write.gives {
                    reply.send(Ok(()));
                }
                for (admit, lock_index) in write.admits.into_iter().zip(lock_indexes) {
                    let taken = Taken::Admitted {
                        lock_index,
                        index: written,
                    };
                    self.answer_take(admit.take, admit.reply, Ok(taken));
                }
            }
            Ok(Err(failed)) => {
                // Someone else wrote the lock key (a stale CAS), or a session is gone (its lock op
                // failed). Answer the latter; everyone else is planned again on a fresh read.
                let mut gone = BTreeSet::new();
                let mut leader_key_changed = false;
                for op in failed {
                    match owners.get(op) {
                        Some(Owner::Lock) => self.http.count_cas_conflict(),
                        Some(Owner::Take(i)) => {
                            gone.insert(*i);
                        }
                        Some(Owner::LeaderKey) => leader_key_changed = true,
                        Some(Owner::Give) | None => {}
                    }
                }
                self.snapshot = None;
                let judged = if leader_key_changed {
                    self.judge_leader_key().await
                } else {
                    Ok(Verdict::Assert(self.leader))
                };
                match judged {
                    Ok(Verdict::Assert(_)) => self.requeue(write, &gone),
                    // A leader lock's key: every take, this write's and the queued ones, is
                    // refused; the give-backs are written again.
                    Ok(Verdict::Refuse) => {
                        let Write { gives, admits, .. } = write;
                        let takes = admits.into_iter().map(|a| (a.take, a.reply));
                        for (take, reply) in takes.chain(self.queue.drain_takes()) {
                            let refusal = Error::leader_lock_in_the_way(&*self.prefix);
                            self.answer_take(take, reply, Err(refusal));
                        }
                        self.queue.put_back(std::iter::empty(), gives.into_iter());
                    }
                    Err(error) => {
                        self.requeue(write, &gone);
                        self.trouble(error).await;
                    }
                }
            }
            Err(error) => {
                // The write may or may not have gone through. A take whose caller has left can
                // no longer be answered, so if it was admitted, give its slot back.
                let (abandoned, waiting): (Vec<_>, Vec<_>) = (write.admits.into_iter())
                    .map(|admit| (admit.take, admit.reply))
                    .partition(|(_, reply)| reply.answer.is_closed());
                for (take, _) in abandoned {
                    self.give_back(take);
                }
                self.queue
                    .put_back(waiting.into_iter(), write.gives.into_iter());
                self.trouble(error).await;
            }
        }
    }

    /// Puts the requests of a write that did not go through back in the queue, but for the
    /// takes whose sessions are `gone`, which are answered so.
    fn requeue(&mut self, write: Write<TakeReply, GiveReply>, gone: &BTreeSet<usize>) {
        let mut kept = Vec::new();
        for (i, admit) in write.admits.into_iter().enumerate() {
            if gone.contains(&i) {
                let _ = admit.reply.answer.send(Ok(Taken::SessionGone));
            } else {
                kept.push((admit.take, admit.reply));
            }
        }
        self.queue
            .put_back(kept.into_iter(), write.gives.into_iter());
    }

    /// After the check of the key `prefix` failed in a write that creates `.lock`: one read of
    /// it. A leader lock's key is refused; anything else is asserted unchanged from now on.
    async fn judge_leader_key(&mut self) -> Result<Verdict, ApiError> {
        let read = self.http.kv_get(&self.prefix).await;
        let verdict = OtherKind::after_failed_check(read.map(|(entry, _)| entry), LEADER_FLAGS)?;
        if let Verdict::Assert(next) = verdict {
            self.leader = next;
        }
        Ok(verdict)
    }

    /// Answers a take; if it was admitted and its caller has gone, gives the slot back in a
    /// later round.
    fn answer_take(&mut self, take: Take, reply: TakeReply, answer: Result<Taken, Error>) {
        let admitted = matches!(answer, Ok(Taken::Admitted { .. }));
        if reply.answer.send(answer).is_err() && admitted {
            self.give_back(take);
        }
    }

    /// Queues a give-back nobody waits for: of a slot admitted after its caller went away.
    fn give_back(&mut self, take: Take) {
        let give = Give {
            session: take.session,
            delete_contender: false,
            settle: take.settle,
        };
        self.queue.push_give(give, GiveReply::unanswered());
    }
}

/// Which request a transaction operation belongs to.
enum Owner {
    Give,
    Take(usize),
    Lock,
    /// The check that no leader lock has the name.
    LeaderKey,
}

#[cfg(test)]
mod tests {
    use tokio::sync::oneshot;

    use super::*;

    fn waiting(
        session: &str,
        queue: &mut Queue<TakeReply, GiveReply>,
    ) -> oneshot::Receiver<Result<Taken, Error>> {
        let (answer, receiver) = oneshot::channel();
        let take = Take {
            session: session.to_owned(),
            limit: 1,
            settle: Duration::ZERO,
            once: false,
        };
        queue.push_take(
            take,
            TakeReply {
                value: Vec::new(),
                answer,
            },
        );
        receiver
    }

    #[tokio::test(start_paused = true)]
    async fn a_take_whose_caller_went_away_wakes_the_coordinator_at_once() {
        let mut queue = Queue::default();
        let _stays = waiting("a", &mut queue);
        let leaves = waiting("b", &mut queue);
        let quiet = tokio::time::timeout(Duration::from_secs(10), abandoned(&mut queue)).await;
        assert!(quiet.is_err(), "woken with every caller still waiting");

        let abandon = async {
            tokio::time::sleep(Duration::from_millis(1)).await;
            drop(leaves);
        };
        let started = Instant::now();
        tokio::join!(abandoned(&mut queue), abandon);
        assert_eq!(started.elapsed(), Duration::from_millis(1));
        queue.retain_takes(|reply| !reply.answer.is_closed());
        assert_eq!(queue.take_replies_mut().count(), 1);
    }
}
