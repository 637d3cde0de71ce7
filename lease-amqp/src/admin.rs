//! Lock administration (amqp-locks'): create, destroy, add and remove slots, wait for a holder to go.
//!
//! Every operation runs under the semaphore's administration mutex, the exclusive queue
//! `N-admin`, so two administrators never interleave their changes and the slot queues always
//! stay a contiguous run `A[1..=C]` from which C can be read. Slot queues are removed in descending
//! order, each delete confirmed by the broker before the next, so an interrupted removal still
//! leaves a contiguous run.

use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

use lapin::Channel;

use super::handle::{AdminLock, Amqp};
use super::holder::delete_queue;
use super::naming::SemaphoreNames;
use super::pool::{self, Reservation, Use};
use super::wire::{self, Failure};
use lease_core::Error;
use lease_core::backoff::Backoff;

/// Administration of the persistent semaphores on one broker. From [`Amqp::admin`].
///
/// Removing a slot does not take it from its holder at once: the holder's lease is lost
/// ([`LostReason::SlotRemoved`](lease_core::LostReason::SlotRemoved)), its work cancelled, and it
/// deletes its holder queue; [`wait_for_holder`](Admin::wait_for_holder) waits for that.
#[derive(Clone)]
pub struct Admin {
    amqp: Amqp,
}

impl fmt::Debug for Admin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Admin").field("amqp", &self.amqp).finish()
    }
}

impl Admin {
    pub(crate) fn new(amqp: Amqp) -> Admin {
        Admin { amqp }
    }

    /// The number of slots C of semaphore `name` (0 if it does not exist): the length of the run
    /// of slot queues from `A[1]`.
    pub async fn slots(&self, name: &str) -> Result<u32, Error> {
        let names = SemaphoreNames::new(name, 1)?;
        let session = self.lock(&names).await?;
        let count = session.count().await;
        session.unlock(count).await
    }

    /// Creates semaphore `name` with `slots` slots. Creating an existing semaphore with the same
    /// number of slots succeeds; with another number it fails with [`Error::LimitMismatch`]
    /// (use [`add`](Admin::add) or [`remove`](Admin::remove)).
    pub async fn create(&self, name: &str, slots: u32) -> Result<(), Error> {
        let names = SemaphoreNames::new(name, slots)?;
        let session = self.lock(&names).await?;
        let result = async {
            let count = session.count().await?;
            if count != 0 && count != slots {
                return Err(Error::LimitMismatch {
                    key: name.to_owned(),
                    stored: u64::from(count),
                    requested: u64::from(slots),
                });
            }
            session.declare_slots(count + 1, slots).await?;
            session.overshoot(slots).await
        }
        .await;
        session.unlock(result).await
    }

    /// Destroys semaphore `name`: deletes its slot queues from the last down to `A[1]`. Returns how
    /// many slots it had. Holders lose their leases.
    pub async fn destroy(&self, name: &str) -> Result<u32, Error> {
        let names = SemaphoreNames::new(name, 1)?;
        let session = self.lock(&names).await?;
        let result = async {
            let count = session.count().await?;
            session.overshoot(count).await?;
            session.delete_slots(count, 0).await?;
            Ok(count)
        }
        .await;
        session.unlock(result).await
    }

    /// Adds `extra` slots to semaphore `name` (which must exist). Returns the new number of slots.
    pub async fn add(&self, name: &str, extra: u32) -> Result<u32, Error> {
        let names = SemaphoreNames::new(name, 1)?;
        let session = self.lock(&names).await?;
        let result =
            async {
                let count = session.count().await?;
                if count == 0 {
                    return Err(Error::config(format!(
                        "semaphore {name:?} does not exist: create it first"
                    )));
                }
                let target = count.checked_add(extra).filter(|&t| names.fits(t)).ok_or(
                    Error::InvalidKey {
                        key: name.to_owned(),
                        reason: "that many slots would make a queue name longer than 255 bytes",
                    },
                )?;
                session.overshoot(count).await?;
                session.declare_slots(count + 1, target).await?;
                Ok(target)
            }
            .await;
        session.unlock(result).await
    }

