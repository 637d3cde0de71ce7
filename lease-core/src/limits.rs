//! The ranges every backend holds a [`LeaseSpec`](crate::LeaseSpec) to: Consul's, so that a spec
//! that works on one backend works on all of them. Their own module, so that the spec that
//! enforces them and the errors that name them both depend on it, and not on each other.

use std::time::Duration;

/// The shortest session TTL Consul accepts.
pub const MIN_TTL: Duration = Duration::from_secs(10);
/// The longest session TTL Consul accepts.
pub const MAX_TTL: Duration = Duration::from_secs(86_400);
/// The longest lock-delay Consul honours.
pub const MAX_LOCK_DELAY: Duration = Duration::from_secs(60);

/// An instant about thirty years ahead: tokio's own stand-in for "never".
pub(crate) fn far_future() -> tokio::time::Instant {
    tokio::time::Instant::now() + Duration::from_secs(86_400 * 365 * 30)
}
