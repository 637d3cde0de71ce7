//! The PostgreSQL lease backend: leases as rows of a table that expire by the database's clock.
//!
//! See [`Postgres`] for how it works and what it costs.
//!
//! The modules, from the top down: `postgres` (the [`Postgres`] type and its `impl Backend`)
//! and `config` (the builder, which builds the wire, the owner and then the backend); the
//! recipes `acquire` (an acquisition, and checking a sequencer), `hold` (holding and giving
//! back a row) and `observe` (who leads a key); `client` (`Shared`, the one owner of the
//! machinery); the machinery: `listen` (the LISTEN connection), `renew` (batched renewal),
//! `attempt` and `release` (batched attempts and releases, over `batch`); and `wire` at the
//! bottom (connections, errors, retries, TLS), which imports none of them.

mod acquire;
mod attempt;
mod batch;
mod client;
mod config;
mod hold;
mod listen;
mod observe;
mod postgres;
mod release;
mod renew;
mod wire;

pub use config::{DATABASE_URL_ENV, PostgresBuilder, URL_ENV};
pub use postgres::Postgres;
pub use wire::DEFAULT_SCHEMA;
