//! The one owner of a handle's shared machinery ([`Shared`]): the wire (its two connections,
//! who listens for what), the holder tasks (lease-core's `Keepers`) and the renewer. It hands
//! each background task what the task needs when it starts (the wire, weakly, and the task's own
//! state), so no task reaches back to it; a lease's hold and an observation keep it while they
//! live, which keeps the connections open.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use lease_core::LostReason;
use lease_core::backend::{Fence, Keepers};
use tokio::sync::oneshot;

use crate::renew::{Kind, Renewer};
use crate::wire::Wire;

/// The state every clone of one backend shares.
pub(crate) struct Shared {
    pub(crate) wire: Arc<Wire>,
    pub(crate) keepers: Keepers,
    renewer: Renewer,
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shared")
            .field("address", &self.wire.address)
            .field("prefix", &self.wire.prefix)
            .finish_non_exhaustive()
    }
}

impl Shared {
    pub(crate) fn new(wire: Wire) -> Shared {
        Shared {
            wire: Arc::new(wire),
            keepers: Keepers::new(),
            renewer: Renewer::default(),
        }
    }

    /// Renews `holder`'s lease from now on; the receiver completes if a renewal finds it gone.
    pub(crate) fn renew(
        &self,
        holder: &str,
        base: &str,
        kind: Kind,
        ttl: Duration,
        fence: Fence,
    ) -> oneshot::Receiver<LostReason> {
        self.renewer
            .register(&self.wire, holder, base, kind, ttl, fence)
    }

    /// Checks `holder`'s lease at once (its key changed, or the connection is back).
    pub(crate) fn check_now(&self, holder: &str) {
        self.renewer.check_now(&self.wire, holder);
    }

    /// Stops renewing `holder` (released, or lost).
    pub(crate) fn stop_renewing(&self, holder: &str) {
        self.renewer.unregister(holder);
    }

    /// How many leases this handle renews.
    pub(crate) fn held(&self) -> usize {
        self.renewer.len()
    }
}
