//! The public backend type, [`Consul`], and its `impl Backend`: calls down into the recipes
//! (leader, semaphore, observe) and the wire client.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::client::Client;
use crate::leader::{self, UnheldKey};
use crate::observe;
use crate::semaphore::{self, SemaphoreState};
use crate::wire::ConsulHttp;
use lease_core::backend::Reachability;
use lease_core::leader::LeaderObserver;
use lease_core::{Backend, BackendKind, BoxFuture, Error, Lease, LeaseSpec, Sequencer, Target};

/// Leases on Consul. Cloning is cheap and clones share one connection pool.
///
/// # Examples
///
/// ```no_run
/// # async fn example() -> Result<(), lease_core::Error> {
/// use lease_core::{Backend, LeaseSpec};
/// use lease_consul::Consul;
///
/// let consul = Consul::from_env()?; // CONSUL_HTTP_ADDR, CONSUL_HTTP_TOKEN, ...
/// let lease = consul.acquire(&LeaseSpec::leader("service/api/leader").value("10.0.0.7:8080")).await?;
/// lease.run(async { /* only the leader gets here */ }).await?;
/// lease.release().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Consul {
    client: Arc<Client>,
    semaphores: Arc<semaphore::Semaphores>,
}

impl Consul {
    /// The wire client of this backend's client.
    fn wire(&self) -> &Arc<ConsulHttp> {
        self.client.wire()
    }

    /// The client this backend and its clones share (for the crate's tests).
    #[cfg(test)]
    pub(crate) fn client(&self) -> &Arc<Client> {
        &self.client
    }
}

impl fmt::Debug for Consul {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Consul")
            .field("address", &self.client.wire().address())
            .finish_non_exhaustive()
    }
}

impl Consul {
    pub(crate) fn from_parts(client: Arc<Client>, pool_idle_for: Option<Duration>) -> Consul {
        Consul {
            client,
            semaphores: Arc::new(semaphore::Semaphores::new(pool_idle_for)),
        }
    }

    /// How many HTTP requests this client (and its clones) has sent to Consul, for measuring.
    pub fn requests_sent(&self) -> u64 {
        self.wire().requests_sent()
    }

    /// How many of those were writes (PUT or DELETE; each one a Raft apply in Consul).
    pub fn writes_sent(&self) -> u64 {
        self.wire().writes_sent()
    }

    /// How many prefix watches (blocking queries, each on one connection) this client runs now:
    /// at most `max_connections − 2` (`− 3` with a client of your own), however many leases it
    /// holds or waits for.
    pub fn prefix_watches(&self) -> usize {
        self.client.watches().groups()
    }

    /// How many semaphore compare-and-set writes this client lost to other contenders.
    pub fn cas_conflicts(&self) -> u64 {
        self.wire().cas_conflicts()
    }

    /// Whether `sequencer` still names a current holder: of its leader key, or (for a semaphore
    /// contender key) of a slot of its semaphore. One consistent read.
    ///
    /// This is the check a downstream service makes on work handed to it with a sequencer.
    /// `Err(Error::Lost(_))` says why it is stale.
    pub async fn check_sequencer(&self, sequencer: &Sequencer) -> Result<(), Error> {
        let (entry, _) =
            self.wire().kv_get(sequencer.key()).await.map_err(|e| {
                e.into_error(self.wire(), format_args!("read {:?}", sequencer.key()))
            })?;
        match (entry, semaphore::prefix_of(sequencer)) {
            (Some(e), Some(prefix)) if e.flags == semaphore::SEMAPHORE_FLAGS => {
                semaphore::check_sequencer(self.wire(), prefix, sequencer).await
            }
            _ => leader::check_sequencer(self.wire(), sequencer).await,
        }
    }

    /// Operator action: destroys session `id` (`PUT /v1/session/destroy/<id>`), taking every lease
    /// it holds away from its holder — the holder's work is cancelled when it notices. Lock-delay
    /// then keeps the keys it held from being taken for the session's lock-delay.
    pub async fn destroy_session(&self, id: &str) -> Result<(), Error> {
        self.wire()
            .session_destroy(id)
            .await
            .map_err(|e| e.into_error(self.wire(), format_args!("destroy session {id}")))
    }

