//! The operator: what an administrator does to a backend behind its clients' backs.
//!
//! Leases are lost because someone acts on the backend: a session destroyed, a key deleted or
//! released, a slot removed. [`Operator`] names those actions once, so the conformance scenarios
//! and the demo inject the same faults the same way. Every action has a default body that answers
//! [`OperatorError::Unsupported`]; a backend's operator implements the ones its backend has, and
//! its [`Harness`](crate::Harness) declares the rest with [`lacks`](crate::Harness::lacks).
//!
//! This crate implements it for the in-tree backends' clients (features `memory`, `consul`,
//! `etcd`, `amqp`, `postgres`, `redis`); a backend author implements it next to their conformance tests.

use std::sync::Arc;

use lease_core::{BoxFuture, Error, Sequencer};

/// Why an operator's action did not happen.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OperatorError {
    /// This operator does not offer the action on this backend.
    #[error("this operator cannot {action}")]
    Unsupported {
        /// The action, e.g. `destroy a session`.
        action: &'static str,
    },
    /// Nothing by that name exists: the session, key or slot is already gone.
    #[error("no {what} {name:?}")]
    NotFound {
        /// `session`, `key`, `slot`.
        what: &'static str,
        /// The name given.
        name: String,
    },
    /// The backend refused the action or could not be reached.
    #[error(transparent)]
    Backend(#[from] Error),
}

/// The answer of an action this operator does not offer.
fn unsupported<'a>(action: &'static str) -> BoxFuture<'a, Result<(), OperatorError>> {
    Box::pin(std::future::ready(Err(OperatorError::Unsupported {
        action,
    })))
}

/// Fault injection on one backend: the out-of-band actions an administrator takes.
///
/// The trait is dyn-compatible; [`Harness`](crate::Harness) and the demo hold a
/// `Box<dyn Operator>`.
///
/// # Examples
///
/// An operator for a backend that can only delete keys:
///
/// ```
/// use lease_conformance::{Operator, OperatorError};
/// use lease_core::{BoxFuture, Sequencer};
///
/// struct KeyDeleter;
///
/// impl Operator for KeyDeleter {
///     fn delete_key<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), OperatorError>> {
///         Box::pin(async move {
///             // e.g. `DELETE /v1/kv/<key>`, or removing a lock file
///             let _ = key;
///             Ok(())
///         })
///     }
///
///     // Deleting its key is how this backend's administrator takes a lease away.
///     fn revoke<'a>(&'a self, lease: &'a Sequencer) -> BoxFuture<'a, Result<(), OperatorError>> {
///         self.delete_key(lease.key())
///     }
/// }
/// ```
pub trait Operator: Send + Sync + 'static {
    /// Destroys the session `holder` (a [`Sequencer::holder`]), as Consul's
    /// `PUT /v1/session/destroy` does: its holders lose their leases with
    /// [`LostReason::SessionInvalidated`](lease_core::LostReason::SessionInvalidated), and the
    /// keys it held stay barred for its lock-delay.
    fn destroy_session<'a>(&'a self, holder: &'a str) -> BoxFuture<'a, Result<(), OperatorError>> {
        let _ = holder;
        unsupported("destroy a session")
    }

    /// Deletes `key` (a leader key, or a semaphore holder's key): its holder loses the lease with
    /// [`LostReason::KeyDeleted`](lease_core::LostReason::KeyDeleted).
    fn delete_key<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), OperatorError>> {
        let _ = key;
        unsupported("delete a key")
    }

    /// Releases the lock `holder` has on `key` without being its holder, as Consul's
    /// `?release=<session>` does: the holder loses the lease with
    /// [`LostReason::KeyReleased`](lease_core::LostReason::KeyReleased), and no lock-delay
    /// applies.
    fn release_key<'a>(
        &'a self,
        key: &'a str,
        holder: &'a str,
    ) -> BoxFuture<'a, Result<(), OperatorError>> {
        let _ = (key, holder);
        unsupported("release a key")
    }

    /// Takes the lease `lease` names away from its holder, the way an administrator of this
    /// backend would. The one action every operator offers: the demo's failover and the
    /// `revoke_cancels_work` scenario use it on every backend.
    ///
    /// The default destroys the lease's session.
    fn revoke<'a>(&'a self, lease: &'a Sequencer) -> BoxFuture<'a, Result<(), OperatorError>> {
        self.destroy_session(lease.holder())
    }

    /// How many sessions exist on the backend, for "nothing left behind" checks; `None` when the
    /// backend cannot tell, or other clients' sessions would be counted too.
    fn sessions_left(&self) -> BoxFuture<'_, Option<usize>> {
        Box::pin(std::future::ready(None))
    }
}

