//! The wire side of the backend: the work connections (a fixed budget, connected on first use
//! and again after a loss), the installation of the tables, the one place requests are sent
//! (reachability, metrics, timeouts), and errors in lease terms. What the clones of a
//! [`Postgres`](crate::Postgres) share above it (the holder tasks, the listener, the batchers)
//! is the owner's, in the `client` module.
//!
//! The bottom of the backend: it imports nothing of the modules above it. [`Wire`] holds the
//! connections ([`connections`]); a failed request is a [`PgError`] ([`error`]), judged by its
//! SQLSTATE ([`sqlstate`]) and retried through transient trouble ([`retry`]); connections use TLS
//! as the URL's `sslmode` asks ([`tls`]); and every statement is written for the schema `lease` and
//! renamed for another ([`schema`]). The detached clean-up of a runtime that ends copies what
//! [`Wire`] connects with, not the wire.

mod connections;
mod error;
mod retry;
mod schema;
mod sqlstate;
mod tls;

pub use schema::DEFAULT_SCHEMA;

pub(crate) use connections::{Wire, set_session};
pub(crate) use error::PgError;
pub(crate) use retry::{Retry, retry_backoff};
pub(crate) use schema::in_schema;
pub(crate) use tls::{Connector, connector};