    /// Removes `fewer` slots from semaphore `name`, the highest first, each delete confirmed
    /// before the next. Returns the new number of slots. Holders of removed slots lose their
    /// leases, and contenders that still ask for the old count get [`Error::LimitMismatch`]
    /// (as after [`add`](Admin::add)).
    pub async fn remove(&self, name: &str, fewer: u32) -> Result<u32, Error> {
        let names = SemaphoreNames::new(name, 1)?;
        let session = self.lock(&names).await?;
        let result = async {
            let count = session.count().await?;
            let target = count.saturating_sub(fewer);
            session.overshoot(count).await?;
            session.delete_slots(count, target).await?;
            Ok(target)
        }
        .await;
        session.unlock(result).await
    }

    /// Whether slot `slot` of semaphore `name` has a holder (its holder queue exists).
    pub async fn has_holder(&self, name: &str, slot: u32) -> Result<bool, Error> {
        let names = SemaphoreNames::new(name, slot.max(1))?;
        let session = self.lock(&names).await?;
        let held = session.probe(&names.holder_queue(slot)).await;
        session.unlock(held).await
    }

    /// Waits until slot `slot` of semaphore `name` has no holder, up to `timeout`
    /// ([`Error::Busy`] after that). Useful after [`remove`](Admin::remove): the mutex is held
    /// while waiting, so no administrator can re-add the slot and let a new holder in meanwhile.
    pub async fn wait_for_holder(
        &self,
        name: &str,
        slot: u32,
        timeout: Duration,
    ) -> Result<(), Error> {
        let names = SemaphoreNames::new(name, slot.max(1))?;
        let session = self.lock(&names).await?;
        let started = Instant::now();
        let queue = names.holder_queue(slot);
        let result = async {
            let mut backoff = admin_backoff();
            while session.probe(&queue).await? {
                if started.elapsed() >= timeout {
                    return Err(Error::Busy {
                        key: format!("{name} slot {slot}"),
                        waited: started.elapsed(),
                    });
                }
                let left = timeout.saturating_sub(started.elapsed());
                tokio::time::sleep(backoff.next_pause().min(left)).await;
            }
            Ok(())
        }
        .await;
        session.unlock(result).await
    }

    async fn lock<'a>(&'a self, names: &'a SemaphoreNames) -> Result<Session<'a>, Error> {
        lock(&self.amqp, names).await
    }
}

/// Creates semaphore `names` with `slots` slots unless it exists (an acquirer found no
/// `A[slots]`). Returns its number of slots, counted under the mutex, so a creation in progress
/// is seen whole.
pub(crate) async fn create_if_missing(
    amqp: &Amqp,
    names: &SemaphoreNames,
    slots: u32,
) -> Result<u32, Error> {
    let session = lock(amqp, names).await?;
    let result = async {
        let count = session.count().await?;
        if count != 0 {
            return Ok(count);
        }
        tracing::info!(semaphore = names.name(), slots, "creating the semaphore");
        session.declare_slots(1, slots).await?;
        Ok(slots)
    }
    .await;
    session.unlock(result).await
}

/// Takes the administration mutex of `names`: this process's lock, then the broker's exclusive
/// queue, retried with backoff while another administrator holds it.
///
/// A look that finds the mutex taken is a probe, which leaves the channel open. Only a declare
/// that loses a race gets the channel closed by the broker, which costs the connection a channel
/// id (see `pool`), so a long wait for the mutex does not wear the connection out.
async fn lock<'a>(amqp: &'a Amqp, names: &'a SemaphoreNames) -> Result<Session<'a>, Error> {
    let local = amqp.admin_lock(names.name()).await;
    let timeout = amqp.config().operation_timeout;
    let reservation = amqp.reserve_channel(Use::Brief).await?;
    let mutex = names.admin_queue();
    let started = Instant::now();
    let mut backoff = admin_backoff();
    let open = || async {
        pool::open_channel(reservation.pooled(), timeout)
            .await
            .map_err(|f| amqp.unreachable("open a channel", f))
    };
    let mut channel = open().await?;
    loop {
        match wire::probe(&channel, &mutex, timeout).await {
            Ok(true) => {}
            Ok(false) => match wire::declare_exclusive(&channel, &mutex, timeout).await {
                Ok(()) => {
                    return Ok(Session {
                        amqp,
                        names,
                        channel,
                        reservation,
                        unlocked: false,
                        local: Some(local),
                    });
                }
                // Taken between the probe and the declare: the broker closed the channel.
                Err(Failure::ResourceLocked) => channel = open().await?,
                Err(failure) => {
                    wire::close_channel(&channel, timeout).await;
                    return Err(amqp.unreachable("take the administration mutex", failure));
                }
            },
            Err(failure) => {
                wire::close_channel(&channel, timeout).await;
                return Err(amqp.unreachable("probe the administration mutex", failure));
            }
        }
        if started.elapsed() >= timeout {
            wire::close_channel(&channel, timeout).await;
            return Err(Error::Busy {
                key: mutex,
                waited: started.elapsed(),
            });
        }
        backoff.wait().await;
    }
}

