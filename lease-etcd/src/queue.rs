//! The shared queue of the leader and semaphore recipes: contenders queued by the create
//! revision of their keys.
//!
//! Every contender writes its own key `<key>/<lease ID in hex>` (`<key>/<lease ID in hex>_<n>` if
//! another contender of this process on that name has that pooled lease: see `slot::Slot`),
//! attached to its etcd lease, if it does not exist yet (one transaction). etcd gives each write
//! the next revision of the whole cluster, so the keys under `<key>/` are a queue in arrival
//! order:
//!
//! - **leader**: the oldest key leads (the `leader` module);
//! - **semaphore of limit N**: the N oldest keys hold (the `semaphore` module).
//!
//! **One kind of lock per name.** Both kinds queue under `<key>/`, so the values tell them apart:
//! a key whose value is exactly our semaphore format is a semaphore contender, any other a leader
//! contender (ours, `etcdctl elect`'s proposal, `etcdctl lock`'s empty value). Judging its turn,
//! a leader contender whose predecessor is a semaphore contender, and a semaphore contender whose
//! oldest key is a leader contender, are refused at once with [`Error::FlagsConflict`] (the
//! flags constants naming the kinds), however long they may wait; a semaphore contender with a
//! leader contender between the oldest and itself waits for it to go (that leader contender is
//! refused by its own judgment). The check reads nothing more than the judgment already reads,
//! and a refused contender's key goes with its lease. A leader holds only as the oldest key and a
//! semaphore contender only with no leader contender older than itself, so the two kinds never
//! hold together, not even when both first arrive at once; such a race can at worst refuse a
//! contender for a leader contender that is itself being refused. The name is another kind's
//! only while that kind's contenders are queued: nothing of it outlives its last lease.
//!
//! **Waiters settle after a removal nobody announced.** A holder that releases first *touches*
//! its key (a put that keeps value and lease, so the key's version becomes 2), then deletes it
//! (both sent at once: the deletion takes only a touched key, so it cannot overtake the touch).
//! Waiters watch with `prev_kv`, so the deletion they see carries the key as it was: a
//! holder's key deleted at version 2 was released, and the next waiter goes at once. Any other
//! removal of a key that was holding (an operator's `etcdctl del` or `lease revoke`, an expired
//! lease) may have happened while its holder still runs: the holder learns it from its own watch
//! a few milliseconds later, and cancels its work. A waiter is in the queue from its join on, so
//! this holds for keys that were ahead of it when it joined and were gone by its first read too
//! (that read also reads, from etcd's history, who was ahead at the join), and for holders gone
//! between the deletion a semaphore waiter was woken by and its read (the count tells how many
//! the read saw gone that the watch has not shown yet; the waiter takes them from the watch
//! before it judges), and for a leader's holder gone between two reads of a waiter that watched
//! only the key just ahead, or did not watch at all while it settled (every judgment also reads
//! the oldest key, the holder: one that held at the last read and is gone, unseen by the wait,
//! is judged from etcd's history; lease-sim's seed 974 of etcd, a holder deleted while its
//! waiter settled for a waiter ahead that gave up). Waiters wait [`LeaseSpec::settle_time`] (100 ms by default, above the
//! loss-to-cancel p99 under load) from the removal before they judge again, so the two never
//! run at once. A watch that breaks counts as such a removal, since a deletion may have been
//! missed. `etcdctl lock` and `etcdctl elect` contenders do not settle; the touch changes nothing
//! they read. Tested by
//! `etcd::waiters_settle_after_an_unannounced_removal_and_not_after_a_release`,
//! `queue::tests::a_holder_removed_between_a_join_and_the_first_read_is_judged_from_history` (the
//! judgment from history passed 50 times in a row with both cores loaded) and
//! `semaphore::tests::holders_gone_before_a_read_are_taken_from_the_watch`.
//!
//! **A waiter whose etcd lease goes** (revoked by an operator, or expired) joins again with a new
//! key, at the back of the queue, and settles once before it may take the turn: a holder of this
//! process ahead of it may have gone with that lease, unannounced (contenders of one name share
//! pooled leases).
//!
//! Keys only leave the queue, never move up past a newer one: a holder stays a holder until its
//! key is deleted. The sequencer's index is the own key's create revision, which rises with every
//! acquisition anywhere in the cluster: a downstream system can refuse any token older than the
//! newest it has seen, across keys, by comparison alone. That revision is also what replaces
//! lock-delay (etcd has none): a holder that lost its lease but is still finishing its work is
//! fenced by the higher revision of the next holder.

