//! The Consul semaphore (seed 000): at most `limit` holders under a prefix, interoperating with
//! `consul lock -n`.
//!
//! Layout, as Consul's CLI and Go client write it: a contender key `<prefix>/<session>` held by
//! each holder's session (behaviour delete, so a dead holder's key vanishes), and the coordinating
//! key `<prefix>/.lock` = `{"Limit":N,"Holders":{"<session>":true}}`, both with flags
//! [`SEMAPHORE_FLAGS`]. The seed's list form of `Holders` is read too.
//!
//! Admission is one atomic transaction: lock our contender key and CAS ourselves into `Holders` on
//! the lock key's ModifyIndex (0 when creating). Holders whose session no longer holds a key under
//! the prefix are pruned in the same write. A lost CAS race re-reads at once; a full semaphore is
//! waited for with a blocking query on the prefix.
//!
//! The sequencer is our contender key with its LockIndex and our session. A pooled session (see
//! [`ConsulBuilder::semaphore_pool`](super::ConsulBuilder::semaphore_pool)) re-locks its contender
//! key in the admitting transaction, so the LockIndex — and the sequencer — changes on every
//! acquisition while a request still costs one write to take a slot and one to give it back.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::http::{Behavior, Blocking, ConsulHttp, KvEntry, TxnOp};
use super::retry::{Backoff, retry_transient, within};
use super::session::{self, KeepAlive, Session, SessionEnd};
use crate::lease::{self, Checker, Hold};
use crate::{BackendKind, BoxFuture, Error, Lease, LeaseSpec, LostReason, Sequencer, Target, Wait};

/// The flags `consul lock -n` (and Consul's Go `api.Semaphore`) put on its keys.
pub(crate) const SEMAPHORE_FLAGS: u64 = 0xe0f6_9a2b_aa41_4de0;

const WATCH_WAIT: Duration = Duration::from_secs(300);

fn lock_key(prefix: &str) -> String {
    format!("{prefix}/.lock")
}

fn contender_key(prefix: &str, session: &str) -> String {
    format!("{prefix}/{session}")
}

/// The decoded value of `<prefix>/.lock`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct LockValue {
    limit: u64,
    holders: BTreeSet<String>,
}

impl LockValue {
    /// Reads Consul's map form and the seed's list form; anything else is refused, never guessed.
    fn parse(bytes: &[u8]) -> Result<LockValue, String> {
        let value: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|e| format!("not JSON: {e}"))?;
        let object = value.as_object().ok_or("not a JSON object")?;
        let limit = match object.get("Limit") {
            None => return Err("no \"Limit\"".into()),
            Some(l) if l.as_i64().is_some_and(|l| l < 0) => {
                return Err(format!("negative \"Limit\" {l}"));
            }
            Some(l) => l
                .as_u64()
                .ok_or_else(|| format!("\"Limit\" {l} is not a whole number"))?,
        };
        if limit == 0 {
            return Err("\"Limit\" is 0".into());
        }
        let holders = match object.get("Holders") {
            None | Some(serde_json::Value::Null) => BTreeSet::new(),
            Some(serde_json::Value::Object(map)) => {
                let mut holders = BTreeSet::new();
                for (session, held) in map {
                    match held.as_bool() {
                        Some(true) => {
                            holders.insert(session.clone());
                        }
                        Some(false) => {}
                        None => {
                            return Err(format!(
                                "\"Holders\" maps {session:?} to {held}, not a boolean"
                            ));
                        }
                    }
                }
                holders
            }
            Some(serde_json::Value::Array(list)) => list
                .iter()
                .map(|s| {
                    s.as_str()
                        .map(str::to_owned)
                        .ok_or_else(|| format!("\"Holders\" lists {s}, not a session ID"))
                })
                .collect::<Result<_, _>>()?,
            Some(other) => return Err(format!("\"Holders\" is {other}, neither a map nor a list")),
        };
        Ok(LockValue { limit, holders })
    }

    /// Consul's own format, so `consul lock -n` reads what we write.
    fn encode(&self) -> Vec<u8> {
        let holders: serde_json::Map<String, serde_json::Value> = self
            .holders
            .iter()
            .map(|s| (s.clone(), serde_json::Value::Bool(true)))
            .collect();
        serde_json::json!({"Limit": self.limit, "Holders": holders})
            .to_string()
            .into_bytes()
    }
}

