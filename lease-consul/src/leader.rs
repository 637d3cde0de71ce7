//! The leader lock: one holder of a key, interoperating with `consul lock`.
//!
//! Acquire (Consul's leader election recipe): create a session (behaviour release, as `consul lock` does), then
//! `PUT ?acquire=` the key with `consul lock`'s flags and the advertised value. A held key is
//! waited for through the client's shared prefix watches (`watch`). A free key that refuses the acquire is under
//! lock-delay (its last holder's session was invalidated); we retry after a short, growing pause
//! rather than `consul lock`'s fixed 5 s. The acquire transaction also asserts that no semaphore
//! uses the name (`<key>/.lock`), so a leader lock is never granted where one is (`kind`): an
//! operation more in the same request, and a read of `<key>/.lock` only when that check fails.
//!
//! Hold: the key, through the client's shared prefix watches. The lease is lost when the key is deleted, held by
//! another (LockIndex, Session), or no longer held (then one read of our session tells an
//! invalidated session from an operator's `?release=`), and when the session's renew loop gives
//! up (invalidated, or self-fenced).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::http::{ApiError, Behavior, ConsulHttp, KvEntry, TxnOp};
use super::kind::{OtherKind, Verdict};
use super::retry::retry_transient;
use super::session::{self, Renewals, Session, SessionEnd, SessionLock};
use super::watch::{Interest, Listing, Watches};
use lease_core::semaphore::{SEMAPHORE_FLAGS, lock_key};
use lease_core::{Backend, Error, Lease, LeaseSpec, LostReason, Sequencer};

/// The flags `consul lock` (and Consul's Go `api.Lock`) put on a leader lock key.
pub(crate) const LEADER_FLAGS: u64 = Error::LEADER_FLAGS;

/// First pause after an acquire refused by lock-delay; doubles up to [`LOCK_DELAY_MAX_PAUSE`].
const LOCK_DELAY_FIRST_PAUSE: Duration = Duration::from_millis(25);
const LOCK_DELAY_MAX_PAUSE: Duration = Duration::from_secs(1);
/// The least time a read of the key gets, whatever the acquire's deadline.
const READ_GRACE: Duration = Duration::from_secs(5);

/// Acquires the leader lock `spec` names (validated by the caller); `backend` answers the
/// lease's checks.
pub(crate) async fn acquire(
    http: &Arc<ConsulHttp>,
    spec: &LeaseSpec,
    backend: Arc<dyn Backend>,
) -> Result<Lease, Error> {
    let started = Instant::now();
    let deadline = spec.wait_policy().deadline(started);
    loop {
        let (mut session, mut renewals) = Session::create(http, spec, Behavior::Release).await?;
        // If this future is dropped from here on, the session releases the key before it is
        // destroyed, so the next holder does not wait out the lock-delay.
        session.may_hold(spec.key());
        let outcome = tokio::select! {
            biased;
            end = &mut renewals => Err(end),
            result = contend(http, session.id(), spec, started, deadline) => Ok(result),
        };
        match outcome {
            Ok(Ok(Contended::Acquired(held))) => {
                return Ok(into_lease(spec, session, renewals, held, backend));
            }
            // Consul no longer knows our waiting session (destroyed by an operator, or gone with
            // its check): wait with a new one.
            Ok(Ok(Contended::SessionGone)) => {
                let _ = session.destroy().await;
            }
            Ok(Err(error)) => {
                // Give the session back now, so a caller that asked not to wait leaves nothing behind.
                let _ = session.give_back().await;
                return Err(error);
            }
            // Our waiting session was destroyed (by an operator, or it expired): wait with a new one.
            Err(SessionEnd::Invalidated) => continue,
            Err(end @ SessionEnd::Fenced { .. }) => return Err(end.into_wait_error(spec.key())),
        }
    }
}

/// How a contention ended, short of an error.
enum Contended {
    Acquired(Acquired),
    /// The session we contend with no longer exists.
    SessionGone,
}