use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::sync::Arc;

use tokio::time::Instant;

use super::client::EtcdClient;
use super::pool::LeaseEnd;
use super::session::{self, Session, Won, retrying};
use super::watch::WatchStream;
use super::wire::proto::{
    Compare, Event, KeyValue, PutRequest, RangeRequest, RequestOp, TxnRequest,
};
use super::wire::{ApiError, Wire, is_not_found};
use lease_core::backoff::Backoff;
use lease_core::{Backend, BackendKind, Error, Lease, LeaseSpec, LostReason, Sequencer};

/// How long the replay of a deletion from etcd's history may take before it counts as missed.
pub(crate) const HISTORY_REPLAY: std::time::Duration = std::time::Duration::from_secs(5);

/// What a contender found when it judged the queue.
pub(crate) enum Turn {
    Mine,
    /// Not yet: wait for a deletion in this range, then judge again.
    WaitFor(RangeRequest),
}

/// Who holds, among the keys under `<key>/`: what a recipe (the leader's, the semaphore's)
/// decides in the shared queue.
pub(crate) trait Recipe: Copy + Send + Sync + fmt::Debug {
    /// How a waiter counts the deletions ahead of it between two reads; a leader's waiters do
    /// not count ([`Infallible`]).
    type Count: Count;

    /// What the own key holds.
    fn value(self, spec: &LeaseSpec) -> Vec<u8>;

    /// The keys ahead of ours that decide our turn.
    fn ahead(self, key: &str, created: i64) -> RangeRequest;

    /// The keys older than ours that may be running work (a leader's holder, a semaphore's
    /// slots), read with each judgment: one that went between two reads without a release is
    /// settled for, whether the wait between saw it or not.
    fn holding(self, key: &str, created: i64) -> RangeRequest;

    /// The keys older than ours that a waiter counts, read with each judgment; `None` if its
    /// waiters do not count.
    fn older(self, key: &str, created: i64) -> Option<RangeRequest>;

    /// Whose turn it is, given the keys [`ahead`](Recipe::ahead) of ours; refuses a name used by
    /// the other kind of lock (see the module docs).
    fn judge(self, key: &str, own: &str, ahead: &[KeyValue]) -> Result<Turn, Error>;

    /// The count of the waiter with the own key `own` (created at `created`), given the keys
    /// that hold (`ahead`) and the keys [`older`](Recipe::older) than ours at the read at
    /// revision `read_at`; `None` if its waiters do not count.
    fn count(
        self,
        own: &str,
        created: i64,
        ahead_older: (&[KeyValue], &[KeyValue]),
        read_at: i64,
    ) -> Option<Self::Count>;

    /// The key a holder's sequencer names, of the name contended for (`key`) and the holder's
    /// own key (`own`).
    fn sequencer_key(self, key: &str, own: &str) -> String;
}

/// A waiter's count of the keys ahead of it, kept up to date from the deletions it watches
/// between two reads, so that it reads again only when its turn may have come.
pub(crate) trait Count: Send + Sized {
    /// Takes in one deletion (after the read); true once the waiter should read again (or may
    /// be in: see [`turn_at`](Count::turn_at)).
    fn deleted(&mut self, event: &Event) -> bool;

    /// The revision at which the waiter holds, if the count alone tells.
    fn turn_at(&self) -> Option<i64>;

    /// The latest holder gone without a release since the last call (or the read).
    fn take_worst(&mut self) -> Removal;

    /// After a read at `revision` found `older` keys ahead of us: the deletions it saw that the
    /// watch had not delivered yet, taken from the watch; how they went.
    fn catch_up(
        self,
        kept: &mut Option<KeptWatch>,
        revision: i64,
        older: usize,
    ) -> impl Future<Output = Removal> + Send;
}