/// The semaphore as one read of its prefix shows it.
struct View<'a> {
    lock: Option<(&'a KvEntry, LockValue)>,
    /// Sessions holding a key under the prefix: the holders still alive.
    live: HashSet<&'a str>,
    entries: &'a [KvEntry],
}

impl<'a> View<'a> {
    /// Validates the lock key against our `limit`; a key we cannot read is an error, never
    /// overwritten.
    fn read(prefix: &str, entries: &'a [KvEntry], limit: Option<u64>) -> Result<View<'a>, Error> {
        let lock_key = lock_key(prefix);
        let mut lock = None;
        let mut live = HashSet::new();
        for entry in entries {
            if entry.key == lock_key {
                if entry.flags != SEMAPHORE_FLAGS {
                    return Err(Error::FlagsConflict {
                        key: lock_key,
                        found: entry.flags,
                        expected: SEMAPHORE_FLAGS,
                    });
                }
                let bytes = entry
                    .decoded_value()
                    .map_err(|reason| corrupt(&lock_key, reason))?;
                let value =
                    LockValue::parse(&bytes).map_err(|reason| corrupt(&lock_key, reason))?;
                if let Some(limit) = limit {
                    if value.limit != limit {
                        return Err(Error::LimitMismatch {
                            key: prefix.to_owned(),
                            stored: value.limit,
                            requested: limit,
                        });
                    }
                }
                lock = Some((entry, value));
            } else if let Some(holder) = entry.holder() {
                live.insert(holder);
            }
        }
        Ok(View {
            lock,
            live,
            entries,
        })
    }

    fn entry(&self, key: &str) -> Option<&'a KvEntry> {
        self.entries.iter().find(|e| e.key == key)
    }

    /// The holders whose sessions still hold a key: the others are dead and pruned.
    fn live_holders(&self) -> BTreeSet<String> {
        self.lock
            .as_ref()
            .map(|(_, v)| {
                v.holders
                    .iter()
                    .filter(|h| self.live.contains(h.as_str()))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }
}

fn corrupt(key: &str, reason: String) -> Error {
    Error::CorruptLockValue {
        key: key.to_owned(),
        reason,
    }
}

/// Idle (session, contender key) pairs kept for reuse, per prefix, when pooling is on.
#[derive(Default)]
pub(crate) struct Pool {
    idle_for: Option<Duration>,
    idle: Mutex<HashMap<String, Vec<oneshot::Sender<oneshot::Sender<Pooled>>>>>,
}

/// A session that holds its contender key but no slot, kept alive by an idle task.
struct Pooled {
    session: Session,
    keep_alive: KeepAlive,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("idle_for", &self.idle_for)
            .finish_non_exhaustive()
    }
}

impl Pool {
    pub(crate) fn new(idle_for: Option<Duration>) -> Self {
        Pool {
            idle_for,
            idle: Mutex::default(),
        }
    }

    /// Takes an idle session of `prefix`, if one is still alive.
    async fn take(&self, prefix: &str) -> Option<Pooled> {
        loop {
            let claim = self.idle.lock().ok()?.get_mut(prefix)?.pop()?;
            let (reply_tx, reply_rx) = oneshot::channel();
            if claim.send(reply_tx).is_ok() {
                if let Ok(pooled) = reply_rx.await {
                    return Some(pooled);
                }
            }
        }
    }