impl<O: Operator + ?Sized> Operator for Arc<O> {
    fn destroy_session<'a>(&'a self, holder: &'a str) -> BoxFuture<'a, Result<(), OperatorError>> {
        (**self).destroy_session(holder)
    }

    fn delete_key<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), OperatorError>> {
        (**self).delete_key(key)
    }

    fn release_key<'a>(
        &'a self,
        key: &'a str,
        holder: &'a str,
    ) -> BoxFuture<'a, Result<(), OperatorError>> {
        (**self).release_key(key, holder)
    }

    fn revoke<'a>(&'a self, lease: &'a Sequencer) -> BoxFuture<'a, Result<(), OperatorError>> {
        (**self).revoke(lease)
    }

    fn sessions_left(&self) -> BoxFuture<'_, Option<usize>> {
        (**self).sessions_left()
    }
}

/// The in-process store's operator actions are its own methods, applied at once.
#[cfg(feature = "memory")]
impl Operator for lease_core::memory::Memory {
    fn destroy_session<'a>(&'a self, holder: &'a str) -> BoxFuture<'a, Result<(), OperatorError>> {
        let found = self.invalidate_session(holder);
        Box::pin(std::future::ready(found_or(found, "session", holder)))
    }

    fn delete_key<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), OperatorError>> {
        let found = lease_core::memory::Memory::delete_key(self, key);
        Box::pin(std::future::ready(found_or(found, "key", key)))
    }

    /// Releases `key` whoever holds it: the store has no `?release=<session>` check.
    fn release_key<'a>(
        &'a self,
        key: &'a str,
        _holder: &'a str,
    ) -> BoxFuture<'a, Result<(), OperatorError>> {
        let found = lease_core::memory::Memory::release_key(self, key);
        Box::pin(std::future::ready(found_or(found, "locked key", key)))
    }

    fn sessions_left(&self) -> BoxFuture<'_, Option<usize>> {
        Box::pin(std::future::ready(Some(self.sessions().len())))
    }
}

#[cfg(feature = "memory")]
fn found_or(found: bool, what: &'static str, name: &str) -> Result<(), OperatorError> {
    if found {
        Ok(())
    } else {
        Err(OperatorError::NotFound {
            what,
            name: name.to_owned(),
        })
    }
}

/// What the Consul client offers an operator: `PUT /v1/session/destroy/<id>`. Deleting and
/// releasing keys take raw KV access, which the client does not expose.
#[cfg(feature = "consul")]
impl Operator for lease_consul::Consul {
    fn destroy_session<'a>(&'a self, holder: &'a str) -> BoxFuture<'a, Result<(), OperatorError>> {
        Box::pin(async move { Ok(lease_consul::Consul::destroy_session(self, holder).await?) })
    }

    // Other clients' sessions may share the agent, so a count would not be ours alone: the
    // default `None` stands.
}

/// What the etcd client offers an operator: revoking a lease (`etcdctl lease revoke`), which
/// etcd's sessions are, and deleting a key with the keys under it (`etcdctl del`). etcd has no
/// release of a key apart from its lease.
#[cfg(feature = "etcd")]
impl Operator for lease_etcd::Etcd {
    fn destroy_session<'a>(&'a self, holder: &'a str) -> BoxFuture<'a, Result<(), OperatorError>> {
        Box::pin(async move {
            if lease_etcd::Etcd::revoke_lease(self, holder).await? {
                Ok(())
            } else {
                Err(OperatorError::NotFound {
                    what: "lease",
                    name: holder.to_owned(),
                })
            }
        })
    }

