//! Lock clients (amqp-locks'): acquire a slot, verify it, give it back (the holder is in `hold`).
//!
//! Acquire first checks that `A[limit]` exists and `A[limit + 1]` does not (another count is
//! [`Error::LimitMismatch`], as on Consul), then scans L = 1, 2, … up to `limit`: `B[L]` present
//! means the slot is held; otherwise declare `B[L]` exclusive. Losing that race (RESOURCE_LOCKED)
//! closes the channel: reopen it, wait a small random time and rescan, at most
//! `race_retries` times. A won declare is only trusted once `A[L]` is shown to still exist, by the
//! consume (or probe) that then watches it, so an administrator's delete in between is never
//! missed.
//!
//! **Settling.** RabbitMQ has no lock-delay: when the broker drops a holder's connection, `B[L]`
//! goes at once, while the holder learns of it only when the close reaches it (milliseconds, or
//! longer on a loaded machine). So a holder also keeps a settle queue `C[L]` (ours, not the
//! seed's), declared with `x-expires` = its [`LeaseSpec::settle_time`] and consumed for as long
//! as it holds the slot. A clean release deletes `C[L]` before `B[L]`; any other end leaves it,
//! and the broker deletes it one settle time after the holder's consumer went away. An acquirer
//! that wins `B[L]` while `C[L]` is still there gives `B[L]` back and counts the slot as taken
//! for this scan (the scan is then [`Scan::Unsettled`], and a waiting acquirer looks again): the
//! Consul contenders' settle rule, kept by the broker's clock, for every acquirer at once (a new
//! process that never saw the old holder too).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use lapin::options::BasicConsumeOptions;
use lapin::types::{FieldTable, ShortString};
use lapin::{Channel, Consumer};

use super::admin;
use super::config::LossDetection;
use super::handle::Amqp;
use super::hold::into_lease;
use super::holder::HolderQueue;
use super::naming::SemaphoreNames;
use super::pool::{self, PooledConnection, Use};
use super::wire::{self, Failure};
use lease_core::backoff::{Backoff, jitter};
use lease_core::{Error, Lease, LeaseSpec, LostReason, Sequencer, Target};

/// The first and longest pause between scans of a full semaphore.
const SCAN_BACKOFF: (Duration, Duration) = (Duration::from_millis(20), Duration::from_secs(1));

pub(crate) async fn acquire(amqp: &Amqp, spec: &LeaseSpec) -> Result<Lease, Error> {
    spec.validate()?;
    let (name, limit) = match spec.target() {
        Target::Leader { key } => (key.as_str(), 1),
        Target::Semaphore { prefix, limit } => (prefix.as_str(), *limit),
        other => return Err(other.unsupported("Amqp")),
    };
    let names = SemaphoreNames::new(name, limit)?;
    let started = Instant::now();
    let deadline = spec.wait_policy().deadline(started);
    let mut backoff = Backoff::new(SCAN_BACKOFF.0, SCAN_BACKOFF.1);
    let mut unsettled_scans = 0;
    loop {
        let scan = try_acquire(amqp, &names, limit, spec.settle_time()).await;
        match scan.map_err(|error| leader_on_a_semaphore(spec, error))? {
            Scan::Acquired(lease) => return Ok(lease),
            // Slots were changing hands while we looked: "busy" would not be the truth yet, so
            // look again soon, even when told not to wait (a bounded number of times).
            Scan::Unsettled if unsettled_scans < amqp.config().race_retries => {
                unsettled_scans += 1;
                tokio::time::sleep(jitter(Duration::from_millis(5))).await;
                continue;
            }
            Scan::Unsettled | Scan::Full => {}
        }
        let now = Instant::now();
        let mut sleep = backoff.next_pause();
        if let Some(deadline) = deadline {
            if now >= deadline {
                return Err(Error::Busy {
                    key: name.to_owned(),
                    waited: now - started,
                });
            }
            sleep = sleep.min(deadline - now);
        }
        tokio::time::sleep(sleep).await;
    }
}