/// The administration mutex, held, with the channel the administration runs on.
struct Session<'a> {
    amqp: &'a Amqp,
    names: &'a SemaphoreNames,
    channel: Channel,
    reservation: Reservation,
    unlocked: bool,
    /// Kept until the broker's mutex is deleted, so no administration of ours can take that
    /// mutex while a cancelled one's delete is still on its way.
    local: Option<AdminLock>,
}

impl Session<'_> {
    fn timeout(&self) -> Duration {
        self.amqp.config().operation_timeout
    }

    async fn probe(&self, queue: &str) -> Result<bool, Error> {
        wire::probe(&self.channel, queue, self.timeout())
            .await
            .map_err(|f| self.amqp.unreachable("probe a queue", f))
    }

    /// C: the last slot of the contiguous run from `A[1]`.
    async fn count(&self) -> Result<u32, Error> {
        let mut count = 0;
        while count < u32::MAX && self.probe(&self.names.slot_queue(count + 1)).await? {
            count += 1;
        }
        Ok(count)
    }

    async fn declare_slots(&self, from: u32, to: u32) -> Result<(), Error> {
        for slot in from..=to {
            let queue = self.names.slot_queue(slot);
            wire::declare_slot(&self.channel, &queue, self.timeout())
                .await
                .map_err(|f| self.failure("declare a slot queue", f))?;
        }
        Ok(())
    }

    /// Deletes `A[from]` down to A[to + 1], each confirmed before the next.
    async fn delete_slots(&self, from: u32, to: u32) -> Result<(), Error> {
        for slot in (to + 1..=from).rev() {
            let queue = self.names.slot_queue(slot);
            wire::delete(&self.channel, &queue, self.timeout())
                .await
                .map_err(|f| self.failure("delete a slot queue", f))?;
        }
        Ok(())
    }

    /// Overshoot (as amqp-locks defines it): deletes slot queues found within T above the last slot, top down.
    async fn overshoot(&self, count: u32) -> Result<(), Error> {
        let t = self.amqp.config().overshoot;
        let top = count.saturating_add(t);
        for slot in (count + 1..=top).rev() {
            if !self.names.fits(slot) {
                continue;
            }
            let queue = self.names.slot_queue(slot);
            if self.probe(&queue).await? {
                tracing::info!(queue, "overshoot: deleting a stray slot queue");
                wire::delete(&self.channel, &queue, self.timeout())
                    .await
                    .map_err(|f| self.failure("delete a stray slot queue", f))?;
            }
        }
        Ok(())
    }

    fn failure(&self, operation: &str, failure: Failure) -> Error {
        self.amqp.unreachable(operation, failure)
    }

    /// Releases the mutex (deleting its queue, confirmed) and passes `result` through.
    async fn unlock<T>(mut self, result: Result<T, Error>) -> Result<T, Error> {
        self.unlocked = true;
        let mutex = self.names.admin_queue();
        let released = delete_queue(
            self.amqp,
            self.reservation.pooled(),
            Some(&self.channel),
            &mutex,
        )
        .await;
        wire::close_channel(&self.channel, self.timeout()).await;
        let value = result?;
        released?;
        Ok(value)
    }
}

impl Drop for Session<'_> {
    fn drop(&mut self) {
        // A cancelled administration must not leave the mutex taken for as long as our
        // connection lives: delete it in the background.
        if tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        if !self.unlocked {
            let (amqp, pooled, mutex, local) = (
                self.amqp.clone(),
                std::sync::Arc::clone(self.reservation.pooled()),
                self.names.admin_queue(),
                self.local.take(),
            );
            lease_core::runtime::spawn(async move {
                let _ = delete_queue(&amqp, &pooled, None, &mutex).await;
                drop(local);
            });
        }
    }
}

/// Between looks at a queue an administrator waits for: 10 ms doubling up to 500 ms.
fn admin_backoff() -> Backoff {
    Backoff::new(Duration::from_millis(10), Duration::from_millis(500))
}