    fn delete_key<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), OperatorError>> {
        Box::pin(async move {
            match lease_etcd::Etcd::delete_key(self, key).await? {
                0 => Err(OperatorError::NotFound {
                    what: "key",
                    name: key.to_owned(),
                }),
                _ => Ok(()),
            }
        })
    }
}

/// What the PostgreSQL backend offers an operator: deleting lease rows, as an administrator's
/// `DELETE` does. A lease has no session to destroy (a connection ended with
/// `pg_terminate_backend` is replaced, and its leases live on) and no release apart from its
/// holder's.
#[cfg(feature = "postgres")]
impl Operator for lease_postgres::Postgres {
    fn delete_key<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), OperatorError>> {
        Box::pin(async move {
            match lease_postgres::Postgres::delete_key(self, key).await? {
                0 => Err(OperatorError::NotFound {
                    what: "lease row of key",
                    name: key.to_owned(),
                }),
                _ => Ok(()),
            }
        })
    }

    /// Deletes the lease's row.
    fn revoke<'a>(&'a self, lease: &'a Sequencer) -> BoxFuture<'a, Result<(), OperatorError>> {
        Box::pin(async move {
            if lease_postgres::Postgres::delete_holder(self, lease.holder()).await? {
                Ok(())
            } else {
                Err(OperatorError::NotFound {
                    what: "lease row of holder",
                    name: lease.holder().to_owned(),
                })
            }
        })
    }
}

/// What the Redis backend offers an operator: deleting holder keys, as an administrator's `DEL`
/// does. A lease has no session to destroy (a connection killed with `CLIENT KILL` is replaced,
/// and its leases live on) and no release apart from its holder's.
#[cfg(feature = "redis")]
impl Operator for lease_redis::Redis {
    fn delete_key<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), OperatorError>> {
        Box::pin(async move {
            if lease_redis::Redis::delete_key(self, key).await? {
                Ok(())
            } else {
                Err(OperatorError::NotFound {
                    what: "holder key of",
                    name: key.to_owned(),
                })
            }
        })
    }

    /// Deletes the lease's holder key.
    fn revoke<'a>(&'a self, lease: &'a Sequencer) -> BoxFuture<'a, Result<(), OperatorError>> {
        Box::pin(async move {
            if lease_redis::Redis::revoke(self, lease).await? {
                Ok(())
            } else {
                Err(OperatorError::NotFound {
                    what: "holder key of",
                    name: lease.to_string(),
                })
            }
        })
    }
}

/// RabbitMQ's operator removes slots: a holder loses its lease with
/// [`LostReason::SlotRemoved`](lease_core::LostReason::SlotRemoved).
#[cfg(feature = "amqp")]
impl Operator for lease_amqp::Amqp {
    /// Removes the lease's slot and creates it again, so the holder loses it and another
    /// contender can take the new one. Slots are removed highest first, so only the semaphore's
    /// highest slot (every leader's only one) can be revoked alone.
    fn revoke<'a>(&'a self, lease: &'a Sequencer) -> BoxFuture<'a, Result<(), OperatorError>> {
        Box::pin(async move {
            let admin = self.admin();
            let name = lease.key();
            let slots = admin.slots(name).await?;
            if u64::from(slots) != lease.index() {
                return Err(OperatorError::Unsupported {
                    action: "revoke a slot other than its semaphore's highest",
                });
            }
            let left = admin.remove(name, 1).await?;
            // Idempotent: a contender may already have created the emptied semaphore again.
            if left == 0 {
                admin.create(name, slots).await?;
            } else {
                admin.add(name, 1).await?;
            }
            Ok(())
        })
    }
}
