//! [`HolderQueue`]: a slot's holder queue `B[L]` (and its settle queue `C[L]`) while we own
//! them, and [`delete_queue`], which gives them back.

use std::sync::Arc;

use lapin::Channel;
use lease_core::Error;

use super::handle::{Amqp, Claim};
use super::pool::{self, PooledConnection};
use super::wire;

/// `B[L]` (and `C[L]`) while we own it: deleted by [`give_back`](HolderQueue::give_back), or in
/// the background if dropped first (a cancelled acquire), so no slot is left taken.
pub(super) struct HolderQueue {
    pub(super) amqp: Amqp,
    pub(super) pooled: Arc<PooledConnection>,
    pub(super) queue: String,
    /// `C[L]`, once we declare it.
    pub(super) settle_queue: Option<String>,
    pub(super) armed: bool,
    pub(super) claim: Claim,
}

impl HolderQueue {
    /// A clean release: deletes `C[L]`, then `B[L]` (on `channel` if it still works, else on a
    /// fresh one), each confirmed, so the next holder need not settle. If the connection is
    /// closed, `B[L]` went with it and `C[L]` expires on its own.
    pub(super) async fn give_back(mut self, channel: Option<&Channel>) -> Result<(), Error> {
        self.armed = false;
        if let Some(settle_queue) = self.settle_queue.take() {
            delete_queue(&self.amqp, &self.pooled, channel, &settle_queue).await?;
        }
        delete_queue(&self.amqp, &self.pooled, channel, &self.queue).await
    }

    /// After a loss: deletes `B[L]` only. `C[L]` is left to expire one settle time after the
    /// channel that consumes it closes, so nobody takes the slot before this holder's work has
    /// had that long to stop.
    pub(super) async fn give_back_after_loss(
        mut self,
        channel: Option<&Channel>,
    ) -> Result<(), Error> {
        self.armed = false;
        delete_queue(&self.amqp, &self.pooled, channel, &self.queue).await
    }
}

impl Drop for HolderQueue {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        if tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        // A cancelled acquire never ran work: nothing to settle.
        let (amqp, pooled) = (self.amqp.clone(), Arc::clone(&self.pooled));
        let queues: Vec<String> = (self.settle_queue.take().into_iter())
            .chain([self.queue.clone()])
            .collect();
        lease_core::runtime::spawn(async move {
            for queue in queues {
                if let Err(error) = delete_queue(&amqp, &pooled, None, &queue).await {
                    tracing::warn!(%error, queue, "could not delete an abandoned holder queue");
                    return;
                }
            }
        });
    }
}

/// Deletes a queue on `pooled`'s connection, confirmed. If that connection is closed there is
/// nothing to do: its exclusive queues went with it, and a settle queue it consumed expires on
/// its own.
pub(crate) async fn delete_queue(
    amqp: &Amqp,
    pooled: &PooledConnection,
    channel: Option<&Channel>,
    queue: &str,
) -> Result<(), Error> {
    let timeout = amqp.config().operation_timeout;
    if let Some(channel) = channel.filter(|c| c.status().connected()) {
        if wire::delete(channel, queue, timeout).await.is_ok() {
            return Ok(());
        }
    }
    let connection = pooled.connection();
    if !connection.status().connected() {
        return Ok(());
    }
    let result = match pool::open_channel(pooled, timeout).await {
        Ok(channel) => {
            let deleted = wire::delete(&channel, queue, timeout).await;
            wire::close_channel(&channel, timeout).await;
            deleted
        }
        Err(failure) => Err(failure),
    };
    match result {
        Ok(()) => Ok(()),
        Err(_) if !connection.status().connected() => Ok(()),
        Err(failure) => Err(amqp.unreachable(&format!("delete the queue {queue:?}"), failure)),
    }
}
