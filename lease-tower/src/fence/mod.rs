//! Fencing on the receiving side: refuse work stamped with a stale sequencer.
//!
//! A leader hands work to another service with its lease's [`Sequencer`] in the
//! [`SEQUENCER_HEADER`] (`lease-sequencer`), in the sequencer's text form
//! `<backend>:[<generation>.]<index>:<holder>:<key>`, e.g.
//!
//! ```text
//! lease-sequencer: consul:41.7:4ca8e74b-6350-7587-addf-a18084928f3c:service/api/leader
//! ```
//!
//! ([`sequencer_header_value`] writes it). [`SequencerCheckLayer`] on the receiving service checks
//! that the sequencer still names the current holder of the leader key it was configured with:
//!
//! - first against what this process knows of the key: the backend's watch of it
//!   ([`LeaderWatch`](lease_core::leader::LeaderWatch), the crate's one observe loop, shareable
//!   with a campaign for the same key) and the layer's own recent consistent reads. The current
//!   holder passes at once **while that answer is fresh** (younger than
//!   [`max_staleness`](SequencerCheckLayer::max_staleness), 1 s by default); an older
//!   acquisition (a lower index) is refused at once;
//! - otherwise (nothing fresh known, nobody holds the key, or the sequencer is newer than what
//!   was seen) with one consistent read
//!   ([`Backend::check_sequencer`](lease_core::Backend::check_sequencer)), bounded by
//!   [`read_timeout`](SequencerCheckLayer::read_timeout) (2 s by default).
//!
//! A receiver cut off from the backend (no error, no answer) therefore stops passing the last
//! leader's work within `max_staleness + read_timeout`.
//!
//! Answers: `409 Conflict` for a stale sequencer or one for another key, `400 Bad Request` for a
//! malformed header, `428 Precondition Required` for a missing one (or, by configuration, the
//! request passes unchecked), `503` with `Retry-After` when the backend cannot tell (now), `500`
//! when the check cannot be made at all (an error retrying cannot fix). A request that
//! passes carries the checked [`Sequencer`] in its extensions
//! ([`LeaseSequencer`](crate::extract::LeaseSequencer)).

mod cache;
mod config;
mod future;
mod layer;
mod service;

pub use future::ResponseFuture;
pub use layer::SequencerCheckLayer;
pub use service::SequencerCheck;

use http::header::InvalidHeaderValue;
use http::{HeaderName, HeaderValue};
use lease_core::Sequencer;

/// The request header carrying a sequencer, in its text form.
pub const SEQUENCER_HEADER: HeaderName = HeaderName::from_static("lease-sequencer");

/// The value of a [`SEQUENCER_HEADER`] for `sequencer`.
///
/// The text form is visible ASCII by construction, so this fails only if that ever changed.
pub fn sequencer_header_value(sequencer: &Sequencer) -> Result<HeaderValue, InvalidHeaderValue> {
    HeaderValue::try_from(sequencer.to_string())
}

/// What [`SequencerCheckLayer`] does with a request that has no sequencer header.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum MissingSequencer {
    /// Answer `428 Precondition Required`.
    #[default]
    Reject,
    /// Pass it to the inner service unchecked, with no sequencer in its extensions.
    Pass,
}
