//! [`ResponseFuture`]: wait for a slot, then run the inner service while the slot is held.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use http::{Request, Response};
use lease_core::{BoxFuture, Error, Lease, LostReason};
use pin_project::pin_project;
use tokio::sync::OwnedSemaphorePermit;
use tower::Service;

use super::config::Config;
use crate::body::{LeaseBody, LossGuard, unavailable};

/// The response future of [`Semaphore`](super::Semaphore).
///
/// It first waits (up to the layer's `max_wait`) for a slot, then calls the inner service with the
/// slot held, and finally moves the slot into the response body.
#[pin_project]
pub struct ResponseFuture<S, ReqBody>
where
    S: Service<Request<ReqBody>>,
{
    #[pin]
    state: State<S, ReqBody>,
    config: Arc<Config>,
}

// The future is created once per request and then pinned in place, so the waiting variant's size
// costs one larger allocation of the connection's task, not copies; boxing it would cost more.
#[allow(clippy::large_enum_variant)]
#[pin_project(project = StateProj)]
enum State<S, ReqBody>
where
    S: Service<Request<ReqBody>>,
{
    Acquiring {
        acquire: BoxFuture<'static, Result<(Lease, OwnedSemaphorePermit), Error>>,
        inner: Option<(S, Request<ReqBody>)>,
    },
    Running {
        #[pin]
        future: S::Future,
        slot: Option<LossGuard>,
    },
    Done,
}

impl<S, ReqBody> fmt::Debug for ResponseFuture<S, ReqBody>
where
    S: Service<Request<ReqBody>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Acquiring { .. } => "acquiring",
            State::Running { .. } => "running",
            State::Done => "done",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish_non_exhaustive()
    }
}

impl<S, ReqBody> ResponseFuture<S, ReqBody>
where
    S: Service<Request<ReqBody>>,
{
    pub(super) fn acquiring(
        acquire: BoxFuture<'static, Result<(Lease, OwnedSemaphorePermit), Error>>,
        inner: S,
        request: Request<ReqBody>,
        config: Arc<Config>,
    ) -> Self {
        ResponseFuture {
            state: State::Acquiring {
                acquire,
                inner: Some((inner, request)),
            },
            config,
        }
    }
}

impl<S, ReqBody, ResBody> Future for ResponseFuture<S, ReqBody>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
{
    type Output = Result<Response<LeaseBody<ResBody>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Acquiring { acquire, inner } => {
                    let acquired = ready!(acquire.as_mut().poll(cx));
                    let (lease, permit) = match acquired {
                        Ok(acquired) => acquired,
                        Err(error) => {
                            this.state.set(State::Done);
                            return Poll::Ready(Ok(no_slot(this.config, &error)));
                        }
                    };
                    let Some((mut service, mut request)) = inner.take() else {
                        this.state.set(State::Done);
                        return Poll::Pending;
                    };
                    request.extensions_mut().insert(lease.watcher());
                    let future = service.call(request);
                    this.state.set(State::Running {
                        future,
                        slot: Some(LossGuard::holding(lease, permit)),
                    });
                }
                StateProj::Running { future, slot } => {
                    if let Some(reason) = slot.as_mut().and_then(|slot| slot.poll_lost(cx)) {
                        this.state.set(State::Done);
                        return Poll::Ready(Ok(slot_lost(this.config, &reason)));
                    }
                    let response = ready!(future.poll(cx));
                    let slot = slot.take();
                    this.state.set(State::Done);
                    let response = response?;
                    return Poll::Ready(Ok(match slot {
                        Some(slot) => response.map(|body| LeaseBody::guarded(body, slot)),
                        None => response.map(LeaseBody::inner),
                    }));
                }
                StateProj::Done => return Poll::Pending,
            }
        }
    }
}

fn no_slot<B>(config: &Config, error: &Error) -> Response<LeaseBody<B>> {
    let key = config.spec.key();
    if error.is_busy() {
        tracing::debug!(
            key,
            "semaphore layer: no slot free within the wait; answering 503"
        );
        unavailable(
            &config.retry_after,
            "every slot of this route's cluster-wide concurrency limit is taken; retry after the delay in Retry-After\n",
        )
    } else {
        tracing::warn!(key, %error, "semaphore layer: cannot take a slot; answering 503");
        unavailable(
            &config.retry_after,
            "the lease backend guarding this route cannot be reached; retry after the delay in Retry-After\n",
        )
    }
}

fn slot_lost<B>(config: &Config, reason: &LostReason) -> Response<LeaseBody<B>> {
    tracing::warn!(key = config.spec.key(), %reason, "semaphore layer: slot lost mid-request; the handler was cancelled");
    unavailable(
        &config.retry_after,
        "the concurrency slot serving this request was lost; the request was cancelled, retry it\n",
    )
}