/// What a successful contention learned about our acquisition.
struct Acquired {
    lock_index: u64,
    modify_index: u64,
}

/// Tries to take the key until it is ours or the deadline passes.
///
/// A holder that loses the key without a clean release (the key deleted, or its session
/// invalidated under a lock-delay of 0) is still stopping its work for a moment: the key is left
/// alone until `LeaseSpec::settle_time` after that was seen. The contender keeps watching while
/// it settles, so a holder that takes the key meanwhile and loses it the same way is seen too;
/// every state read, whether from the watch or after a refused acquire, is judged the same way.
async fn contend(
    http: &Arc<ConsulHttp>,
    session: &str,
    spec: &LeaseSpec,
    started: Instant,
    deadline: Option<Instant>,
) -> Result<Contended, Error> {
    let key = spec.key();
    let busy = || Error::Busy {
        key: key.to_owned(),
        waited: started.elapsed(),
    };
    let mut watched = Watches::watch(http, Interest::Key(key.to_owned()), false, None);
    // Where a semaphore on this name would be, and what the acquire asserts of it (see `kind`).
    let semaphore_lock = lock_key(key);
    let mut semaphore = OtherKind::Absent;
    // The index of the last state judged; `None`: read the key afresh.
    let mut index: Option<u64> = None;
    // A state already read (after a refused acquire), to judge before waiting for the next.
    let mut read: Option<Option<KvEntry>> = None;
    // The last state judged: judged again when a settle ends with nothing new.
    let mut last: Option<KvEntry> = None;
    let mut lock_delay_pause = LOCK_DELAY_FIRST_PAUSE;
    // The other session last seen holding the key, and its lock-delay once read.
    let mut seen_holder: Option<(String, Option<Duration>)> = None;
    let mut settle_until: Option<Instant> = None;
    loop {
        let entry = match (read.take(), index) {
            (Some(entry), _) => entry,
            (None, None) => {
                let (entry, read_at) = read_retrying(http, key, deadline).await?;
                index = Some(read_at);
                entry
            }
            (None, Some(read_at)) => {
                let changed = async {
                    loop {
                        if let Ok(listing) = watched.next(read_at + 1).await {
                            return listing;
                        }
                    }
                };
                // While settling, wake when the settle ends too, to judge the last state again.
                let settling = settle_until.filter(|until| *until > Instant::now());
                let listing = match [settling, deadline].into_iter().flatten().min() {
                    None => Some(changed.await),
                    Some(wake) => tokio::time::timeout_at(wake, changed).await.ok(),
                };
                match listing {
                    Some(listing) => {
                        index = Some(listing.index);
                        listing.get(key).cloned()
                    }
                    None if deadline.is_some_and(|d| Instant::now() >= d) => return Err(busy()),
                    None => last.clone(),
                }
            }
        };
        last.clone_from(&entry);
        if let Some(entry) = &entry {
            if entry.flags != LEADER_FLAGS {
                return Err(Error::FlagsConflict {
                    key: key.to_owned(),
                    found: entry.flags,
                    expected: LEADER_FLAGS,
                });
            }
            if let Some(holder) = entry.holder().filter(|h| *h != session) {
                if seen_holder.as_ref().is_none_or(|(seen, _)| seen != holder) {
                    tracing::debug!(%key, %holder, "the key is held by another session; waiting");
                    let lock_delay = http.session_lock_delay(holder).await.ok().flatten();
                    seen_holder = Some((holder.to_owned(), lock_delay));
                }
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    return Err(busy());
                }
                continue;
            }
        }
        if let Some((previous, lock_delay)) = seen_holder.take() {
            let settle = match &entry {
                // Deleted under its holder: no lock-delay applies.
                None => Some(spec.settle_after_removal()),
                // Released. Cleanly (its session still exists, or its lock-delay protects the
                // key, and Consul refuses us while it runs), or by an invalidation Consul does
                // not delay.
                Some(_) if lock_delay.is_some_and(|d| d >= spec.settle_time()) => None,
                // Released cleanly by this very client.
                Some(_) if http.released().contains(&previous) => None,
                Some(_) => match http.session_exists(&previous).await {
                    Ok(true) => None,
                    Ok(false) | Err(_) => Some(spec.settle_time()),
                },
            };
            if let Some(settle) = settle {
                settle_until = Some(Instant::now() + settle);
            }
        }
        if let Some(until) = settle_until.filter(|until| *until > Instant::now()) {
            if deadline.is_some_and(|d| until >= d) {
                return Err(busy());
            }
            tracing::debug!(
                ?until,
                "the last holder lost the key without a release; settling"
            );
            // Wait for the next state or the settle's end, whichever comes first.
            continue;
        }
        // `?acquire=` as a transaction: its answer carries the LockIndex, so no read follows
        // (none that could hang after the lock is ours). Its first operation asserts that no
        // semaphore uses the name (see `kind`): no request of its own.
        let check = semaphore.check(&semaphore_lock);
        let lock_op = usize::from(check.is_some());
        let lock = TxnOp::Lock {
            key,
            session,
            value: spec.advertised_value(),
            flags: LEADER_FLAGS,
        };
        let ops: Vec<TxnOp<'_>> = check.into_iter().chain([lock]).collect();
        let locked = http
            .txn(&ops)
            .await
            .map_err(|e| e.into_error(http, format_args!("acquire {key:?}")))?;
        let failed = match locked {
            Ok(entries) => {
                let ours = entries.iter().find(|e| e.key == key);
                return ours
                    .map(|e| {
                        Contended::Acquired(Acquired {
                            lock_index: e.lock_index,
                            modify_index: e.modify_index,
                        })
                    })
                    .ok_or_else(|| Error::Backend {
                        backend: "Consul",
                        operation: format!("acquire {key:?}"),
                        message: "the transaction's answer does not name the key".into(),
                        transient: false,
                    });
            }
            Err(failed) => failed,
        };
        if lock_op == 1 && failed.contains(&0) {
            // `<key>/.lock` exists, or changed since we read it: one read tells a semaphore
            // (refused for good) from anything else (asserted from now on).
            let lock_read = read_raw(http, &semaphore_lock, deadline).await;
            let verdict =
                OtherKind::after_failed_check(lock_read.map(|(entry, _)| entry), SEMAPHORE_FLAGS)
                    .map_err(|e| e.into_error(http, format_args!("read {semaphore_lock:?}")))?;
            match verdict {
                Verdict::Refuse => return Err(Error::semaphore_in_the_way(&*semaphore_lock)),
                Verdict::Assert(next) => semaphore = next,
            }
            if !failed.contains(&lock_op) {
                // The key itself was ours to take: try again on the same state.
                read = Some(last.clone());
                continue;
            }
        }
        // Refused. Either someone else won the race (the next read shows them), or the key is
        // free but under lock-delay, or our session is gone: then pause briefly, growing, never
        // past the deadline.
        let (entry, read_at) = read_retrying(http, key, deadline).await?;
        index = Some(read_at);
        if entry.as_ref().is_some_and(|e| e.holder().is_some()) {
            // Judged like any other state: its holder is seen, so a deletion under it settles.
            read = Some(entry);
            continue;
        }
        if let Ok(false) = http.session_exists(session).await {
            return Ok(Contended::SessionGone);
        }
        let pause_until = Instant::now() + lock_delay_pause;
        if deadline.is_some_and(|d| pause_until >= d) {
            return Err(busy());
        }
        tracing::debug!(pause = ?lock_delay_pause, "key is free but under lock-delay");
        tokio::time::sleep_until(pause_until).await;
        lock_delay_pause = (lock_delay_pause * 2).min(LOCK_DELAY_MAX_PAUSE);
        index = None;
    }
}

