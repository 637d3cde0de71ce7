//! The one owner of the client's shared machinery: the wire client every call goes through
//! ([`Wire`]), the pooled etcd leases and their keep-alive stream ([`Pool`]), the watches and
//! their stream ([`Watches`]), the holder tasks of every lease ([`Keepers`]), the probe while etcd
//! is unreachable, and the token that ends the stream tasks when the client goes.
//!
//! The stream tasks are handed the wire client and the state they serve when they start (as
//! etcd's Go lessor and watcher hold only their gRPC stubs), never this owner: it is dropped with
//! the last [`Etcd`](crate::Etcd) clone, acquisition or observer that holds it, and its drop ends
//! them. The clean-ups that run on the detached runtime get a copy of the wire client only, on
//! connections of its own ([`EtcdClient::detached`]).

use std::fmt;
use std::sync::{Arc, OnceLock};

use tokio_util::sync::CancellationToken;

use super::pool::{self, Attached, Pool};
use super::watch::{WatchStream, Watches};
use super::wire::proto::RangeRequest;
use super::wire::{ApiError, Wire};
use lease_core::LeaseSpec;
use lease_core::backend::{Keepers, Reachability};

/// The shared machinery of an [`Etcd`](crate::Etcd) and its clones.
pub(crate) struct EtcdClient {
    wire: Arc<Wire>,
    pool: Arc<Pool>,
    watches: Arc<Watches>,
    /// The holder tasks of every lease this client (and its clones) acquired.
    keepers: Keepers,
    /// The wire client on connections of the clean-up runtime, built by the first clean-up that
    /// needs it (see [`EtcdClient::detached`]).
    detached: OnceLock<Option<Arc<Wire>>>,
    /// Probes etcd while it is unreachable (see [`EtcdClient::probed_reachability`]).
    probe: lease_http::Probe,
    /// Cancelled when the client is dropped: ends the stream tasks.
    closed: CancellationToken,
}

impl fmt::Debug for EtcdClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdClient")
            .field("wire", &self.wire)
            .finish_non_exhaustive()
    }
}

impl Drop for EtcdClient {
    fn drop(&mut self) {
        self.closed.cancel();
    }
}

impl EtcdClient {
    pub(crate) fn new(wire: Wire) -> Arc<EtcdClient> {
        let pool = Arc::new(Pool::default());
        Arc::new(EtcdClient {
            wire: Arc::new(wire),
            watches: Arc::new(Watches::new(Arc::clone(&pool))),
            pool,
            keepers: Keepers::new(),
            detached: OnceLock::new(),
            probe: lease_http::Probe::default(),
            closed: CancellationToken::new(),
        })
    }

    /// The wire client: etcd's calls.
    pub(crate) fn wire(&self) -> &Wire {
        &self.wire
    }

    /// The wire client on its own connections, for the clean-ups that run on the detached
    /// runtime. Built once and shared by every clean-up of this client.
    pub(crate) fn detached(&self) -> Option<Arc<Wire>> {
        self.detached
            .get_or_init(|| self.wire.twin().ok().map(Arc::new))
            .clone()
    }

    pub(crate) fn keepers(&self) -> &Keepers {
        &self.keepers
    }

    pub(crate) fn pool(&self) -> &Pool {
        &self.pool
    }

    #[cfg(test)]
    pub(crate) fn watches(&self) -> &Watches {
        &self.watches
    }

    /// A place for a contender of `spec` on a pooled etcd lease (see [`Pool::attach`]).
    pub(crate) async fn attach(&self, spec: &LeaseSpec) -> Result<Attached, ApiError> {
        Pool::attach(&self.pool, &self.wire, &self.closed, spec).await
    }

    /// A watch of `range` from `start_revision` on, each event with the key as it was before
    /// (`prev_kv`), on the client's one watch stream. Etcd has created it when this returns.
    pub(crate) async fn watch(
        &self,
        range: &RangeRequest,
        start_revision: i64,
    ) -> Result<WatchStream, ApiError> {
        Watches::watch(
            &self.watches,
            &self.wire,
            &self.closed,
            range,
            start_revision,
        )
        .await
    }

    /// As [`watch`](EtcdClient::watch), on one etcd watch shared by every watcher of `range` in
    /// this process (see the `watch` module).
    pub(crate) async fn watch_shared(
        &self,
        range: &RangeRequest,
        start_revision: i64,
    ) -> Result<WatchStream, ApiError> {
        Watches::watch_shared(
            &self.watches,
            &self.wire,
            &self.closed,
            range,
            start_revision,
        )
        .await
    }

    /// Whether an endpoint answered this client's last request, probing etcd in the background
    /// while none did (a one-key read about every second, until one is answered), so that the
    /// answer turns current again without other traffic.
    pub(crate) fn probed_reachability(&self) -> Reachability {
        self.probe
            .watch(&self.wire, Wire::reachability, |wire| async move {
                // Any answer, an error status too, is etcd answering.
                let _ = wire.range(&RangeRequest::probe()).await;
            })
    }

    /// Ends every lease (their holder tasks), then revokes the pooled etcd leases left (an
    /// acquire still running).
    pub(crate) async fn shutdown(&self) {
        self.keepers.shutdown().await;
        // Every lease is given back, and with it every pooled etcd lease; any left (an
        // acquire still running) goes too.
        for id in self.pool.drain() {
            let _ = pool::revoke(&self.wire, id).await;
        }
    }
}