    /// Parks `pooled` for reuse; its idle task renews it and destroys it after `idle_for`.
    fn put(&self, prefix: &str, pooled: Pooled) -> Result<(), Pooled> {
        let Some(idle_for) = self.idle_for else {
            return Err(pooled);
        };
        let Ok(mut idle) = self.idle.lock() else {
            return Err(pooled);
        };
        let (claim_tx, claim_rx) = oneshot::channel();
        let slots = idle.entry(prefix.to_owned()).or_default();
        slots.retain(|s| !s.is_closed());
        slots.push(claim_tx);
        tokio::spawn(park(pooled, claim_rx, idle_for));
        Ok(())
    }
}

async fn park(
    pooled: Pooled,
    claim: oneshot::Receiver<oneshot::Sender<Pooled>>,
    idle_for: Duration,
) {
    let Pooled {
        session,
        mut keep_alive,
    } = pooled;
    tokio::select! {
        claimed = claim => {
            if let Ok(reply) = claimed {
                // If the claimer went away meanwhile, the returned value is dropped: the session's
                // guard destroys it.
                let _ = reply.send(Pooled { session, keep_alive });
            }
        }
        () = tokio::time::sleep(idle_for) => {
            let _ = session.destroy().await;
        }
        _ = &mut keep_alive => {}
    }
}

/// Acquires a slot of the semaphore `spec` names (validated by the caller).
pub(crate) async fn acquire(
    http: &Arc<ConsulHttp>,
    pool: &Arc<Pool>,
    spec: &LeaseSpec,
) -> Result<Lease, Error> {
    let Target::Semaphore { prefix, limit } = spec.target() else {
        return Err(Error::Config("not a semaphore spec".into()));
    };
    let limit = u64::from(*limit);
    let started = Instant::now();
    let deadline = match spec.wait_policy() {
        Wait::Forever => None,
        Wait::UpTo(d) => Some(started + d),
        Wait::Never => Some(started),
    };
    loop {
        let (
            pooled,
            Pooled {
                session,
                mut keep_alive,
            },
        ) = match pool.take(prefix).await {
            Some(p) => (true, p),
            None => {
                let (session, keep_alive) = Session::create(http, spec, Behavior::Delete).await?;
                (
                    false,
                    Pooled {
                        session,
                        keep_alive,
                    },
                )
            }
        };
        let contend = Contend {
            http,
            prefix,
            limit,
            session: session.id(),
            relock: pooled,
            value: spec.advertised_value(),
            started,
            deadline,
        };
        let outcome = tokio::select! {
            biased;
            end = &mut keep_alive => Err(end),
            result = contend.run() => Ok(result),
        };
        match outcome {
            Ok(Ok(Some(admitted))) => {
                return Ok(hold(http, pool, prefix, session, keep_alive, admitted));
            }
            // Our contender key could not be locked: the session is gone. Try another.
            Ok(Ok(None)) => {
                let _ = session.destroy().await;
            }
            Ok(Err(error)) => {
                // A busy session holds nothing: keep it for the next try if pooling is on.
                let pooled = Pooled {
                    session,
                    keep_alive,
                };
                let leftover = if error.is_busy() {
                    pool.put(prefix, pooled).err()
                } else {
                    Some(pooled)
                };
                if let Some(Pooled { session, .. }) = leftover {
                    let _ = release_session(http, prefix, session).await;
                }
                return Err(error);
            }
            Err(SessionEnd::Invalidated) => {}
            Err(SessionEnd::Fenced { last_error, .. }) => {
                return Err(Error::Backend {
                    backend: "Consul",
                    operation: format!(
                        "keep a session alive while waiting for semaphore {prefix:?}"
                    ),
                    message: last_error.unwrap_or_else(|| "renewals did not succeed".into()),
                });
            }
        }
    }
}

/// What admission learned: our contender key's LockIndex and an index to watch from.
struct Admitted {
    lock_index: u64,
    index: u64,
}

struct Contend<'a> {
    http: &'a ConsulHttp,
    prefix: &'a str,
    limit: u64,
    session: &'a str,
    /// The contender key is already ours (a pooled session): unlock it first, so that locking
    /// it again raises its LockIndex.
    relock: bool,
    value: &'a [u8],
    started: Instant,
    deadline: Option<Instant>,
}

