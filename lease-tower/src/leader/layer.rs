//! [`LeaderOnlyLayer`]: the layer, its builder options (and the service's
//! constructors that go through the layer, so the service never names it).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use lease_core::leader::CampaignHandle;
use tower::Layer;

use super::Refusal;
use super::config::Config;
use super::service::LeaderOnly;
use crate::body::retry_after_value;

/// Serves requests only while this node's [`Campaign`](lease_core::leader::Campaign) holds its
/// lease.
///
/// Built from a handle on the campaign (`campaign.handle()`), so the routes share the one
/// election the process runs for the key with its worker and health checks; the layer itself
/// starts nothing. Run the campaign next to the server (`tokio::spawn(campaign.run_until(..))`
/// or `hold_until`). See the [module docs](crate::leader) for what leaders and followers answer,
/// and for graceful shutdown.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use axum::{Router, routing::post};
/// use lease_core::leader::Campaign;
/// use lease_core::{LeaseSpec, memory::Memory};
/// use lease_tower::extract::LeaseSequencer;
/// use lease_tower::leader::LeaderOnlyLayer;
/// use lease_core::CancellationToken;
///
/// let campaign = Campaign::try_new(
///     Memory::new(),
///     LeaseSpec::leader("service/api/leader").value("http://10.0.0.7:8080"),
/// )?;
/// let leader_only = LeaderOnlyLayer::new(campaign.handle())
///     .retry_after(Duration::from_secs(2))
///     .redirect_to_leader(true);
///
/// let app: Router = Router::new()
///     .route(
///         "/admin/compact",
///         post(|LeaseSequencer(sequencer): LeaseSequencer| async move {
///             format!("compacting as {sequencer}")
///         }),
///     )
///     .route_layer(leader_only);
/// let shutdown = CancellationToken::new();
/// tokio::spawn(campaign.hold_until(shutdown.clone()));
/// # let _ = app;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
#[must_use]
pub struct LeaderOnlyLayer {
    pub(super) config: Arc<Config>,
}

impl fmt::Debug for LeaderOnlyLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaderOnlyLayer")
            .field("config", &self.config)
            .finish()
    }
}

impl LeaderOnlyLayer {
    /// The default `Retry-After` of a follower's 503.
    pub const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(1);

    /// A layer serving requests while the campaign behind `campaign` leads. Give the campaign's
    /// spec the node's base URL as its [`value`](lease_core::LeaseSpec::value), so followers can
    /// point clients to the leader.
    pub fn new(campaign: CampaignHandle) -> Self {
        LeaderOnlyLayer {
            config: Arc::new(Config {
                campaign,
                retry_after: retry_after_value(Self::DEFAULT_RETRY_AFTER),
                redirect: false,
                refusal_body: None,
            }),
        }
    }

    /// The `Retry-After` of a 503 (a follower, no leader known, stepping down), rounded up to
    /// whole seconds. Default: 1 s.
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

    /// Answers each [`Refusal`] with the body `body` returns for it (status and headers stay
    /// the layer's, and `Content-Type` stays `text/plain; charset=utf-8`). Default:
    /// [`Refusal::text`]. Whatever it returns reaches any client: keep internal details out.
    ///
    /// ```
    /// use lease_core::leader::Campaign;
    /// use lease_core::{LeaseSpec, memory::Memory};
    /// use lease_tower::leader::{LeaderOnlyLayer, Refusal};
    ///
    /// let campaign = Campaign::try_new(Memory::new(), LeaseSpec::leader("service/api/leader"))?;
    /// let layer = LeaderOnlyLayer::new(campaign.handle()).refusal_body(|refusal| match refusal {
    ///     Refusal::NoLeader => "Electing a leader; try again in a second.\n".to_owned(),
    ///     other => format!("{other}\n"),
    /// });
    /// # let _ = layer;
    /// # Ok::<(), lease_core::Error>(())
    /// ```
    pub fn refusal_body<F>(mut self, body: F) -> Self
    where
        F: Fn(Refusal) -> String + Send + Sync + 'static,
    {
        Arc::make_mut(&mut self.config).refusal_body = Some(Arc::new(body));
        self
    }

    /// The campaign the layer serves under: whether this node leads, who does, its state.
    pub fn campaign(&self) -> &CampaignHandle {
        &self.config.campaign
    }
}

impl<S> LeaderOnly<S> {
    /// Wraps `inner`; shorthand for `LeaderOnlyLayer::new(campaign).layer(inner)`.
    pub fn new(inner: S, campaign: CampaignHandle) -> Self {
        tower::Layer::layer(&LeaderOnlyLayer::new(campaign), inner)
    }

    /// A layer that wraps services in `LeaderOnly`; the same as [`LeaderOnlyLayer::new`].
    pub fn layer(campaign: CampaignHandle) -> LeaderOnlyLayer {
        LeaderOnlyLayer::new(campaign)
    }
}

impl<S> Layer<S> for LeaderOnlyLayer {
    type Service = LeaderOnly<S>;

    fn layer(&self, inner: S) -> Self::Service {
        LeaderOnly {
            inner,
            config: Arc::clone(&self.config),
        }
    }
}
