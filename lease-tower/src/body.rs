//! The response body every layer of this crate returns: the inner service's body, or the short
//! text of a rejection, optionally carrying a semaphore slot until the last byte is sent.
//!
//! Holding the slot in the body rather than in the response future is what makes a cluster-wide
//! concurrency limit mean "requests being served": a streaming response keeps its slot until its
//! last frame has been handed to the connection (or the body is dropped, e.g. the client left).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use http_body::{Body, Frame, SizeHint};
use lease_core::{BoxError, Lease, LostReason};
use pin_project::pin_project;
use tokio::sync::OwnedSemaphorePermit;

/// The response body of the layers in this crate.
///
/// Either the inner service's body, passed through frame by frame, or the plain-text message of a
/// rejection (503, 307, 409, 428...). Behind [`SemaphoreLayer`](crate::semaphore::SemaphoreLayer)
/// the body also holds the request's slot and gives it back when the last frame has been produced
/// or the body is dropped; if the slot is lost first, the body ends with a [`SlotLost`] error,
/// which makes the server abort the response.
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
        slot: Option<SlotGuard>,
    },
    Message {
        text: Option<Bytes>,
    },
}

impl<B> fmt::Debug for LeaseBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Inner { slot, .. } => f
                .debug_struct("LeaseBody::Inner")
                .field("slot", slot)
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
            kind: Kind::Inner { body, slot: None },
        }
    }

    /// The inner service's body, holding `slot` until it ends.
    pub(crate) fn holding(body: B, slot: SlotGuard) -> Self {
        LeaseBody {
            kind: Kind::Inner {
                body,
                slot: Some(slot),
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
        match self.project().kind.project() {
            KindProj::Message { text } => Poll::Ready(text.take().map(|t| Ok(Frame::data(t)))),
            KindProj::Inner { mut body, slot } => {
                if let Some(reason) = slot.as_mut().and_then(|guard| guard.poll_lost(cx)) {
                    *slot = None;
                    return Poll::Ready(Some(Err(Box::new(SlotLost { reason }))));
                }
                let frame = ready!(body.as_mut().poll_frame(cx));
                match frame {
                    Some(Ok(frame)) => {
                        if body.is_end_stream() {
                            *slot = None;
                        }
                        Poll::Ready(Some(Ok(frame)))
                    }
                    Some(Err(error)) => {
                        *slot = None;
                        Poll::Ready(Some(Err(error.into())))
                    }
                    None => {
                        *slot = None;
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

/// A semaphore slot held by a response body, with the future that reports its loss.
pub(crate) struct SlotGuard {
    lease: Lease,
    lost: Pin<Box<dyn Future<Output = LostReason> + Send>>,
    _local: OwnedSemaphorePermit,
}

impl SlotGuard {
    /// `local` is the process-wide admission permit taken before the slot; both go together.
    pub(crate) fn new(lease: Lease, local: OwnedSemaphorePermit) -> Self {
        let lost = Box::pin(lease.lost());
        SlotGuard {
            lease,
            lost,
            _local: local,
        }
    }

    /// The reason, if the slot has been lost; registers `cx` for the loss otherwise.
    pub(crate) fn poll_lost(&mut self, cx: &mut Context<'_>) -> Option<LostReason> {
        match self.lost.as_mut().poll(cx) {
            Poll::Ready(reason) => Some(reason),
            Poll::Pending => None,
        }
    }
}

impl fmt::Debug for SlotGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SlotGuard")
            .field("lease", &self.lease)
            .finish_non_exhaustive()
    }
}

/// The error a response body ends with when its semaphore slot is lost while it is being sent.
#[derive(Debug, Clone, thiserror::Error)]
#[error("the semaphore slot serving this response was lost ({reason}); the response was cut short")]
pub struct SlotLost {
    reason: LostReason,
}

impl SlotLost {
    /// Why the slot was lost.
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
