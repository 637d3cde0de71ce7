//! The public backend, [`Etcd`]: its own methods and its [`Backend`] implementation, which call
//! down into the recipes (leader, semaphore: the `queue` module), the observer, the sequencer
//! check and the client.

use std::fmt;
use std::sync::Arc;

use super::check;
use super::client::EtcdClient;
use super::leader::Leader;
use super::observe;
use super::queue;
use super::semaphore::Semaphore;
use super::slot;
use lease_core::backend::Reachability;
use lease_core::leader::LeaderObserver;
use lease_core::{Backend, BackendKind, BoxFuture, Error, Lease, LeaseSpec, Sequencer, Target};

/// Leases on etcd. Cloning is cheap, and clones share the connections (two per endpoint).
///
/// # Examples
///
/// ```no_run
/// # async fn example() -> Result<(), lease_core::Error> {
/// use lease_core::{Backend, LeaseSpec};
/// use lease_etcd::Etcd;
///
/// let etcd = Etcd::from_env()?; // ETCD_ENDPOINTS, ETCD_USER, ETCD_PASSWORD, ETCD_CACERT, ...
/// let lease = etcd.acquire(&LeaseSpec::leader("service/api/leader").value("10.0.0.7:8080")).await?;
/// // etcd:<create revision>:<lease ID>:service/api/leader — rises with every acquisition.
/// let token = lease.sequencer().to_string();
/// lease.run(async { /* only the leader gets here */ }).await?;
/// lease.release().await?;
/// # let _ = token;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Etcd {
    pub(crate) http: Arc<EtcdClient>,
}

impl fmt::Debug for Etcd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Etcd")
            .field("endpoints", &self.http.wire().address())
            .finish_non_exhaustive()
    }
}

impl Etcd {
    pub(crate) fn from_client(http: Arc<EtcdClient>) -> Etcd {
        Etcd { http }
    }

    /// The endpoints, comma-separated.
    pub fn endpoints(&self) -> String {
        self.http.wire().address()
    }

    /// How many requests this client (and its clones) has sent to etcd, for measuring: calls,
    /// and the messages on its watch and keep-alive streams.
    pub fn requests_sent(&self) -> u64 {
        self.http.wire().requests_sent()
    }

    /// Whether `sequencer` still names a current holder: of its election, or of a slot of its
    /// semaphore. One linearizable read (a read-only transaction).
    ///
    /// This is the check a downstream service makes on work handed to it with a sequencer.
    /// `Err(Error::Lost(_))` says why it is stale.
    pub async fn check_sequencer(&self, sequencer: &Sequencer) -> Result<(), Error> {
        check::check_sequencer(&self.http, sequencer).await
    }

    /// Operator action: revokes the etcd lease a sequencer's holder names (its hex ID, as
    /// `etcdctl lease revoke` takes it, optionally followed by `_<n>`), deleting its keys and taking their leases away from
    /// their holders (every lease of that process on the same pooled etcd lease), whose work is
    /// cancelled when they notice. `Ok(false)` if it no longer existed.
    pub async fn revoke_lease(&self, holder: &str) -> Result<bool, Error> {
        let id = slot::lease_of(holder)
            .ok_or_else(|| Error::config(format!("{holder:?} is not an etcd lease ID (hex)")))?;
        let wire = self.http.wire();
        wire.lease_revoke(id)
            .await
            .map_err(|e| e.into_error(wire, format_args!("revoke lease {holder}")))
    }

    /// Operator action: deletes `key` and every key under `key/` (an election's or a
    /// semaphore's contenders), as `etcdctl del` would. Their holders lose their leases with
    /// [`LostReason::KeyDeleted`](lease_core::LostReason::KeyDeleted). Returns how many keys went.
    pub async fn delete_key(&self, key: &str) -> Result<u64, Error> {
        lease_core::validate_key(key)?;
        let wire = self.http.wire();
        let deleted = wire
            .delete(key, true)
            .await
            .map_err(|e| e.into_error(wire, format_args!("delete {key:?}")))?;
        Ok(u64::try_from(deleted).unwrap_or_default())
    }
}

impl Backend for Etcd {
    fn acquire<'a>(&'a self, spec: &'a LeaseSpec) -> BoxFuture<'a, Result<Lease, Error>> {
        lease_core::backend::instrument_acquire(BackendKind::Etcd, spec, async move {
            spec.validate()?;
            let backend: Arc<dyn Backend> = Arc::new(self.clone());
            match spec.target() {
                Target::Leader { .. } => queue::acquire(&self.http, spec, Leader, backend).await,
                Target::Semaphore { limit, .. } => {
                    let semaphore = Semaphore { limit: *limit };
                    queue::acquire(&self.http, spec, semaphore, backend).await
                }
                other => Err(other.unsupported("Etcd")),
            }
        })
    }

    fn observe_leader<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<LeaderObserver, Error>> {
        Box::pin(observe::observe(&self.http, key))
    }

    fn check_sequencer<'a>(&'a self, sequencer: &'a Sequencer) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(Etcd::check_sequencer(self, sequencer))
    }

    fn reachability(&self) -> Reachability {
        self.http.probed_reachability()
    }

    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(self.http.shutdown())
    }
}
