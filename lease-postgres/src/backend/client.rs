//! The one owner of a handle's shared machinery ([`Shared`]): the wire, the holder tasks
//! (lease-core's `Keepers`), the listener, the renewer, the releaser and the attempt batcher.
//! It starts each background task with what the task needs (the wire, weakly, and the task's
//! own state), so no task reaches back to it; a lease's hold and an observation keep it while
//! they live, which keeps the connections open.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use lease_core::backend::{Fence, Keepers};
use lease_core::{Error, LostReason};
use tokio::sync::oneshot;

use super::attempt::{Attempt, Attempts, InFlight};
use super::listen::{Listener, Subscription};
use super::release::Releaser;
use super::renew::Renewer;
use super::wire::Wire;

/// The state every clone of one backend shares: the wire side, and the machinery that runs on
/// it (the holder tasks, the listener, the renewer, the releaser and the attempt batcher). Each
/// background task is handed what it needs when it starts (the wire, weakly, and its own
/// state), never this.
pub(crate) struct Shared {
    pub(crate) wire: Arc<Wire>,
    pub(crate) keepers: Keepers,
    listener: Listener,
    renewer: Renewer,
    releaser: Arc<Releaser>,
    attempts: Attempts,
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shared")
            .field("address", &self.wire.address)
            .field("schema", &self.wire.schema)
            .finish_non_exhaustive()
    }
}

impl Shared {
    pub(crate) fn new(wire: Wire) -> Shared {
        Shared {
            wire: Arc::new(wire),
            keepers: Keepers::new(),
            listener: Listener::default(),
            renewer: Renewer::default(),
            releaser: Arc::default(),
            attempts: Attempts::default(),
        }
    }

    /// Queues `attempt` to go with the attempts queued beside it (one try, no retry); its answer
    /// arrives in what this returns.
    pub(crate) fn attempt(&self, attempt: Attempt) -> InFlight {
        super::attempt::attempt(&self.attempts, &self.wire, attempt)
    }

    /// Gives `holder`'s row of `key` back, with the releases queued beside it.
    pub(crate) async fn release(&self, key: &str, holder: &str) -> Result<(), Error> {
        super::release::release(&self.releaser, &self.wire, key, holder).await
    }

    /// Subscribes to `key`'s notifications, starting the listening task on first use.
    pub(crate) fn subscribe(&self, key: &str) -> Subscription {
        self.listener.subscribe(&self.wire, key)
    }

    /// Renews `holder`'s row from now on; the receiver completes if a renewal finds it gone.
    pub(crate) fn renew(
        &self,
        holder: &str,
        ttl: Duration,
        fence: Fence,
    ) -> oneshot::Receiver<LostReason> {
        self.renewer.register(&self.wire, holder, ttl, fence)
    }

    /// Stops renewing `holder` (released, or lost).
    pub(crate) fn stop_renewing(&self, holder: &str) {
        self.renewer.unregister(holder);
    }
}
