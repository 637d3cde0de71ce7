//! The response body every layer of this crate returns: the inner service's body, or the short
//! text of a rejection, optionally guarded by the lease it is served under.
//!
//! A guarded body ends with a [`LeaseLost`] error the moment its lease is known lost, so a
//! streaming response stops like the handler would have. Behind the semaphore layer the guard
//! also *holds* the slot: holding it in the body rather than in the response future is what
//! makes a cluster-wide concurrency limit mean "requests being served", since a streaming response
//! keeps its slot until its last frame has been handed to the connection (or the body is dropped,
//! e.g. the client left).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use http_body::{Body, Frame, SizeHint};
use lease_core::leader::TermGuard;
use lease_core::{BoxError, Lease, LostReason};
use pin_project::pin_project;
use tokio::sync::OwnedSemaphorePermit;

/// The response body of the layers in this crate.
///
/// Either the inner service's body, passed through frame by frame, or the plain-text message of a
/// rejection (503, 307, 409, 428...). Behind [`LeaderOnlyLayer`](crate::leader::LeaderOnlyLayer)
/// and [`SemaphoreLayer`](crate::semaphore::SemaphoreLayer) the body is guarded by the request's
/// lease: if the lease is lost before the last frame, the body ends with a [`LeaseLost`] error,
/// which makes the server abort the response, and it stays ended. Behind the semaphore layer
/// the body also holds the request's slot and gives it back when the last frame has been produced
/// or the body is dropped.
#[pin_project]
pub struct LeaseBody<B> {
    #[pin]
    kind: Kind<B>,
}

#[pin_project(project = KindProj)]
enum Kind<B> {
    Inner {
        #[pin]
        body: B,
        guard: Option<LossGuard>,
    },
    Message {
        text: Option<Bytes>,
    },
}

impl<B> fmt::Debug for LeaseBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Inner { guard, .. } => f
                .debug_struct("LeaseBody::Inner")
                .field("guard", guard)
                .finish_non_exhaustive(),
            Kind::Message { text } => f
                .debug_struct("LeaseBody::Message")
                .field("text", text)
                .finish(),
        }
    }
}

impl<B> LeaseBody<B> {
    /// The inner service's body, unchanged.
    pub(crate) fn inner(body: B) -> Self {
        LeaseBody {
            kind: Kind::Inner { body, guard: None },
        }
    }

    /// The inner service's body, ended if `guard`'s lease is lost first.
    pub(crate) fn guarded(body: B, guard: LossGuard) -> Self {
        LeaseBody {
            kind: Kind::Inner {
                body,
                guard: Some(guard),
            },
        }
    }

    /// A rejection's plain-text message.
    pub(crate) fn message(text: impl Into<Bytes>) -> Self {
        LeaseBody {
            kind: Kind::Message {
                text: Some(text.into()),
            },
        }
    }
}

impl<B> Body for LeaseBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let mut kind = self.project().kind;
        match kind.as_mut().project() {
            KindProj::Message { text } => Poll::Ready(text.take().map(|t| Ok(Frame::data(t)))),
            KindProj::Inner { mut body, guard } => {
                // Loss first (an atomic read): no frame is produced once the loss is known.
                if let Some(reason) = guard.as_mut().and_then(LossGuard::lost_now) {
                    return end_lost(kind, reason);
                }
                let Poll::Ready(frame) = body.as_mut().poll_frame(cx) else {
                    // Only a body that waits registers for the loss, so it is woken to end.
                    return match guard.as_mut().and_then(|g| g.poll_lost(cx)) {
                        Some(reason) => end_lost(kind, reason),
                        None => Poll::Pending,
                    };
                };
                match frame {
                    Some(Ok(frame)) => {
                        if body.is_end_stream() {
                            *guard = None;
                        }
                        Poll::Ready(Some(Ok(frame)))
                    }
                    Some(Err(error)) => {
                        *guard = None;
                        Poll::Ready(Some(Err(error.into())))
                    }
                    None => {
                        *guard = None;
                        Poll::Ready(None)
                    }
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body, .. } => body.is_end_stream(),
            Kind::Message { text } => text.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body, .. } => body.size_hint(),
            Kind::Message { text } => {
                SizeHint::with_exact(text.as_ref().map_or(0, |t| t.len() as u64))
            }
        }
    }
}

