//! [`ResponseFuture`]: the inner service's future, dropped the moment the term's lease is lost.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::Response;
use lease_core::LostReason;
use lease_core::leader::TermGuard;
use pin_project::pin_project;

use crate::body::{LeaseBody, LossGuard, unavailable};

/// The response future of [`LeaderOnly`](super::LeaderOnly).
///
/// On the leader it polls the inner future, and drops it with a 503 answer if the lease is lost
/// first: it waits on the lease itself ([`LeaseWatcher::lost`](lease_core::LeaseWatcher::lost)), so it wakes the moment the loss
/// is known, whatever the campaign is doing. On a follower it is the ready rejection.
#[pin_project]
pub struct ResponseFuture<F, B> {
    #[pin]
    state: State<F, B>,
}

type LostSignal = Pin<Box<dyn Future<Output = LostReason> + Send>>;

#[pin_project(project = StateProj)]
enum State<F, B> {
    /// Boxed: a response is large, and the leader's path should not move its bytes around.
    Rejected {
        response: Option<Box<Response<LeaseBody<B>>>>,
    },
    Running {
        #[pin]
        inner: F,
        /// The request's place in the term's work in flight, which a voluntary step-down waits
        /// for; it moves into the body, and carries the term's lease.
        work: Option<TermGuard>,
        /// Registered only once the inner future suspends: a handler that answers on its first
        /// poll (most do) costs no allocation and no waiter registration.
        lost: Option<LostSignal>,
    },
    Done,
}

impl<F, B> fmt::Debug for ResponseFuture<F, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Rejected { .. } => "rejected",
            State::Running { .. } => "running",
            State::Done => "done",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}

impl<F, B> ResponseFuture<F, B> {
    pub(super) fn running(inner: F, work: TermGuard) -> Self {
        ResponseFuture {
            state: State::Running {
                inner,
                work: Some(work),
                lost: None,
            },
        }
    }

    pub(super) fn rejected(response: Response<LeaseBody<B>>) -> Self {
        ResponseFuture {
            state: State::Rejected {
                response: Some(Box::new(response)),
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
                Some(response) => Poll::Ready(Ok(*response)),
                None => Poll::Pending,
            },
            StateProj::Running { inner, work, lost } => {
                let Some(guard) = work.as_ref() else {
                    return Poll::Pending;
                };
                // Loss first, an atomic read and the fence deadline: the inner future is never
                // polled once the loss is known (or the deadline has passed in a paused process).
                if !guard.lease().is_held() {
                    this.state.set(State::Done);
                    return Poll::Ready(Ok(lost_response()));
                }
                if let Poll::Ready(response) = inner.poll(cx) {
                    // The body is guarded too: a streaming answer ends when the lease is lost,
                    // and a step-down waits for it to be sent.
                    let guard = work.take().map(LossGuard::serving);
                    this.state.set(State::Done);
                    return Poll::Ready(response.map(|r| {
                        r.map(|body| match guard {
                            Some(guard) => LeaseBody::guarded(body, guard),
                            None => LeaseBody::inner(body),
                        })
                    }));
                }
                let lost = lost.get_or_insert_with(|| Box::pin(guard.lease().lost()));
                match lost.as_mut().poll(cx) {
                    Poll::Ready(_) => {
                        this.state.set(State::Done);
                        Poll::Ready(Ok(lost_response()))
                    }
                    Poll::Pending => Poll::Pending,
                }
            }
            StateProj::Done => Poll::Pending,
        }
    }
}

fn lost_response<B>() -> Response<LeaseBody<B>> {
    unavailable(
        &http::HeaderValue::from_static("1"),
        "this node lost the leader lease before it could complete the request; it was not served, retry on the new leader\n",
    )
}
