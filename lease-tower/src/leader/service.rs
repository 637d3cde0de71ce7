//! [`LeaderOnly`]: the service, which decides each request with a read of the campaign's term.

use std::sync::Arc;
use std::task::{Context, Poll};

use http::{HeaderValue, Request, Response, StatusCode, header};
use lease_core::leader::{CampaignHandle, CampaignState, Leader, Term};
use tower::Service;

use super::config::Config;
use super::future::ResponseFuture;
use super::{LEADER_HEADER, Refusal};
use crate::body::{LeaseBody, rejection, unavailable};

/// Passes requests to `S` only while this node's campaign holds its lease. Built by
/// [`LeaderOnlyLayer`](super::LeaderOnlyLayer); see there and the [module docs](crate::leader).
#[derive(Clone, Debug)]
pub struct LeaderOnly<S> {
    pub(super) inner: S,
    pub(super) config: Arc<Config>,
}

impl<S> LeaderOnly<S> {
    /// The campaign the service serves under.
    pub fn campaign(&self) -> &CampaignHandle {
        &self.config.campaign
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Consumes `self`, returning the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }

    /// The answer when this node does not serve: why, and where to go instead.
    fn refusal<ReqBody, ResBody>(
        &self,
        request: &Request<ReqBody>,
        term: Option<&Term>,
    ) -> Response<LeaseBody<ResBody>> {
        let config = &*self.config;
        let campaign = &config.campaign;
        let refuse = |refusal: Refusal| {
            let body = config.body(refusal);
            match refusal.status() {
                StatusCode::SERVICE_UNAVAILABLE => unavailable(&config.retry_after, body),
                status => rejection(status, body),
            }
        };
        if term.is_some_and(Term::is_stepping_down) {
            return refuse(Refusal::SteppingDown);
        }
        let not_running = match campaign.state() {
            CampaignState::Failed(error) => {
                tracing::debug!(key = campaign.key(), %error, "leader-only route: the campaign failed; answering 500");
                return refuse(Refusal::CampaignFailed);
            }
            CampaignState::Running => None,
            _ => Some(Refusal::NotCampaigning),
        };
        let leader = campaign.leader();
        if config.redirect {
            if let Some(location) = leader.as_ref().and_then(|l| location(l, request)) {
                let mut response = refuse(Refusal::Redirect);
                response.headers_mut().insert(header::LOCATION, location);
                return response;
            }
        }
        let refusal = not_running.unwrap_or(if leader.is_some() {
            Refusal::NotLeader
        } else {
            Refusal::NoLeader
        });
        let mut response = refuse(refusal);
        if let Some(value) = leader.and_then(|l| HeaderValue::from_bytes(&l.value).ok()) {
            response.headers_mut().insert(LEADER_HEADER, value);
        }
        response
    }
}

/// Where to redirect a request to the leader: its advertised base URL plus the request's path
/// and query.
fn location<ReqBody>(leader: &Leader, request: &Request<ReqBody>) -> Option<HeaderValue> {
    let base = base_url(leader.value_str()?)?;
    let path = request
        .uri()
        .path_and_query()
        .map_or("/", |path| path.as_str());
    HeaderValue::try_from(format!("{base}{path}")).ok()
}

/// The advertised value as a base URL for redirects: `http://` is assumed when no scheme is given.
fn base_url(value: &str) -> Option<String> {
    let value = value.trim().trim_end_matches('/');
    if value.is_empty() || value.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return None;
    }
    if value.starts_with("http://") || value.starts_with("https://") {
        Some(value.to_owned())
    } else {
        Some(format!("http://{value}"))
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for LeaderOnly<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
{
    type Response = Response<LeaseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, ResBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<ReqBody>) -> Self::Future {
        match self.config.campaign.begin() {
            Some(work) => {
                request.extensions_mut().insert(work.lease().clone());
                ResponseFuture::running(self.inner.call(request), work)
            }
            None => {
                let term = self.config.campaign.term();
                ResponseFuture::rejected(self.refusal(&request, term.as_ref()))
            }
        }
    }
}
