//! The Consul backend: leases on Consul sessions and KV.
//!
//! [`Consul`] is a cheap, cloneable handle (an HTTP client and its configuration). Each acquired
//! lease has its own session, and is watched with blocking queries, so loss is noticed as soon as
//! Consul knows it.
//!
//! # Many leases per process
//!
//! A client uses at most [`ConsulBuilder::max_connections`] connections (default 8) however many
//! leases it holds, so ten processes on one host stay under the agent's default limit of 200 per
//! client IP (`limits.http_max_conns_per_client`):
//!
//! - **Connections are counted.** The client's connector holds one of `max_connections`
//!   permits per open connection (plain or TLS), from connect to close. Through a client of your
//!   own, requests are bounded instead; see [`ConsulBuilder::max_connections`].
//! - **Watches are shared.** Every blocking query goes through at most `max_connections − 2`
//!   recursive prefix watches covering every key some lease, waiter or observer cares about; an
//!   answer wakes only the watchers whose keys changed. Every key someone cares about is covered
//!   by a blocking read at every moment, except while its watch starts, widens or recovers from a
//!   failed read (one plain listing: milliseconds); a held lease that no read covers stops
//!   counting its heartbeat from that moment, so it self-fences rather than run unwatched. The
//!   price: an answer carries every key under its prefix, so a loss among many keys in one
//!   directory is read as one large listing (the workspace's BENCHMARKS.md has the figures).
//! - **One heartbeat keeps every session alive.** Sessions are tied to one agent TTL check per
//!   process (a service `lease`), passed every TTL/2: idle traffic does not grow with the number
//!   of leases, and each lease keeps its own session, so destroying one session loses one lease.
//!   A process that dies loses its leases one TTL after its last pass. See [`KeepAlive`] for the
//!   per-session alternative (and the ACL it needs).
//! - **No retry storms.** After a refused, dropped or unreachable request the client sends one
//!   request at a time, paced by a jittered backoff from 100 ms to 2 s: at most 20 requests per
//!   second during an outage. Leases are still given up at their fence deadline, never later.
//!
//! Await [`Backend::shutdown`] before the process exits to give every lease back at once; a
//! process that exits without it (its runtime dropping the holder tasks) still releases its keys
//! and destroys its sessions from a detached runtime, within about a second.
//!
//! Interoperation: `consul lock PREFIX cmd` holds the key `PREFIX/.lock`; a leader lease on that
//! key uses the same flags, so the two exclude each other. A semaphore on `PREFIX` shares its
//! slots with `consul lock -n N PREFIX cmd`.

mod config;
mod keepalive;
mod kind;
mod leader;
mod observe;
mod retry;
mod semaphore;
mod session;
mod watch;
mod wire;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

pub use config::{ConsulBuilder, KeepAlive};

use lease_core::backend::Reachability;
use lease_core::leader::LeaderObserver;
use lease_core::{Backend, BackendKind, BoxFuture, Error, Lease, LeaseSpec, Sequencer, Target};
use wire::ConsulHttp;

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
    http: Arc<ConsulHttp>,
    semaphores: Arc<semaphore::Semaphores>,
}

impl fmt::Debug for Consul {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Consul")
            .field("address", &self.http.address())
            .finish_non_exhaustive()
    }
}

impl Consul {
    /// A builder with Consul's defaults, ignoring the environment.
    pub fn builder() -> ConsulBuilder {
        ConsulBuilder::new()
    }

    /// A backend configured from the environment as the `consul` CLI is
    /// (see [`ConsulBuilder::from_env`]).
    pub fn from_env() -> Result<Consul, Error> {
        ConsulBuilder::from_env().build()
    }

    pub(crate) fn from_parts(http: Arc<ConsulHttp>, pool_idle_for: Option<Duration>) -> Consul {
        Consul {
            http,
            semaphores: Arc::new(semaphore::Semaphores::new(pool_idle_for)),
        }
    }

    /// How many HTTP requests this client (and its clones) has sent to Consul, for measuring.
    pub fn requests_sent(&self) -> u64 {
        self.http.requests_sent()
    }

    /// How many of those were writes (PUT or DELETE; each one a Raft apply in Consul).
    pub fn writes_sent(&self) -> u64 {
        self.http.writes_sent()
    }

    /// How many prefix watches (blocking queries, each on one connection) this client runs now:
    /// at most `max_connections − 2` (`− 3` with a client of your own), however many leases it
    /// holds or waits for.
    pub fn prefix_watches(&self) -> usize {
        self.http.watches().groups()
    }

    /// How many semaphore compare-and-set writes this client lost to other contenders.
    pub fn cas_conflicts(&self) -> u64 {
        self.http.cas_conflicts()
    }

