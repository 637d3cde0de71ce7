//! Leader and semaphore: contenders queued by the create revision of their keys.
//!
//! Every contender writes its own key `<key>/<lease ID in hex>` (`<key>/<lease ID in hex>_<n>` if
//! another contender of this process on that name has that pooled lease: see `pool::Slot`),
//! attached to its etcd lease, if it does not exist yet (one transaction). etcd gives each write the next revision of the whole
//! cluster, so the keys under `<key>/` are a queue in arrival order:
//!
//! - **leader** (etcd's `concurrency.Election`, the recipe `etcdctl elect` uses): the oldest key
//!   leads. A waiter watches only the key just before its own, so a hand-over wakes one waiter,
//!   not all of them. The key's value is the advertised value, as `etcdctl elect` writes its
//!   proposal, so the two interoperate on the same name.
//! - **semaphore of limit N**: the N oldest keys hold; the others wait in arrival order (FIFO),
//!   and any deletion under the prefix makes them judge again. The value is
//!   `{"limit": N, "value": <base64>}`: every contender must ask for the limit of the oldest, or
//!   gets [`Error::LimitMismatch`].
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
//! its key (a put that keeps value and lease, so the key's version becomes 2), then deletes it.
//! Waiters watch with `prev_kv`, so the deletion they see carries the key as it was: a
//! holder's key deleted at version 2 was released, and the next waiter goes at once. Any other
//! removal of a key that was holding (an operator's `etcdctl del` or `lease revoke`, an expired
//! lease) may have happened while its holder still runs: the holder learns it from its own watch
//! a few milliseconds later, and cancels its work. A waiter is in the queue from its join on, so
//! this holds for keys that were ahead of it when it joined and were gone by its first read too
//! (that read also reads, from etcd's history, who was ahead at the join). Waiters wait
//! [`LeaseSpec::settle_time`] (100 ms by default, above the loss-to-cancel p99 under load)
//! before they judge again, so the two never run at once. A watch that breaks counts as such a
//! removal, since a deletion may have been missed. `etcdctl lock` and `etcdctl elect` contenders
//! do not settle; the touch changes nothing they read.
//!
//! Keys only leave the queue, never move up past a newer one: a holder stays a holder until its
//! key is deleted. The sequencer's index is the own key's create revision, which rises with every
//! acquisition anywhere in the cluster: a downstream system can refuse any token older than the
//! newest it has seen, across keys, by comparison alone. That revision is also what replaces
//! lock-delay (etcd has none): a holder that lost its lease but is still finishing its work is
//! fenced by the higher revision of the next holder.

use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::grpc::{ApiError, EtcdClient, is_not_found};
use super::pool::LeaseEnd;
use super::proto::{Compare, Event, KeyValue, PutRequest, RangeRequest, RequestOp, TxnRequest};
use super::session::{self, Session, Won, holder_in, lease_of, retrying};
use super::watch::WatchStream;
use lease_core::backoff::Backoff;
use lease_core::{Backend, BackendKind, Error, Lease, LeaseSpec, LostReason, Sequencer, Target};

/// How long the replay of a deletion from etcd's history may take before it counts as missed.
const HISTORY_REPLAY: std::time::Duration = std::time::Duration::from_secs(5);

/// Who holds, among the keys under `<key>/`.
#[derive(Clone, Copy, Debug)]
enum Rule {
    /// The oldest key.
    Leader,
    /// The `limit` oldest keys.
    Semaphore { limit: u32 },
}

/// What a contender found when it judged the queue.
enum Turn {
    Mine,
    /// Not yet: wait for a deletion in this range, then judge again.
    WaitFor(RangeRequest),
}

impl Rule {
    fn of(spec: &LeaseSpec) -> Result<Rule, Error> {
        match spec.target() {
            Target::Leader { .. } => Ok(Rule::Leader),
            Target::Semaphore { limit, .. } => Ok(Rule::Semaphore { limit: *limit }),
            other => Err(other.unsupported("Etcd")),
        }
    }