/// A leader lock is the one-slot semaphore of its key, so a leader lock asked for on a name whose
/// semaphore has more slots finds a semaphore there, and is refused as on the other backends:
/// with [`Error::FlagsConflict`], not [`Error::LimitMismatch`].
///
/// The other way round cannot be told: a leader lock's queues are a one-slot semaphore's, declared
/// with the same arguments (amqp-locks', which every client of the semaphore must use, or the broker
/// refuses the redeclare). A semaphore asked for on a leader lock's name keeps
/// [`Error::LimitMismatch`] (`stored: 1`), refused at once and for good all the same; asking for one
/// slot, it shares the leader lock's. Marking the kind would take a queue, or an argument, that
/// other clients of amqp-locks do not write and existing leader locks do not have.
fn leader_on_a_semaphore(spec: &LeaseSpec, error: Error) -> Error {
    match (spec.target(), error) {
        (Target::Leader { .. }, Error::LimitMismatch { key, stored, .. }) if stored > 1 => {
            Error::semaphore_in_the_way(key)
        }
        (_, error) => error,
    }
}

/// What one scan of the semaphore found.
enum Scan {
    Acquired(Lease),
    /// Every slot is held.
    Full,
    /// No slot was free, but some were being taken (by our own leases, or in a race we lost)
    /// while we looked: one may be free once they settle.
    Unsettled,
}

/// One scan of the semaphore. A slot whose last holder has not settled yet counts as taken.
///
/// The scan runs on one channel (reopened when the broker closes it on a lost race); a won
/// slot's lease takes the channel over, and every other ending closes it, here and only here.
async fn try_acquire(
    amqp: &Amqp,
    names: &SemaphoreNames,
    limit: u32,
    settle: Duration,
) -> Result<Scan, Error> {
    // The channel every scan of this acquire runs on, and the lease's channel if it wins a slot.
    let reservation = amqp.reserve_channel(Use::Lease).await?;
    let pooled = Arc::clone(reservation.pooled());
    let mut channel = open(amqp, &pooled).await?;
    let scanned = scan(amqp, names, limit, settle, &pooled, &mut channel).await;
    let ended = match scanned {
        Ok(Scanned::Won(won)) => {
            let won = *won;
            return Ok(Scan::Acquired(into_lease(
                amqp,
                names,
                won.slot,
                reservation,
                channel,
                won.consumer,
                won.settle_consumer,
                won.holder,
                won.confirmed_at,
            )));
        }
        Ok(Scanned::Full) => Ok(Scan::Full),
        Ok(Scanned::Unsettled) => Ok(Scan::Unsettled),
        Err(error) => Err(error),
    };
    wire::close_channel(&channel, amqp.config().operation_timeout).await;
    ended
}

/// How a scan ended, before its channel is handed to the lease or closed.
enum Scanned {
    /// Boxed: a won slot is the rare, large ending.
    Won(Box<Won>),
    /// Every slot is held.
    Full,
    /// See [`Scan::Unsettled`].
    Unsettled,
}

/// A won slot: everything its lease needs but the channel.
struct Won {
    slot: u32,
    consumer: Option<Consumer>,
    settle_consumer: Option<Consumer>,
    holder: HolderQueue,
    confirmed_at: Instant,
}

