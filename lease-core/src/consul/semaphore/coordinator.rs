//! One writer of a semaphore's `.lock` key per process: takes and give-backs are batched.
//!
//! Every slot taken or given back is a compare-and-set of `<prefix>/.lock`. If each task of a
//! process wrote for itself, they would race each other's CAS: each loser costs a failed write
//! and a re-read, and under load most writes are losers. Instead, each process runs one
//! coordinator task per prefix. The process's tasks queue their takes and give-backs with it,
//! and each round it writes everything queued as **one transaction**:
//!
//! - delete the contender keys of those leaving;
//! - lock the contender keys of those admitted (unlock first for a pooled session, so the
//!   LockIndex rises);
//! - CAS the new holder set: the live holders, minus those leaving, plus those admitted.
//!
//! A give-back and a waiting take of the same process thus hand a slot over in one write. Other
//! processes (`consul lock -n`, other instances) still race, and CAS keeps that correct: a stale
//! index means someone else wrote, so the coordinator re-reads and plans again. When the
//! semaphore is full it blocks on the prefix, as seed 000 says, and still takes requests.
//!
//! Cancel safety: a take whose caller went away before its round is skipped; one admitted after
//! its caller went away is given back by the coordinator itself.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::value::{LockValue, SEMAPHORE_FLAGS, Snapshot, contender_key, lock_key};
use crate::Error;
use crate::backoff::Backoff;
use crate::consul::http::{ApiError, Blocking, ConsulHttp, KvEntry, TxnOp};
use crate::consul::retry::backoff;

/// A coordinator with nothing to do for this long stops; the next request starts another.
const IDLE_STOP: Duration = Duration::from_secs(30);
/// How long one blocking read of a full semaphore lasts, so that waiters who gave up are noticed.
const FULL_WAIT: Duration = Duration::from_secs(10);
/// How long a give-back is retried through trouble before it is reported failed.
const GIVE_UP_AFTER: Duration = Duration::from_secs(5);
/// Requests per transaction: Consul 1.8 takes at most 64 operations (a take is up to 2, a
/// give-back 1, plus the CAS).
const MAX_TAKES: usize = 20;
const MAX_GIVES: usize = 20;

/// A request for a slot.
#[derive(Clone, Copy, Debug)]
pub(super) struct Take<'a> {
    /// The session to admit.
    pub(super) session: &'a str,
    /// The limit the contender expects.
    pub(super) limit: u64,
    /// The value to write into the contender key.
    pub(super) value: &'a [u8],
    /// How long a holder that lost its slot without a clean release keeps it before this take
    /// may have it: `LeaseSpec::settle_time`.
    pub(super) settle: Duration,
    /// Answer `Full` after one fresh read instead of waiting.
    pub(super) once: bool,
}

/// The answer to a take.
#[derive(Debug)]
pub(super) enum Taken {
    /// Admitted: our contender key's LockIndex, and an index from which to watch the prefix.
    Admitted { lock_index: u64, index: u64 },
    /// No slot is free, and the take asked not to wait.
    Full,
    /// The session cannot lock its contender key: Consul no longer has it.
    SessionGone,
}

struct TakeRequest {
    session: String,
    limit: u64,
    value: Vec<u8>,
    /// See [`Take::settle`].
    settle: Duration,
    once: bool,
    reply: oneshot::Sender<Result<Taken, Error>>,
}

struct GiveRequest {
    session: String,
    delete_contender: bool,
    give_up: Instant,
    reply: Option<oneshot::Sender<Result<(), Error>>>,
}

enum Request {
    Take(TakeRequest),
    Give(GiveRequest),
}

/// The coordinators of one client, one per prefix, started on demand.
#[derive(Default)]
pub(super) struct Coordinators {
    senders: Mutex<HashMap<String, mpsc::UnboundedSender<Request>>>,
}

impl fmt::Debug for Coordinators {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let prefixes = self.senders.lock().map(|s| s.len()).unwrap_or_default();
        f.debug_struct("Coordinators")
            .field("prefixes", &prefixes)
            .finish()
    }
}

