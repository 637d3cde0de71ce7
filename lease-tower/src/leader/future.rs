//! [`ResponseFuture`]: the inner service's future raced against the end of this node's tenure.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use http::Response;
use pin_project::pin_project;
use tokio_util::sync::WaitForCancellationFutureOwned;

use super::state::Tenure;
use crate::body::{LeaseBody, LossGuard, unavailable};

/// The response future of [`LeaderOnly`](super::LeaderOnly).
///
/// On the leader it polls the inner future, and drops it with a 503 answer if the lease is lost
/// first. On a follower it is the ready rejection.
#[pin_project]
pub struct ResponseFuture<F, B> {
    #[pin]
    state: State<F, B>,
}

#[pin_project(project = StateProj)]
enum State<F, B> {
    Rejected {
        response: Option<Response<LeaseBody<B>>>,
    },
    Running {
        #[pin]
        inner: F,
        tenure: Arc<Tenure>,
        /// Registered only once the inner future suspends: a handler that answers on its first
        /// poll (most do) never touches the token's waiter list, which every request shares.
        #[pin]
        lost: Option<WaitForCancellationFutureOwned>,
    },
    Cancelled,
}

impl<F, B> fmt::Debug for ResponseFuture<F, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Rejected { .. } => "rejected",
            State::Running { .. } => "running",
            State::Cancelled => "cancelled",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}

impl<F, B> ResponseFuture<F, B> {
    pub(super) fn running(inner: F, tenure: Arc<Tenure>) -> Self {
        ResponseFuture {
            state: State::Running {
                inner,
                tenure,
                lost: None,
            },
        }
    }

    pub(super) fn rejected(response: Response<LeaseBody<B>>) -> Self {
        ResponseFuture {
            state: State::Rejected {
                response: Some(response),
            },
        }
    }
}

impl<F, B, E> Future for ResponseFuture<F, B>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<LeaseBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        match this.state.as_mut().project() {
            StateProj::Rejected { response } => match response.take() {
                Some(response) => Poll::Ready(Ok(response)),
                None => Poll::Pending,
            },
            StateProj::Running {
                inner,
                tenure,
                mut lost,
            } => {
                // Loss first: the inner future is never polled once the loss is known, so a
                // request cannot complete as if led after the lease was lost. The lease's own
                // flag turns first (the tenure's token follows a task hop later); both are atomic
                // reads.
                if !tenure.watcher.is_held() || tenure.ended.is_cancelled() {
                    this.state.set(State::Cancelled);
                    return Poll::Ready(Ok(lost_response()));
                }
                if let Poll::Ready(response) = inner.poll(cx) {
                    // The body is guarded too: a streaming answer ends when the tenure does.
                    let guard = || LossGuard::watching(tenure.watcher.clone());
                    return Poll::Ready(
                        response.map(|r| r.map(|body| LeaseBody::guarded(body, guard()))),
                    );
                }
                if lost.is_none() {
                    lost.set(Some(tenure.ended.clone().cancelled_owned()));
                }
                if let Some(lost) = lost.as_pin_mut() {
                    ready!(lost.poll(cx));
                }
                this.state.set(State::Cancelled);
                Poll::Ready(Ok(lost_response()))
            }
            StateProj::Cancelled => Poll::Pending,
        }
    }
}

fn lost_response<B>() -> Response<LeaseBody<B>> {
    unavailable(
        &http::HeaderValue::from_static("1"),
        "this node lost the leader lease while serving the request; it was cancelled, retry on the new leader\n",
    )
}