    /// Deletes the leader key `key` if nobody holds it, as `consul lock` does once its child has
    /// exited, so a released lock leaves no key behind. A held key, a key taken between the read
    /// and the delete, or a key that is not a leader lock (other flags) is left alone. Returns
    /// whether the key was deleted.
    ///
    /// A contender waiting for the key is not delayed by the deletion: the key was released
    /// first, and a release is not a loss.
    pub async fn remove_unheld_key(&self, key: &str) -> Result<bool, Error> {
        lease_core::validate_key(key)?;
        leader::remove_unheld(self.wire(), key).await
    }

    /// Operator action: the leader keys under `prefix` (a plain string prefix of key names, as
    /// Consul's `?recurse` reads it) that no session holds, as one consistent read finds them.
    /// Only keys with the leader lock's flags (this crate's and `consul lock`'s) are listed.
    ///
    /// Consul keeps a leader key after its release (this crate keeps it on purpose: its
    /// LockIndex, the sequencer's index, rises only while the key lives), so a service with a
    /// lease per customer or per job leaves a key per name for ever. With
    /// [`remove_unheld_key_as_found`](Self::remove_unheld_key_as_found) this is the clean-up
    /// (`lease gc`). A key removed and taken again starts its LockIndex at 1.
    pub async fn unheld_leader_keys(&self, prefix: &str) -> Result<Vec<UnheldKey>, Error> {
        leader::unheld(self.wire(), prefix).await
    }

    /// Deletes the key `found` names if it is still exactly as
    /// [`unheld_leader_keys`](Self::unheld_leader_keys) found it: a compare-and-set on its
    /// ModifyIndex, so a key acquired, released or written since (even one taken and let go
    /// again) is left alone. Returns whether the key was deleted.
    pub async fn remove_unheld_key_as_found(&self, found: &UnheldKey) -> Result<bool, Error> {
        leader::remove_as_found(self.wire(), found).await
    }

    /// Who holds the semaphore at `prefix` (one consistent read), for operators and tools such
    /// as `lease status -n`: its stored limit and its live holders. A semaphore nobody has used
    /// has no limit and no holders.
    pub async fn semaphore_state(&self, prefix: &str) -> Result<SemaphoreState, Error> {
        lease_core::validate_key(prefix)?;
        semaphore::state(self.wire(), prefix).await
    }

    /// Removes the semaphore at `prefix` (its `.lock` key) if no live holder remains; refuses
    /// with [`Error::SemaphoreInUse`] while holders remain.
    pub async fn destroy_semaphore(&self, prefix: &str) -> Result<(), Error> {
        lease_core::validate_key(prefix)?;
        semaphore::destroy(self.wire(), prefix).await
    }
}

impl Backend for Consul {
    fn acquire<'a>(&'a self, spec: &'a LeaseSpec) -> BoxFuture<'a, Result<Lease, Error>> {
        lease_core::backend::instrument_acquire(BackendKind::Consul, spec, async move {
            spec.validate()?;
            let backend: Arc<dyn Backend> = Arc::new(self.clone());
            match spec.target() {
                Target::Leader { .. } => leader::acquire(&self.client, spec, backend).await,
                Target::Semaphore { .. } => {
                    semaphore::acquire(&self.client, &self.semaphores, spec, backend).await
                }
                other => Err(other.unsupported("Consul")),
            }
        })
    }

    fn observe_leader<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<LeaderObserver, Error>> {
        Box::pin(observe::observe(&self.client, key))
    }

    fn check_sequencer<'a>(&'a self, sequencer: &'a Sequencer) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(Consul::check_sequencer(self, sequencer))
    }

    fn reachability(&self) -> Reachability {
        self.client.probed_reachability()
    }

    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(self.client.keepers().shutdown())
    }
}
