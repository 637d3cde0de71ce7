//! `Config`: what the layer and every service it builds share, in one `Arc`.

use std::fmt;
use std::sync::Arc;

use http::HeaderValue;
use lease_core::{Backend, LeaseSpec};

/// What every request of one layer shares.
#[derive(Clone)]
pub(super) struct Config {
    pub(super) backend: Arc<dyn Backend>,
    pub(super) spec: Arc<LeaseSpec>,
    pub(super) retry_after: HeaderValue,
    /// Admission in this process before the distributed acquire: a process can never hold more
    /// than `limit` slots, so more concurrent contenders would only add failed CAS writes.
    pub(super) local: Arc<tokio::sync::Semaphore>,
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("backend", &self.backend)
            .field("spec", &self.spec)
            .field("retry_after", &self.retry_after)
            .field("local_permits", &self.local.available_permits())
            .finish()
    }
}
