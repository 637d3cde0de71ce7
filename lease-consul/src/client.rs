//! The one owner of a client's shared machinery: the wire client, the prefix watches, the
//! heartbeats its sessions are tied to, the holder tasks of its leases (Keepers), the sessions
//! it released lately and the reachability probe.
//!
//! [`Consul`](crate::Consul) and its clones share one [`Client`]. The recipes (leader, semaphore,
//! observe) and the sessions they create reach everything through it; what runs in the
//! background is handed what it needs when it starts (a watch's group task and the heartbeat the
//! wire client, a semaphore coordinator the wire client and the watches), never the client
//! itself. The clean-ups that run on the detached runtime use a copy of the wire client only
//! ([`ConsulHttp::detached`]).

use std::sync::Arc;

use crate::keepalive::{KeepAlive, KeepAlives};
use crate::session::ReleasedSessions;
use crate::watch::Watches;
use crate::wire::ConsulHttp;
use lease_core::backend::{Keepers, Reachability};

/// What every lease of a client shares.
#[derive(Debug)]
pub(crate) struct Client {
    wire: Arc<ConsulHttp>,
    /// The holder tasks of every lease this client (and its clones) acquired.
    keepers: Keepers,
    /// Every blocking query of this client, multiplexed.
    watches: Watches,
    /// The heartbeat checks this client's sessions are tied to.
    keep_alives: KeepAlives,
    /// The sessions this client gave back with a clean release, lately.
    released: ReleasedSessions,
    /// Probes the agent while it is unreachable (see [`Client::probed_reachability`]).
    probe: lease_http::Probe,
}

impl Client {
    /// The machinery around `wire`, keeping sessions alive as `keep_alive` says.
    pub(crate) fn new(wire: Arc<ConsulHttp>, keep_alive: KeepAlive) -> Arc<Client> {
        let keepers = Keepers::new();
        Arc::new(Client {
            watches: Watches::new(Arc::clone(&wire)),
            keep_alives: KeepAlives::new(keep_alive, Arc::clone(&wire), keepers.clone()),
            keepers,
            wire,
            released: ReleasedSessions::default(),
            probe: lease_http::Probe::default(),
        })
    }

    /// The wire client: one method per Consul call.
    pub(crate) fn wire(&self) -> &Arc<ConsulHttp> {
        &self.wire
    }

    /// The holder tasks of this client's leases.
    pub(crate) fn keepers(&self) -> &Keepers {
        &self.keepers
    }

    /// The prefix watches of this client.
    pub(crate) fn watches(&self) -> &Watches {
        &self.watches
    }

    /// The heartbeats of this client's sessions.
    pub(crate) fn keep_alives(&self) -> &KeepAlives {
        &self.keep_alives
    }

    /// The sessions this client gave back with a clean release, lately.
    pub(crate) fn released(&self) -> &ReleasedSessions {
        &self.released
    }

    /// Whether the agent answered this client's last request, probing it in the background while
    /// it did not (`GET /v1/status/leader` about every second, until one is answered), so that
    /// the answer turns current again without other traffic.
    pub(crate) fn probed_reachability(&self) -> Reachability {
        self.probe
            .watch(&self.wire, ConsulHttp::reachability, |wire| async move {
                // Any answer, a 500 "No cluster leader" too, is the agent answering.
                let _ = wire.status_leader().await;
            })
    }
}
