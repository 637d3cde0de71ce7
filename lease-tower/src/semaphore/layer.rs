//! [`SemaphoreLayer`]: the layer, its builder options (and the service's
//! constructors that go through the layer, so the service never names it).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use lease_core::{Backend, LeaseSpec, Target, Wait};
use tower::Layer;

use super::config::Config;
use super::service::Semaphore;
use crate::body::retry_after_value;

/// Limits the requests served at once, across every process, to the semaphore's limit.
///
/// See the [module docs](crate::semaphore).
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use axum::{Router, routing::get};
/// use lease_core::{LeaseSpec, memory::Memory};
/// use lease_tower::semaphore::SemaphoreLayer;
/// use tower::ServiceExt;
///
/// let backend = Memory::new();
/// let app: Router = Router::new()
///     .route("/report", get(|| async { "a heavy report" }))
///     .route_layer(
///         SemaphoreLayer::new(backend, LeaseSpec::semaphore("semaphores/reports", 2))
///             .max_wait(Duration::from_millis(500)),
///     );
///
/// let request = http::Request::get("/report").body(axum::body::Body::empty())?;
/// let response = app.oneshot(request).await?;
/// assert_eq!(response.status(), http::StatusCode::OK);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
#[must_use]
pub struct SemaphoreLayer {
    pub(super) config: Arc<Config>,
}

impl fmt::Debug for SemaphoreLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SemaphoreLayer")
            .field("config", &self.config)
            .finish()
    }
}

impl SemaphoreLayer {
    /// The default longest wait for a slot.
    pub const DEFAULT_MAX_WAIT: Duration = Duration::from_secs(5);
    /// The default `Retry-After` of a 503.
    pub const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(1);

    /// A layer taking one slot of `spec` (a [`LeaseSpec::semaphore`]) on `backend` per request.
    ///
    /// `backend` is any backend: by value, in an `Arc`, or an `Arc<dyn Backend>`
    /// ([`into_shared`](lease_core::backend::into_shared)).
    ///
    /// The spec's wait policy is replaced by [`max_wait`](Self::max_wait) (default 5 s): a request
    /// never waits forever.
    ///
    /// Clones of the layer also share a process-local gate of `limit` permits taken before the
    /// distributed slot: this process can never hold more than `limit` slots, and letting more
    /// requests contend would only cost the backend failed compare-and-set writes. Layers built
    /// separately for the same semaphore each have their own gate.
    pub fn new(backend: impl Backend, spec: LeaseSpec) -> Self {
        let spec = spec.wait(Wait::UpTo(Self::DEFAULT_MAX_WAIT));
        let limit = match spec.target() {
            Target::Semaphore { limit, .. } => *limit as usize,
            _ => 1,
        };
        SemaphoreLayer {
            config: Arc::new(Config {
                backend: lease_core::backend::into_shared(backend),
                spec: Arc::new(spec),
                retry_after: retry_after_value(Self::DEFAULT_RETRY_AFTER),
                local: Arc::new(tokio::sync::Semaphore::new(limit)),
            }),
        }
    }

    /// How long a request waits for a slot before it gets 503. Zero means one attempt.
    ///
    /// A finished request frees its place in this process at once and gives its slot back to
    /// the cluster a moment later (in the background), so with zero wait a request arriving in
    /// that moment can get 503 although a slot is about to be free; a short wait avoids that.
    pub fn max_wait(mut self, wait: Duration) -> Self {
        let wait = if wait.is_zero() {
            Wait::Never
        } else {
            Wait::UpTo(wait)
        };
        let config = self.config_mut();
        config.spec = Arc::new((*config.spec).clone().wait(wait));
        self
    }

    /// The `Retry-After` of a 503, rounded up to whole seconds. Default: 1 s.
    pub fn retry_after(mut self, after: Duration) -> Self {
        self.config_mut().retry_after = retry_after_value(after);
        self
    }

    /// The spec each request acquires.
    pub fn spec(&self) -> &LeaseSpec {
        &self.config.spec
    }

    fn config_mut(&mut self) -> &mut Config {
        Arc::make_mut(&mut self.config)
    }
}

impl<S> Semaphore<S> {
    /// Wraps `inner`; shorthand for `SemaphoreLayer::new(backend, spec).layer(inner)`.
    pub fn new(inner: S, backend: impl Backend, spec: LeaseSpec) -> Self {
        tower::Layer::layer(&SemaphoreLayer::new(backend, spec), inner)
    }

    /// A layer that wraps services in `Semaphore`; the same as [`SemaphoreLayer::new`].
    pub fn layer(backend: impl Backend, spec: LeaseSpec) -> SemaphoreLayer {
        SemaphoreLayer::new(backend, spec)
    }
}

impl<S> Layer<S> for SemaphoreLayer {
    type Service = Semaphore<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Semaphore {
            inner,
            config: Arc::clone(&self.config),
        }
    }
}
