//! The public conformance suite (`lease-conformance`) run against the in-tree backends: memory,
//! Consul, etcd and RabbitMQ, one test per scenario each.
//!
//! Consul has every capability; memory every one but keeping a lease past its holder (the
//! process is the store). RabbitMQ has no sessions, keys or lock-delay, cannot observe a leader
//! and keeps nothing past its holder: its harness declares so, and those scenarios check the
//! refusal instead. Its own losses (connection closed, slot removed) are tested in tests/amqp.rs.
//!
//! etcd has no lock-delay and no release of a key apart from its lease: its harness declares so.
//! Its sessions are etcd leases (revoked by the operator), and its own losses are tested in
//! tests/etcd.rs.
//!
//! PostgreSQL has no session an operator destroys and no release of a row but its holder's: its
//! harness declares so. Its operator deletes rows; its own faults are tested in
//! tests/postgres_lease.rs.
//!
//! Redis has no session an operator destroys (a killed connection is replaced, and its leases
//! live on) and no release of a key but its holder's: its harness declares so. Its operator
//! deletes holder keys; its own faults are tested in tests/redis_lease.rs.
//!
//! Run: `cargo test -p lease-tests --test conformance` (the Consul half starts a dev agent per
//! test; see `lease_tests::consul`; the etcd half an etcd per test, see `lease_tests::etcd`; the AMQP half needs the broker on 127.0.0.1:5672).

use std::sync::Arc;

use lease_conformance::{Capability, Harness, Operator, OperatorError};
use lease_core::BoxFuture;
use lease_core::memory::Memory;
use lease_tests::consul::Agent;

async fn memory() -> Harness {
    lease_tests::init_tracing();
    let memory = Memory::new();
    // The process is the store: nothing of it outlives the holder.
    Harness::new(memory.clone(), memory).lacks(Capability::KeepsPastHolder)
}

/// A dev agent's operator actions: raw KV and session calls, as an administrator makes them.
struct AgentOperator(Arc<Agent>);

impl Operator for AgentOperator {
    fn destroy_session<'a>(&'a self, holder: &'a str) -> BoxFuture<'a, Result<(), OperatorError>> {
        Box::pin(async move {
            self.0.destroy_session(holder).await;
            Ok(())
        })
    }

    fn delete_key<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), OperatorError>> {
        Box::pin(async move {
            self.0.delete_key(key).await;
            Ok(())
        })
    }

    fn release_key<'a>(
        &'a self,
        key: &'a str,
        holder: &'a str,
    ) -> BoxFuture<'a, Result<(), OperatorError>> {
        Box::pin(async move {
            if self.0.release_key(key, holder).await {
                Ok(())
            } else {
                Err(OperatorError::NotFound {
                    what: "lock held by that session on",
                    name: key.to_owned(),
                })
            }
        })
    }

    fn sessions_left(&self) -> BoxFuture<'_, Option<usize>> {
        Box::pin(async { Some(self.0.sessions().await.len()) })
    }
}

async fn consul() -> Harness {
    lease_tests::init_tracing();
    let agent = Arc::new(Agent::start().await);
    Harness::new(agent.backend(), AgentOperator(agent))
}

/// An etcd's operator actions: raw gateway calls, as an administrator makes them.
struct EtcdOperator(Arc<lease_tests::etcd::Server>);

impl Operator for EtcdOperator {
    fn destroy_session<'a>(&'a self, holder: &'a str) -> BoxFuture<'a, Result<(), OperatorError>> {
        Box::pin(async move {
            if self.0.revoke(holder).await {
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
            self.0.delete_key(key).await;
            Ok(())
        })
    }

    fn sessions_left(&self) -> BoxFuture<'_, Option<usize>> {
        Box::pin(async { Some(self.0.leases().await.len()) })
    }
}

async fn etcd() -> Harness {
    lease_tests::init_tracing();
    let server = Arc::new(lease_tests::etcd::Server::start().await);
    Harness::new(server.backend(), EtcdOperator(server))
        .lacks(Capability::LockDelay)
        .lacks(Capability::ReleaseKey)
}

