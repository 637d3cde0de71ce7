//! A cluster-wide concurrency limit: each request holds one slot of a distributed semaphore.
//!
//! [`SemaphoreLayer`] takes one slot of the semaphore `(prefix, limit)` before the inner service
//! sees the request and keeps it until the response body has been sent in full (streaming bodies
//! included) or dropped. At most `limit` requests are served at once across every process that
//! uses the same prefix and limit, whatever the number of instances.
//!
//! - A request waits up to [`max_wait`](SemaphoreLayer::max_wait) for a slot, then gets `503` with
//!   `Retry-After`. The wait happens in the response future, never in `poll_ready`.
//! - A slot lost while the handler runs cancels the request (its future is dropped; 503); lost
//!   while the body is streaming, it ends the body with a [`LeaseLost`](crate::LeaseLost) error, which
//!   makes the server abort the response.
//! - The slot's [`LeaseWatcher`](lease_core::LeaseWatcher) is in the request's extensions
//!   ([`HeldLease`](crate::extract::HeldLease)).
//!
//! Each request is one [`Backend::acquire`](lease_core::Backend::acquire): how much that costs is
//! the backend's business (on Consul, a session/contender pool makes it one CAS to take and one to
//! give back).

mod config;
mod future;
mod layer;
mod service;

pub use future::ResponseFuture;
pub use layer::SemaphoreLayer;
pub use service::Semaphore;
