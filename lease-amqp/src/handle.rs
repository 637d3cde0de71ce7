//! [`Amqp`]: the handle its clones share (configuration, connection pool, holder tasks), and
//! this process's bookkeeping of the slots its leases hold ([`Claim`]) and of the semaphores it
//! administers ([`AdminLock`]).

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use lease_core::Error;
use lease_core::backend::Keepers;

use super::config::AmqpConfig;
use super::naming::SemaphoreNames;
use super::pool::{ConnectionPool, PooledConnection, Reservation, Use};
use super::wire::Failure;

/// The RabbitMQ backend: persistent semaphores and one-slot leader leases.
///
/// Cheap to clone; clones share the connections. See the [crate docs](crate) for the semantics
/// and for what each lease costs the broker.
///
/// # Examples
///
/// ```no_run
/// # async fn example() -> Result<(), lease_core::Error> {
/// use lease_core::{Backend, LeaseSpec};
/// use lease_amqp::Amqp;
///
/// let amqp = Amqp::from_env()?;
/// let lease = amqp.acquire(&LeaseSpec::semaphore("reports", 3)).await?;
/// let result = lease.run(async { /* at most 3 of these run at once */ }).await;
/// lease.release().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Amqp {
    pub(super) inner: Arc<Inner>,
}

pub(super) struct Inner {
    pub(super) config: AmqpConfig,
    pub(super) connections: ConnectionPool,
    /// Slots held (`Some(holder)`, the holder part of the lease's sequencer) or being taken
    /// (`None`) by leases on any of our connections.
    claims: Mutex<HashMap<(String, u32), Option<String>>>,
    /// The holder tasks of this handle's leases.
    pub(super) keepers: Keepers,
    /// Per semaphore, serialises this process's administration of it: the broker's mutex is an
    /// exclusive queue, which every channel of one of our connections could declare at once.
    /// Different semaphores are administered in parallel (a process taking thousands of new
    /// leader keys creates them concurrently).
    admin_locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Connects to the broker while it is unreachable (see [`Amqp::reachability`]).
    pub(super) probe: lease_http::Probe,
}

impl fmt::Debug for Amqp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Amqp")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl Amqp {
    /// The broker's URL without the password.
    pub fn redacted_url(&self) -> String {
        self.inner.config.redacted_url()
    }

    pub(crate) fn with_config(config: AmqpConfig) -> Amqp {
        Amqp {
            inner: Arc::new(Inner {
                config,
                connections: ConnectionPool::new(),
                claims: Mutex::new(HashMap::new()),
                keepers: Keepers::new(),
                probe: lease_http::Probe::default(),
                admin_locks: Mutex::new(HashMap::new()),
            }),
        }
    }

    pub(crate) fn config(&self) -> &AmqpConfig {
        &self.inner.config
    }

    /// A channel of one of our connections for `use_`, spoken for until the reservation is
    /// dropped; see [`ConnectionPool::reserve`].
    pub(crate) async fn reserve_channel(&self, use_: Use) -> Result<Reservation, Error> {
        self.inner
            .connections
            .reserve(&self.inner.config, use_)
            .await
    }

    /// Stops reserving channels on `pooled` (a lease on it self-fenced) and closes it, so its
    /// exclusive queues go. Only the leases on that connection are lost.
    pub(crate) async fn discard_connection(&self, pooled: &Arc<PooledConnection>) {
        self.inner.connections.remove(pooled).await;
        let connection = pooled.connection();
        if connection.status().connected() {
            let close = connection.close(320, lapin::types::ShortString::from("lease self-fenced"));
            let _ = tokio::time::timeout(self.inner.config.operation_timeout, close).await;
        }
    }

    /// The claim registry. A panic while it was locked cannot leave it inconsistent (each
    /// update is one map operation), so a poisoned lock is used as it is.
    fn claims(&self) -> std::sync::MutexGuard<'_, HashMap<(String, u32), Option<String>>> {
        self.inner.claims.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Marks `slot` of `names` as taken by a lease of ours; `None` if one already has it.
    pub(crate) fn claim(&self, names: &SemaphoreNames, slot: u32) -> Option<Claim> {
        let key = (names.name().to_owned(), slot);
        let mut claims = self.claims();
        if claims.contains_key(&key) {
            return None;
        }
        claims.insert(key.clone(), None);
        Some(Claim {
            amqp: self.clone(),
            key,
        })
    }

    /// Whether one of this process's leases holds slot `slot` (`Some(true)`), is taking it right
    /// now (`Some(false)`), or neither (`None`).
    pub(crate) fn claim_state(&self, names: &SemaphoreNames, slot: u32) -> Option<bool> {
        self.claims()
            .get(&(names.name().to_owned(), slot))
            .map(Option::is_some)
    }

    /// The holder (sequencer part) of the lease of ours that holds `slot` of `name`, if any.
    pub(crate) fn local_holder(&self, name: &str, slot: u32) -> Option<String> {
        self.claims()
            .get(&(name.to_owned(), slot))
            .cloned()
            .flatten()
    }

    pub(crate) fn keepers(&self) -> &Keepers {
        &self.inner.keepers
    }

    /// Waits for this process's administration lock of semaphore `name`.
    pub(crate) async fn admin_lock(&self, name: &str) -> AdminLock {
        let mutex = Arc::clone(self.admin_locks().entry(name.to_owned()).or_default());
        AdminLock {
            amqp: self.clone(),
            name: name.to_owned(),
            guard: Some(mutex.lock_owned().await),
        }
    }

    /// The administration locks. Each update is one map operation, so a poisoned lock is used
    /// as it is.
    fn admin_locks(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<String, Arc<tokio::sync::Mutex<()>>>> {
        self.inner
            .admin_locks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn unreachable(&self, operation: &str, failure: Failure) -> Error {
        failure.into_error(operation, &self.inner.config)
    }
}

/// This process's administration lock of one semaphore, held; released on drop, and forgotten
/// once nobody holds or waits for it.
pub(crate) struct AdminLock {
    amqp: Amqp,
    name: String,
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl fmt::Debug for AdminLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("AdminLock").field(&self.name).finish()
    }
}

impl Drop for AdminLock {
    fn drop(&mut self) {
        drop(self.guard.take());
        let mut locks = self.amqp.admin_locks();
        // Waiters clone the mutex under the map's lock, so one count means nobody else has it.
        if locks
            .get(&self.name)
            .is_some_and(|mutex| Arc::strong_count(mutex) == 1)
        {
            locks.remove(&self.name);
        }
    }
}

/// A slot this process's leases hold or are taking; released on drop.
pub(crate) struct Claim {
    amqp: Amqp,
    key: (String, u32),
}

impl fmt::Debug for Claim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Claim").field(&self.key).finish()
    }
}

impl Claim {
    /// The slot is now held by the lease whose sequencer's holder part is `holder`, no longer
    /// being taken.
    pub(crate) fn mark_held(&self, holder: &str) {
        let mut claims = self.amqp.claims();
        if let Some(held) = claims.get_mut(&self.key) {
            *held = Some(holder.to_owned());
        }
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        let mut claims = self.amqp.claims();
        claims.remove(&self.key);
    }
}