impl Coordinators {
    /// Asks for a slot of `prefix`; waits until admitted (or, for a take that must not wait,
    /// until one attempt has been made on a fresh read).
    ///
    /// Cancel safe: see the module docs.
    pub(super) async fn take(
        &self,
        http: &Arc<ConsulHttp>,
        prefix: &str,
        take: Take<'_>,
    ) -> Result<Taken, Error> {
        // A coordinator that stopped for idleness just as we sent drops the request; send again.
        for _ in 0..3 {
            let (reply, answer) = oneshot::channel();
            self.send(
                http,
                prefix,
                Request::Take(TakeRequest {
                    session: take.session.to_owned(),
                    limit: take.limit,
                    value: take.value.to_vec(),
                    settle: take.settle,
                    once: take.once,
                    reply,
                }),
            );
            if let Ok(result) = answer.await {
                return result;
            }
        }
        Err(stopped(prefix))
    }

    /// Gives `session`'s slot of `prefix` back (if it has one), deleting its contender key too if
    /// `delete_contender`. Waits for the write.
    pub(super) async fn give(
        &self,
        http: &Arc<ConsulHttp>,
        prefix: &str,
        session: &str,
        delete_contender: bool,
    ) -> Result<(), Error> {
        for _ in 0..3 {
            let (reply, answer) = oneshot::channel();
            self.send(
                http,
                prefix,
                Request::Give(GiveRequest {
                    session: session.to_owned(),
                    delete_contender,
                    give_up: Instant::now() + GIVE_UP_AFTER,
                    reply: Some(reply),
                }),
            );
            if let Ok(result) = answer.await {
                return result;
            }
        }
        Err(stopped(prefix))
    }

    fn send(&self, http: &Arc<ConsulHttp>, prefix: &str, request: Request) {
        let Ok(mut senders) = self.senders.lock() else {
            // Poisoned: dropping the request drops its reply, and the caller reports it.
            return;
        };
        senders.retain(|_, sender| !sender.is_closed());
        let sender = senders.entry(prefix.to_owned()).or_insert_with(|| {
            let (sender, requests) = mpsc::unbounded_channel();
            tokio::spawn(run(Arc::clone(http), prefix.to_owned(), requests));
            sender
        });
        // A send to a coordinator that has just stopped drops the request (and its reply), which
        // the caller notices and retries.
        let _ = sender.send(request);
    }
}

fn stopped(prefix: &str) -> Error {
    Error::Backend {
        backend: "Consul",
        operation: format!("coordinate semaphore {prefix:?}"),
        message: "the coordinator stopped repeatedly; is the runtime shutting down?".into(),
        transient: true,
    }
}

type PrefixRead = Pin<Box<dyn Future<Output = Result<(Vec<KvEntry>, u64), ApiError>> + Send>>;

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
    takes: VecDeque<TakeRequest>,
    gives: Vec<GiveRequest>,
    snapshot: Option<Snapshot>,
    /// The snapshot was read from Consul, not derived from our own writes.
    fresh: bool,
    /// Recorded holders whose sessions are gone, and when we first saw them so.
    dead_since: HashMap<String, Instant>,
    /// Since when the lock key has been missing while other sessions hold contender keys: it
    /// was deleted under its holders, who may still be running. Nobody is admitted until the
    /// settle time has passed since then.
    lock_gone_since: Option<Instant>,
    /// The longest settle time of any take this coordinator has served: how long a holder
    /// that lost its slot without a clean release keeps it.
    settle: Duration,
    /// When the next dead holder may be pruned, if one waits for its lock-delay.
    next_prune: Option<Instant>,
    backoff: Backoff,
}

