//! Tower and axum middleware on distributed leases.
//!
//! Three layers, each deciding per request in `call` (never waiting for a remote lease in
//! `poll_ready`) and answering with HTTP responses rather than errors:
//!
//! - [`leader::LeaderOnlyLayer`]: routes served only while this node's
//!   [`Campaign`](lease_core::leader::Campaign) leads; followers answer 503 with `Retry-After`
//!   and the leader's advertised address, or redirect to it (307). The layer is built from a
//!   handle on the campaign, so routes, a leader-only worker and a health check on the same key
//!   share one election; on graceful shutdown the campaign lets requests in flight finish before
//!   it hands the lease on.
//! - [`semaphore::SemaphoreLayer`]: a cluster-wide concurrency limit; each request holds one slot
//!   of a distributed semaphore until its response body has been sent.
//! - [`fence::SequencerCheckLayer`]: fencing on the receiving side; a request stamped with a stale
//!   sequencer gets 409, and no answer older than a freshness bound (1 s by default) passes one.
//!
//! Beside them, [`health::Health`] answers `/healthz` and `/readyz` with this node's campaigns,
//! leases and backend reachability as JSON; readiness turns 503 while the backend is unreachable.
//!
//! Layers are pure constructors: building one, or its services, starts no task. Every layer
//! works on any [`lease_core::Backend`], so the same router runs on the in-process memory
//! backend in tests and on Consul in production. With the `axum` feature (default), [`extract`]
//! lets handlers take the lease or its sequencer as an argument.
//!
//! # Example
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use axum::{Router, routing::{get, post}};
//! use lease_core::leader::Campaign;
//! use lease_core::{BoxError, LeaseSpec, memory::Memory};
//! use lease_tower::{leader::LeaderOnlyLayer, semaphore::SemaphoreLayer};
//! use lease_tower::extract::LeaseSequencer;
//! use lease_core::CancellationToken;
//! use tower::ServiceExt;
//!
//! let backend = Memory::new(); // or Consul::from_env()?, or an Arc<dyn Backend>: any backend
//! // One election for the key, shared by the routes and a worker.
//! let campaign = Campaign::try_new(
//!     backend.clone(),
//!     LeaseSpec::leader("service/api/leader").value("http://127.0.0.1:3000"),
//! )?;
//! let leader = campaign.handle();
//! let app: Router = Router::new()
//!     .route(
//!         "/admin/compact",
//!         post(|LeaseSequencer(s): LeaseSequencer| async move { format!("compacted under {s}\n") }),
//!     )
//!     .route_layer(LeaderOnlyLayer::new(campaign.handle()))
//!     .merge(
//!         Router::new()
//!             .route("/report", get(|| async { "report\n" }))
//!             .route_layer(SemaphoreLayer::new(backend, LeaseSpec::semaphore("semaphores/report", 2))),
//!     );
//! let shutdown = CancellationToken::new();
//! let running = tokio::spawn(campaign.run_until(shutdown.clone(), |lease| async move {
//!     // The leader-only worker runs under the same term as the routes.
//!     println!("worker leading as {}", lease.sequencer());
//!     std::future::pending::<Result<(), BoxError>>().await
//! }));
//!
//! // The only node campaigning wins at once.
//! leader.terms().wait_for(|term| term.is_some()).await?;
//! let request = http::Request::post("/admin/compact").body(axum::body::Body::empty())?;
//! assert_eq!(app.clone().oneshot(request).await?.status(), http::StatusCode::OK);
//! let request = http::Request::get("/report").body(axum::body::Body::empty())?;
//! assert_eq!(app.oneshot(request).await?.status(), http::StatusCode::OK);
//!
//! shutdown.cancel();
//! running.await??;
//! # Ok(())
//! # }
//! ```

// On docs.rs (`--cfg docsrs`), a feature-gated item shows the feature it needs.
#![cfg_attr(docsrs, feature(doc_cfg))]
// The docs point handlers to the extractors, which exist only with the `axum` feature.
#![cfg_attr(not(feature = "axum"), allow(rustdoc::broken_intra_doc_links))]

mod body;
#[cfg(feature = "axum")]
pub mod extract;
pub mod fence;
pub mod health;
pub mod leader;
pub mod semaphore;

pub use body::{LeaseBody, LeaseLost};

/// The examples of this crate's README (what crates.io shows), compiled as doctests so that the
/// front page cannot drift from the API; `tests/tests/readmes.rs` of the workspace checks the
/// features, commands and links it names.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
