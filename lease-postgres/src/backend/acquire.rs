//! Acquiring a lease: one row of the leases table each (holding the row and giving it back: the
//! `hold` module).
//!
//! `lease.leases` holds one row per held lease (key, holder, index, kind, limit, TTL,
//! `expires_at`, settle, value); a row is live while `expires_at > now()`, and an expired row is
//! free. An attempt is one call of `lease.try_acquire(..)` (sent with the attempts pending beside
//! it: the `attempt` module), which takes the key's advisory lock for its transaction
//! (`pg_advisory_xact_lock(class, hashtext(key))`), deletes the key's expired rows and ended
//! bars, refuses the other kind of lock (`FlagsConflict`) or another limit (`LimitMismatch`), and
//! inserts the contender's row if fewer than 1 (a leader key) or `limit` (a semaphore) rows and
//! bars hold the key, drawing the index from the sequence `lease.lease_index`. A retry after a
//! lost answer finds its own row (and counts its expiry from the retry, as the fence does). A
//! busy key answers how
//! long until its first holder's row expires: the waiter sleeps until then, or until the key's
//! notification of a removal wakes it (a release hands over at once), never polling. A row
//! deleted under its holder bars its key (or slot) for the holder's
//! [`settle_after_removal`](LeaseSpec::settle_after_removal) in the same transaction, so the old
//! holder, told by the same notification, stops before anyone else starts.
//!
//! **Settle.** The deleted row (op `d` of the notification: an operator's `DELETE`) is written to
//! `lease.bars` by the table's trigger, for the holder's `settle_after_removal` (its settle time,
//! or its lock-delay if longer), and counts as a taken slot for every contender, waiting or new,
//! until then; the holder learns of the deletion from the same notification and stops
//! (`postgres_lease::a_holder_whose_row_is_deleted_loses_at_once`). A release bars nothing, and
//! neither does an expiry: the holder fenced itself a tenth of the TTL before. A bar counts from
//! the `DELETE`, so an operator's transaction kept open past the holder's settle time bars
//! nothing once it commits.
//!
//! A cancelled acquisition whose attempt was sent gives its row back in the background, once the
//! statement carrying the attempt has answered (before it, the row may not exist yet), as one of
//! the clean-ups `Backend::shutdown` waits for
//! (`postgres_lease::cancelled_acquisitions_leave_nothing_in_another_schema`,
//! `postgres_lease::shutdown_waits_for_the_row_of_an_acquire_dropped_while_its_attempt_was_blocked`).

use std::sync::Arc;

use lease_core::backend::Fence;
use lease_core::{Backend, BackendKind, Error, Lease, LeaseSpec, LostReason, Sequencer, Target};
use tokio::time::Instant;

use super::attempt::{Attempt, InFlight};
use super::client::Shared;
use super::hold::{Detached, RowHold};
use super::listen::{Note, Subscription};
use super::wire::{PgError, Retry, Wire};

/// The longest key a notification can carry with room to spare (PostgreSQL's payloads stop
/// below 8,000 bytes).
const MAX_KEY_BYTES: usize = 7_000;

/// A new holder ID: 128 random bits in hex, unique per acquisition.
fn new_holder() -> String {
    use lease_core::backoff::random_below;
    format!(
        "{:016x}{:016x}",
        random_below(u64::MAX),
        random_below(u64::MAX)
    )
}

/// Refuses a key too long for the table's notifications.
pub(crate) fn check_key(key: &str) -> Result<(), Error> {
    lease_core::validate_key(key)?;
    if key.len() > MAX_KEY_BYTES {
        return Err(Error::InvalidKey {
            key: key.chars().take(64).collect(),
            reason: "longer than 7,000 bytes, more than PostgreSQL's notifications carry",
        });
    }
    Ok(())
}

/// Gives a half-taken acquisition back if `acquire` is dropped: the attempt may have inserted
/// the row after all.
struct Pending {
    shared: Arc<Shared>,
    key: String,
    holder: String,
    armed: bool,
    /// The attempt under way, if one is: its statement may insert the row after the drop.
    in_flight: Option<InFlight>,
}

