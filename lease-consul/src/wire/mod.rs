//! The wire client: the Consul HTTP API calls this crate makes (one method each, in `calls`),
//! what their answers mean, and the connections they go over.
//!
//! Everything that comes back over the network is parsed without panicking: an answer we cannot
//! read becomes an [`ApiError`], which knows whether retrying could help (transport errors and 5xx
//! answers: Consul electing a leader, a proxy in trouble) or not (a 403, a 400).
//!
//! The wire client ([`ConsulHttp`]) is the bottom of the crate: it imports nothing above it, and
//! what it needs of the configuration (the token, where the address came from) is handed to it
//! as plain values ([`Settings`]). Beside the calls (`calls`) it holds the connections (`pool`,
//! through `transport`), the connection budget and the outage gate (`budget`), reachability and
//! the request counters (`http`), and what an error means to the user (`error`). The watches,
//! heartbeats and holder tasks built on it belong to the client above (`crate::client`).

mod answer;
mod budget;
mod calls;
mod error;
mod http;
mod pool;
mod settings;
mod transport;
mod types;

pub(crate) use budget::{DEFAULT_MAX_CONNECTIONS, MIN_CONNECTIONS, WatchSlot};
pub(crate) use calls::SessionLife;
#[cfg(test)]
pub(crate) use error::hint;
pub(crate) use http::ConsulHttp;
pub(crate) use lease_http::ApiError;
pub(crate) use settings::{AddressOrigin, Settings, Token};
pub(crate) use transport::HttpClient;
pub(crate) use types::{Behavior, Blocking, KvEntry, TxnOp};