impl Contend<'_> {
    /// `Ok(None)` if our contender key cannot be locked (our session is gone).
    async fn run(&self) -> Result<Option<Admitted>, Error> {
        let http = self.http;
        let lock_key = lock_key(self.prefix);
        let contender = contender_key(self.prefix, self.session);
        let mut index = 0;
        loop {
            let blocking = match self.deadline {
                _ if index == 0 => None,
                None => Some(Blocking {
                    index,
                    wait: WATCH_WAIT,
                }),
                Some(deadline) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(self.busy());
                    }
                    Some(Blocking {
                        index,
                        wait: left.min(WATCH_WAIT),
                    })
                }
            };
            let (entries, new_index) =
                retry_transient(self.deadline, || http.kv_list(self.prefix, blocking))
                    .await
                    .map_err(|e| {
                        e.into_error(http, format_args!("read semaphore {:?}", self.prefix))
                    })?;
            index = if new_index < index {
                0
            } else {
                new_index.max(1)
            };
            let view = View::read(self.prefix, &entries, Some(self.limit))?;
            let mut holders = view.live_holders();
            if holders.len() as u64 >= self.limit {
                if self.deadline.is_some_and(|d| Instant::now() >= d) {
                    return Err(self.busy());
                }
                continue;
            }
            holders.insert(self.session.to_owned());
            let value = LockValue {
                limit: self.limit,
                holders,
            }
            .encode();
            let cas = view.lock.as_ref().map_or(0, |(e, _)| e.modify_index);
            let lock_op = TxnOp::Lock {
                key: &contender,
                session: self.session,
                value: self.value,
                flags: SEMAPHORE_FLAGS,
            };
            let cas_op = TxnOp::Cas {
                key: &lock_key,
                value: &value,
                flags: SEMAPHORE_FLAGS,
                index: cas,
            };
            let unlock_op = TxnOp::Unlock {
                key: &contender,
                session: self.session,
                flags: SEMAPHORE_FLAGS,
            };
            let relocking = self.relock
                && view.entry(&contender).and_then(KvEntry::holder) == Some(self.session);
            let ops: &[TxnOp<'_>] = if relocking {
                &[unlock_op, lock_op, cas_op]
            } else {
                &[lock_op, cas_op]
            };
            let cas_position = ops.len() - 1;
            match http.txn(ops).await.map_err(|e| {
                e.into_error(
                    http,
                    format_args!("take a slot of semaphore {:?}", self.prefix),
                )
            })? {
                Ok(results) => {
                    let Some(entry) = results
                        .iter()
                        .rev()
                        .find(|e| e.key == contender && e.holder() == Some(self.session))
                    else {
                        return Err(Error::Backend {
                            backend: "Consul",
                            operation: format!("take a slot of semaphore {:?}", self.prefix),
                            message: "the transaction's answer lacks the contender key".into(),
                        });
                    };
                    return Ok(Some(Admitted {
                        lock_index: entry.lock_index,
                        index,
                    }));
                }
                Err(failed) if failed.contains(&cas_position) && failed.len() == 1 => {
                    http.count_cas_conflict();
                    index = 0;
                }
                Err(_) => return Ok(None),
            }
        }
    }

    fn busy(&self) -> Error {
        Error::Busy {
            key: self.prefix.to_owned(),
            waited: self.started.elapsed(),
        }
    }
}

fn hold(
    http: &Arc<ConsulHttp>,
    pool: &Arc<Pool>,
    prefix: &str,
    session: Session,
    keep_alive: KeepAlive,
    admitted: Admitted,
) -> Lease {
    let contender = contender_key(prefix, session.id());
    let sequencer = Sequencer::new(
        BackendKind::Consul,
        &contender,
        admitted.lock_index,
        session.id(),
    );
    let (lease, holding) = Lease::new(
        sequencer.clone(),
        Box::new(SemaphoreChecker {
            http: Arc::clone(http),
            prefix: prefix.to_owned(),
        }),
    );
    tracing::info!(%sequencer, "semaphore slot acquired");
    lease::spawn_keeper(
        holding,
        SemaphoreHold {
            pool: Arc::clone(pool),
            prefix: prefix.to_owned(),
            session,
            keep_alive,
            lock_index: admitted.lock_index,
            index: admitted.index,
        },
    );
    lease
}

/// Whether a holder still holds its slot, from one read of the prefix; `None` if it does.
async fn verdict(
    http: &ConsulHttp,
    prefix: &str,
    entries: &[KvEntry],
    session: &str,
    lock_index: u64,
) -> Option<LostReason> {
    let contender = contender_key(prefix, session);
    let view = match View::read(prefix, entries, None) {
        Ok(view) => view,
        // The lock key was overwritten with something unreadable: our slot is no longer provable.
        Err(_) => return Some(LostReason::HolderPruned),
    };
    match view.entry(&contender) {
        None => {
            return Some(match http.session_exists(session).await {
                Ok(false) => LostReason::SessionInvalidated,
                Ok(true) | Err(_) => LostReason::KeyDeleted,
            });
        }
        Some(e) if e.holder() != Some(session) || e.lock_index != lock_index => {
            return Some(match e.holder() {
                Some(holder) => LostReason::KeyTaken {
                    lock_index: e.lock_index,
                    session: holder.to_owned(),
                },
                None => LostReason::KeyReleased,
            });
        }
        Some(_) => {}
    }
    match &view.lock {
        Some((_, value)) if value.holders.contains(session) => None,
        _ => Some(LostReason::HolderPruned),
    }
}

