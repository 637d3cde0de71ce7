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

mod contention;

use std::sync::Arc;

use tokio::time::Instant;

use super::client::Client;
use super::kind::LEADER_FLAGS;
use super::session::{self, Renewals, Session, SessionEnd, SessionLock};
use super::watch::{Interest, Listing};
use super::wire::{Behavior, ConsulHttp, KvEntry};
use contention::{Acquired, Contended, contend};
use lease_core::{Backend, Error, Lease, LeaseSpec, LostReason, Sequencer};

/// A leader key nobody holds, as [`Consul::unheld_leader_keys`](crate::Consul::unheld_leader_keys) found it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct UnheldKey {
    /// The key.
    pub key: String,
    /// Its LockIndex: how many times it was acquired since it was created.
    pub lock_index: u64,
    /// Its CreateIndex: the Raft index at which it was created (higher for every re-creation).
    pub create_index: u64,
    /// Its ModifyIndex when found: any acquisition, release or write changes it.
    pub modify_index: u64,
}

/// Acquires the leader lock `spec` names (validated by the caller); `backend` answers the
/// lease's checks.
pub(crate) async fn acquire(
    client: &Arc<Client>,
    spec: &LeaseSpec,
    backend: Arc<dyn Backend>,
) -> Result<Lease, Error> {
    let started = Instant::now();
    let deadline = spec.wait_policy().deadline(started);
    loop {
        let (mut session, mut renewals) = Session::create(client, spec, Behavior::Release).await?;
        // If this future is dropped from here on, the session releases the key before it is
        // destroyed, so the next holder does not wait out the lock-delay.
        session.may_hold(spec.key());
        let outcome = tokio::select! {
            biased;
            end = &mut renewals => Err(end),
            result = contend(client, session.id(), spec, started, deadline) => Ok(result),
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
                // A call that timed out in a pause of this process fails beside the fence: the
                // pause is what to report.
                let error = session.fence().explain(error);
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

/// Turns a successful contention into a lease and starts its holder task.
fn into_lease(
    spec: &LeaseSpec,
    mut session: Session,
    renewals: Renewals,
    acquired: Acquired,
    backend: Arc<dyn Backend>,
) -> Lease {
    session.holds(acquired.create_index, acquired.lock_index);
    let lock = LeaderKey {
        key: spec.key().to_owned(),
        lock_index: acquired.lock_index,
    };
    let at = (
        spec.key(),
        acquired.create_index,
        acquired.lock_index,
        acquired.modify_index,
    );
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
    let fail = |e: super::wire::ApiError| e.into_error(http, format_args!("remove {key:?}"));
    let (entry, _) = http.kv_get(key).await.map_err(fail)?;
    match entry {
        Some(entry) if entry.holder().is_none() && entry.flags == LEADER_FLAGS => http
            .kv_delete(key, Some(entry.modify_index))
            .await
            .map_err(fail),
        _ => Ok(false),
    }
}

/// The leader keys under `prefix` that no session holds, as one consistent read found them.
pub(crate) async fn unheld(http: &ConsulHttp, prefix: &str) -> Result<Vec<UnheldKey>, Error> {
    let (entries, _) = http
        .kv_list(prefix)
        .await
        .map_err(|e| e.into_error(http, format_args!("list the keys under {prefix:?}")))?;
    Ok(entries
        .into_iter()
        .filter(|e| e.flags == LEADER_FLAGS && e.holder().is_none())
        .map(|e| UnheldKey {
            key: e.key,
            lock_index: e.lock_index,
            create_index: e.create_index,
            modify_index: e.modify_index,
        })
        .collect())
}

/// Deletes `found.key` with a compare-and-set on the ModifyIndex it was found at.
pub(crate) async fn remove_as_found(http: &ConsulHttp, found: &UnheldKey) -> Result<bool, Error> {
    http.kv_delete(&found.key, Some(found.modify_index))
        .await
        .map_err(|e| e.into_error(http, format_args!("remove {:?}", found.key)))
}

/// Whether `sequencer` is still the current holder of its leader key.
pub(crate) async fn check_sequencer(http: &ConsulHttp, sequencer: &Sequencer) -> Result<(), Error> {
    let (entry, _) = http
        .kv_get(sequencer.key())
        .await
        .map_err(|e| e.into_error(http, format_args!("read {:?}", sequencer.key())))?;
    let mut lost = verdict(entry.as_ref(), sequencer.holder(), sequencer.index());
    // The key deleted and re-created since (a sequencer without a generation cannot tell).
    if lost.is_none()
        && sequencer.generation() != 0
        && entry
            .as_ref()
            .is_some_and(|e| e.create_index != sequencer.generation())
    {
        lost = Some(LostReason::KeyDeleted);
    }
    session::judged::<LeaderKey>(http, sequencer.holder(), lost).await
}