/// Acquires the leader key or semaphore `spec` names (validated by the caller); `backend` answers
/// the lease's checks.
pub(crate) async fn acquire(
    http: &Arc<EtcdClient>,
    spec: &LeaseSpec,
    recipe: impl Recipe,
    backend: Arc<dyn Backend>,
) -> Result<Lease, Error> {
    let started = Instant::now();
    let deadline = spec.wait_policy().deadline(started);
    // Set once our waiting key went with its etcd lease: the contenders of this process on that
    // lease went with it, unannounced, a holder of this name among them perhaps.
    let mut lost_with_a_lease = false;
    loop {
        let (mut session, mut keep_alive) = Session::attach(http, spec).await?;
        let own = session.own().to_owned();
        let outcome = tokio::select! {
            biased;
            end = &mut keep_alive => Err(end),
            result = contend(http, recipe, spec, &session, lost_with_a_lease, started, deadline) => Ok(result),
        };
        match outcome {
            Ok(Ok(won)) => {
                let key = recipe.sequencer_key(spec.key(), &own);
                let index = u64::try_from(won.created).unwrap_or_default();
                let sequencer = Sequencer::new(BackendKind::Etcd, key, index, session.holder());
                return Ok(session::start_lease(
                    sequencer, own, won, session, keep_alive, backend,
                ));
            }
            Ok(Err(Error::Lost(LostReason::SessionInvalidated))) => {
                // The pooled lease went before the pool learned it: wait on another one.
                http.pool().retire(session.id());
                let _ = session.give_back(None).await;
                lost_with_a_lease = true;
            }
            Ok(Err(error)) => {
                // A call that timed out in a pause of this process fails beside the fence: the
                // pause is what to report.
                let error = session.fence().explain(error);
                // Give the lease back now, so a caller that asked not to wait leaves nothing
                // behind.
                let _ = session.give_back(None).await;
                return Err(error);
            }
            // Our waiting lease was revoked (by an operator, or it expired): wait with a new one,
            // at the back of the queue.
            Err(LeaseEnd::Revoked) => {
                let _ = session.give_back(None).await;
                lost_with_a_lease = true;
            }
            Err(end @ LeaseEnd::Fenced(_)) => {
                let _ = session.give_back(None).await;
                return Err(Error::Lost(end.into()));
            }
        }
    }
}