struct SemaphoreHold {
    pool: Arc<Pool>,
    prefix: String,
    session: Session,
    keep_alive: KeepAlive,
    lock_index: u64,
    index: u64,
}

impl Hold for SemaphoreHold {
    async fn watch(&mut self) -> LostReason {
        tokio::select! {
            biased;
            end = &mut self.keep_alive => end.into(),
            end = session::watch_invalidation(self.session.http(), self.session.id()) => end.into(),
            reason = watch_prefix(&self.session, &self.prefix, self.lock_index, &mut self.index) => reason,
        }
    }

    async fn release(self) -> Result<(), Error> {
        let http = Arc::clone(self.session.http());
        let SemaphoreHold {
            pool,
            prefix,
            session,
            keep_alive,
            ..
        } = self;
        if pool.idle_for.is_some() {
            leave_holders(&http, &prefix, session.id(), false).await?;
            if let Err(Pooled { session, .. }) = pool.put(
                &prefix,
                Pooled {
                    session,
                    keep_alive,
                },
            ) {
                return session.destroy().await;
            }
            return Ok(());
        }
        release_session(&http, &prefix, session).await
    }

    async fn clean_up(self) {
        let http = Arc::clone(self.session.http());
        if let Err(error) = release_session(&http, &self.prefix, self.session).await {
            tracing::warn!(%error, "could not clean up a lost semaphore slot; its session expires with its TTL");
        }
    }
}

/// Blocks on the prefix until it no longer shows our slot.
async fn watch_prefix(
    session: &Session,
    prefix: &str,
    lock_index: u64,
    index: &mut u64,
) -> LostReason {
    let http = session.http();
    let mut backoff = Backoff::new();
    loop {
        let blocking = Blocking {
            index: *index,
            wait: WATCH_WAIT,
        };
        match http.kv_list(prefix, Some(blocking)).await {
            Ok((entries, new_index)) => {
                backoff.reset();
                if let Some(reason) =
                    verdict(http, prefix, &entries, session.id(), lock_index).await
                {
                    return reason;
                }
                *index = if new_index < *index { 0 } else { new_index };
            }
            Err(error) => {
                tracing::debug!(%error, "watching the semaphore failed; retrying");
                backoff.wait().await;
            }
        }
    }
}

/// CASes `session` out of `Holders` (retrying lost races), deleting its contender key in the same
/// write if `delete_contender`.
async fn leave_holders(
    http: &ConsulHttp,
    prefix: &str,
    session: &str,
    delete_contender: bool,
) -> Result<(), Error> {
    let lock_key = lock_key(prefix);
    let contender = contender_key(prefix, session);
    let give_up = within(Duration::from_secs(5));
    let fail =
        |e: super::http::ApiError| e.into_error(http, format_args!("leave semaphore {prefix:?}"));
    loop {
        let (entries, _) = retry_transient(give_up, || http.kv_list(prefix, None))
            .await
            .map_err(fail)?;
        let mut ops = Vec::new();
        let value;
        // Only a lock key we can read is rewritten; otherwise our contender key's deletion (or
        // our session's) is what frees the slot, as pruning goes.
        let lock = View::read(prefix, &entries, None)
            .ok()
            .and_then(|v| v.lock.map(|(e, v)| (e.modify_index, v)));
        if let Some((modify_index, mut lock)) = lock {
            if lock.holders.remove(session) {
                value = lock.encode();
                ops.push(TxnOp::Cas {
                    key: &lock_key,
                    value: &value,
                    flags: SEMAPHORE_FLAGS,
                    index: modify_index,
                });
            }
        }
        if delete_contender {
            ops.push(TxnOp::Delete { key: &contender });
        }
        if ops.is_empty() {
            return Ok(());
        }
        match retry_transient(give_up, || http.txn(&ops))
            .await
            .map_err(fail)?
        {
            Ok(_) => return Ok(()),
            Err(_) => {
                http.count_cas_conflict();
                if give_up.is_some_and(|g| Instant::now() >= g) {
                    return Err(Error::Backend {
                        backend: "Consul",
                        operation: format!("leave semaphore {prefix:?}"),
                        message: "lost every compare-and-set race for 5 s".into(),
                    });
                }
            }
        }
    }
}