/// Ends a guarded body for good: its lease was lost. Dropping the inner body (and the guard,
/// which gives a semaphore slot back) now; a later poll finds an empty message.
fn end_lost<B>(
    mut kind: Pin<&mut Kind<B>>,
    reason: LostReason,
) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
    kind.set(Kind::Message { text: None });
    Poll::Ready(Some(Err(Box::new(LeaseLost { reason }))))
}

/// What a guarded body watches (and holds) while it is sent.
pub(crate) struct LossGuard {
    /// Registered for the loss only once the body has had to wait.
    lost: Option<Pin<Box<dyn Future<Output = LostReason> + Send>>>,
    held: BodyHold,
}

/// What a body keeps until its last frame is produced or it is dropped, and watches.
enum BodyHold {
    /// A leader's request: its place in the term's work in flight, which a voluntary
    /// step-down waits for; the term's lease is watched.
    Term(TermGuard),
    /// A semaphore slot's lease and the local admission permit taken before it (boxed: a
    /// leader's body should not carry their size).
    Slot(Box<(Lease, OwnedSemaphorePermit)>),
}

impl LossGuard {
    /// Watches a leader's term while the body is sent, and keeps `work` until it is.
    pub(crate) fn serving(work: TermGuard) -> Self {
        LossGuard {
            lost: None,
            held: BodyHold::Term(work),
        }
    }

    /// Holds a semaphore slot (and the local admission permit taken before it) until the body
    /// ends, and watches it.
    pub(crate) fn holding(lease: Lease, local: OwnedSemaphorePermit) -> Self {
        LossGuard {
            lost: None,
            held: BodyHold::Slot(Box::new((lease, local))),
        }
    }

    fn is_held(&self) -> bool {
        match &self.held {
            BodyHold::Term(work) => work.lease().is_held(),
            BodyHold::Slot(slot) => slot.0.is_held(),
        }
    }

    fn lost_signal(&mut self) -> &mut Pin<Box<dyn Future<Output = LostReason> + Send>> {
        let held = &self.held;
        self.lost.get_or_insert_with(|| match held {
            BodyHold::Term(work) => Box::pin(work.lease().lost()),
            BodyHold::Slot(slot) => Box::pin(slot.0.lost()),
        })
    }

    /// The reason, if the loss is already known (no registration, an atomic read first).
    fn lost_now(&mut self) -> Option<LostReason> {
        if self.is_held() {
            return None;
        }
        match self
            .lost_signal()
            .as_mut()
            .poll(&mut Context::from_waker(std::task::Waker::noop()))
        {
            Poll::Ready(reason) => Some(reason),
            // Not held but the reason not published yet: the release is under way.
            Poll::Pending => Some(LostReason::Released),
        }
    }

    /// The reason, if the lease has been lost; registers `cx` for the loss otherwise.
    pub(crate) fn poll_lost(&mut self, cx: &mut Context<'_>) -> Option<LostReason> {
        match self.lost_signal().as_mut().poll(cx) {
            Poll::Ready(reason) => Some(reason),
            Poll::Pending => None,
        }
    }
}

impl fmt::Debug for LossGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut debug = f.debug_struct("LossGuard");
        match &self.held {
            BodyHold::Term(work) => debug.field("term", work),
            BodyHold::Slot(slot) => debug.field("slot", &slot.0),
        };
        debug.finish_non_exhaustive()
    }
}

/// The error a response body ends with when the lease serving it (a leader's tenure, a
/// semaphore slot) is lost while it is being sent.
#[derive(Debug, Clone, thiserror::Error)]
#[error("the lease serving this response was lost ({reason}); the response was cut short")]
pub struct LeaseLost {
    reason: LostReason,
}

impl LeaseLost {
    /// Why the lease was lost.
    pub fn reason(&self) -> &LostReason {
        &self.reason
    }
}

/// A plain-text rejection response with `status`.
pub(crate) fn rejection<B>(status: StatusCode, text: impl Into<Bytes>) -> Response<LeaseBody<B>> {
    let mut response = Response::new(LeaseBody::message(text));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// A 503 telling the client to come back after `retry_after`.
pub(crate) fn unavailable<B>(
    retry_after: &HeaderValue,
    text: impl Into<Bytes>,
) -> Response<LeaseBody<B>> {
    let mut response = rejection(StatusCode::SERVICE_UNAVAILABLE, text);
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, retry_after.clone());
    response
}

/// `Retry-After` in whole seconds, at least one.
pub(crate) fn retry_after_value(after: std::time::Duration) -> HeaderValue {
    let secs = after.as_secs() + u64::from(after.subsec_nanos() > 0);
    HeaderValue::from(secs.max(1))
}