/// The scan of [`try_acquire`], on `channel`.
async fn scan(
    amqp: &Amqp,
    names: &SemaphoreNames,
    limit: u32,
    settle: Duration,
    pooled: &Arc<PooledConnection>,
    channel: &mut Channel,
) -> Result<Scanned, Error> {
    let config = amqp.config();
    let timeout = config.operation_timeout;
    let mut races = 0;
    let mut unsettled = false;
    let mut created = false;
    'scan: loop {
        // Every contender must ask for the semaphore's slot count, as on Consul: `A[limit]`
        // exists and `A[limit + 1]` does not.
        if !probe(amqp, channel, &names.slot_queue(limit)).await? {
            if created {
                // Destroyed by an administrator right after it was created.
                return Ok(Scanned::Full);
            }
            // Missing, fewer slots, or being created by another acquirer right now: counted
            // under the administration mutex, and created if it does not exist.
            let stored = admin::create_if_missing(amqp, names, limit).await?;
            if stored != limit {
                return Err(limit_mismatch(names, stored, limit));
            }
            created = true;
            continue 'scan;
        }
        let stored = count_from(amqp, channel, names, limit).await?;
        if stored != limit {
            return Err(limit_mismatch(names, stored, limit));
        }
        // Slot queues are a contiguous run (administrators remove them from the top down), so
        // `A[limit]` existing means `A[1..=limit]` do: they are not probed one by one. A slot
        // removed since is found by the consume (or probe) that watches a won slot.
        let mut slot = 1;
        loop {
            let slot_queue = names.slot_queue(slot);
            if slot > limit {
                return Ok(if unsettled || races > 0 {
                    Scanned::Unsettled
                } else {
                    Scanned::Full
                });
            }
            match amqp.claim_state(names, slot) {
                Some(true) => {
                    slot += 1;
                    continue;
                }
                Some(false) => {
                    unsettled = true;
                    slot += 1;
                    continue;
                }
                None => {}
            }
            if probe(amqp, channel, &names.holder_queue(slot)).await? {
                slot += 1;
                continue;
            }
            let Some(claim) = amqp.claim(names, slot) else {
                unsettled = true;
                slot += 1;
                continue;
            };
            let holder_queue = names.holder_queue(slot);
            match wire::declare_exclusive(channel, &holder_queue, timeout).await {
                Ok(()) => {}
                Err(Failure::ResourceLocked) => {
                    drop(claim);
                    races += 1;
                    if races > config.race_retries {
                        return Err(crate::AmqpError::Contended {
                            key: names.name().to_owned(),
                            attempts: races,
                        }
                        .into());
                    }
                    tracing::debug!(
                        semaphore = names.name(),
                        slot,
                        races,
                        "lost the race for a slot; rescanning"
                    );
                    // Randomly skewed, so racers that collided do not collide again.
                    tokio::time::sleep(jitter(Duration::from_millis(u64::from(races.min(10)) * 5)))
                        .await;
                    *channel = open(amqp, pooled).await?;
                    continue 'scan;
                }
                Err(failure) => {
                    return Err(amqp.unreachable("declare the holder queue", failure));
                }
            }
            let mut holder = HolderQueue {
                amqp: amqp.clone(),
                pooled: Arc::clone(pooled),
                queue: holder_queue,
                settle_queue: None,
                armed: true,
                claim,
            };
            let settle_consumer =
                match settle_in(amqp, channel, names, slot, settle, &mut holder).await {
                    Ok(Settle::Ready(settle_consumer)) => settle_consumer,
                    Ok(Settle::Settling) => {
                        // Not ours to take yet; free once `C[L]` expires.
                        holder.give_back(Some(channel)).await?;
                        unsettled = true;
                        slot += 1;
                        continue;
                    }
                    Err(failure) => {
                        let _ = holder.give_back(Some(channel)).await;
                        return Err(amqp.unreachable("settle the slot", failure));
                    }
                };
            // The fence starts when the request that proves the channel alive was sent.
            let confirmed_at = Instant::now();
            match watch_slot(amqp, channel, &slot_queue).await {
                Ok(consumer) => {
                    return Ok(Scanned::Won(Box::new(Won {
                        slot,
                        consumer,
                        settle_consumer,
                        holder,
                        confirmed_at,
                    })));
                }
                Err(Failure::NotFound) => {
                    // A[L] was removed after the scan saw it: the slot is not ours to take.
                    let _ = holder.give_back(None).await;
                    *channel = open(amqp, pooled).await?;
                    continue 'scan;
                }
                Err(failure) => {
                    let _ = holder.give_back(Some(channel)).await;
                    return Err(amqp.unreachable("watch the slot queue", failure));
                }
            }
        }
    }
}

