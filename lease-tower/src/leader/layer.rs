//! [`LeaderOnlyLayer`]: the layer and its builder options.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::HeaderValue;
use lease_core::leader::Leader;
use lease_core::{Backend, LeaseSpec};
use tokio_util::sync::CancellationToken;
use tower::Layer;

use super::service::LeaderOnly;
use super::state::Handle;
use crate::body::retry_after_value;

/// Serves requests only on the node that holds the leader lease `spec` names.
///
/// See the [module docs](crate::leader) for what leaders and followers answer. Clones share one
/// campaign; it starts when the first service is built (or the first request arrives) inside a
/// Tokio runtime, and stops, releasing the lease, when the last clone of the layer and of its
/// services is dropped or the [shutdown token](Self::shutdown_on) is cancelled.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use std::time::Duration;
/// use axum::{Router, routing::post};
/// use lease_core::{LeaseSpec, memory::Memory};
/// use lease_tower::extract::LeaseSequencer;
/// use lease_tower::leader::LeaderOnlyLayer;
///
/// let backend = Arc::new(Memory::new());
/// let leader_only = LeaderOnlyLayer::new(
///     backend,
///     LeaseSpec::leader("service/api/leader").value("http://10.0.0.7:8080"),
/// )
/// .retry_after(Duration::from_secs(2))
/// .redirect_to_leader(true);
///
/// let app: Router = Router::new()
///     .route(
///         "/admin/compact",
///         post(|LeaseSequencer(sequencer): LeaseSequencer| async move {
///             format!("compacting as {sequencer}")
///         }),
///     )
///     .route_layer(leader_only.clone());
/// # let _ = app;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
#[must_use]
pub struct LeaderOnlyLayer {
    pub(super) backend: Arc<dyn Backend>,
    pub(super) spec: LeaseSpec,
    pub(super) handle: Arc<Handle>,
    pub(super) config: Arc<Config>,
}

/// How followers answer.
#[derive(Clone, Debug)]
pub(super) struct Config {
    pub(super) retry_after: HeaderValue,
    pub(super) redirect: bool,
}

impl fmt::Debug for LeaderOnlyLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaderOnlyLayer")
            .field("backend", &self.backend)
            .field("spec", &self.spec)
            .field("handle", &self.handle)
            .field("config", &self.config)
            .finish()
    }
}

impl LeaderOnlyLayer {
    /// The default `Retry-After` of a follower's 503.
    pub const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(1);

    /// A layer that campaigns for `spec` (normally [`LeaseSpec::leader`], with the node's base URL
    /// as its [`value`](LeaseSpec::value) so followers can point clients to it) on `backend`.
    pub fn new(backend: Arc<dyn Backend>, spec: LeaseSpec) -> Self {
        let handle = Arc::new(Handle::new(
            Arc::clone(&backend),
            spec.clone(),
            CancellationToken::new(),
        ));
        LeaderOnlyLayer {
            backend,
            spec,
            handle,
            config: Arc::new(Config {
                retry_after: retry_after_value(Self::DEFAULT_RETRY_AFTER),
                redirect: false,
            }),
        }
    }

    /// The `Retry-After` of a follower's 503, rounded up to whole seconds. Default: 1 s.
    pub fn retry_after(mut self, after: Duration) -> Self {
        Arc::make_mut(&mut self.config).retry_after = retry_after_value(after);
        self
    }

    /// Answer followers' requests with `307 Temporary Redirect` to the leader's advertised URL
    /// (`http://` assumed when it has no scheme) plus the request's path and query, instead of 503.
    /// While no leader is known the answer stays 503. Default: off.
    pub fn redirect_to_leader(mut self, redirect: bool) -> Self {
        Arc::make_mut(&mut self.config).redirect = redirect;
        self
    }

    /// Also stop the campaign and release the lease when `token` is cancelled (e.g. on graceful
    /// shutdown, so a follower takes over without waiting for the session TTL).
    ///
    /// Call it before the layer is used: it replaces the campaign, which has not started yet.
    pub fn shutdown_on(mut self, token: &CancellationToken) -> Self {
        self.handle = Arc::new(Handle::new(
            Arc::clone(&self.backend),
            self.spec.clone(),
            token.child_token(),
        ));
        self
    }

    /// Stops the campaign and waits until the lease is released (so a follower can take over at
    /// once); requests get 503 from then on. Call it after the server's graceful shutdown, before
    /// the runtime ends: a lease still held when the process exits is only freed by its TTL.
    pub async fn shutdown(&self) {
        self.handle.shutdown().await;
    }

    /// Whether this node holds the lease now (an atomic read).
    pub fn is_leader(&self) -> bool {
        self.handle.shared.held_tenure().is_some()
    }

    /// The current leader as the backend's watch last saw it (no I/O); `None` while nobody leads,
    /// or when the backend cannot observe leader keys.
    pub fn leader(&self) -> Option<Leader> {
        self.handle.shared.leader().map(|view| view.leader)
    }
}

impl<S> Layer<S> for LeaderOnlyLayer {
    type Service = LeaderOnly<S>;

    fn layer(&self, inner: S) -> Self::Service {
        self.handle.ensure_started();
        LeaderOnly {
            inner,
            handle: Arc::clone(&self.handle),
            config: Arc::clone(&self.config),
        }
    }
}
