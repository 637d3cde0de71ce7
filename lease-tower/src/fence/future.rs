//! [`ResponseFuture`]: a consistent read when the cache could not answer, then the inner service.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use http::{Request, Response, StatusCode};
use lease_core::{BoxFuture, Sequencer};
use pin_project::pin_project;
use tower::Service;

use super::config::Config;
use crate::body::{LeaseBody, rejection, unavailable};

/// The response future of [`SequencerCheck`](super::SequencerCheck).
#[pin_project]
pub struct ResponseFuture<S, ReqBody>
where
    S: Service<Request<ReqBody>>,
{
    #[pin]
    state: State<S, ReqBody>,
}

/// An answer decided before the inner service was called; the body is built when it is sent.
#[derive(Debug)]
pub(super) struct Refusal {
    pub(super) status: StatusCode,
    pub(super) text: String,
}

// The future is created once per request and then pinned in place, so the waiting variant's size
// costs one larger allocation of the connection's task, not copies; boxing it would cost more.
#[allow(clippy::large_enum_variant)]
#[pin_project(project = StateProj)]
enum State<S, ReqBody>
where
    S: Service<Request<ReqBody>>,
{
    Rejected {
        refusal: Option<Refusal>,
    },
    Checking {
        check: BoxFuture<'static, Result<(), Refusal>>,
        pending: Option<(Sequencer, S, Request<ReqBody>, Arc<Config>)>,
    },
    Running {
        #[pin]
        future: S::Future,
    },
    Done,
}

impl<S, ReqBody> fmt::Debug for ResponseFuture<S, ReqBody>
where
    S: Service<Request<ReqBody>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Rejected { .. } => "rejected",
            State::Checking { .. } => "checking",
            State::Running { .. } => "running",
            State::Done => "done",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}

impl<S, ReqBody> ResponseFuture<S, ReqBody>
where
    S: Service<Request<ReqBody>>,
{
    pub(super) fn rejected(refusal: Refusal) -> Self {
        ResponseFuture {
            state: State::Rejected {
                refusal: Some(refusal),
            },
        }
    }

    pub(super) fn running(future: S::Future) -> Self {
        ResponseFuture {
            state: State::Running { future },
        }
    }

    pub(super) fn checking(
        check: BoxFuture<'static, Result<(), Refusal>>,
        sequencer: Sequencer,
        inner: S,
        request: Request<ReqBody>,
        config: Arc<Config>,
    ) -> Self {
        ResponseFuture {
            state: State::Checking {
                check,
                pending: Some((sequencer, inner, request, config)),
            },
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
                StateProj::Rejected { refusal } => {
                    let Some(Refusal { status, text }) = refusal.take() else {
                        return Poll::Pending;
                    };
                    this.state.set(State::Done);
                    return Poll::Ready(Ok(rejection(status, text)));
                }
                StateProj::Checking { check, pending } => {
                    let checked = ready!(check.as_mut().poll(cx));
                    let Some((sequencer, mut inner, mut request, config)) = pending.take() else {
                        return Poll::Pending;
                    };
                    match checked {
                        Ok(()) => {
                            request.extensions_mut().insert(sequencer);
                            let future = inner.call(request);
                            this.state.set(State::Running { future });
                        }
                        Err(Refusal { status, text }) => {
                            this.state.set(State::Done);
                            let response = if status == StatusCode::SERVICE_UNAVAILABLE {
                                unavailable(&config.retry_after, text)
                            } else {
                                rejection(status, text)
                            };
                            return Poll::Ready(Ok(response));
                        }
                    }
                }
                StateProj::Running { future } => {
                    let response = ready!(future.poll(cx))?;
                    return Poll::Ready(Ok(response.map(LeaseBody::inner)));
                }
                StateProj::Done => return Poll::Pending,
            }
        }
    }
}