async fn run(
    http: Arc<ConsulHttp>,
    prefix: String,
    mut requests: mpsc::UnboundedReceiver<Request>,
) {
    let mut coordinator = Coordinator {
        http,
        prefix,
        takes: VecDeque::new(),
        gives: Vec::new(),
        snapshot: None,
        fresh: false,
        dead_since: HashMap::new(),
        lock_gone_since: None,
        settle: Duration::ZERO,
        next_prune: None,
        backoff: backoff(),
    };
    let mut watch: Option<PrefixRead> = None;
    let mut open = true;
    loop {
        // A dead holder still to prune keeps the coordinator until it is pruned, so a semaphore
        // whose last event was a loss is not left with its entry.
        let prune_due = coordinator
            .next_prune
            .is_some_and(|at| at <= Instant::now());
        let idle = coordinator.takes.is_empty() && coordinator.gives.is_empty();
        if idle && !coordinator.fresh {
            // Before idling, look once more: a holder may have died since our own writes, and
            // its entry is pruned only by someone who has seen it dead.
            coordinator.snapshot = None;
        } else if idle && !prune_due {
            watch = None;
            if !open {
                return;
            }
            let idle_for = coordinator
                .next_prune
                .map_or(IDLE_STOP, |at| at.saturating_duration_since(Instant::now()));
            match tokio::time::timeout(idle_for, requests.recv()).await {
                Ok(Some(request)) => coordinator.push(request),
                Err(_) if coordinator.next_prune.is_some() => {}
                Ok(None) | Err(_) => return,
            }
        }
        while let Ok(request) = requests.try_recv() {
            coordinator.push(request);
        }
        coordinator.takes.retain(|t| !t.reply.is_closed());
        if let Round::Full = coordinator.round().await {
            let read = watch.get_or_insert_with(|| coordinator.read_when_changed());
            tokio::select! {
                request = requests.recv(), if open => match request {
                    Some(request) => coordinator.push(request),
                    None => open = false,
                },
                answer = read => {
                    watch = None;
                    coordinator.observe(answer).await;
                }
            }
        }
    }
}

impl Coordinator {
    fn push(&mut self, request: Request) {
        match request {
            Request::Take(take) => {
                self.settle = self.settle.max(take.settle);
                self.takes.push_back(take);
            }
            Request::Give(give) => self.gives.push(give),
        }
    }

    fn read_when_changed(&self) -> PrefixRead {
        let http = Arc::clone(&self.http);
        let prefix = self.prefix.clone();
        let index = self.snapshot.as_ref().map_or(0, |s| s.index);
        // Wake up in time to prune a dead holder whose lock-delay is about to run out.
        let wait = self.next_prune.map_or(FULL_WAIT, |at| {
            at.saturating_duration_since(Instant::now())
                .clamp(Duration::from_millis(1), FULL_WAIT)
        });
        Box::pin(async move { http.kv_list(&prefix, Some(Blocking { index, wait })).await })
    }

