//! The etcd backend: leases on etcd leases, revisions and watches, over etcd's v3 gRPC API.
//!
//! [`Etcd`] is a cheap, cloneable handle (two HTTP/2 connections per endpoint in use, shared by
//! its clones): one carries the calls, the other one `Watch` stream with every watch of the
//! process and one `LeaseKeepAlive` stream. A lease or a waiter costs no connection of its own. Acquisitions attach their keys to a few pooled etcd leases per TTL, each kept alive every
//! TTL/3 for all the keys on it, so keep-alives do not grow with the leases held.
//!
//! - **Leader**: the recipe of etcd's `concurrency.Election`, so a lease here and
//!   `etcdctl elect <name>` exclude each other on the same name: each contender creates
//!   `<key>/<lease ID in hex>` with its lease (`<key>/<lease ID in hex>_<n>` for the second and
//!   later contenders of this process on one name and lease), the oldest key (lowest create
//!   revision) leads, and
//!   a waiter watches only the key just before its own.
//! - **Semaphore (limit N)**: the N oldest keys under `<prefix>/` hold; waiters are admitted in
//!   arrival order (FIFO), each time a key ahead of them is deleted.
//! - **One kind per name**: a key's value says whether it is a semaphore contender (our format)
//!   or a leader contender, and a contender that finds the other kind ahead of it is refused at
//!   once with [`Error::FlagsConflict`], at no extra request.
//! - **Sequencer**: `etcd:<create revision>:<holder>:<key>`, the holder being the own key's part
//!   after `<key>/` (`<lease ID hex>` or `<lease ID hex>_<n>`) and the key the election name for a
//!   leader, the holder's own key for a semaphore. The create revision rises with every write anywhere
//!   in the cluster, so a downstream system can refuse any token older than the newest it has
//!   seen, even across keys: a property Consul's per-key LockIndex lacks.
//! - **Loss**: the own key deleted or its lease revoked (a watch on the own key), the keep-alive
//!   ending (etcd says the lease is gone), or the self-fence: no keep-alive answered for
//!   [`LeaseSpec::fence_after`] (the TTL less a tenth, at least a second), which is before etcd
//!   could expire the lease.
//! - **No lock-delay; waiters settle instead**: etcd has none, and the spec's lock-delay is
//!   ignored. A holder releases by touching its key, then deleting it, so waiters can tell
//!   a release (taken at once) from a key that went under a holder still running (deleted by an
//!   operator, its lease revoked or expired): after that, they wait
//!   [`LeaseSpec::settle_time`] while the old holder notices and stops. A holder that is slower
//!   than that is fenced by the next holder's higher revision: downstream systems that check the
//!   sequencer refuse it.
//!
//! The messages are hand-written prost structs for the few calls used, so a build needs no
//! protobuf compiler and no build script. An etcd lease is shared by the acquisitions on it: one
//! revoked (`etcdctl lease revoke`, [`Etcd::revoke_lease`]) or expired loses every lease of this
//! process on it.

mod client;
mod config;
mod observe;
mod pool;
mod queue;
mod session;
mod watch;
mod wire;

use std::fmt;
use std::sync::Arc;

pub use config::EtcdBuilder;

use client::EtcdClient;
use lease_core::backend::Reachability;
use lease_core::leader::LeaderObserver;
use lease_core::{Backend, BackendKind, BoxFuture, Error, Lease, LeaseSpec, Sequencer, Target};
use queue::{Leader, Semaphore};

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
    http: Arc<EtcdClient>,
}

impl fmt::Debug for Etcd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Etcd")
            .field("endpoints", &self.http.wire().address())
            .finish_non_exhaustive()
    }
}

impl Etcd {
    /// A builder with etcd's defaults (`http://127.0.0.1:2379`), ignoring the environment.
    pub fn builder() -> EtcdBuilder {
        EtcdBuilder::new()
    }

    /// A backend configured from the environment (see [`EtcdBuilder::from_env`]).
    pub fn from_env() -> Result<Etcd, Error> {
        EtcdBuilder::from_env().build()
    }

    fn from_client(http: Arc<EtcdClient>) -> Etcd {
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
        queue::check_sequencer(&self.http, sequencer).await
    }

    /// Operator action: revokes the etcd lease a sequencer's holder names (its hex ID, as
    /// `etcdctl lease revoke` takes it, optionally followed by `_<n>`), deleting its keys and taking their leases away from
    /// their holders (every lease of that process on the same pooled etcd lease), whose work is
    /// cancelled when they notice. `Ok(false)` if it no longer existed.
    pub async fn revoke_lease(&self, holder: &str) -> Result<bool, Error> {
        let id = session::lease_of(holder)
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

/// The examples of this crate's README (what crates.io shows), compiled as doctests so that the
/// front page cannot drift from the API; `tests/tests/readmes.rs` of the workspace checks the
/// features, commands and links it names.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