async fn amqp() -> Harness {
    lease_tests::init_tracing();
    lease_tests::amqp::require_broker().await;
    let (amqp, _) = lease_tests::amqp::backend();
    let admin = amqp.admin();
    Harness::new(amqp.clone(), amqp)
        .lacks(Capability::ObserveLeader)
        .lacks(Capability::LockDelay)
        // The index is the slot number; the key is the semaphore's name.
        .lacks(Capability::RisingIndex)
        .lacks(Capability::ContenderKeys)
        // A leader lock is a one-slot semaphore: a semaphore on its name gets LimitMismatch.
        .lacks(Capability::LockKinds)
        .lacks(Capability::DestroySession)
        .lacks(Capability::DeleteKey)
        .lacks(Capability::ReleaseKey)
        // A slot is held by an exclusive queue, which goes with its connection.
        .lacks(Capability::KeepsPastHolder)
        // Slot queues are durable: remove the semaphores the scenario created.
        .clean_up_with(|keys| async move {
            for key in keys {
                admin.destroy(&key).await.unwrap();
            }
        })
}

lease_conformance::suite!(memory, memory);
lease_conformance::suite!(consul, consul);
lease_conformance::suite!(etcd, etcd);
/// A database of its own per scenario; the backend is its own operator (deleting rows). The
/// database goes with the harness.
async fn postgres() -> Harness {
    lease_tests::init_tracing();
    let db = lease_tests::postgres::TestDb::create("conformance").await;
    let postgres = lease_postgres::Postgres::new(db.url()).unwrap();
    Harness::new(postgres.clone(), PostgresOperator(postgres, Arc::new(db)))
        // No session an operator destroys: a terminated connection is replaced and its leases
        // live on (tests/postgres_lease.rs). Lock-delay shows only after a destroyed session.
        .lacks(Capability::DestroySession)
        .lacks(Capability::LockDelay)
        .lacks(Capability::ReleaseKey)
}

/// The backend's operator actions, keeping the test database for as long as the harness (it is
/// dropped, with its connections, when the harness is).
struct PostgresOperator(
    lease_postgres::Postgres,
    #[allow(dead_code)] Arc<lease_tests::postgres::TestDb>,
);

impl Operator for PostgresOperator {
    fn delete_key<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), OperatorError>> {
        Operator::delete_key(&self.0, key)
    }

    fn revoke<'a>(
        &'a self,
        lease: &'a lease_core::Sequencer,
    ) -> BoxFuture<'a, Result<(), OperatorError>> {
        Operator::revoke(&self.0, lease)
    }
}

lease_conformance::suite!(amqp, amqp);
lease_conformance::suite!(postgres, postgres);

/// A `redis-server` of its own per scenario; the backend is its own operator (deleting holder
/// keys). The server goes with the harness.
async fn redis() -> Harness {
    lease_tests::init_tracing();
    let server = lease_tests::redis::Server::start().await;
    let redis = lease_redis::Redis::new(&server.url()).unwrap();
    Harness::new(redis.clone(), RedisOperator(redis, Arc::new(server)))
        // No session an operator destroys: a killed connection is replaced and its leases live
        // on (tests/redis_lease.rs). Lock-delay shows only after a destroyed session.
        .lacks(Capability::DestroySession)
        .lacks(Capability::LockDelay)
        .lacks(Capability::ReleaseKey)
}

/// The backend's operator actions, keeping the server for as long as the harness.
struct RedisOperator(
    lease_redis::Redis,
    #[allow(dead_code)] Arc<lease_tests::redis::Server>,
);

impl Operator for RedisOperator {
    fn delete_key<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), OperatorError>> {
        Operator::delete_key(&self.0, key)
    }

    fn revoke<'a>(
        &'a self,
        lease: &'a lease_core::Sequencer,
    ) -> BoxFuture<'a, Result<(), OperatorError>> {
        Operator::revoke(&self.0, lease)
    }
}

lease_conformance::suite!(redis, redis);