/// Joins the queue with `session`'s key and waits for our turn, or until the deadline passes.
/// `rejoined`: our previous key went with its etcd lease, and a holder of this process ahead of
/// it may have gone with it (contenders of one name share pooled leases): settle once before the
/// first judgment, as for any holder that went without a release.
async fn contend<R: Recipe>(
    http: &EtcdClient,
    recipe: R,
    spec: &LeaseSpec,
    session: &Session,
    rejoined: bool,
    started: Instant,
    deadline: Option<Instant>,
) -> Result<Won, Error> {
    let key = spec.key();
    let busy = || Error::Busy {
        key: key.to_owned(),
        waited: started.elapsed(),
    };
    let failed = |e: ApiError| {
        if is_not_found(&e) {
            // etcd no longer has the pooled lease (revoked, expired) the key was to go on.
            return Error::Lost(LostReason::SessionInvalidated);
        }
        e.into_error(http.wire(), format_args!("contend for {key:?}"))
    };
    let (own, lease) = (session.own(), session.id());
    let value = recipe.value(spec);
    let mut created = join(http.wire(), own, &value, lease, deadline)
        .await
        .map_err(failed)?;
    let mut pause = lease_http::backoff();
    let mut kept = None;
    // A semaphore waiter's count of the keys ahead, from its last wait.
    let mut counted: Option<R::Count> = None;
    let mut first_judgment = true;
    // The keys that held at the last read, unless a count judged every removal since.
    let mut held_at_last: Option<HeldAt> = None;
    loop {
        let mut ops = vec![
            RequestOp::range(RangeRequest::key(own)),
            RequestOp::range(recipe.ahead(key, created)),
            RequestOp::range(recipe.holding(key, created)),
        ];
        let older = recipe.older(key, created).map(|older| {
            ops.push(RequestOp::range(older));
            ops.len() - 1
        });
        if first_judgment {
            // Who was ahead when we joined, from etcd's history.
            ops.push(RequestOp::range(
                recipe.ahead(key, created).at_revision(created),
            ));
        }
        let ops_len = ops.len();
        let read = TxnRequest {
            success: ops,
            ..TxnRequest::default()
        };
        let read = retrying(deadline, || http.wire().txn(&read))
            .await
            .map_err(failed)?;
        if read.range(0).kvs.first().map(|kv| kv.create_revision) != Some(created) {
            // Our key was deleted while we waited (an operator): join again, at the back.
            created = join(http.wire(), own, &value, lease, deadline)
                .await
                .map_err(failed)?;
            counted = None;
            continue;
        }
        let ahead = &read.range(1).kvs;
        let holding = &read.range(2).kvs;
        // A holder at the last read that went without a release before this one, unseen by the
        // wait between (it watches only the key just ahead, and not while it settles): settled
        // for like one it saw go.
        let unseen = match held_at_last.take() {
            Some(then) => then.removed_unseen(http, holding, &mut pause).await,
            None => Removal::Released,
        };
        held_at_last = Some(HeldAt::new(read.revision(), holding));
        // A waiter is in the queue from its join on: a holder ahead of it then that went without
        // a release before this read is settled for like one it saw go.
        let since_join = std::mem::take(&mut first_judgment)
            && (rejoined
                || removed_since(
                    http,
                    created,
                    &read.range(ops_len - 1).kvs,
                    ahead,
                    &mut pause,
                )
                .await
                .is_unannounced());
        if since_join || unseen.is_unannounced() {
            tracing::debug!(key, settle = ?spec.settle_time(), rejoined, "a holder ahead of us at our join or our last read, or of our lost key, went without a release; settling");
            tokio::time::sleep(spec.settle_time()).await;
            continue;
        }
        let older = older.map(|at| read.range(at).kvs);
        // Keys the read found gone that the watch has not shown yet: how they went, before the
        // judgment.
        if let (Some(count), Some(older)) = (counted.take(), &older) {
            let caught_up = count.catch_up(&mut kept, read.revision(), older.len());
            let removal = settled(caught_up, spec, deadline).await.ok_or_else(busy)?;
            if removal.is_unannounced() {
                continue;
            }
        }
        let range = match recipe.judge(key, own, ahead)? {
            Turn::Mine => {
                return Ok(Won {
                    created,
                    judged_at: read.revision(),
                });
            }
            Turn::WaitFor(range) => range,
        };
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(busy());
        }
        let counting = older
            .as_ref()
            .and_then(|older| recipe.count(own, created, (ahead, older), read.revision()));
        let mut waiting = match counting {
            Some(count) => Waiting::CountDown(count),
            None => Waiting::Any { holding: ahead },
        };
        match (&waiting, held_at_last.as_mut()) {
            // The wait judges the removal of the key it watches.
            (Waiting::Any { .. }, Some(held)) => held.watched(&range),
            // A count judges every removal ahead, and its catch-up those its watch has not shown.
            (Waiting::CountDown(_), _) | (_, None) => held_at_last = None,
        }
        let removal = wait_for_removal(
            http,
            &range,
            &mut waiting,
            read.revision(),
            &mut pause,
            &mut kept,
        );
        let removal = settled(removal, spec, deadline).await.ok_or_else(busy)?;
        if let Waiting::CountDown(count) = waiting {
            // The count alone lets us in when it is exact and everything ahead is our kind.
            if let (Removal::Released, Some(judged_at)) = (removal, count.turn_at()) {
                return Ok(Won { created, judged_at });
            }
            counted = Some(count);
        }
    }
}

