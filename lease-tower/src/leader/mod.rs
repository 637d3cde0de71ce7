//! Leader-only routes: requests are served only by the node whose campaign holds the leader lease.
//!
//! [`LeaderOnlyLayer`] is built from a handle on a [`Campaign`](lease_core::leader::Campaign),
//! the one election this process runs for the key: routes, a leader-only worker and a health
//! check on the same key share it, and see the same terms. The layer starts nothing; run the
//! campaign next to the server. Each request is decided in `call` from the
//! [`Term`](lease_core::leader::Term) the campaign has published (a read, no I/O), and again
//! before every poll of the inner future from the term's lease itself:
//!
//! - **On the leader** the request goes to the inner service with the term's
//!   [`LeaseWatcher`](lease_core::LeaseWatcher) in its extensions (take it in a handler with
//!   [`HeldLease`](crate::extract::HeldLease) or [`LeaseSequencer`](crate::extract::LeaseSequencer)).
//!   The inner future is polled only while the lease is held and its fence deadline has not
//!   passed, and the response future waits on the lease itself: the moment the lease is known
//!   lost, the inner future is dropped and the client gets `503 Service Unavailable`, whatever
//!   the campaign is doing; a streaming body ends with [`LeaseLost`](crate::LeaseLost).
//! - **On a follower** the answer is `503` with `Retry-After` and a [`LEADER_HEADER`] carrying the
//!   value the current leader advertises (its [`LeaseSpec::value`](lease_core::LeaseSpec::value),
//!   e.g. its base URL); or, opt-in, `307 Temporary Redirect` to that URL plus the request's path.
//!   While no leader is known, the 503 says so.
//! - **When the campaign failed** on an error retrying cannot fix (a key used by another kind of
//!   lock, a permission denial...), the answer is `500 Internal Server Error`, not a 503 that
//!   would send clients to retry forever.
//!
//! Each of these answers is a [`Refusal`]: its body tells the client only what it can act on, never
//! an error message, the key or the backend's address (the campaign logs those, and
//! [`CampaignHandle::last_error`](lease_core::leader::CampaignHandle::last_error) has the last
//! one); [`LeaderOnlyLayer::refusal_body`] replaces the bodies.
//!
//! # Graceful shutdown
//!
//! Cancel the campaign's shutdown token when the server begins its graceful shutdown. The
//! campaign then steps down in order:
//!
//! 1. new leader-only requests get `503` ("stepping down"), with `Retry-After`;
//! 2. requests in flight (until their response bodies are sent) keep the lease, up to
//!    [`Campaign::drain_timeout`](lease_core::leader::Campaign::drain_timeout) (default 10 s);
//! 3. the lease is released, so a follower takes over at once; anything still in flight then is
//!    cancelled with a 503.
//!
//! ```no_run
//! # async fn f() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use std::time::Duration;
//! use axum::{Router, routing::post};
//! use lease_core::leader::Campaign;
//! use lease_consul::Consul;
//! use lease_core::LeaseSpec;
//! use lease_tower::leader::LeaderOnlyLayer;
//! use lease_core::CancellationToken;
//!
//! let campaign = Campaign::try_new(
//!     Arc::new(Consul::from_env()?),
//!     LeaseSpec::leader("service/api/leader").value("http://10.0.0.7:8080"),
//! )?
//! .drain_timeout(Duration::from_secs(30)); // in-flight requests get up to 30 s
//! let app: Router = Router::new()
//!     .route("/admin/compact", post(|| async { "compacted" }))
//!     .route_layer(LeaderOnlyLayer::new(campaign.handle()));
//!
//! let shutdown = CancellationToken::new();
//! let campaign = tokio::spawn(campaign.hold_until(shutdown.clone()));
//! let listener = tokio::net::TcpListener::bind("0.0.0.0:8080").await?;
//! let stop = shutdown.clone();
//! axum::serve(listener, app)
//!     .with_graceful_shutdown(async move {
//!         lease_core::shutdown_signal().await; // SIGTERM or Ctrl-C
//!         stop.cancel(); // step down: drain, then release
//!     })
//!     .await?;
//! campaign.await??; // the lease is released: a follower leads now
//! # Ok(())
//! # }
//! ```

mod config;
mod future;
mod layer;
mod refusal;
mod service;

pub use future::ResponseFuture;
pub use layer::LeaderOnlyLayer;
pub use refusal::Refusal;
pub use service::LeaderOnly;

use http::HeaderName;

/// The header a follower's 503 carries: the value the current leader advertises (usually its base
/// URL), absent while no leader is known or when the value is not a valid header value.
pub const LEADER_HEADER: HeaderName = HeaderName::from_static("lease-leader");
