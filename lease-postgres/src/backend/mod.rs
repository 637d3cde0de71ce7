//! The PostgreSQL lease backend: leases as rows of a table that expire by the database's clock.
//!
//! See [`Postgres`] for how it works and what it costs.

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
