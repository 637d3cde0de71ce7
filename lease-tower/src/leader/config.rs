//! `Config`: what the layer and every service it builds share, in one `Arc`.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use http::HeaderValue;
use lease_core::leader::CampaignHandle;

use super::Refusal;

/// The campaign, and how followers are answered: one `Arc`, so a service clone (axum clones a
/// route's service per request) is one reference-count increment.
#[derive(Clone)]
pub(super) struct Config {
    pub(super) campaign: CampaignHandle,
    pub(super) retry_after: HeaderValue,
    pub(super) redirect: bool,
    /// The body of each refusal; `None`: [`Refusal::text`].
    pub(super) refusal_body: Option<Arc<RefusalBody>>,
}

type RefusalBody = dyn Fn(Refusal) -> String + Send + Sync;

impl Config {
    /// The body a refusal answers with.
    pub(super) fn body(&self, refusal: Refusal) -> Bytes {
        match &self.refusal_body {
            Some(body) => Bytes::from(body(refusal)),
            None => Bytes::from_static(refusal.text().as_bytes()),
        }
    }
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("campaign", &self.campaign)
            .field("retry_after", &self.retry_after)
            .field("redirect", &self.redirect)
            .field(
                "refusal_body",
                &self.refusal_body.as_ref().map(|_| "custom"),
            )
            .finish()
    }
}
