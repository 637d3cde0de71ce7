//! [`LeaderOnly`]: the service, which decides each request with one atomic read.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode, header};
use lease_core::leader::Leader;
use lease_core::{Backend, LeaseSpec};
use tower::Service;

use super::LEADER_HEADER;
use super::future::ResponseFuture;
use super::layer::{Config, LeaderOnlyLayer};
use super::state::Handle;
use crate::body::{LeaseBody, rejection, unavailable};

/// Passes requests to `S` only while this node holds the leader lease. Built by
/// [`LeaderOnlyLayer`]; see there and the [module docs](crate::leader).
pub struct LeaderOnly<S> {
    pub(super) inner: S,
    pub(super) handle: Arc<Handle>,
    pub(super) config: Arc<Config>,
}

impl<S: Clone> Clone for LeaderOnly<S> {
    fn clone(&self) -> Self {
        LeaderOnly {
            inner: self.inner.clone(),
            handle: Arc::clone(&self.handle),
            config: Arc::clone(&self.config),
        }
    }
}

impl<S: fmt::Debug> fmt::Debug for LeaderOnly<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaderOnly")
            .field("inner", &self.inner)
            .field("handle", &self.handle)
            .field("config", &self.config)
            .finish()
    }
}

impl<S> LeaderOnly<S> {
    /// Wraps `inner` with its own campaign for `spec` on `backend`; shorthand for
    /// `LeaderOnlyLayer::new(backend, spec).layer(inner)`.
    pub fn new(inner: S, backend: Arc<dyn Backend>, spec: LeaseSpec) -> Self {
        tower::Layer::layer(&LeaderOnlyLayer::new(backend, spec), inner)
    }

    /// A layer that wraps services in `LeaderOnly`; the same as [`LeaderOnlyLayer::new`].
    pub fn layer(backend: Arc<dyn Backend>, spec: LeaseSpec) -> LeaderOnlyLayer {
        LeaderOnlyLayer::new(backend, spec)
    }

    /// Whether this node holds the lease now (an atomic read).
    pub fn is_leader(&self) -> bool {
        self.handle.shared.held_tenure().is_some()
    }

    /// The current leader as the backend's watch last saw it; see [`LeaderOnlyLayer::leader`].
    pub fn leader(&self) -> Option<Leader> {
        self.handle.shared.leader().map(|view| view.leader)
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

    fn follower_response<ReqBody, ResBody>(
        &self,
        request: &Request<ReqBody>,
    ) -> Response<LeaseBody<ResBody>> {
        let view = self.handle.shared.leader();
        if self.config.redirect {
            let location = view.as_ref().and_then(|view| {
                let base = view.base_url.as_ref()?;
                let path = request
                    .uri()
                    .path_and_query()
                    .map_or("/", |path| path.as_str());
                HeaderValue::try_from(format!("{base}{path}")).ok()
            });
            if let Some(location) = location {
                let mut response = rejection(
                    StatusCode::TEMPORARY_REDIRECT,
                    "this node is not the leader; follow the redirect to the leader\n",
                );
                response.headers_mut().insert(header::LOCATION, location);
                return response;
            }
        }
        let text: Bytes = match &view {
            Some(_) => "this node is not the leader; send the request to the node named in the lease-leader header\n".into(),
            None => "no leader is known yet; retry after the delay in Retry-After\n".into(),
        };
        let mut response = unavailable(&self.config.retry_after, text);
        if let Some(value) = view.and_then(|view| view.header) {
            response.headers_mut().insert(LEADER_HEADER, value);
        }
        response
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
        self.handle.ensure_started();
        match self.handle.shared.held_tenure() {
            Some(tenure) => {
                request.extensions_mut().insert(tenure.watcher.clone());
                ResponseFuture::running(self.inner.call(request), tenure)
            }
            None => ResponseFuture::rejected(self.follower_response(&request)),
        }
    }
}