/// How a holder ahead went (`removal`), after the settle that a removal without a release asks
/// for (counted from when it was seen); `None` if the deadline passed first.
async fn settled(
    removal: impl Future<Output = Removal>,
    spec: &LeaseSpec,
    deadline: Option<Instant>,
) -> Option<Removal> {
    let settled = async {
        let removal = removal.await;
        if let Removal::Unannounced(seen) = removal {
            tracing::debug!(key = spec.key(), settle = ?spec.settle_time(), "a holder's key went without a release; settling");
            tokio::time::sleep_until(seen + spec.settle_time()).await;
        }
        removal
    };
    match deadline {
        None => Some(settled.await),
        Some(deadline) => tokio::time::timeout_at(deadline, settled).await.ok(),
    }
}

/// Writes the own key if it does not exist yet; returns its create revision. Idempotent: a retry
/// after a lost answer finds the key it wrote.
async fn join(
    http: &Wire,
    own: &str,
    value: &[u8],
    lease: i64,
    deadline: Option<Instant>,
) -> Result<i64, ApiError> {
    let txn = TxnRequest {
        compare: vec![Compare::absent(own)],
        success: vec![RequestOp::put(PutRequest {
            key: own.as_bytes().to_vec(),
            value: value.to_vec(),
            lease,
            ..PutRequest::default()
        })],
        failure: vec![RequestOp::range(RangeRequest::key(own))],
    };
    let answer = retrying(deadline, || http.txn(&txn)).await?;
    if answer.succeeded {
        return Ok(answer.revision());
    }
    answer
        .range(0)
        .kvs
        .first()
        .map(|kv| kv.create_revision)
        .ok_or_else(|| ApiError::Malformed("the own key neither absent nor present".into()))
}

/// How a key a waiter was waiting on went; of several removals, the greatest (the latest
/// unannounced one) decides.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Removal {
    /// Released: touched by its holder, then deleted; or not one of the keys that held.
    Released,
    /// A holding key deleted without a release (or a watch that broke, which may have missed
    /// one), seen at this instant: its holder may still be running; the waiter settles from then.
    Unannounced(Instant),
}

impl Removal {
    /// How `event` (a deletion) removed its key, given the keys that held at the waiter's read.
    fn of(event: &Event, holding: &[KeyValue]) -> Removal {
        let held = holding
            .iter()
            .any(|kv| event.kv.as_ref().is_some_and(|gone| gone.key == kv.key));
        if held && !released(event) {
            Removal::unannounced()
        } else {
            Removal::Released
        }
    }

    pub(crate) fn unannounced() -> Removal {
        Removal::Unannounced(Instant::now())
    }

    pub(crate) fn is_unannounced(self) -> bool {
        matches!(self, Removal::Unannounced(_))
    }
}

/// Whether a deletion's key had been touched by its holder first: a release.
pub(crate) fn released(event: &Event) -> bool {
    event.prev_kv.as_ref().is_some_and(|prev| prev.version >= 2)
}

/// What a waiter waits for between two reads.
enum Waiting<'a, C> {
    /// The first deletion in the watched range after the read (a leader waiter's: of the key
    /// just ahead of it); `holding`: the keys that held at the read.
    Any { holding: &'a [KeyValue] },
    /// A semaphore waiter: the deletions of keys ahead of it, until it may be in.
    CountDown(C),
}

/// The keys that held ([`Recipe::holding`]) at a waiter's read, kept to its next read.
struct HeldAt {
    /// The read's revision.
    revision: i64,
    holding: Vec<KeyValue>,
    /// The key the wait after the read watched, whose removal the wait judged.
    watched: Option<Vec<u8>>,
}

impl HeldAt {
    fn new(revision: i64, holding: &[KeyValue]) -> HeldAt {
        HeldAt {
            revision,
            holding: holding.to_vec(),
            watched: None,
        }
    }

    /// The wait after the read watches `range`: a removal of the one key it names is judged by
    /// the wait.
    fn watched(&mut self, range: &RangeRequest) {
        self.watched = range.range_end.is_empty().then(|| range.key.clone());
    }

