//! [`SequencerCheckLayer`]: the layer and its builder options.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, HeaderValue};
use lease_core::Backend;
use tower::Layer;

use super::cache::LeaderCache;
use super::service::SequencerCheck;
use super::{MissingSequencer, SEQUENCER_HEADER};
use crate::body::retry_after_value;

/// Refuses requests whose sequencer is no longer the current holder of a leader key.
///
/// See the [module docs](crate::fence) for the header, the checks and the answers. Clones share
/// one watch of the key, started when the first service is built inside a Tokio runtime and
/// stopped when the last clone of the layer and its services is dropped.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use axum::{Router, routing::post};
/// use lease_core::{Backend, LeaseSpec, memory::Memory};
/// use lease_tower::extract::LeaseSequencer;
/// use lease_tower::fence::{SequencerCheckLayer, SEQUENCER_HEADER, sequencer_header_value};
/// use tower::ServiceExt;
///
/// let backend = Arc::new(Memory::new());
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

#[derive(Clone)]
pub(super) struct Config {
    pub(super) backend: Arc<dyn Backend>,
    pub(super) key: String,
    pub(super) header: HeaderName,
    pub(super) missing: MissingSequencer,
    pub(super) retry_after: HeaderValue,
    pub(super) cache: Arc<LeaderCache>,
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("backend", &self.backend)
            .field("key", &self.key)
            .field("header", &self.header)
            .field("missing", &self.missing)
            .field("retry_after", &self.retry_after)
            .field("cache", &self.cache)
            .finish()
    }
}

impl fmt::Debug for SequencerCheckLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SequencerCheckLayer")
            .field("config", &self.config)
            .finish()
    }
}

impl SequencerCheckLayer {
    /// A layer accepting only sequencers of the current holder of the leader key `key` on
    /// `backend`.
    pub fn new(backend: Arc<dyn Backend>, key: impl Into<String>) -> Self {
        SequencerCheckLayer {
            config: Arc::new(Config {
                backend,
                key: key.into(),
                header: SEQUENCER_HEADER,
                missing: MissingSequencer::default(),
                retry_after: retry_after_value(Duration::from_secs(1)),
                cache: Arc::new(LeaderCache::new()),
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

    /// The leader key whose holder is accepted.
    pub fn key(&self) -> &str {
        &self.config.key
    }
}

impl<S> Layer<S> for SequencerCheckLayer {
    type Service = SequencerCheck<S>;

    fn layer(&self, inner: S) -> Self::Service {
        self.config
            .cache
            .ensure_started(&self.config.backend, &self.config.key);
        SequencerCheck {
            inner,
            config: Arc::clone(&self.config),
        }
    }
}
