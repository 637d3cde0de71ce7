//! Holding a slot: the keeper's watch of `A[L]` (a consumer the broker cancels when the queue is
//! deleted, and a probe every quarter heartbeat that confirms the lease's fence), and the
//! give-back of `B[L]` (with `C[L]` on a clean release; after a loss `C[L]` is left to expire).

use std::future::poll_fn;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use lapin::{Channel, Connection, Consumer};
use tokio::time::Instant;

use super::config::LossDetection;
use super::handle::Amqp;
use super::holder::HolderQueue;
use super::naming::SemaphoreNames;
use super::pool::Reservation;
use super::wire::{self, Failure};
use lease_core::backend::{Fence, Hold};
use lease_core::backoff::random_below;
use lease_core::{BackendKind, Error, Lease, LostReason, Sequencer};

#[allow(clippy::too_many_arguments)]
pub(super) fn into_lease(
    amqp: &Amqp,
    names: &SemaphoreNames,
    slot: u32,
    reservation: Reservation,
    channel: Channel,
    consumer: Option<Consumer>,
    settle_consumer: Option<Consumer>,
    holder: HolderQueue,
    confirmed_at: Instant,
) -> Lease {
    // The queue name alone would repeat when the slot is taken again; the nonce makes every
    // acquisition's sequencer its own, so a stale holder is detectable.
    let sequencer = Sequencer::new(
        BackendKind::Amqp,
        names.name(),
        u64::from(slot),
        format!(
            "{}#{:016x}",
            names.holder_queue(slot),
            random_below(u64::MAX)
        ),
    );
    holder.claim.mark_held(sequencer.holder());
    let config = amqp.config();
    // The broker may have negotiated a shorter heartbeat than we asked for; fence by that one.
    let negotiated = Duration::from_secs(u64::from(
        reservation.connection().configuration().heartbeat(),
    ));
    let heartbeat = if negotiated.is_zero() {
        config.heartbeat
    } else {
        config.heartbeat.min(negotiated)
    };
    // The broker may drop a connection it has not heard from for about a heartbeat; we must
    // give up the lease before that, and confirm often enough not to give it up needlessly.
    let fence = Fence::new(heartbeat * 3 / 4, confirmed_at);
    let mut ping_every = heartbeat / 4;
    if let LossDetection::Verify { period } = config.loss_detection {
        ping_every = ping_every.min(period);
    }
    tracing::debug!(semaphore = names.name(), slot, "slot acquired");
    amqp.keepers().start(
        sequencer,
        fence.clone(),
        Arc::new(amqp.clone()),
        SlotHold {
            amqp: amqp.clone(),
            reservation,
            channel,
            consumer,
            settle_consumer,
            slot_queue: names.slot_queue(slot),
            holder: Some(holder),
            fence,
            ping_every,
        },
    )
}

/// What the keeper task holds for an acquired slot.
struct SlotHold {
    amqp: Amqp,
    /// The lease's channel on its connection, counted against that connection's `channel_max`
    /// for as long as the lease is held.
    reservation: Reservation,
    channel: Channel,
    consumer: Option<Consumer>,
    /// Keeps `C[L]` in use (so it does not expire) until the channel closes.
    settle_consumer: Option<Consumer>,
    slot_queue: String,
    /// Taken by the give-back.
    holder: Option<HolderQueue>,
    fence: Fence,
    ping_every: Duration,
}

impl SlotHold {
    async fn watch_inner(&mut self) -> LostReason {
        loop {
            let Some(deadline) = self.fence.deadline() else {
                return std::future::pending().await;
            };
            let (channel, slot_queue, fence) = (&self.channel, &self.slot_queue, &self.fence);
            let ping_every = self.ping_every;
            let ping = async move {
                tokio::time::sleep(ping_every).await;
                let sent = Instant::now();
                let remaining = deadline.saturating_duration_since(sent);
                match wire::probe(channel, slot_queue, remaining).await {
                    Ok(true) => Ok(sent),
                    Ok(false) => Err(LostReason::SlotRemoved),
                    // The holder task declares the self-fence when the deadline passes.
                    Err(Failure::TimedOut) => std::future::pending().await,
                    Err(failure) => Err(failure.lost_reason()),
                }
            };
            let outcome = tokio::select! {
                biased;
                reason = consumer_ended(self.consumer.as_mut(), &self.channel, self.reservation.connection()) => Err(reason),
                outcome = ping => outcome,
            };
            match outcome {
                Ok(sent) => fence.confirm(sent),
                Err(reason) => return reason,
            }
        }
    }

    /// Gives the slot back and closes the channel: cleanly (`lost` is `None`: `C[L]` and `B[L]`
    /// deleted, the next holder need not settle), or after a loss (`B[L]` only; `C[L]` expires
    /// one settle time after the channel closes). After a self-fence the connection may be one
    /// the broker is about to drop (or already has), so it is discarded too: the other leases on
    /// it are lost with it, those on the backend's other connections are not.
    async fn give_back(&mut self, lost: Option<&LostReason>) -> Result<(), Error> {
        self.consumer = None;
        let Some(holder) = self.holder.take() else {
            return Ok(());
        };
        let result = match lost {
            None => holder.give_back(Some(&self.channel)).await,
            Some(_) => holder.give_back_after_loss(Some(&self.channel)).await,
        };
        wire::close_channel(&self.channel, self.amqp.config().operation_timeout).await;
        self.settle_consumer = None;
        if lost.is_some_and(LostReason::is_self_fenced) {
            self.amqp
                .discard_connection(self.reservation.pooled())
                .await;
        }
        result
    }
}

/// Completes when the consumer on `A[L]` ends: the broker cancelled it because `A[L]` was deleted
/// (slot removed), or the channel or connection closed. Never completes without a consumer.
async fn consumer_ended(
    consumer: Option<&mut Consumer>,
    channel: &Channel,
    connection: &Connection,
) -> LostReason {
    let Some(consumer) = consumer else {
        return std::future::pending().await;
    };
    loop {
        let next =
            poll_fn(|cx| futures_core::Stream::poll_next(Pin::new(&mut *consumer), cx)).await;
        match next {
            // A stray message: already acknowledged (no_ack), nothing to do.
            Some(Ok(_)) => continue,
            Some(Err(_)) => return LostReason::ConnectionClosed,
            None => {
                // lapin marks the channel closed before it ends its consumers, so a consumer
                // ended on an open channel was cancelled by the broker: A[L] is gone.
                return if channel.status().connected() && connection.status().connected() {
                    LostReason::SlotRemoved
                } else {
                    LostReason::ConnectionClosed
                };
            }
        }
    }
}

impl Hold for SlotHold {
    async fn watch(&mut self) -> LostReason {
        self.watch_inner().await
    }

    async fn release(&mut self) -> Result<(), Error> {
        self.give_back(None).await
    }

    async fn clean_up(&mut self, reason: &LostReason) {
        if let Err(error) = self.give_back(Some(reason)).await {
            tracing::warn!(%error, "could not delete the holder queue after losing the lease");
        }
    }
}