    /// How the keys that held then and do not hold `now` went, but the one the wait judged.
    async fn removed_unseen(
        self,
        http: &EtcdClient,
        now: &[KeyValue],
        pause: &mut Backoff,
    ) -> Removal {
        let unseen: Vec<KeyValue> = (self.holding.into_iter())
            .filter(|kv| self.watched.as_ref() != Some(&kv.key))
            .collect();
        removed_since(http, self.revision, &unseen, now, pause).await
    }
}

/// How the keys `then` (ahead of a contender at revision `since`: its join, read from etcd's
/// history, or its last read) that are gone from `now` went: a watch from `since` replays each
/// one's deletion. Settle-worthy if any went unannounced, or if the history cannot be read
/// (compacted): a deletion may have been missed.
async fn removed_since(
    http: &EtcdClient,
    since: i64,
    then: &[KeyValue],
    now: &[KeyValue],
    pause: &mut Backoff,
) -> Removal {
    let mut worst = Removal::Released;
    for gone in then
        .iter()
        .filter(|kv| !now.iter().any(|a| a.key == kv.key))
    {
        let range = RangeRequest::key(&gone.key_str());
        // Deleted already, so the watch replays the deletion at once; bounded all the same.
        let mut watch = None;
        let mut waiting: Waiting<'_, Infallible> = Waiting::Any { holding: then };
        let replayed = wait_for_removal(http, &range, &mut waiting, since, pause, &mut watch);
        let removal = tokio::time::timeout(HISTORY_REPLAY, replayed)
            .await
            .unwrap_or_else(|_| Removal::unannounced());
        worst = worst.max(removal);
    }
    worst
}

/// Completes once the deletions in `range` after `revision` are what `waiting` waits for, saying
/// whether one of them removed a holding key without a release; or when the watch breaks (the
/// caller judges again either way; a broken watch first waits `pause`). A range of many keys (a
/// semaphore's prefix) is watched on the process's shared watch of it.
async fn wait_for_removal<C: Count>(
    http: &EtcdClient,
    range: &RangeRequest,
    waiting: &mut Waiting<'_, C>,
    revision: i64,
    pause: &mut Backoff,
    kept: &mut Option<KeptWatch>,
) -> Removal {
    // The same range as last time (a semaphore's prefix): go on with that watch. etcd delivers
    // a watch created at a past revision only from its next sync (up to 100 ms later), and a
    // holder's touch often falls between a waiter's read and its new watch.
    if kept.as_ref().is_none_or(|k| k.range != *range) {
        *kept = None;
        let watched = if range.range_end.is_empty() {
            http.watch(range, revision + 1).await
        } else {
            http.watch_shared(range, revision + 1).await
        };
        match watched {
            Ok(stream) => {
                *kept = Some(KeptWatch {
                    range: range.clone(),
                    stream,
                });
            }
            Err(error) => {
                tracing::debug!(%error, "cannot watch the queue; judging again");
                pause.wait().await;
                return Removal::unannounced();
            }
        }
    }
    let Some(KeptWatch { stream, .. }) = kept.as_mut() else {
        return Removal::unannounced();
    };
    loop {
        match stream.next().await {
            Ok(batch) => {
                // Deletions the read at `revision` already saw are not news.
                let deletions = batch
                    .events
                    .iter()
                    .filter(|e| e.is_delete() && e.kv().mod_revision > revision);
                let decided = match waiting {
                    Waiting::Any { holding } => deletions.map(|e| Removal::of(e, holding)).max(),
                    Waiting::CountDown(count) => {
                        // Every deletion of the batch is counted, even past the one that decides.
                        let mut read_again = false;
                        for deletion in deletions {
                            read_again |= count.deleted(deletion);
                        }
                        read_again.then(|| count.take_worst())
                    }
                };
                if let Some(removal) = decided {
                    pause.reset();
                    return removal;
                }
            }
            Err(error) => {
                tracing::debug!(%error, "the watch of the queue broke; judging again");
                *kept = None;
                pause.wait().await;
                return Removal::unannounced();
            }
        }
    }
}

/// A waiter's watch, kept from one judgment to the next while it watches the same range.
pub(crate) struct KeptWatch {
    pub(crate) range: RangeRequest,
    pub(crate) stream: WatchStream,
}

#[cfg(test)]
pub(crate) mod tests;