impl Drop for Pending {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let shared = Arc::clone(&self.shared);
        let (key, holder) = (self.key.clone(), self.holder.clone());
        let in_flight = self.in_flight.take();
        let detached = Detached::of(&shared.wire);
        let abandoned = (key.clone(), holder.clone());
        self.shared.keepers.spawn_clean_up(
            async move {
                // A release sent before the statement that inserts the row commits would find
                // nothing: its answer first. Busy (or in another's way) inserted nothing; a
                // retry of a lost answer finds its own row, so the last answer is the one.
                if let Some(mut in_flight) = in_flight {
                    let answer = super::attempt::answer(&mut in_flight).await;
                    if answer.is_ok_and(|a| a.outcome != "acquired") {
                        return;
                    }
                }
                let _ = shared.release(&key, &holder).await;
            },
            move || Some(detached.release(abandoned.0, abandoned.1)),
        );
    }
}

/// Acquires what `spec` names (validated by the caller).
pub(crate) async fn acquire(
    shared: &Arc<Shared>,
    spec: &LeaseSpec,
    backend: Arc<dyn Backend>,
) -> Result<Lease, Error> {
    let (semaphore, limit) = match spec.target() {
        Target::Leader { .. } => (false, 1),
        Target::Semaphore { limit, .. } => (true, *limit),
        other => return Err(other.unsupported("Postgres")),
    };
    let key = spec.key();
    check_key(key)?;
    let limit = i32::try_from(limit).map_err(|_| Error::InvalidLimit {
        key: key.to_owned(),
        limit: limit.into(),
    })?;
    let started = Instant::now();
    let deadline = spec.wait_policy().deadline(started);
    let busy = || Error::Busy {
        key: key.to_owned(),
        waited: started.elapsed(),
    };
    let holder = new_holder();
    // Subscribed before the first attempt, so no release between an answer and the wait is
    // missed.
    let mut notes = shared.subscribe(key);
    let mut pending = Pending {
        shared: Arc::clone(shared),
        key: key.to_owned(),
        holder: holder.clone(),
        armed: true,
        in_flight: None,
    };
    let attempt = Attempt {
        key: key.to_owned(),
        holder: holder.clone(),
        semaphore,
        limit,
        ttl: spec.session_ttl().as_secs_f64(),
        settle: spec.settle_after_removal().as_secs_f64(),
        value: spec.advertised_value().to_vec(),
    };
    // Until the server has answered once, trouble is retried for at most RETRY_GRACE (or until
    // the deadline, if later), whatever the wait: a server that cannot be reached at all is an
    // error the caller sees (`Unreachable`, naming the address), as on the other backends, not
    // a wait without end. A waiter the server has answered rides out an outage within its wait.
    let mut answered = false;
    loop {
        // From here until the answer is read, the row may exist.
        pending.armed = true;
        let mut retry = Retry::until(if answered {
            deadline
        } else {
            Some(deadline.unwrap_or_else(Instant::now))
        });
        // Whether a failed try may have reached the server (and inserted the row).
        let mut maybe_sent = false;
        let answer = loop {
            let in_flight = pending.in_flight.insert(shared.attempt(attempt.clone()));
            let answer = super::attempt::answer(in_flight).await;
            pending.in_flight = None;
            match answer {
                Err(error) => {
                    maybe_sent |= error.maybe_sent();
                    if !retry.again(&error).await {
                        break Err(error);
                    }
                }
                answer => break answer,
            }
        };
        if answer.is_err() && !maybe_sent {
            // Never sent: there is no row to give back (and no server to give it to).
            pending.armed = false;
        }
        let answer = answer
            .map_err(|e| e.into_error(&shared.wire.address, format_args!("acquire {key:?}")))?;
        answered = true;
        let sent = answer.sent;
        if semaphore {
            if let Some(in_use) = answer.in_use {
                let in_use = usize::try_from(in_use).unwrap_or_default();
                lease_core::metrics::semaphore_slots_in_use(BackendKind::Postgres, key, in_use);
            }
        }
        match answer.outcome.as_str() {
            "acquired" => {
                let index = answer
                    .index
                    .and_then(|i| u64::try_from(i).ok())
                    .ok_or_else(|| {
                        PgError::Malformed("an acquisition without an index".into())
                            .into_error(&shared.wire.address, format_args!("acquire {key:?}"))
                    })?;
                pending.armed = false;
                let sequencer_key = if semaphore {
                    format!("{key}/{holder}")
                } else {
                    key.to_owned()
                };
                let sequencer =
                    Sequencer::new(BackendKind::Postgres, sequencer_key, index, holder.clone());
                tracing::info!(%sequencer, "lease acquired");
                let fence = Fence::new(spec.fence_after(), sent);
                let lost = shared.renew(&holder, spec.session_ttl(), fence.clone());
                let hold = RowHold {
                    shared: Arc::clone(shared),
                    key: key.to_owned(),
                    holder,
                    lost,
                    notes,
                    keep_until: None,
                };
                return Ok(shared.keepers.start(sequencer, fence, backend, hold));
            }
            "busy" => {}
            "leader_in_the_way" => {
                pending.armed = false;
                return Err(Error::leader_lock_in_the_way(key));
            }
            "semaphore_in_the_way" => {
                pending.armed = false;
                return Err(Error::semaphore_in_the_way(key));
            }
            "limit_mismatch" => {
                pending.armed = false;
                return Err(Error::LimitMismatch {
                    key: key.to_owned(),
                    stored: answer
                        .in_use
                        .and_then(|l| u64::try_from(l).ok())
                        .unwrap_or_default(),
                    requested: u64::from(limit.unsigned_abs()),
                });
            }
            other => {
                return Err(PgError::Malformed(format!("the outcome {other:?}"))
                    .into_error(&shared.wire.address, format_args!("acquire {key:?}")));
            }
        }
        // Busy: nothing was inserted, nothing to give back while waiting.
        pending.armed = false;
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(busy());
        }
        let expiry = answer
            .wait_seconds
            .filter(|s| s.is_finite() && *s >= 0.0)
            .map(|s| Instant::now() + std::time::Duration::from_secs_f64(s.min(86_400.0)));
        let turn = wait_for_turn(&mut notes, expiry);
        match deadline {
            None => turn.await,
            Some(deadline) => {
                if tokio::time::timeout_at(deadline, turn).await.is_err() {
                    return Err(busy());
                }
            }
        }
    }
}