/// Reads `key`, retrying transient failures until `deadline` (if any). The deadline is how long
/// to wait for *another holder*; a read queued behind many of this client's own requests (its
/// connection budget) still gets [`READ_GRACE`] to answer.
async fn read_retrying(
    http: &ConsulHttp,
    key: &str,
    deadline: Option<Instant>,
) -> Result<(Option<KvEntry>, u64), Error> {
    read_raw(http, key, deadline)
        .await
        .map_err(|e| e.into_error(http, format_args!("read {key:?}")))
}

/// [`read_retrying`], with Consul's error as it came.
async fn read_raw(
    http: &ConsulHttp,
    key: &str,
    deadline: Option<Instant>,
) -> Result<(Option<KvEntry>, u64), ApiError> {
    let give_up = deadline.map(|d| d.max(Instant::now() + READ_GRACE));
    retry_transient(give_up, || http.kv_get(key)).await
}

/// Turns a successful contention into a lease and starts its holder task.
fn into_lease(
    spec: &LeaseSpec,
    session: Session,
    renewals: Renewals,
    acquired: Acquired,
    backend: Arc<dyn Backend>,
) -> Lease {
    let lock = LeaderKey {
        key: spec.key().to_owned(),
        lock_index: acquired.lock_index,
    };
    let at = (spec.key(), acquired.lock_index, acquired.modify_index);
    session::start_lease(at, session, renewals, backend, lock)
}