/// The last slot of the run of slot queues from `A[from]`, which exists (seen without the
/// administration mutex: a creation in progress may show fewer).
async fn count_from(
    amqp: &Amqp,
    channel: &Channel,
    names: &SemaphoreNames,
    from: u32,
) -> Result<u32, Error> {
    let mut count = from;
    while names.fits(count.saturating_add(1))
        && probe(amqp, channel, &names.slot_queue(count + 1)).await?
    {
        count += 1;
    }
    Ok(count)
}

/// The error for a contender whose `requested` limit is not the semaphore's `stored` slot count.
fn limit_mismatch(names: &SemaphoreNames, stored: u32, requested: u32) -> Error {
    Error::LimitMismatch {
        key: names.name().to_owned(),
        stored: u64::from(stored),
        requested: u64::from(requested),
    }
}

/// What [`settle_in`] found.
enum Settle {
    /// The slot is ours: the consumer that keeps our `C[L]` (none with a settle time of zero).
    Ready(Option<Consumer>),
    /// The last holder's `C[L]` is still there: the slot is not free yet.
    Settling,
}

/// With `B[L]` won: checks that the last holder's settle queue `C[L]` has expired, then declares
/// and consumes our own, unless `settle` is zero.
///
/// `C[L]` starts expiring when it is declared, and only our consume stops that: on a broker
/// slow enough to let it expire in between, the consume fails (closing the channel), and the
/// declare and consume are made again on a fresh channel. Nobody else can declare it meanwhile:
/// we hold `B[L]`.
async fn settle_in(
    amqp: &Amqp,
    channel: &mut Channel,
    names: &SemaphoreNames,
    slot: u32,
    settle: Duration,
    holder: &mut HolderQueue,
) -> Result<Settle, Failure> {
    let timeout = amqp.config().operation_timeout;
    let queue = names.settle_queue(slot);
    if wire::probe(channel, &queue, timeout).await? {
        tracing::debug!(
            semaphore = names.name(),
            slot,
            "the slot's last holder lost it without a release; it settles before anyone takes it"
        );
        return Ok(Settle::Settling);
    }
    if settle.is_zero() {
        return Ok(Settle::Ready(None));
    }
    // Named before it exists, so a give-back (or a cancelled acquire) deletes it.
    holder.settle_queue = Some(queue.clone());
    let mut attempts = 0;
    loop {
        wire::declare_settle(channel, &queue, settle, timeout).await?;
        match consume(channel, &queue, timeout).await {
            Ok(consumer) => return Ok(Settle::Ready(Some(consumer))),
            Err(Failure::NotFound) if attempts < amqp.config().race_retries => {
                attempts += 1;
                tracing::debug!(
                    queue,
                    attempts,
                    "the settle queue expired before its consume"
                );
                *channel = pool::open_channel(&holder.pooled, timeout).await?;
            }
            Err(failure) => return Err(failure),
        }
    }
}

async fn open(amqp: &Amqp, pooled: &PooledConnection) -> Result<Channel, Error> {
    pool::open_channel(pooled, amqp.config().operation_timeout)
        .await
        .map_err(|failure| amqp.unreachable("open a channel", failure))
}

async fn probe(amqp: &Amqp, channel: &Channel, queue: &str) -> Result<bool, Error> {
    wire::probe(channel, queue, amqp.config().operation_timeout)
        .await
        .map_err(|failure| amqp.unreachable("probe a queue", failure))
}