    /// Takes in a read of the prefix, unless our own writes already know a later state.
    async fn observe(&mut self, answer: Result<(Vec<KvEntry>, u64), ApiError>) {
        match answer {
            Ok((entries, index)) => {
                if self.snapshot.as_ref().is_none_or(|s| index >= s.index) {
                    self.snapshot = Some(Snapshot::read(&self.prefix, &entries, index));
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
        let operation = format!("update semaphore {:?}", self.prefix);
        if error.is_transient() {
            tracing::debug!(%error, prefix = %self.prefix, "semaphore coordinator: Consul trouble; retrying");
            let now = Instant::now();
            let (expired, pending): (Vec<_>, Vec<_>) =
                self.gives.drain(..).partition(|g| g.give_up <= now);
            self.gives = pending;
            for give in expired {
                if let Some(reply) = give.reply {
                    let _ = reply.send(Err(error.to_error(&self.http, &operation)));
                }
            }
            self.backoff.wait().await;
            return;
        }
        for give in self.gives.drain(..) {
            if let Some(reply) = give.reply {
                let _ = reply.send(Err(error.to_error(&self.http, &operation)));
            }
        }
        for take in self.takes.drain(..) {
            let _ = take.reply.send(Err(error.to_error(&self.http, &operation)));
        }
    }

    /// One round: read if needed, answer what can be answered, write one transaction.
    async fn round(&mut self) -> Round {
        if self.snapshot.is_none() {
            match self.http.kv_list(&self.prefix, None).await {
                Ok((entries, index)) => {
                    self.snapshot = Some(Snapshot::read(&self.prefix, &entries, index));
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
        match self.plan_and_write(&snapshot).await {
            Planned::Full => Round::Full,
            Planned::Reread => {
                self.snapshot = None;
                Round::Progress
            }
            Planned::Written | Planned::Nothing => Round::Progress,
        }
    }

    /// Refuses the takes this semaphore can never serve: an unreadable lock key, another limit.
    fn refuse_unservable(&mut self, snapshot: &Snapshot) {
        if let Err(unreadable) = &snapshot.lock {
            for take in self.takes.drain(..) {
                let _ = take.reply.send(Err(unreadable.to_error(&self.prefix)));
            }
        }
        if let Some(stored) = snapshot.limit() {
            let (fits, mismatched): (VecDeque<_>, VecDeque<_>) =
                self.takes.drain(..).partition(|t| t.limit == stored);
            self.takes = fits;
            for take in mismatched {
                let _ = take.reply.send(Err(Error::LimitMismatch {
                    key: self.prefix.clone(),
                    stored,
                    requested: take.limit,
                }));
            }
        }
    }

    async fn plan_and_write(&mut self, snapshot: &Snapshot) -> Planned {
        self.refuse_unservable(snapshot);
        let gives: Vec<GiveRequest> = {
            let n = self.gives.len().min(MAX_GIVES);
            self.gives.drain(..n).collect()
        };
        // The holders after this round: the live ones and the dead ones still within their
        // lock-delay, less those leaving, plus those admitted.
        let mut holders = self.unpruned_holders(snapshot);
        let pruning = match &snapshot.lock {
            Ok(Some((_, value))) => value.holders.iter().any(|h| !holders.contains(h)),
            _ => false,
        };
        for give in &gives {
            holders.remove(&give.session);
        }
        // A take already recorded as a holder: our write went through, but its answer was lost.
        // Not if a give-back of the same session still waits beyond this round's batch: that give
        // would take the slot away from the take right after.
        let giving_later: HashSet<String> = self.gives.iter().map(|g| g.session.clone()).collect();
        let (recorded, waiting): (VecDeque<_>, VecDeque<_>) = self.takes.drain(..).partition(|t| {
            holders.contains(&t.session)
                && snapshot.contenders.contains_key(&t.session)
                && !giving_later.contains(&t.session)
        });
        self.takes = waiting;
        for take in recorded {
            let lock_index = snapshot
                .contenders
                .get(&take.session)
                .copied()
                .unwrap_or_default();
            self.answer_take(
                take,
                Taken::Admitted {
                    lock_index,
                    index: snapshot.index,
                },
            );
        }
        let limit = snapshot.limit().or(self.takes.front().map(|t| t.limit));
        let settling = self.lock_settling(snapshot);
        let free = limit.filter(|_| !settling).map_or(0, |l| {
            usize::try_from(l)
                .unwrap_or(usize::MAX)
                .saturating_sub(holders.len())
        });
        let admit_count = self
            .takes
            .iter()
            .take_while(|t| Some(t.limit) == limit)
            .count()
            .min(free)
            .min(MAX_TAKES);
        let admits: Vec<TakeRequest> = self.takes.drain(..admit_count).collect();

        // Takes that asked not to wait and found no slot are refused, but only on a fresh read.
        if self.takes.iter().any(|t| t.once) {
            if !self.fresh {
                put_back(&mut self.takes, admits);
                self.gives.extend(gives);
                return Planned::Reread;
            }
            let (once, waiting): (VecDeque<_>, VecDeque<_>) =
                self.takes.drain(..).partition(|t| t.once);
            self.takes = waiting;
            for take in once {
                let _ = take.reply.send(Ok(Taken::Full));
            }
        }

        let leaving_recorded = gives.iter().any(|g| snapshot.records_holder(&g.session));
        let deleting = gives.iter().any(|g| g.delete_contender);
        if admits.is_empty() && !leaving_recorded && !deleting && !pruning {
            for give in gives {
                if let Some(reply) = give.reply {
                    let _ = reply.send(Ok(()));
                }
            }
            return if self.takes.is_empty() {
                Planned::Nothing
            } else {
                Planned::Full
            };
        }
        self.write(
            snapshot,
            holders,
            limit,
            admits,
            gives,
            leaving_recorded || pruning,
        )
        .await
    }

    /// The recorded holders that still count against the limit: the live ones, and the dead
    /// ones until the lock-delay of the take at the head of the queue has passed since we first
    /// saw them dead.
    ///
    /// This is lock-delay's promise carried over to semaphores: when an operator (or a failure
    /// detector) invalidates a holder's session, the holder may still be running its work until
    /// it notices, so its slot is not handed to anyone else for the lock-delay. With lock-delay 0
    /// dead holders are pruned at once, as `consul lock -n` does.
    fn unpruned_holders(&mut self, snapshot: &Snapshot) -> BTreeSet<String> {
        let now = Instant::now();
        let settle = self.settle;
        let recorded: BTreeSet<String> = match &snapshot.lock {
            Ok(Some((_, value))) => value.holders.clone(),
            _ => BTreeSet::new(),
        };
        self.dead_since
            .retain(|session, _| recorded.contains(session) && !snapshot.live.contains(session));
        self.next_prune = None;
        let mut holders = BTreeSet::new();
        for session in recorded {
            if snapshot.live.contains(&session) {
                holders.insert(session);
                continue;
            }
            let seen = *self.dead_since.entry(session.clone()).or_insert(now);
            let prunable_at = seen + settle;
            if prunable_at > now {
                self.next_prune = Some(self.next_prune.map_or(prunable_at, |p| p.min(prunable_at)));
                holders.insert(session);
            }
        }
        holders
    }

    /// Whether the lock key is missing while sessions other than our waiting takes hold
    /// contender keys, and the settle time since that was first seen has not passed. Holders of
    /// a deleted `.lock` lost their slots all at once and are still stopping; recreating it
    /// with a fresh holder set at once would let more than `limit` run.
    fn lock_settling(&mut self, snapshot: &Snapshot) -> bool {
        let orphaned = matches!(snapshot.lock, Ok(None))
            && snapshot
                .live
                .iter()
                .any(|session| !self.takes.iter().any(|t| t.session == *session));
        if !orphaned {
            self.lock_gone_since = None;
            return false;
        }
        let now = Instant::now();
        let settle = self.settle;
        let until = *self.lock_gone_since.get_or_insert(now) + settle;
        if until <= now {
            return false;
        }
        self.next_prune = Some(self.next_prune.map_or(until, |p| p.min(until)));
        true
    }

    /// Writes one round as one transaction and answers its requests.
    async fn write(
        &mut self,
        snapshot: &Snapshot,
        mut holders: BTreeSet<String>,
        limit: Option<u64>,
        admits: Vec<TakeRequest>,
        gives: Vec<GiveRequest>,
        holders_changed: bool,
    ) -> Planned {
        holders.extend(admits.iter().map(|t| t.session.clone()));
        let lock_key = lock_key(&self.prefix);
        // An unreadable lock key is never rewritten: deleting contender keys is all we do then.
        let new_lock = match (&snapshot.lock, limit) {
            (Ok(_), Some(limit)) if !admits.is_empty() || holders_changed => {
                Some(LockValue { limit, holders })
            }
            _ => None,
        };
        let encoded = new_lock.as_ref().map(LockValue::encode);
        let give_keys: Vec<String> = gives
            .iter()
            .map(|g| contender_key(&self.prefix, &g.session))
            .collect();
        let take_keys: Vec<String> = admits
            .iter()
            .map(|t| contender_key(&self.prefix, &t.session))
            .collect();
        let mut ops = Vec::new();
        let mut owners = Vec::new();
        for (give, key) in gives.iter().zip(&give_keys) {
            if give.delete_contender {
                ops.push(TxnOp::Delete { key });
                owners.push(Owner::Give);
            }
        }
        for (i, (take, key)) in admits.iter().zip(&take_keys).enumerate() {
            if snapshot.contenders.contains_key(&take.session) {
                // A pooled session re-locks its key, so the LockIndex (the sequencer) changes.
                ops.push(TxnOp::Unlock {
                    key,
                    session: &take.session,
                    flags: SEMAPHORE_FLAGS,
                });
                owners.push(Owner::Take(i));
            }
            ops.push(TxnOp::Lock {
                key,
                session: &take.session,
                value: &take.value,
                flags: SEMAPHORE_FLAGS,
            });
            owners.push(Owner::Take(i));
        }
        if let Some(value) = &encoded {
            let index = match &snapshot.lock {
                Ok(Some((index, _))) => *index,
                _ => 0,
            };
            ops.push(TxnOp::Cas {
                key: &lock_key,
                value,
                flags: SEMAPHORE_FLAGS,
                index,
            });
            owners.push(Owner::Lock);
        }

        let answer = self.http.txn(&ops).await;
        drop(ops);
        match answer {
            Ok(Ok(results)) => {
                self.backoff.reset();
                let written = results
                    .iter()
                    .map(|e| e.modify_index)
                    .max()
                    .unwrap_or(snapshot.index);
                let mut next = snapshot.clone();
                next.index = next.index.max(written);
                if let Some(lock) = new_lock {
                    let index = results
                        .iter()
                        .find(|e| e.key == lock_key)
                        .map_or(written, |e| e.modify_index);
                    next.lock = Ok(Some((index, lock)));
                }
                for give in gives {
                    if give.delete_contender {
                        next.live.remove(&give.session);
                        next.contenders.remove(&give.session);
                    }
                    if let Some(reply) = give.reply {
                        let _ = reply.send(Ok(()));
                    }
                }
                for (take, key) in admits.into_iter().zip(&take_keys) {
                    let lock_index = results
                        .iter()
                        .rev()
                        .find(|e| &e.key == key && e.holder() == Some(take.session.as_str()))
                        .map_or(0, |e| e.lock_index);
                    next.live.insert(take.session.clone());
                    next.contenders.insert(take.session.clone(), lock_index);
                    self.answer_take(
                        take,
                        Taken::Admitted {
                            lock_index,
                            index: written,
                        },
                    );
                }
                self.snapshot = Some(next);
                self.fresh = false;
                Planned::Written
            }
            Ok(Err(failed)) => {
                // Someone else wrote the lock key (a stale CAS), or a session is gone (its lock op
                // failed). Answer the latter; everyone else is planned again on a fresh read.
                let mut gone = HashSet::new();
                for op in failed {
                    match owners.get(op) {
                        Some(Owner::Lock) => self.http.count_cas_conflict(),
                        Some(Owner::Take(i)) => {
                            gone.insert(*i);
                        }
                        Some(Owner::Give) | None => {}
                    }
                }
                let mut kept = Vec::new();
                for (i, take) in admits.into_iter().enumerate() {
                    if gone.contains(&i) {
                        let _ = take.reply.send(Ok(Taken::SessionGone));
                    } else {
                        kept.push(take);
                    }
                }
                put_back(&mut self.takes, kept);
                self.gives.extend(gives);
                Planned::Reread
            }
            Err(error) => {
                // The write may or may not have gone through. A take whose caller has left can
                // no longer be answered, so if it was admitted, give its slot back.
                let (abandoned, waiting): (Vec<_>, Vec<_>) =
                    admits.into_iter().partition(|t| t.reply.is_closed());
                for take in abandoned {
                    self.gives.push(GiveRequest {
                        session: take.session,
                        delete_contender: false,
                        give_up: Instant::now() + GIVE_UP_AFTER,
                        reply: None,
                    });
                }
                put_back(&mut self.takes, waiting);
                self.gives.extend(gives);
                self.trouble(error).await;
                Planned::Reread
            }
        }
    }

    /// Answers an admitted take; if its caller has gone, gives the slot back in a later round.
    fn answer_take(&mut self, take: TakeRequest, taken: Taken) {
        if take.reply.send(Ok(taken)).is_err() {
            self.gives.push(GiveRequest {
                session: take.session,
                delete_contender: false,
                give_up: Instant::now() + GIVE_UP_AFTER,
                reply: None,
            });
        }
    }
}

/// What a round's plan led to.
enum Planned {
    /// A transaction was written and answered.
    Written,
    /// The plan needs a fresh read of the prefix first.
    Reread,
    /// Nothing to write, and nobody waiting.
    Nothing,
    /// Nothing to write, and takes wait for a slot.
    Full,
}

/// Which request a transaction operation belongs to.
enum Owner {
    Give,
    Take(usize),
    Lock,
}

/// Puts `items` back at the front of `queue`, in their order: they keep their place.
fn put_back<T>(queue: &mut VecDeque<T>, items: Vec<T>) {
    for item in items.into_iter().rev() {
        queue.push_front(item);
    }
}
