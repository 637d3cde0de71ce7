//! What every clone of a [`Postgres`](crate::Postgres) shares: the work connections (a fixed
//! budget, connected on first use and again after a loss), the installation of the tables, the
//! one place requests are sent (reachability, metrics, timeouts), and errors in lease terms.

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