/// Proves `A[L]` exists and starts watching it: a consumer (cancelled by the broker when the queue
/// is deleted) or, in verify mode, one probe.
async fn watch_slot(
    amqp: &Amqp,
    channel: &Channel,
    slot_queue: &str,
) -> Result<Option<Consumer>, Failure> {
    let timeout = amqp.config().operation_timeout;
    match amqp.config().loss_detection {
        LossDetection::ConsumerCancel => consume(channel, slot_queue, timeout).await.map(Some),
        LossDetection::Verify { .. } => match wire::probe(channel, slot_queue, timeout).await? {
            true => Ok(None),
            false => Err(Failure::NotFound),
        },
    }
}

/// Consumes `queue` without acknowledgements (stray messages must not pile up unacknowledged on
/// the holder's channel).
async fn consume(channel: &Channel, queue: &str, timeout: Duration) -> Result<Consumer, Failure> {
    let options = BasicConsumeOptions {
        no_ack: true,
        ..BasicConsumeOptions::default()
    };
    let consume = channel.basic_consume(
        ShortString::from(queue),
        ShortString::from(""),
        options,
        FieldTable::default(),
    );
    wire::bounded(timeout, queue, consume).await
}

/// [`Backend::check_sequencer`](lease_core::Backend::check_sequencer) on AMQP; see there.
pub(crate) async fn check_sequencer(amqp: &Amqp, sequencer: &Sequencer) -> Result<(), Error> {
    let names = SemaphoreNames::new(sequencer.key(), u32::MAX)?;
    let slot =
        u32::try_from(sequencer.index()).map_err(|_| Error::Lost(LostReason::SlotRemoved))?;
    let local = amqp.local_holder(names.name(), slot);
    let timeout = amqp.config().operation_timeout;
    let reservation = amqp.reserve_channel(Use::Brief).await?;
    let channel = open(amqp, reservation.pooled()).await?;
    let probed: Result<Option<bool>, Failure> = async {
        if !wire::probe(&channel, &names.slot_queue(slot), timeout).await? {
            return Ok(None);
        }
        wire::probe(&channel, &names.holder_queue(slot), timeout)
            .await
            .map(Some)
    }
    .await;
    wire::close_channel(&channel, timeout).await;
    let slot_held = match probed {
        Ok(Some(held)) => held,
        Ok(None) => return Err(Error::Lost(LostReason::SlotRemoved)),
        Err(failure) => return Err(amqp.unreachable("verify a slot", failure)),
    };
    match local {
        Some(holder) if holder == sequencer.holder() && slot_held => Ok(()),
        // Ours once, but the slot is free now or held by a later acquisition of ours.
        Some(_) => Err(Error::Lost(LostReason::Released)),
        None if slot_held => Err(Error::Unsupported {
            backend: "RabbitMQ",
            operation: "checking a sequencer issued by another process while its slot is held",
        }),
        None => Err(Error::Lost(LostReason::Released)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mismatch(stored: u64, requested: u64) -> Error {
        Error::LimitMismatch {
            key: "jobs".to_owned(),
            stored,
            requested,
        }
    }

    #[test]
    fn a_leader_on_a_semaphore_of_more_slots_is_another_kind_of_lock() {
        let leader = LeaseSpec::leader("jobs");
        let refused = leader_on_a_semaphore(&leader, mismatch(3, 1));
        assert!(
            matches!(&refused, Error::FlagsConflict { key, found: Error::SEMAPHORE_FLAGS, expected: Error::LEADER_FLAGS } if key == "jobs"),
            "{refused:?}"
        );
        // A semaphore on a one-slot queue set may be on a leader lock or on a one-slot
        // semaphore: the queues do not say, so the limits do.
        let semaphore = LeaseSpec::semaphore("jobs", 2);
        let refused = leader_on_a_semaphore(&semaphore, mismatch(1, 2));
        assert!(matches!(refused, Error::LimitMismatch { stored: 1, .. }));
        let other = leader_on_a_semaphore(&leader, Error::config("x"));
        assert!(matches!(other, Error::Config { .. }));
    }
}