/// Compares the key as read with the acquisition (`session`, `lock_index`): `None` if it still
/// holds. A released key is reported as [`LostReason::KeyReleased`]; whether its session was
/// invalidated takes one more read (`session::went_with_session`).
fn verdict(entry: Option<&KvEntry>, session: &str, lock_index: u64) -> Option<LostReason> {
    let Some(entry) = entry else {
        return Some(LostReason::KeyDeleted);
    };
    match entry.holder() {
        Some(holder) if holder == session && entry.lock_index == lock_index => None,
        Some(holder) => Some(LostReason::KeyTaken {
            lock_index: entry.lock_index,
            session: holder.to_owned(),
        }),
        None => Some(LostReason::KeyReleased),
    }
}

/// The leader key a session holds.
struct LeaderKey {
    key: String,
    lock_index: u64,
}

impl SessionLock for LeaderKey {
    /// Released: by an operator, or because our session was invalidated.
    const COARSE: LostReason = LostReason::KeyReleased;

    fn interest(&self) -> Interest {
        Interest::Key(self.key.clone())
    }

    fn verdict(&self, listing: &Listing, session: &str) -> Option<LostReason> {
        verdict(listing.get(&self.key), session, self.lock_index)
    }

    async fn give_back(
        &mut self,
        session: &mut Option<Session>,
        _renewals: &mut Renewals,
    ) -> Result<(), Error> {
        match session {
            Some(session) => session.give_back().await,
            None => Ok(()),
        }
    }
}

/// Deletes the leader key `key` if no session holds it and it carries the leader flags, with a
/// compare-and-set on the index it was read at, so a key taken meanwhile is left alone.
pub(crate) async fn remove_unheld(http: &ConsulHttp, key: &str) -> Result<bool, Error> {
    let fail = |e: super::http::ApiError| e.into_error(http, format_args!("remove {key:?}"));
    let (entry, _) = http.kv_get(key).await.map_err(fail)?;
    match entry {
        Some(entry) if entry.holder().is_none() && entry.flags == LEADER_FLAGS => http
            .kv_delete(key, Some(entry.modify_index))
            .await
            .map_err(fail),
        _ => Ok(false),
    }
}

/// Whether `sequencer` is still the current holder of its leader key.
pub(crate) async fn check_sequencer(http: &ConsulHttp, sequencer: &Sequencer) -> Result<(), Error> {
    let (entry, _) = http
        .kv_get(sequencer.key())
        .await
        .map_err(|e| e.into_error(http, format_args!("read {:?}", sequencer.key())))?;
    let lost = verdict(entry.as_ref(), sequencer.holder(), sequencer.index());
    session::judged::<LeaderKey>(http, sequencer.holder(), lost).await
}