    /// Whether `sequencer` still names a current holder: of its leader key, or (for a semaphore
    /// contender key) of a slot of its semaphore. One consistent read.
    ///
    /// This is the check a downstream service makes on work handed to it with a sequencer.
    /// `Err(Error::Lost(_))` says why it is stale.
    pub async fn check_sequencer(&self, sequencer: &Sequencer) -> Result<(), Error> {
        let (entry, _) =
            self.http.kv_get(sequencer.key()).await.map_err(|e| {
                e.into_error(&self.http, format_args!("read {:?}", sequencer.key()))
            })?;
        match (entry, semaphore::prefix_of(sequencer)) {
            (Some(e), Some(prefix)) if e.flags == semaphore::SEMAPHORE_FLAGS => {
                semaphore::check_sequencer(&self.http, prefix, sequencer).await
            }
            _ => leader::check_sequencer(&self.http, sequencer).await,
        }
    }

    /// Operator action: destroys session `id` (`PUT /v1/session/destroy/<id>`), taking every lease
    /// it holds away from its holder — the holder's work is cancelled when it notices. Lock-delay
    /// then keeps the keys it held from being taken for the session's lock-delay.
    pub async fn destroy_session(&self, id: &str) -> Result<(), Error> {
        self.http
            .session_destroy(id)
            .await
            .map_err(|e| e.into_error(&self.http, format_args!("destroy session {id}")))
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
        leader::remove_unheld(&self.http, key).await
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
        leader::unheld(&self.http, prefix).await
    }

    /// Deletes the key `found` names if it is still exactly as
    /// [`unheld_leader_keys`](Self::unheld_leader_keys) found it: a compare-and-set on its
    /// ModifyIndex, so a key acquired, released or written since (even one taken and let go
    /// again) is left alone. Returns whether the key was deleted.
    pub async fn remove_unheld_key_as_found(&self, found: &UnheldKey) -> Result<bool, Error> {
        leader::remove_as_found(&self.http, found).await
    }

    /// Who holds the semaphore at `prefix` (one consistent read), for operators and tools such
    /// as `lease status -n`: its stored limit and its live holders. A semaphore nobody has used
    /// has no limit and no holders.
    pub async fn semaphore_state(&self, prefix: &str) -> Result<SemaphoreState, Error> {
        lease_core::validate_key(prefix)?;
        semaphore::state(&self.http, prefix).await
    }

    /// Removes the semaphore at `prefix` (its `.lock` key) if no live holder remains; refuses
    /// with [`Error::SemaphoreInUse`] while holders remain.
    pub async fn destroy_semaphore(&self, prefix: &str) -> Result<(), Error> {
        lease_core::validate_key(prefix)?;
        semaphore::destroy(&self.http, prefix).await
    }
}

/// A leader key nobody holds, as [`Consul::unheld_leader_keys`] found it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct UnheldKey {
    /// The key.
    pub key: String,
    /// Its LockIndex: how many times it was acquired since it was created.
    pub lock_index: u64,
    /// Its CreateIndex: the Raft index at which it was created (higher for every re-creation).
    pub create_index: u64,
    /// Its ModifyIndex when found: any acquisition, release or write changes it.
    pub modify_index: u64,
}

/// A Consul semaphore as one read found it ([`Consul::semaphore_state`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SemaphoreState {
    /// The limit stored in its `.lock` key; `None` if there is no `.lock` key.
    pub limit: Option<u64>,
    /// The holders recorded in `.lock` whose sessions are alive.
    pub holders: Vec<SemaphoreHolder>,
}

/// One live holder of a Consul semaphore.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SemaphoreHolder {
    /// Its session.
    pub session: String,
    /// The value it advertises in its contender key.
    pub value: Vec<u8>,
    /// Its sequencer (contender key, that key's LockIndex, session).
    pub sequencer: Sequencer,
}

impl Backend for Consul {
    fn acquire<'a>(&'a self, spec: &'a LeaseSpec) -> BoxFuture<'a, Result<Lease, Error>> {
        lease_core::backend::instrument_acquire(BackendKind::Consul, spec, async move {
            spec.validate()?;
            let backend: Arc<dyn Backend> = Arc::new(self.clone());
            match spec.target() {
                Target::Leader { .. } => leader::acquire(&self.http, spec, backend).await,
                Target::Semaphore { .. } => {
                    semaphore::acquire(&self.http, &self.semaphores, spec, backend).await
                }
                other => Err(other.unsupported("Consul")),
            }
        })
    }

    fn observe_leader<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<LeaderObserver, Error>> {
        Box::pin(observe::observe(&self.http, key))
    }

    fn check_sequencer<'a>(&'a self, sequencer: &'a Sequencer) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(Consul::check_sequencer(self, sequencer))
    }

    fn reachability(&self) -> Reachability {
        self.http.probed_reachability()
    }

    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(self.http.keepers().shutdown())
    }
}

/// The examples of this crate's README (what crates.io shows), compiled as doctests so that the
/// front page cannot drift from the API; `tests/tests/readmes.rs` of the workspace checks the
/// features, commands and links it names.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
