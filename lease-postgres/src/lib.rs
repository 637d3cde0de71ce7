//! PostgreSQL for the distributed leases of [`lease_core`]: a lease backend (feature `backend`)
//! and fencing tokens the database enforces inside your own transaction.
//!
//! # The lease backend
//!
//! With the feature `backend`, `Postgres` takes leader and semaphore leases in a table of the
//! database: a lease is a row that expires by the database's clock, renewed in batches (one
//! statement per TTL every TTL/3 for all the leases of a process), and loss and hand-over are
//! told by `NOTIFY`, so nothing polls. One process holds 1,000 leases on 3 connections. See
//! `Postgres` for how it works, and `sql/lease.sql` ([`LEASE_SQL`]) for the tables.
//!
//! ```no_run
//! # #[cfg(feature = "backend")]
//! # async fn example() -> Result<(), lease_core::Error> {
//! use lease_core::{Backend, LeaseSpec};
//! use lease_postgres::Postgres;
//!
//! // Connects on first use; `Postgres::from_env()` reads LEASE_POSTGRES_URL, else DATABASE_URL.
//! let postgres = Postgres::new("postgres://app:secret@db.internal:5432/app")?;
//! let lease = postgres.acquire(&LeaseSpec::leader("jobs/billing")).await?;
//! lease.run(async { /* only one process at a time gets here */ }).await?;
//! lease.release().await?;
//!
//! // At most three of these at once, cluster-wide.
//! let slot = postgres.acquire(&LeaseSpec::semaphore("jobs/reports", 3)).await?;
//! slot.release().await?;
//! postgres.shutdown().await;
//! # Ok(())
//! # }
//! ```
//!
//! # The fence
//!
//! A lease cancels the work it guards once it is known lost, but nothing in the holder can close
//! the window between its last check and its write: a process paused there (a GC pause, a frozen
//! VM, SIGSTOP) writes after its lease has been given to the next holder. Only the system that
//! receives the write can refuse it, by remembering the highest fencing token it has seen. When
//! the protected data lives in PostgreSQL, PostgreSQL can do that inside the transaction that
//! writes it: [`fence`] installs a function that records each lease key's highest
//! [`lease_core::Sequencer`] index and raises an error for an older one, so a stale
//! holder's transaction is rolled back with its writes.
//!
//! - [`fence::FENCE_SQL`]: the migration, plain SQL for any client (sqlx, tokio-postgres, diesel,
//!   psql), idempotent; `sql/fence.sql` in this package.
//! - [`fence::Token`]: the `(key, generation, index, holder)` the SQL functions take, from a
//!   sequencer whose `(generation, index)` rises with every acquisition of its key (Consul, etcd,
//!   PostgreSQL, Redis, memory);
//!   RabbitMQ's slot numbers and semaphores' sequencers are refused with an error that says why.
//! - `fence::tokio_postgres` (feature `tokio-postgres`) and `fence::sqlx` (feature `sqlx`):
//!   `install`, `fence`, `advance` (register a new holder when it acquires) and `fence_held`
//!   (leases on PostgreSQL: the holder's own row) for each client, with an [`fence::Error`]
//!   that says what to do; [`fence::AdvanceOnAcquire`] advances on every acquisition of a
//!   backend, so an older holder is refused from the newer one's acquisition, not its first
//!   write.
//!
//! ## Example
//!
//! With the `tokio-postgres` feature, a lease guarding a job whose result is written to
//! PostgreSQL:
//!
//! ```no_run
//! # #[cfg(feature = "tokio-postgres")]
//! # mod example {
//! use lease_core::memory::Memory;
//! use lease_core::{Backend, LeaseSpec};
//! use lease_postgres::fence;
//!
//! # #[allow(dead_code)]
//! async fn charge(invoice: i64) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//!     let (mut client, connection) =
//!         tokio_postgres::connect("host=127.0.0.1 user=postgres", tokio_postgres::NoTls).await?;
//!     tokio::spawn(connection);
//!     // Once per database; or ship `sql/fence.sql` with your migrations.
//!     fence::tokio_postgres::install(&client).await?;
//!
//!     let backend = Memory::new(); // Consul::from_env()? or Etcd::from_env()? across nodes
//!     let lease = backend.acquire(&LeaseSpec::leader("jobs/billing")).await?;
//!     let tx = client.transaction().await?;
//!     // First in the transaction: if a newer holder of "jobs/billing" has committed a fenced
//!     // transaction, this fails with `fence::Error::Stale` and nothing below is committed.
//!     fence::tokio_postgres::fence(&tx, lease.sequencer()).await?;
//!     tx.execute("UPDATE invoices SET charged = true WHERE id = $1", &[&invoice])
//!         .await?;
//!     tx.commit().await?;
//!     lease.release().await?;
//!     Ok(())
//! }
//! # }
//! ```
//!
//! [`fence`] says exactly what the fence guarantees, for each interleaving of an older and a
//! newer holder and each isolation level, and what it does not do.
//!
//! # Features
//!
//! No client by default: the SQL and [`fence::Token`] work with any client.
//!
//! - `backend`: the lease backend `Postgres` (tokio-postgres 0.7 with its runtime).
//! - `rustls` (default; it adds nothing without `backend`): the backend's TLS, with rustls and
//!   the platform's certificate verifier, as the URL's `sslmode` asks
//!   (`PostgresBuilder::ca_cert` says how).
//! - `tokio-postgres`: `fence::tokio_postgres` (tokio-postgres 0.7, without its `runtime`
//!   feature: the application connects).
//! - `sqlx`: `fence::sqlx` (sqlx 0.8 with its `postgres` feature; the application picks sqlx's
//!   runtime and TLS).

// On docs.rs (`--cfg docsrs`), a feature-gated item shows the feature it needs.
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(feature = "backend")]
mod backend;
pub mod fence;

#[cfg(feature = "backend")]
pub use backend::{DATABASE_URL_ENV, DEFAULT_SCHEMA, Postgres, PostgresBuilder, URL_ENV};

/// The migration the lease backend (`Postgres`, feature `backend`) installs on first use: the
/// schema `lease`, its sequence, the tables `lease.leases` and `lease.bars`, the trigger that
/// notifies their changes and the functions `lease.try_acquire` and `lease.release`. Plain SQL,
/// idempotent, without `BEGIN`/`COMMIT`; the file `sql/lease.sql` of this package, to ship with
/// your migrations when the backend's role may not create a schema
/// (`PostgresBuilder::install(false)`).
pub const LEASE_SQL: &str = include_str!("../sql/lease.sql");

/// The examples of this crate's README (what crates.io shows), compiled as doctests so that the
/// front page cannot drift from the API; `tests/tests/readmes.rs` of the workspace checks the
/// features, commands and links it names.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
