//! Leader and semaphore: contenders queued by the create revision of their keys.
//!
//! Every contender writes its own key `<key>/<lease ID in hex>` (`<key>/<lease ID in hex>_<n>` if
//! another contender of this process on that name has that pooled lease: see `pool::Slot`),
//! attached to its etcd lease, if it does not exist yet (one transaction). etcd gives each write
//! the next revision of the whole cluster, so the keys under `<key>/` are a queue in arrival
//! order:
//!
//! - **leader** (etcd's `concurrency.Election`, the recipe `etcdctl elect` uses): the oldest key
//!   leads. A waiter watches only the key just before its own, so a hand-over wakes one waiter,
//!   not all of them. The key's value is the advertised value, as `etcdctl elect` writes its
//!   proposal, so the two interoperate on the same name.
//! - **semaphore of limit N**: the N oldest keys hold; the others wait in arrival order (FIFO).
//!   A waiter's read also counts the keys ahead of it, and it counts their deletions down on the
//!   process's one watch of the prefix (shared by all its waiters there: see the `watch`
//!   module), so a release makes only the waiter whose turn may have come read, not every
//!   waiter. The value is `{"limit": N, "value": <base64>}`: every contender must ask for the
//!   limit of the oldest, or gets [`Error::LimitMismatch`].
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
//! before it judges). Waiters wait [`LeaseSpec::settle_time`] (100 ms by default, above the
//! loss-to-cancel p99 under load) from the removal before they judge again, so the two never
//! run at once. A watch that breaks counts as such a
//! removal, since a deletion may have been missed. `etcdctl lock` and `etcdctl elect` contenders
//! do not settle; the touch changes nothing they read.
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

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::client::EtcdClient;
use super::pool::LeaseEnd;
use super::session::{self, Session, Won, holder_in, lease_of, retrying};
use super::watch::WatchStream;
use super::wire::proto::{
    Compare, Event, KeyValue, PutRequest, RangeRequest, RequestOp, TxnRequest,
};
use super::wire::{ApiError, Wire, is_not_found};
use lease_core::backoff::Backoff;
use lease_core::{Backend, BackendKind, Error, Lease, LeaseSpec, LostReason, Sequencer};

/// How long the replay of a deletion from etcd's history may take before it counts as missed.
pub(crate) const HISTORY_REPLAY: std::time::Duration = std::time::Duration::from_secs(5);

/// How many of the keys ahead of a semaphore waiter its read counts (more if the limit is
/// higher); further back, it counts down from this many and reads again when that is done.
const COUNTED_AHEAD: usize = 1000;

/// How many keys ahead of it a waiter on a semaphore of `limit` counts: more than the limit, so
/// the count is exact whenever the waiter may be let in.
fn counted_ahead(limit: u32) -> usize {
    COUNTED_AHEAD.max(
        usize::try_from(limit)
            .unwrap_or(usize::MAX)
            .saturating_add(1),
    )
}

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

/// The leader recipe: the oldest key holds.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Leader;

impl Recipe for Leader {
    type Count = Infallible;

    fn value(self, spec: &LeaseSpec) -> Vec<u8> {
        spec.advertised_value().to_vec()
    }

    fn ahead(self, key: &str, created: i64) -> RangeRequest {
        // The newest key older than ours: the one to wait for.
        RangeRequest::under(key)
            .by_creation(false)
            .limit(1)
            .created_by(created - 1)
    }

    fn older(self, _: &str, _: i64) -> Option<RangeRequest> {
        None
    }

    fn judge(self, key: &str, _: &str, ahead: &[KeyValue]) -> Result<Turn, Error> {
        match ahead.first() {
            None => Ok(Turn::Mine),
            Some(previous) if SemaphoreValue::parse(previous).is_some() => {
                Err(Error::semaphore_in_the_way(key))
            }
            Some(previous) => Ok(Turn::WaitFor(RangeRequest::key(&previous.key_str()))),
        }
    }

    fn count(self, _: &str, _: i64, _: (&[KeyValue], &[KeyValue]), _: i64) -> Option<Infallible> {
        None
    }

    fn sequencer_key(self, key: &str, _: &str) -> String {
        key.to_owned()
    }
}