/// Until a row of the key is removed (or the listener resynced), or the first holder's row
/// expires (`expiry`, by the database's clock).
async fn wait_for_turn(notes: &mut Subscription, expiry: Option<Instant>) {
    let expired = async {
        match expiry {
            // A little after, so the row has surely expired by the database's clock too.
            Some(at) => tokio::time::sleep_until(at + std::time::Duration::from_millis(5)).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(expired);
    loop {
        tokio::select! {
            biased;
            () = &mut expired => return,
            note = notes.next() => match note {
                Note::Acquired { .. } => {}
                Note::Removed { .. } | Note::Resync => return,
            },
        }
    }
}

/// Whether `sequencer` names a current holder: one read of its row, and of the key's holders.
pub(crate) async fn check_sequencer(wire: &Wire, sequencer: &Sequencer) -> Result<(), Error> {
    if sequencer.backend() != BackendKind::Postgres {
        return Err(Error::Lost(LostReason::KeyDeleted));
    }
    let holder = sequencer.holder();
    // A semaphore holder's sequencer names its own key, `<prefix>/<holder>`.
    let prefix = sequencer
        .key()
        .strip_suffix(holder)
        .and_then(|p| p.strip_suffix('/'))
        .unwrap_or(sequencer.key());
    let sql = wire.sql(
        "SELECT holder, lease_index, expires_at > now(), lease_key FROM lease.leases \
         WHERE holder = $2 OR (lease_key = $1 AND expires_at > now()) \
         ORDER BY holder = $2 DESC, lease_index DESC LIMIT 1",
    );
    let key = sequencer.key();
    // Brief trouble (a connection being replaced) is retried for a few seconds.
    let row = wire
        .retrying(Some(Instant::now()), false, |client| {
            let sql = &sql;
            async move { client.query_opt(sql, &[&key, &holder]).await }
        })
        .await
        .map_err(|e| e.into_error(&wire.address, format_args!("check {sequencer}")))?;
    let Some(row) = row else {
        return Err(Error::Lost(LostReason::KeyDeleted));
    };
    let read = |e| PgError::Query(e).into_error(&wire.address, format_args!("check {sequencer}"));
    let found: String = row.try_get(0).map_err(read)?;
    let index: i64 = row.try_get(1).map_err(read)?;
    let live: bool = row.try_get(2).map_err(read)?;
    let found_key: String = row.try_get(3).map_err(read)?;
    let index = u64::try_from(index).unwrap_or_default();
    if found != holder {
        return Err(Error::Lost(LostReason::KeyTaken {
            lock_index: index,
            session: found,
        }));
    }
    if index != sequencer.index() || (found_key != key && found_key != prefix) {
        return Err(Error::Lost(LostReason::KeyDeleted));
    }
    if !live {
        return Err(Error::Lost(LostReason::SessionInvalidated));
    }
    Ok(())
}
