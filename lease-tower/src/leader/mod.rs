//! Leader-only routes: requests are served only by the node that holds a leader lease.
//!
//! [`LeaderOnlyLayer`] runs **one** background campaign for the lease (shared by every clone of
//! the layer and of the services it builds) and decides each request in `call` with an atomic
//! read of the lease's state:
//!
//! - **On the leader** the request goes to the inner service with the lease's
//!   [`LeaseWatcher`](lease_core::LeaseWatcher) in its extensions (take it in a handler with
//!   [`HeldLease`](crate::extract::HeldLease) or [`LeaseSequencer`](crate::extract::LeaseSequencer)).
//!   If the lease is lost while the request is in flight, the inner future is dropped and the client
//!   gets `503 Service Unavailable`.
//! - **On a follower** the answer is `503` with `Retry-After` and a [`LEADER_HEADER`] carrying the
//!   value the current leader advertises (its [`LeaseSpec::value`](lease_core::LeaseSpec::value),
//!   e.g. its base URL); or, opt-in, `307 Temporary Redirect` to that URL plus the request's path.
//!
//! The campaign stops, and the lease is released so another node takes over at once, when the last
//! clone of the layer and its services is dropped or the [shutdown
//! token](LeaderOnlyLayer::shutdown_on) is cancelled.

mod future;
mod layer;
mod service;
mod state;

pub use future::ResponseFuture;
pub use layer::LeaderOnlyLayer;
pub use service::LeaderOnly;

use http::HeaderName;

/// The header a follower's 503 carries: the value the current leader advertises (usually its base
/// URL), absent while no leader is known or when the value is not a valid header value.
pub const LEADER_HEADER: HeaderName = HeaderName::from_static("lease-leader");
