//! [`SequencerCheckLayer`]: the layer, its builder options (and the service's
//! constructors that go through the layer, so the service never names it).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::HeaderName;
use lease_core::Backend;
use lease_core::leader::LeaderWatch;
use tower::Layer;

use super::cache::LeaderCache;
use super::config::Config;
use super::service::SequencerCheck;
use super::{MissingSequencer, SEQUENCER_HEADER};
use crate::body::retry_after_value;

/// Refuses requests whose sequencer is no longer the current holder of a leader key.
///
/// See the [module docs](crate::fence) for the header, the checks and the answers. Clones share
/// one watch of the key ([`LeaderWatch`]), started by the first request that needs it (building
/// the layer or its services starts nothing) and stopped when the last clone of the layer and
/// its services is dropped.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use axum::{Router, routing::post};
/// use lease_core::{Backend, LeaseSpec, memory::Memory};
/// use lease_tower::extract::LeaseSequencer;
/// use lease_tower::fence::{SequencerCheckLayer, SEQUENCER_HEADER, sequencer_header_value};
/// use tower::ServiceExt;
///
/// let backend = Memory::new();
/// let app: Router = Router::new()
///     .route("/apply", post(|LeaseSequencer(s): LeaseSequencer| async move { format!("applied under {s}") }))
///     .route_layer(SequencerCheckLayer::new(backend.clone(), "service/api/leader"));
///
/// // The leader stamps its request with its sequencer...
/// let lease = backend.acquire(&LeaseSpec::leader("service/api/leader")).await?;
/// let request = http::Request::post("/apply")
///     .header(SEQUENCER_HEADER, sequencer_header_value(lease.sequencer())?)
///     .body(axum::body::Body::empty())?;
/// assert_eq!(app.clone().oneshot(request).await?.status(), http::StatusCode::OK);
///
/// // ...and once it has lost the lease, the same stamp is refused.
/// let stale = lease.sequencer().clone();
/// lease.release().await?;
/// let request = http::Request::post("/apply")
///     .header(SEQUENCER_HEADER, sequencer_header_value(&stale)?)
///     .body(axum::body::Body::empty())?;
/// assert_eq!(app.oneshot(request).await?.status(), http::StatusCode::CONFLICT);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
#[must_use]
pub struct SequencerCheckLayer {
    pub(super) config: Arc<Config>,
}

impl fmt::Debug for SequencerCheckLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SequencerCheckLayer")
            .field("config", &self.config)
            .finish()
    }
}

impl SequencerCheckLayer {
    /// The default [`max_staleness`](Self::max_staleness).
    pub const DEFAULT_MAX_STALENESS: Duration = Duration::from_secs(1);
    /// The default [`read_timeout`](Self::read_timeout).
    pub const DEFAULT_READ_TIMEOUT: Duration = Duration::from_secs(2);

    /// A layer accepting only sequencers of the current holder of the leader key `key` on
    /// `backend` (any backend: by value, in an `Arc`, or an `Arc<dyn Backend>`).
    pub fn new(backend: impl Backend, key: impl Into<String>) -> Self {
        Self::with_watch(LeaderWatch::new(backend, key))
    }

    /// A layer following the key of `watch` through it, shared with others in this process (such
    /// as the campaign for the same key:
    /// [`CampaignHandle::leader_watch`](lease_core::leader::CampaignHandle::leader_watch)), so
    /// the process runs one observation of the key.
    pub fn with_watch(watch: LeaderWatch) -> Self {
        SequencerCheckLayer {
            config: Arc::new(Config {
                header: SEQUENCER_HEADER,
                missing: MissingSequencer::default(),
                retry_after: retry_after_value(Duration::from_secs(1)),
                max_staleness: Self::DEFAULT_MAX_STALENESS,
                read_timeout: Self::DEFAULT_READ_TIMEOUT,
                cache: Arc::new(LeaderCache::new(watch)),
            }),
        }
    }

    /// What to do with a request that has no sequencer header. Default:
    /// [`MissingSequencer::Reject`] (428).
    pub fn missing(mut self, missing: MissingSequencer) -> Self {
        Arc::make_mut(&mut self.config).missing = missing;
        self
    }

    /// The header to read the sequencer from. Default: [`SEQUENCER_HEADER`] (`lease-sequencer`).
    pub fn header(mut self, header: impl Into<HeaderName>) -> Self {
        Arc::make_mut(&mut self.config).header = header.into();
        self
    }

    /// The `Retry-After` of the 503 answered when the backend cannot tell. Default: 1 s.
    pub fn retry_after(mut self, after: Duration) -> Self {
        Arc::make_mut(&mut self.config).retry_after = retry_after_value(after);
        self
    }

    /// How old an answer about the key's holder may be and still pass a request without asking
    /// the backend. Default: [`DEFAULT_MAX_STALENESS`](Self::DEFAULT_MAX_STALENESS) (1 s).
    ///
    /// The watch of the key reports changes as they happen, but silence looks the same whether
    /// the key is quiet or the network is: past this bound, the layer makes a consistent read
    /// ([`Backend::check_sequencer`], bounded by [`read_timeout`](Self::read_timeout)), whose
    /// success is itself fresh for this long. So a receiver that can no longer hear from the
    /// backend stops passing the last leader's work within `max_staleness + read_timeout`. A
    /// stale sequencer (older than one already seen) is refused whatever the age. `Duration::ZERO`
    /// makes every check a consistent read.
    pub fn max_staleness(mut self, max_staleness: Duration) -> Self {
        Arc::make_mut(&mut self.config).max_staleness = max_staleness;
        self
    }

    /// How long a consistent read may take; past it, the request is refused with 503 and
    /// `Retry-After`. Default: [`DEFAULT_READ_TIMEOUT`](Self::DEFAULT_READ_TIMEOUT) (2 s).
    pub fn read_timeout(mut self, read_timeout: Duration) -> Self {
        Arc::make_mut(&mut self.config).read_timeout = read_timeout;
        self
    }

    /// The leader key whose holder is accepted.
    pub fn key(&self) -> &str {
        self.config.key()
    }
}

impl<S> SequencerCheck<S> {
    /// Wraps `inner`; shorthand for `SequencerCheckLayer::new(backend, key).layer(inner)`.
    pub fn new(inner: S, backend: impl Backend, key: impl Into<String>) -> Self {
        tower::Layer::layer(&SequencerCheckLayer::new(backend, key), inner)
    }

    /// A layer that wraps services in `SequencerCheck`; the same as [`SequencerCheckLayer::new`].
    pub fn layer(backend: impl Backend, key: impl Into<String>) -> SequencerCheckLayer {
        SequencerCheckLayer::new(backend, key)
    }
}

impl<S> Layer<S> for SequencerCheckLayer {
    type Service = SequencerCheck<S>;

    fn layer(&self, inner: S) -> Self::Service {
        SequencerCheck {
            inner,
            config: Arc::clone(&self.config),
        }
    }
}