/// A leader's waiter counts nothing: it waits for the deletion of the one key just ahead of it.
impl Count for Infallible {
    fn deleted(&mut self, _: &Event) -> bool {
        match *self {}
    }

    fn turn_at(&self) -> Option<i64> {
        match *self {}
    }

    fn take_worst(&mut self) -> Removal {
        match *self {}
    }

    async fn catch_up(self, _: &mut Option<KeptWatch>, _: i64, _: usize) -> Removal {
        match self {}
    }
}

/// The semaphore recipe of limit `limit`: the `limit` oldest keys hold.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Semaphore {
    pub(crate) limit: u32,
}

impl Recipe for Semaphore {
    type Count = CountDown;

    fn value(self, spec: &LeaseSpec) -> Vec<u8> {
        SemaphoreValue::encode(self.limit, spec.advertised_value())
    }

    fn ahead(self, key: &str, _: i64) -> RangeRequest {
        RangeRequest::under(key)
            .by_creation(true)
            .limit(i64::from(self.limit))
    }

    /// The keys older than ours (at most [`counted_ahead`]): how many deletions a waiter waits
    /// for, and whether they are all of its kind and limit (see [`CountDown`]).
    fn older(self, key: &str, created: i64) -> Option<RangeRequest> {
        Some(
            RangeRequest::under(key)
                .created_by(created - 1)
                .limit(i64::try_from(counted_ahead(self.limit)).unwrap_or(i64::MAX)),
        )
    }

    fn judge(self, key: &str, own: &str, ahead: &[KeyValue]) -> Result<Turn, Error> {
        let limit = self.limit;
        if let Some(oldest) = ahead.first() {
            let Some(stored) = SemaphoreValue::parse(oldest) else {
                return Err(Error::leader_lock_in_the_way(key));
            };
            if stored.limit != limit {
                return Err(Error::LimitMismatch {
                    key: key.to_owned(),
                    stored: u64::from(stored.limit),
                    requested: u64::from(limit),
                });
            }
        }
        let Some(at) = ahead.iter().position(|kv| kv.key == own.as_bytes()) else {
            return Ok(Turn::WaitFor(RangeRequest::under(key)));
        };
        // A leader contender that joined behind a semaphore holder is refused by its
        // own judgment and goes; until it has, it is not let in beside us.
        if ahead[..at]
            .iter()
            .all(|kv| SemaphoreValue::parse(kv).is_some())
        {
            Ok(Turn::Mine)
        } else {
            Ok(Turn::WaitFor(RangeRequest::under(key)))
        }
    }

    fn count(
        self,
        own: &str,
        created: i64,
        ahead_older: (&[KeyValue], &[KeyValue]),
        read_at: i64,
    ) -> Option<CountDown> {
        Some(CountDown::of(
            own,
            created,
            self.limit,
            ahead_older,
            read_at,
        ))
    }

    fn sequencer_key(self, _: &str, own: &str) -> String {
        own.to_owned()
    }
}

/// The value of a semaphore contender's key: `{"limit":N,"value":"<base64>"}`, exactly.
///
/// It is also what tells a semaphore contender from a leader contender, whose value is its
/// advertised value (`etcdctl elect`'s proposal, or empty for `etcdctl lock`): only a value of
/// exactly this form, a limit of at least 1 and valid base64, is a semaphore's. A leader whose
/// value is such a document would be taken for one.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SemaphoreValue {
    limit: u32,
    /// The advertised value, base64.
    value: String,
}

impl SemaphoreValue {
    fn encode(limit: u32, value: &[u8]) -> Vec<u8> {
        let value = SemaphoreValue {
            limit,
            value: BASE64.encode(value),
        };
        serde_json::to_vec(&value).unwrap_or_default()
    }

    /// The semaphore contender's value in `kv`; `None` if `kv` is a leader contender's.
    fn parse(kv: &KeyValue) -> Option<SemaphoreValue> {
        let parsed = serde_json::from_slice::<SemaphoreValue>(&kv.value).ok()?;
        let valid = parsed.limit >= 1 && BASE64.decode(&parsed.value).is_ok();
        valid.then_some(parsed)
    }

