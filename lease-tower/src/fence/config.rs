//! `Config`: what the layer and every service it builds share, in one `Arc`.

use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, HeaderValue};
use lease_core::Backend;

use super::MissingSequencer;
use super::cache::LeaderCache;

#[derive(Clone, Debug)]
pub(super) struct Config {
    pub(super) header: HeaderName,
    pub(super) missing: MissingSequencer,
    pub(super) retry_after: HeaderValue,
    pub(super) max_staleness: Duration,
    pub(super) read_timeout: Duration,
    pub(super) cache: Arc<LeaderCache>,
}

impl Config {
    pub(super) fn key(&self) -> &str {
        self.cache.watch().key()
    }

    pub(super) fn backend(&self) -> &Arc<dyn Backend> {
        self.cache.watch().backend()
    }
}