/// Leaves `Holders`, deletes the contender key and destroys the session.
async fn release_session(http: &ConsulHttp, prefix: &str, session: Session) -> Result<(), Error> {
    let left = leave_holders(http, prefix, session.id(), true).await;
    let destroyed = session.destroy().await;
    left.and(destroyed)
}

/// `Lease::check` for a semaphore slot: one consistent read of the prefix.
struct SemaphoreChecker {
    http: Arc<ConsulHttp>,
    prefix: String,
}

impl Checker for SemaphoreChecker {
    fn check<'a>(&'a self, sequencer: &'a Sequencer) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(check_sequencer(&self.http, &self.prefix, sequencer))
    }
}

/// Whether `sequencer` (a contender key of the semaphore at `prefix`) still holds a slot.
pub(crate) async fn check_sequencer(
    http: &ConsulHttp,
    prefix: &str,
    sequencer: &Sequencer,
) -> Result<(), Error> {
    let (entries, _) = http
        .kv_list(prefix, None)
        .await
        .map_err(|e| e.into_error(http, format_args!("read semaphore {prefix:?}")))?;
    match verdict(
        http,
        prefix,
        &entries,
        sequencer.holder(),
        sequencer.index(),
    )
    .await
    {
        None => Ok(()),
        Some(reason) => Err(Error::Lost(reason)),
    }
}

/// The prefix of a semaphore sequencer's contender key, if the key is one.
pub(crate) fn prefix_of(sequencer: &Sequencer) -> Option<&str> {
    sequencer
        .key()
        .strip_suffix(sequencer.holder())
        .and_then(|p| p.strip_suffix('/'))
}

/// Removes the semaphore at `prefix` if no live holder remains.
pub(crate) async fn destroy(http: &ConsulHttp, prefix: &str) -> Result<(), Error> {
    let lock_key = lock_key(prefix);
    let fail =
        |e: super::http::ApiError| e.into_error(http, format_args!("destroy semaphore {prefix:?}"));
    loop {
        let (entries, _) = retry_transient(within(Duration::from_secs(5)), || {
            http.kv_list(prefix, None)
        })
        .await
        .map_err(fail)?;
        let view = View::read(prefix, &entries, None)?;
        let Some((entry, _)) = &view.lock else {
            return Ok(());
        };
        let live = view.live_holders();
        if !live.is_empty() {
            return Err(Error::SemaphoreInUse {
                key: prefix.to_owned(),
                holders: live.len(),
            });
        }
        if http
            .kv_delete(&lock_key, Some(entry.modify_index))
            .await
            .map_err(fail)?
        {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_both_holder_forms_and_writes_consuls() {
        let map = LockValue::parse(br#"{"Limit":3,"Holders":{"a":true,"b":true}}"#).unwrap();
        let list = LockValue::parse(br#"{"Limit":3,"Holders":["a","b"]}"#).unwrap();
        assert_eq!(map, list);
        assert_eq!(
            map.encode(),
            br#"{"Holders":{"a":true,"b":true},"Limit":3}"#.to_vec()
        );
        assert_eq!(LockValue::parse(&map.encode()).unwrap(), map);
        assert!(
            LockValue::parse(br#"{"Limit":1,"Holders":null}"#)
                .unwrap()
                .holders
                .is_empty()
        );
    }

    #[test]
    fn refuses_what_it_cannot_read() {
        for bad in [
            &b"\xff\x00garbage"[..],
            b"[1,2]",
            br#"{"Holders":{}}"#,
            br#"{"Limit":-2,"Holders":{}}"#,
            br#"{"Limit":0}"#,
            br#"{"Limit":2.5}"#,
            br#"{"Limit":"3"}"#,
            br#"{"Limit":3,"Holders":"a"}"#,
            br#"{"Limit":3,"Holders":[1]}"#,
            br#"{"Limit":3,"Holders":{"a":"yes"}}"#,
        ] {
            assert!(
                LockValue::parse(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