    fn limit_of(prefix: &str, kv: &KeyValue) -> Result<u32, Error> {
        Self::parse(kv)
            .map(|v| v.limit)
            .ok_or_else(|| Error::CorruptLockValue {
                key: kv.key_str(),
                reason: format!("not a semaphore contender of {prefix:?}"),
            })
    }
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
    loop {
        let mut ops = vec![
            RequestOp::range(RangeRequest::key(own)),
            RequestOp::range(recipe.ahead(key, created)),
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
        // A waiter is in the queue from its join on: a holder ahead of it then that went without
        // a release before this read is settled for like one it saw go.
        if std::mem::take(&mut first_judgment)
            && (rejoined
                || removed_since_join(
                    http,
                    created,
                    &read.range(ops_len - 1).kvs,
                    ahead,
                    &mut pause,
                )
                .await
                .is_unannounced())
        {
            tracing::debug!(key, settle = ?spec.settle_time(), rejoined, "a holder ahead of us at our join, or of our lost key, went without a release; settling");
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

/// A semaphore waiter's place in the queue, kept up to date from the deletions under the prefix
/// so that it reads again only when its turn may have come (or its own key went), not on every
/// release ahead of it. The count never overstates what is ahead: keys only leave the queue ahead
/// of a waiter (a new key is newer than every key there), each deletion of an older key removes
/// exactly one, and the read counts at most [`counted_ahead`] of them.
///
/// When the read counted every key ahead and found them all semaphore contenders of our limit,
/// the count alone lets the waiter in (no read more): fewer than `limit` keys ahead of it at the
/// revision of the deletion that brought it there, every one of them of its kind, is what a read
/// at that revision would judge its turn (the watch delivers every event after the read, in
/// order, and the own key's deletion would have been among them). Otherwise it reads and judges
/// then.
pub(crate) struct CountDown {
    own: Vec<u8>,
    created: i64,
    limit: usize,
    /// Keys older than ours at the read (at least), less those deleted since.
    older: usize,
    /// Whether the read counted every key older than ours.
    exact: bool,
    /// Whether every key older than ours at the read is a semaphore contender of our limit.
    clean: bool,
    /// Whether our own key was seen deleted.
    own_gone: bool,
    /// The revision of the last deletion taken in.
    through: i64,
    /// The revision of the read.
    read_at: i64,
    /// The keys that held at the read and are not yet seen deleted.
    holding: Vec<Vec<u8>>,
    /// Whether a holder went since the read, so some waiter of then may hold now: a deletion
    /// without a release of any key ahead then counts as a holder's.
    moved_up: bool,
    /// The latest holder seen gone without a release.
    worst: Removal,
}

impl CountDown {
    /// The count-down of the waiter with the own key `own` (created at `created`), given the
    /// keys that hold (`ahead`) and the keys older than ours (`older`, read up to
    /// [`counted_ahead`] of them) at the read at revision `read_at`.
    fn of(
        own: &str,
        created: i64,
        limit: u32,
        (ahead, older): (&[KeyValue], &[KeyValue]),
        read_at: i64,
    ) -> CountDown {
        let clean = older
            .iter()
            .all(|kv| SemaphoreValue::parse(kv).is_some_and(|value| value.limit == limit));
        CountDown {
            read_at,
            own: own.as_bytes().to_vec(),
            created,
            limit: usize::try_from(limit).unwrap_or(usize::MAX),
            older: older.len(),
            exact: older.len() < counted_ahead(limit),
            clean,
            own_gone: false,
            through: read_at,
            holding: ahead.iter().map(|kv| kv.key.clone()).collect(),
            moved_up: false,
            worst: Removal::Released,
        }
    }
}

impl Count for CountDown {
    /// Takes in one deletion (after the read); true once the waiter should read again (or may
    /// be in: see [`turn_at`](CountDown::turn_at)).
    fn deleted(&mut self, event: &Event) -> bool {
        let key = event.kv.as_ref().map(|kv| kv.key.as_slice());
        self.through = self.through.max(event.kv().mod_revision);
        if key == Some(self.own.as_slice()) {
            // Our own key went: the read finds out and joins again.
            self.own_gone = true;
            return true;
        }
        let Some(prev) = &event.prev_kv else {
            // Cannot tell whose key it was (etcd compacted the previous revision), nor count it.
            self.worst = Removal::unannounced();
            self.exact = false;
            return true;
        };
        if prev.create_revision >= self.created {
            // Behind us.
            return false;
        }
        self.older = self.older.saturating_sub(1);
        let was_holding = match self.holding.iter().position(|k| *k == prev.key) {
            Some(at) => {
                self.holding.swap_remove(at);
                self.moved_up = true;
                true
            }
            None => self.moved_up,
        };
        if was_holding && !released(event) {
            // Settled for when our turn comes.
            self.worst = Removal::unannounced();
        }
        self.older < self.limit
    }

    /// The revision at which the waiter holds, if the count alone tells (see [`CountDown`]).
    fn turn_at(&self) -> Option<i64> {
        let counted = self.exact && self.clean && !self.own_gone;
        (counted && self.older < self.limit).then_some(self.through)
    }

    /// The latest holder gone without a release since the last call (or the read).
    fn take_worst(&mut self) -> Removal {
        std::mem::replace(&mut self.worst, Removal::Released)
    }

    /// After a read at `revision` found `older` keys ahead of us: the deletions it saw that the
    /// watch had not delivered yet (the count tells how many), taken from the watch, since one
    /// of them may have been a holder's without a release. Bounded by [`HISTORY_REPLAY`]; what
    /// cannot be told counts as a removal without a release.
    async fn catch_up(
        mut self,
        kept: &mut Option<KeptWatch>,
        revision: i64,
        older: usize,
    ) -> Removal {
        if older >= self.limit || self.older <= older && self.exact {
            // Not let in by this read, or nothing missed.
            return Removal::Released;
        }
        let Some(KeptWatch { stream, .. }) = kept.as_mut().filter(|_| self.exact) else {
            // We cannot tell what we missed.
            return Removal::unannounced();
        };
        let deadline = Instant::now() + HISTORY_REPLAY;
        while self.older > older {
            let Ok(Ok(batch)) = tokio::time::timeout_at(deadline, stream.next()).await else {
                *kept = None;
                return Removal::unannounced();
            };
            let (seen, later): (Vec<Event>, Vec<Event>) = batch
                .events
                .into_iter()
                .partition(|e| e.kv().mod_revision <= revision);
            let read_at = self.read_at;
            let since_count = |e: &&Event| e.is_delete() && e.kv().mod_revision > read_at;
            for deletion in seen.iter().filter(since_count) {
                self.deleted(deletion);
            }
            if !later.is_empty() {
                // The watch is past the read: it delivered everything the read saw.
                stream.put_back(later);
                if self.older > older {
                    return Removal::unannounced();
                }
            }
        }
        self.take_worst()
    }
}

/// How the keys that were ahead of a contender when it joined (at revision `created`: `then`,
/// read from etcd's history) and are gone from `ahead` now went: a watch from the join replays
/// each one's deletion. Settle-worthy if any went unannounced, or if the history cannot be read
/// (compacted): a deletion may have been missed.
async fn removed_since_join(
    http: &EtcdClient,
    created: i64,
    then: &[KeyValue],
    ahead: &[KeyValue],
    pause: &mut Backoff,
) -> Removal {
    let mut worst = Removal::Released;
    for gone in then
        .iter()
        .filter(|kv| !ahead.iter().any(|a| a.key == kv.key))
    {
        let range = RangeRequest::key(&gone.key_str());
        // Deleted already, so the watch replays the deletion at once; bounded all the same.
        let mut watch = None;
        let mut waiting: Waiting<'_, Infallible> = Waiting::Any { holding: then };
        let replayed = wait_for_removal(http, &range, &mut waiting, created, pause, &mut watch);
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
    range: RangeRequest,
    pub(crate) stream: WatchStream,
}

/// Whether `sequencer` (of this backend) still names a holder: one linearizable transaction reads
/// the own key of a leader or a semaphore holder, and the keys ahead of it.
pub(crate) async fn check_sequencer(http: &EtcdClient, sequencer: &Sequencer) -> Result<(), Error> {
    let Some(lease) = lease_of(sequencer.holder()) else {
        return Err(Error::Lost(LostReason::KeyDeleted));
    };
    let index = i64::try_from(sequencer.index()).unwrap_or(i64::MAX);
    let key = sequencer.key();
    // A leader's sequencer names the election; a semaphore holder's, its own key.
    let leader_own = format!("{key}/{}", sequencer.holder());
    let mut ops = vec![
        RequestOp::range(RangeRequest::key(&leader_own)),
        RequestOp::range(Leader.ahead(key, index)),
        RequestOp::range(RangeRequest::key(key)),
    ];
    let prefix = key.rsplit_once('/').map(|(prefix, _)| prefix);
    if let Some(prefix) = prefix {
        ops.push(RequestOp::range(
            RangeRequest::under(prefix)
                .keys_only()
                .created_by(index - 1),
        ));
    }
    let read = http
        .wire()
        .txn(&TxnRequest {
            success: ops,
            ..TxnRequest::default()
        })
        .await
        .map_err(|e| e.into_error(http.wire(), format_args!("check {sequencer}")))?;
    let lost = |reason| Err(Error::Lost(reason));
    let taken = |kv: &KeyValue| {
        lost(LostReason::KeyTaken {
            lock_index: u64::try_from(kv.create_revision).unwrap_or_default(),
            session: holder_in(key, &kv.key_str(), kv.lease),
        })
    };
    if let Some(own) = read.range(0).kvs.first() {
        if own.create_revision != index || own.lease != lease {
            return taken(own);
        }
        return match read.range(1).kvs.first() {
            Some(older) => taken(older),
            None => Ok(()),
        };
    }
    match (read.range(2).kvs.first(), prefix) {
        (Some(own), Some(prefix)) if own.lease == lease && own.create_revision == index => {
            let limit = SemaphoreValue::limit_of(prefix, own)?;
            let older = read.range(3).kvs.len();
            if older >= usize::try_from(limit).unwrap_or(usize::MAX) {
                // Still waiting behind `limit` older contenders: not a holder.
                return lost(LostReason::HolderPruned);
            }
            Ok(())
        }
        (Some(other), _) => taken(other),
        (None, _) => lost(LostReason::KeyDeleted),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lease_tests::etcd::Server;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A contender key under `q/` as a range returns it.
    fn contender(name: &str, value: &[u8]) -> KeyValue {
        KeyValue {
            key: format!("q/{name}").into_bytes(),
            value: value.to_vec(),
            ..KeyValue::default()
        }
    }

    fn semaphore_contender(name: &str, limit: u32) -> KeyValue {
        contender(name, &SemaphoreValue::encode(limit, b"10.0.0.7"))
    }

    fn refused(turn: Result<Turn, Error>, found: u64, expected: u64) -> bool {
        matches!(turn, Err(Error::FlagsConflict { key, found: f, expected: e })
            if key == "q" && f == found && e == expected)
    }

    /// Only our semaphore format is a semaphore contender: `etcdctl lock`'s empty value and any
    /// `etcdctl elect` proposal (text, other JSON, a near miss of ours) are leader contenders.
    #[test]
    fn only_our_exact_format_is_a_semaphore_contender() {
        assert!(SemaphoreValue::parse(&semaphore_contender("a", 3)).is_some());
        assert!(SemaphoreValue::parse(&contender("a", br#"{"limit":1,"value":""}"#)).is_some());
        for proposal in [
            &b""[..],
            b"10.0.0.7:8080",
            br#"{"limit":2}"#,
            br#"{"limit":0,"value":""}"#,
            br#"{"limit":2,"value":"not base64!"}"#,
            br#"{"limit":2,"value":"","node":"a"}"#,
            br#"{"limit":-1,"value":""}"#,
            b"[2]",
        ] {
            let kv = contender("a", proposal);
            let text = String::from_utf8_lossy(proposal);
            assert!(SemaphoreValue::parse(&kv).is_none(), "{text}");
        }
    }

    #[test]
    fn each_kind_refuses_a_name_the_other_kind_holds() {
        let (leader_flags, semaphore_flags) = (Error::LEADER_FLAGS, Error::SEMAPHORE_FLAGS);
        let semaphore = Semaphore { limit: 2 };
        // A leader (ours, `etcdctl elect`'s, `etcdctl lock`'s) holds: a semaphore is refused,
        // whether or not it is among the `limit` oldest.
        for value in [&b"node-1"[..], b""] {
            let ahead = [contender("leader", value), contender("own", b"")];
            let turn = semaphore.judge("q", "q/own", &ahead);
            assert!(refused(turn, leader_flags, semaphore_flags));
            let turn = semaphore.judge("q", "q/own", &ahead[..1]);
            assert!(refused(turn, leader_flags, semaphore_flags));
        }
        // A semaphore holds: a leader behind it is refused; behind a leader, it waits.
        let holder = semaphore_contender("holder", 2);
        let turn = Leader.judge("q", "q/own", std::slice::from_ref(&holder));
        assert!(refused(turn, semaphore_flags, leader_flags));
        let turn = Leader.judge("q", "q/own", &[contender("leader", b"")]);
        assert!(matches!(turn, Ok(Turn::WaitFor(_))));
        assert!(matches!(Leader.judge("q", "q/own", &[]), Ok(Turn::Mine)));
        // Semaphore contenders only: the limit decides.
        let ahead = [holder.clone(), semaphore_contender("own", 2)];
        assert!(matches!(
            semaphore.judge("q", "q/own", &ahead),
            Ok(Turn::Mine)
        ));
        let turn = semaphore.judge("q", "q/own", &[holder.clone(), semaphore_contender("b", 2)]);
        assert!(matches!(turn, Ok(Turn::WaitFor(_))));
        let turn = Semaphore { limit: 3 }.judge("q", "q/own", &ahead);
        assert!(matches!(
            turn,
            Err(Error::LimitMismatch {
                stored: 2,
                requested: 3,
                ..
            })
        ));
    }

    /// A leader contender that joined behind a semaphore holder (and is about to be refused)
    /// is never let in beside a semaphore contender behind it: that one waits for it to go.
    #[test]
    fn a_semaphore_contender_waits_for_a_leader_contender_ahead_of_it_to_go() {
        let semaphore = Semaphore { limit: 3 };
        let ahead = [
            semaphore_contender("holder", 3),
            contender("leader", b"node-1"),
            semaphore_contender("own", 3),
        ];
        let turn = semaphore.judge("q", "q/own", &ahead);
        assert!(matches!(turn, Ok(Turn::WaitFor(_))));
        let turn = semaphore.judge("q", "q/own", &[ahead[0].clone(), ahead[2].clone()]);
        assert!(matches!(turn, Ok(Turn::Mine)));
    }

    /// Writes `key` (touched once more if `touched`, as a release does) and returns its create
    /// revision.
    /// An etcd server of its own, and a client of it (this crate's, not `lease_tests`'s).
    async fn started() -> (Server, crate::Etcd) {
        let server = Server::start().await;
        let etcd = crate::Etcd::builder()
            .endpoints([server.url()])
            .build()
            .unwrap();
        (server, etcd)
    }

    async fn put(http: &EtcdClient, key: &str, touched: bool) -> i64 {
        let put = |touch| TxnRequest {
            success: vec![RequestOp::put(if touch {
                PutRequest::touch(key)
            } else {
                PutRequest {
                    key: key.as_bytes().to_vec(),
                    value: b"v".to_vec(),
                    ..PutRequest::default()
                }
            })],
            ..TxnRequest::default()
        };
        let created = http.wire().txn(&put(false)).await.unwrap().revision();
        if touched {
            http.wire().txn(&put(true)).await.unwrap();
        }
        created
    }

    /// The keys ahead at the join, as the first read's history range reads them.
    async fn ahead_at(http: &EtcdClient, rule: impl Recipe, created: i64) -> Vec<KeyValue> {
        let range = rule.ahead("q", created).at_revision(created);
        http.wire().range(&range).await.unwrap().kvs
    }

    /// A holder ahead of a waiter when it joined, removed before the waiter's first read: gone
    /// without a release, the waiter must settle; released (touched first), it need not. The
    /// deletion falls between the join and the read here by construction, whatever the timing.
    #[tokio::test]
    async fn a_holder_removed_between_a_join_and_the_first_read_is_judged_from_history() {
        let (_server, etcd) = started().await;
        let http = &etcd.http;
        for released in [false, true] {
            judged_from_history(http, Leader, released).await;
        }
        for released in [false, true] {
            judged_from_history(http, Semaphore { limit: 1 }, released).await;
        }
    }

    async fn judged_from_history(http: &EtcdClient, rule: impl Recipe, released: bool) {
        let holder = "q/holder";
        put(http, holder, released).await;
        let joined = put(http, "q/waiter", false).await;
        let then = ahead_at(http, rule, joined).await;
        assert_eq!(then.len(), 1, "{rule:?}: the holder was ahead at the join");
        http.wire().delete(holder, false).await.unwrap();
        let mut pause = lease_http::backoff();
        let removal = removed_since_join(http, joined, &then, &[], &mut pause).await;
        assert_eq!(
            removal.is_unannounced(),
            !released,
            "{rule:?}, released: {released}"
        );
        // Nothing gone since the join: nothing to settle for.
        let still = removed_since_join(http, joined, &[], &[], &mut pause).await;
        assert_eq!(still, Removal::Released);
        http.wire().delete("q", true).await.unwrap();
    }

    /// The deletion of `q/<key>` (created at `created`, at `version`), at revision 1000 +
    /// `created`.
    fn deletion(key: &str, created: i64, version: i64) -> Event {
        let key = format!("q/{key}").into_bytes();
        Event {
            kind: 1,
            kv: Some(KeyValue {
                key: key.clone(),
                mod_revision: 1000 + created,
                ..KeyValue::default()
            }),
            prev_kv: Some(KeyValue {
                key,
                create_revision: created,
                version,
                ..KeyValue::default()
            }),
        }
    }

    /// A waiter with four keys ahead at a semaphore of limit 2 reads again only once two of them
    /// went; a key behind it changes nothing; an unannounced removal of a key that may hold by
    /// then is remembered for its settle; the deletion of its own key sends it to read at once.
    #[test]
    fn a_semaphore_waiter_counts_down_to_its_turn() {
        let older: Vec<KeyValue> = ["a", "b", "c", "d"]
            .into_iter()
            .map(|name| semaphore_contender(name, 2))
            .collect();
        let waiter = || CountDown::of("q/own", 100, 2, (&older[..2], &older[..]), 50);
        let mut count = waiter();
        // A waiter between the holders and us goes (cancelled: no touch): not a holder's.
        assert!(!count.deleted(&deletion("c", 30, 1)));
        assert_eq!(count.take_worst(), Removal::Released);
        // Behind us: not counted.
        assert!(!count.deleted(&deletion("later", 200, 1)));
        // A holder releases: the waiter of then behind it holds now.
        assert!(!count.deleted(&deletion("a", 10, 2)));
        assert_eq!(count.take_worst(), Removal::Released);
        assert_eq!(count.turn_at(), None);
        // That waiter's key deleted without a release: settled for, and our turn has come.
        assert!(count.deleted(&deletion("d", 40, 1)));
        assert!(count.take_worst().is_unannounced());
        assert_eq!(
            count.turn_at(),
            Some(1200),
            "at the latest deletion's revision"
        );

        // A holder deleted without a release while we are still far back: remembered.
        let mut count = waiter();
        assert!(!count.deleted(&deletion("b", 20, 1)));
        assert!(!count.deleted(&deletion("a", 10, 2)));
        assert!(count.deleted(&deletion("c", 30, 2)));
        assert!(count.take_worst().is_unannounced());

        // A deletion etcd gives without the key as it was (its revision compacted): read at once,
        // settle, and never take the turn from the count.
        let mut count = waiter();
        let mut unknown = deletion("a", 10, 2);
        unknown.prev_kv = None;
        assert!(count.deleted(&unknown));
        assert!(count.take_worst().is_unannounced());
        assert!(!count.deleted(&deletion("b", 20, 2)));
        assert!(!count.deleted(&deletion("c", 30, 2)));
        assert!(
            count.deleted(&deletion("d", 40, 2)),
            "the rest still counted down"
        );
        assert_eq!(count.turn_at(), None);

        // Our own key went: read at once, nothing to settle for.
        let mut count = waiter();
        let mut own = deletion("own", 100, 1);
        own.prev_kv = None;
        assert!(count.deleted(&own));
        assert_eq!(count.take_worst(), Removal::Released);
        assert_eq!(count.turn_at(), None);

        // Ahead of us, a leader contender (refused by its own judgment, not yet gone), or a
        // contender that asks for another limit: only a read may let us in.
        for stranger in [contender("b", b"10.0.0.7"), semaphore_contender("b", 3)] {
            let older = [older[0].clone(), stranger];
            let mut count = CountDown::of("q/own", 100, 2, (&older[..], &older[..]), 50);
            assert!(count.deleted(&deletion("a", 10, 2)));
            assert_eq!(count.turn_at(), None);
        }
    }

    /// Waiters of one semaphore in one process share one etcd watch of its prefix, take their
    /// turns in arrival order, and leave no watch behind.
    #[tokio::test]
    async fn the_waiters_of_a_semaphore_share_one_watch() {
        let (_server, etcd) = started().await;
        let spec = LeaseSpec::semaphore("shared", 1);
        let holder = etcd.acquire(&spec).await.unwrap();
        let (order, mut turns) = tokio::sync::mpsc::unbounded_channel();
        let in_flight = Arc::new(AtomicUsize::new(0));
        let mut waiters = Vec::new();
        for i in 0..5 {
            let (backend, spec, order) = (etcd.clone(), spec.clone(), order.clone());
            let in_flight = Arc::clone(&in_flight);
            waiters.push(tokio::spawn(async move {
                let lease = backend.acquire(&spec).await.unwrap();
                let holding = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                assert_eq!(holding, 1, "waiter {i} held beside another");
                order.send(i).unwrap();
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                in_flight.fetch_sub(1, Ordering::SeqCst);
                lease.release().await.unwrap();
            }));
            // Joined before the next one starts: arrival order is known.
            let joined = 2 + i;
            let deadline = Instant::now() + std::time::Duration::from_secs(10);
            loop {
                let keys = etcd
                    .http
                    .wire()
                    .range(&RangeRequest::under("shared"))
                    .await
                    .unwrap();
                if keys.kvs.len() == joined {
                    break;
                }
                assert!(Instant::now() < deadline, "waiter {i} did not join");
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        }
        // The holder's watch of its own key, and one watch of the prefix for five waiters.
        let deadline = Instant::now() + std::time::Duration::from_secs(10);
        while etcd.http.watches().counts() != (2, 6) {
            assert!(
                Instant::now() < deadline,
                "watches: {:?}",
                etcd.http.watches().counts()
            );
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        holder.release().await.unwrap();
        for waiter in waiters {
            tokio::time::timeout(std::time::Duration::from_secs(10), waiter)
                .await
                .unwrap()
                .unwrap();
        }
        let mut taken = Vec::new();
        while let Ok(i) = turns.try_recv() {
            taken.push(i);
        }
        assert_eq!(taken, [0, 1, 2, 3, 4], "FIFO");
        assert_eq!(etcd.http.watches().counts(), (0, 0), "a watch left behind");
    }

    /// The read after a waiter was woken saw holders gone that the watch had not shown yet: the
    /// waiter takes them from the watch before it judges, and settles if one went without a
    /// release.
    #[tokio::test]
    async fn holders_gone_before_a_read_are_taken_from_the_watch() {
        let (_server, etcd) = started().await;
        let http = &etcd.http;
        for second_released in [true, false] {
            put(http, "q/a", true).await;
            put(http, "q/b", second_released).await;
            let created = put(http, "q/own", false).await;
            let read_at = http
                .wire()
                .range(&RangeRequest::key("q/own"))
                .await
                .unwrap()
                .revision();
            let ahead = http
                .wire()
                .range(&Semaphore { limit: 2 }.ahead("q", created))
                .await
                .unwrap()
                .kvs;
            let count = CountDown::of("q/own", created, 2, (&ahead[..2], &ahead[..2]), read_at);
            let stream = http
                .watch_shared(&RangeRequest::under("q"), read_at + 1)
                .await;
            let mut kept = Some(KeptWatch {
                range: RangeRequest::under("q"),
                stream: stream.unwrap(),
            });
            http.wire().delete("q/a", false).await.unwrap();
            http.wire().delete("q/b", false).await.unwrap();
            let read = http
                .wire()
                .range(&RangeRequest::key("q/own"))
                .await
                .unwrap()
                .revision();
            // The read found both gone (0 ahead) before the watch showed either.
            let removal = count.catch_up(&mut kept, read, 0).await;
            assert_eq!(
                removal.is_unannounced(),
                !second_released,
                "second released: {second_released}"
            );
            http.wire().delete("q", true).await.unwrap();
        }
    }
}
