//! THROWAWAY STAND-IN (branch `pgbench`), dropped at merge: the real backend (branch `pg28`)
//! replaces this whole file with its own `Postgres`, behind the same feature `backend`.
//!
//! It has the public API the real backend will have (`Postgres::new(url)`, `Postgres::builder()`,
//! `Postgres::from_env()`, `Clone + Debug`, `lease_core::Backend`) so that the benchmark, the CLI,
//! the demo and the chaos wiring compile and run their harness before the backend lands. It holds
//! nothing in PostgreSQL: every lease lives in a `lease_core::memory::Memory` of this process, so
//! two processes do not exclude each other and its sequencers read `memory:…`, not
//! `postgres:…`. No figure measured on it says anything about PostgreSQL.

#![allow(missing_docs)]

use lease_core::leader::LeaderObserver;
use lease_core::memory::Memory;
use lease_core::{Backend, BoxFuture, Error, Lease, LeaseSpec, Sequencer};

/// Whether this build has the stand-in (true) or the real backend (the real one has no such
/// constant: code that reads it must change at merge, which is the point).
pub const STANDIN: bool = true;

/// STAND-IN for the PostgreSQL backend (see the module docs).
#[derive(Clone, Debug)]
pub struct Postgres {
    url: String,
    memory: Memory,
}

/// STAND-IN for the PostgreSQL backend's builder.
#[derive(Clone, Debug, Default)]
pub struct PostgresBuilder {
    url: Option<String>,
}

impl PostgresBuilder {
    /// The server's URL.
    pub fn url(mut self, url: impl Into<String>) -> Self {
        self.url = Some(url.into());
        self
    }

    /// The backend (lazy: nothing is connected).
    pub fn build(self) -> Result<Postgres, Error> {
        Postgres::new(self.url.as_deref().unwrap_or(DEFAULT_URL))
    }
}

const DEFAULT_URL: &str = "postgres://127.0.0.1:5432/postgres";

impl Postgres {
    /// A backend for `url`; checks only that it looks like a PostgreSQL URL.
    pub fn new(url: &str) -> Result<Postgres, Error> {
        if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            return Err(Error::config(format!(
                "{url:?} is not a PostgreSQL URL: give postgres://user@host:5432/database"
            )));
        }
        Ok(Postgres {
            url: url.to_owned(),
            memory: Memory::new(),
        })
    }

    /// A builder.
    pub fn builder() -> PostgresBuilder {
        PostgresBuilder::default()
    }

    /// From `LEASE_POSTGRES_URL`, else `DATABASE_URL`.
    pub fn from_env() -> Result<Postgres, Error> {
        let url = std::env::var("LEASE_POSTGRES_URL")
            .or_else(|_| std::env::var("DATABASE_URL"))
            .map_err(|_| {
                Error::config("set LEASE_POSTGRES_URL (or DATABASE_URL) to the server's URL")
            })?;
        Postgres::new(&url)
    }

    /// STAND-IN only: the in-process store, for the stand-in's operator (lease-conformance).
    #[doc(hidden)]
    pub fn standin_memory(&self) -> &Memory {
        &self.memory
    }
}

impl Backend for Postgres {
    fn acquire<'a>(&'a self, spec: &'a LeaseSpec) -> BoxFuture<'a, Result<Lease, Error>> {
        let _ = &self.url;
        self.memory.acquire(spec)
    }

    fn observe_leader<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<LeaderObserver, Error>> {
        self.memory.observe_leader(key)
    }

    fn check_sequencer<'a>(&'a self, sequencer: &'a Sequencer) -> BoxFuture<'a, Result<(), Error>> {
        self.memory.check_sequencer(sequencer)
    }

    fn shutdown(&self) -> BoxFuture<'_, ()> {
        self.memory.shutdown()
    }
}
