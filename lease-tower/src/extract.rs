//! axum extractors for what the layers put in a request's extensions.
//!
//! - [`HeldLease`]: the lease a request runs under ([`LeaderOnlyLayer`](crate::leader::LeaderOnlyLayer)
//!   or [`SemaphoreLayer`](crate::semaphore::SemaphoreLayer)), to await its loss or pass it on.
//! - [`LeaseSequencer`]: the fencing token of that lease, or the sequencer a
//!   [`SequencerCheckLayer`](crate::fence::SequencerCheckLayer) has checked.
//!
//! A handler that takes one of them on a route without the layer gets `500 Internal Server Error`
//! with a message naming the missing layer: that is a wiring mistake, not a client error.

use axum::extract::FromRequestParts;
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use http::request::Parts;
use lease_core::{LeaseWatcher, Sequencer};

/// The lease the request runs under.
///
/// # Examples
///
/// ```
/// use lease_tower::extract::HeldLease;
///
/// async fn handler(HeldLease(lease): HeldLease) -> String {
///     // Stop at the next await point if the lease is lost meanwhile.
///     match lease.run(async { "done" }).await {
///         Ok(out) => out.to_owned(),
///         Err(reason) => format!("cancelled: {reason}"),
///     }
/// }
/// # let _: axum::routing::MethodRouter = axum::routing::get(handler);
/// ```
#[derive(Clone, Debug)]
pub struct HeldLease(pub LeaseWatcher);

/// The sequencer of the request's lease, or the one a sequencer check accepted.
///
/// # Examples
///
/// ```
/// use lease_tower::extract::LeaseSequencer;
///
/// async fn handler(LeaseSequencer(sequencer): LeaseSequencer) -> String {
///     format!("working under {sequencer}")
/// }
/// # let _: axum::routing::MethodRouter = axum::routing::get(handler);
/// ```
#[derive(Clone, Debug)]
pub struct LeaseSequencer(pub Sequencer);

/// The rejection of [`HeldLease`] and [`LeaseSequencer`]: the route lacks the layer that provides
/// them. Answers 500 with a message naming the layers.
#[derive(Clone, Copy, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MissingLease {
    /// No [`LeaseWatcher`] in the request's extensions.
    #[error(
        "this handler takes the request's lease, but no lease layer ran for this route: add \
         lease_tower::leader::LeaderOnlyLayer or lease_tower::semaphore::SemaphoreLayer with \
         `route_layer` (a layer added after the route is registered does not apply to it)"
    )]
    Lease,
    /// No [`Sequencer`] nor [`LeaseWatcher`] in the request's extensions.
    #[error(
        "this handler takes a sequencer, but no lease layer ran for this route: add \
         lease_tower::fence::SequencerCheckLayer (checked sequencers of requests), or \
         LeaderOnlyLayer / SemaphoreLayer (this node's lease), with `route_layer`"
    )]
    Sequencer,
}

impl IntoResponse for MissingLease {
    fn into_response(self) -> Response {
        tracing::error!(error = %self, "lease extractor: missing layer");
        (StatusCode::INTERNAL_SERVER_ERROR, self.to_string()).into_response()
    }
}

impl<S: Send + Sync> FromRequestParts<S> for HeldLease {
    type Rejection = MissingLease;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        parts
            .extensions
            .get::<LeaseWatcher>()
            .cloned()
            .map(HeldLease)
            .ok_or(MissingLease::Lease)
    }
}

impl<S: Send + Sync> FromRequestParts<S> for LeaseSequencer {
    type Rejection = MissingLease;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        if let Some(sequencer) = parts.extensions.get::<Sequencer>() {
            return Ok(LeaseSequencer(sequencer.clone()));
        }
        parts
            .extensions
            .get::<LeaseWatcher>()
            .map(|lease| LeaseSequencer(lease.sequencer().clone()))
            .ok_or(MissingLease::Sequencer)
    }
}