    /// What the own key holds.
    fn value(self, spec: &LeaseSpec) -> Vec<u8> {
        match self {
            Rule::Leader => spec.advertised_value().to_vec(),
            Rule::Semaphore { limit } => SemaphoreValue::encode(limit, spec.advertised_value()),
        }
    }

    /// The keys ahead of ours that decide our turn.
    fn ahead(self, key: &str, created: i64) -> RangeRequest {
        match self {
            // The newest key older than ours: the one to wait for.
            Rule::Leader => RangeRequest::under(key)
                .by_creation(false)
                .limit(1)
                .created_by(created - 1),
            Rule::Semaphore { limit } => RangeRequest::under(key)
                .by_creation(true)
                .limit(i64::from(limit)),
        }
    }

    /// Whose turn it is, given the keys [`ahead`](Rule::ahead) of ours; refuses a name used by
    /// the other kind of lock (see the module docs).
    fn judge(self, key: &str, own: &str, ahead: &[KeyValue]) -> Result<Turn, Error> {
        match self {
            Rule::Leader => match ahead.first() {
                None => Ok(Turn::Mine),
                Some(previous) if SemaphoreValue::parse(previous).is_some() => {
                    Err(Error::semaphore_in_the_way(key))
                }
                Some(previous) => Ok(Turn::WaitFor(RangeRequest::key(&previous.key_str()))),
            },
            Rule::Semaphore { limit } => {
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
        }
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
    backend: Arc<dyn Backend>,
) -> Result<Lease, Error> {
    let started = Instant::now();
    let deadline = spec.wait_policy().deadline(started);
    let rule = Rule::of(spec)?;
    // Set once our waiting key went with its etcd lease: the contenders of this process on that
    // lease went with it, unannounced, a holder of this name among them perhaps.
    let mut lost_with_a_lease = false;
    loop {
        let (mut session, mut keep_alive) = Session::attach(http, spec).await?;
        let own = session.own().to_owned();
        let outcome = tokio::select! {
            biased;
            end = &mut keep_alive => Err(end),
            result = contend(http, rule, spec, &session, lost_with_a_lease, started, deadline) => Ok(result),
        };
        match outcome {
            Ok(Ok(won)) => {
                let key = match rule {
                    Rule::Leader => spec.key().to_owned(),
                    Rule::Semaphore { .. } => own.clone(),
                };
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
            Err(end @ LeaseEnd::Fenced { .. }) => {
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
async fn contend(
    http: &EtcdClient,
    rule: Rule,
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
        e.into_error(http, format_args!("contend for {key:?}"))
    };
    let (own, lease) = (session.own(), session.id());
    let value = rule.value(spec);
    let mut created = join(http, own, &value, lease, deadline)
        .await
        .map_err(failed)?;
    let mut pause = lease_http::backoff();
    let mut kept = None;
    let mut first_judgment = true;
    loop {
        let mut ops = vec![
            RequestOp::range(RangeRequest::key(own)),
            RequestOp::range(rule.ahead(key, created)),
        ];
        if first_judgment {
            // Who was ahead when we joined, from etcd's history.
            ops.push(RequestOp::range(
                rule.ahead(key, created).at_revision(created),
            ));
        }
        let read = TxnRequest {
            success: ops,
            ..TxnRequest::default()
        };
        let read = retrying(deadline, || http.txn(&read))
            .await
            .map_err(failed)?;
        if read.range(0).kvs.first().map(|kv| kv.create_revision) != Some(created) {
            // Our key was deleted while we waited (an operator): join again, at the back.
            created = join(http, own, &value, lease, deadline)
                .await
                .map_err(failed)?;
            continue;
        }
        let ahead = &read.range(1).kvs;
        // A waiter is in the queue from its join on: a holder ahead of it then that went without
        // a release before this read is settled for like one it saw go.
        if std::mem::take(&mut first_judgment)
            && (rejoined
                || removed_since_join(http, created, &read.range(2).kvs, ahead, &mut pause).await
                    == Removal::Unannounced)
        {
            tracing::debug!(key, settle = ?spec.settle_time(), rejoined, "a holder ahead of us at our join, or of our lost key, went without a release; settling");
            tokio::time::sleep(spec.settle_time()).await;
            continue;
        }
        let range = match rule.judge(key, own, ahead)? {
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
        let turn = async {
            let removal =
                wait_for_removal(http, &range, ahead, read.revision(), &mut pause, &mut kept);
            if removal.await == Removal::Unannounced {
                tracing::debug!(key, settle = ?spec.settle_time(), "a holder's key went without a release; settling");
                tokio::time::sleep(spec.settle_time()).await;
            }
        };
        match deadline {
            None => turn.await,
            Some(deadline) => tokio::time::timeout_at(deadline, turn)
                .await
                .map_err(|_| busy())?,
        }
    }
}

/// Writes the own key if it does not exist yet; returns its create revision. Idempotent: a retry
/// after a lost answer finds the key it wrote.
async fn join(
    http: &EtcdClient,
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

/// How a key a waiter was waiting on went; of several removals, the greatest decides.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Removal {
    /// Released: touched by its holder, then deleted; or not one of the keys that held.
    Released,
    /// A holding key deleted without a release (or a watch that broke, which may have missed
    /// one): its holder may still be running.
    Unannounced,
}

impl Removal {
    /// How `event` (a deletion) removed its key, given the keys that held at the waiter's read.
    fn of(event: &Event, holding: &[KeyValue]) -> Removal {
        let held = holding
            .iter()
            .any(|kv| event.kv.as_ref().is_some_and(|gone| gone.key == kv.key));
        let released = event.prev_kv.as_ref().is_some_and(|prev| prev.version >= 2);
        if held && !released {
            Removal::Unannounced
        } else {
            Removal::Released
        }
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
        let replayed = wait_for_removal(http, &range, then, created, pause, &mut watch);
        let removal = tokio::time::timeout(HISTORY_REPLAY, replayed)
            .await
            .unwrap_or(Removal::Unannounced);
        worst = worst.max(removal);
    }
    worst
}

/// Completes at the first deletion in `range` after `revision`, saying whether it removed one of
/// the `holding` keys without a release; or when the watch breaks (the caller judges again either
/// way; a broken watch first waits `pause`).
async fn wait_for_removal(
    http: &EtcdClient,
    range: &RangeRequest,
    holding: &[KeyValue],
    revision: i64,
    pause: &mut Backoff,
    kept: &mut Option<KeptWatch>,
) -> Removal {
    // The same range as last time (a semaphore's prefix): go on with that watch. etcd delivers
    // a watch created at a past revision only from its next sync (up to 100 ms later), and a
    // holder's touch often falls between a waiter's read and its new watch.
    if kept.as_ref().is_none_or(|k| k.range != *range) {
        *kept = None;
        match http.watch(range, revision + 1).await {
            Ok(stream) => {
                *kept = Some(KeptWatch {
                    range: range.clone(),
                    stream,
                });
            }
            Err(error) => {
                tracing::debug!(%error, "cannot watch the queue; judging again");
                pause.wait().await;
                return Removal::Unannounced;
            }
        }
    }
    let Some(KeptWatch { stream, .. }) = kept.as_mut() else {
        return Removal::Unannounced;
    };
    loop {
        match stream.next().await {
            Ok(batch) => {
                // Deletions the read at `revision` already saw are not news.
                let mut deletions = batch
                    .events
                    .iter()
                    .filter(|e| e.is_delete() && e.kv().mod_revision > revision)
                    .peekable();
                if deletions.peek().is_none() {
                    continue;
                }
                pause.reset();
                return deletions
                    .map(|e| Removal::of(e, holding))
                    .max()
                    .unwrap_or(Removal::Released);
            }
            Err(error) => {
                tracing::debug!(%error, "the watch of the queue broke; judging again");
                *kept = None;
                pause.wait().await;
                return Removal::Unannounced;
            }
        }
    }
}

/// A waiter's watch, kept from one judgment to the next while it watches the same range.
struct KeptWatch {
    range: RangeRequest,
    stream: WatchStream,
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
        RequestOp::range(Rule::Leader.ahead(key, index)),
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
        .txn(&TxnRequest {
            success: ops,
            ..TxnRequest::default()
        })
        .await
        .map_err(|e| e.into_error(http, format_args!("check {sequencer}")))?;
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
        let semaphore = Rule::Semaphore { limit: 2 };
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
        let turn = Rule::Leader.judge("q", "q/own", std::slice::from_ref(&holder));
        assert!(refused(turn, semaphore_flags, leader_flags));
        let turn = Rule::Leader.judge("q", "q/own", &[contender("leader", b"")]);
        assert!(matches!(turn, Ok(Turn::WaitFor(_))));
        assert!(matches!(
            Rule::Leader.judge("q", "q/own", &[]),
            Ok(Turn::Mine)
        ));
        // Semaphore contenders only: the limit decides.
        let ahead = [holder.clone(), semaphore_contender("own", 2)];
        assert!(matches!(
            semaphore.judge("q", "q/own", &ahead),
            Ok(Turn::Mine)
        ));
        let turn = semaphore.judge("q", "q/own", &[holder.clone(), semaphore_contender("b", 2)]);
        assert!(matches!(turn, Ok(Turn::WaitFor(_))));
        let turn = Rule::Semaphore { limit: 3 }.judge("q", "q/own", &ahead);
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
        let semaphore = Rule::Semaphore { limit: 3 };
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
        let created = http.txn(&put(false)).await.unwrap().revision();
        if touched {
            http.txn(&put(true)).await.unwrap();
        }
        created
    }

    /// The keys ahead at the join, as the first read's history range reads them.
    async fn ahead_at(http: &EtcdClient, rule: Rule, created: i64) -> Vec<KeyValue> {
        let range = rule.ahead("q", created).at_revision(created);
        http.range(&range).await.unwrap().kvs
    }

    /// A holder ahead of a waiter when it joined, removed before the waiter's first read: gone
    /// without a release, the waiter must settle; released (touched first), it need not. The
    /// deletion falls between the join and the read here by construction, whatever the timing.
    #[tokio::test]
    async fn a_holder_removed_between_a_join_and_the_first_read_is_judged_from_history() {
        let server = Server::start().await;
        let etcd = crate::Etcd::builder()
            .endpoints([server.url()])
            .build()
            .unwrap();
        let http = &etcd.http;
        for (rule, released) in [
            (Rule::Leader, false),
            (Rule::Leader, true),
            (Rule::Semaphore { limit: 1 }, false),
            (Rule::Semaphore { limit: 1 }, true),
        ] {
            let holder = "q/holder";
            put(http, holder, released).await;
            let joined = put(http, "q/waiter", false).await;
            let then = ahead_at(http, rule, joined).await;
            assert_eq!(then.len(), 1, "{rule:?}: the holder was ahead at the join");
            http.delete(holder, false).await.unwrap();
            let mut pause = lease_http::backoff();
            let removal = removed_since_join(http, joined, &then, &[], &mut pause).await;
            let expected = if released {
                Removal::Released
            } else {
                Removal::Unannounced
            };
            assert_eq!(removal, expected, "{rule:?}, released: {released}");
            // Nothing gone since the join: nothing to settle for.
            let still = removed_since_join(http, joined, &[], &[], &mut pause).await;
            assert_eq!(still, Removal::Released);
            http.delete("q", true).await.unwrap();
        }
    }
}
