//! The model's gRPC server: tonic's server-side codec (prost, over lease-etcd's own messages)
//! under hyper's HTTP/2 server, routed by path; no generated code, no transport server.
//!
//! Each unary call is decoded, handed to the state machine with the time and the call's
//! `token`, and answered. The two streams have a reader task each (spawned through
//! [`spawn`](crate::server::spawn)) that hands the client's messages to the state machine, and answer
//! through a channel: the watch stream's answers are sent by whatever makes them (a creation, a
//! write, the sync loop), a keep-alive's by its reader, which waits for the revocation of a lease
//! that expired (etcd's `Renew` does), so the keep-alives after it on the stream wait too.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use hyper::body::Incoming;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::Status;
use tonic::body::Body;
use tonic::metadata::MetadataMap;
use tonic_prost::ProstCodec;

use lease_etcd::proto::{
    AuthenticateRequest, DeleteRangeRequest, Empty, LeaseGrantRequest, LeaseId,
    LeaseKeepAliveResponse, LeaseTimeToLiveResponse, RangeRequest, TxnRequest, WatchRequest,
    WatchResponse, path,
};

use super::Model;
use super::error;
use super::lessor::Renewal;
use crate::server::spawn;

/// The model as a hyper service: one gRPC call per HTTP/2 request, routed by its path.
#[derive(Clone, Debug)]
pub struct Service {
    model: Model,
}

impl Model {
    /// The model's gRPC service, for hyper's HTTP/2 server (see [`Model::serve_connection`]).
    pub fn service(&self) -> Service {
        self.ensure_background();
        Service {
            model: self.clone(),
        }
    }

    /// Serves one client connection (any byte stream: a TCP socket, the simulation's network)
    /// with hyper's HTTP/2 server, until the client closes it, or until
    /// [`break_streams`](Model::break_streams) or [`restart`](Model::restart) drops it. No
    /// timers: no keep-alive pings, no timeouts.
    pub async fn serve_connection<I>(&self, io: I) -> Result<(), hyper::Error>
    where
        I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let service = self.service();
        let mut breaks = self.shared.breaks.subscribe();
        let connection = hyper::server::conn::http2::Builder::new(Executor)
            .serve_connection(hyper_util::rt::TokioIo::new(io), service);
        tokio::select! {
            biased;
            _ = breaks.changed() => Ok(()),
            served = connection => served,
        }
    }

    /// A receiver told of every [`break_streams`](Model::break_streams) and
    /// [`restart`](Model::restart): the streams served end on it.
    fn breaks(&self) -> tokio::sync::watch::Receiver<u64> {
        self.shared.breaks.subscribe()
    }
}

impl hyper::service::Service<http::Request<Incoming>> for Service {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn call(&self, request: http::Request<Incoming>) -> Self::Future {
        let model = self.model.clone();
        Box::pin(async move { Ok(route(model, request).await) })
    }
}

/// hyper's executor for the connection's tasks: through the model's one [`spawn`](crate::server::spawn).
#[derive(Clone, Copy, Debug)]
struct Executor;

impl<F> hyper::rt::Executor<F> for Executor
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn execute(&self, future: F) {
        drop(spawn(future));
    }
}

/// The `token` metadata of a call.
fn token(metadata: &MetadataMap) -> Option<String> {
    metadata
        .get("token")
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned)
}

async fn route(model: Model, request: http::Request<Incoming>) -> http::Response<Body> {
    let path = request.uri().path().to_owned();
    match path.as_str() {
        path::RANGE => {
            unary(request, move |call: tonic::Request<RangeRequest>, now| {
                let token = token(call.metadata());
                model.state(|s| s.range(call.get_ref(), token.as_deref(), now))
            })
            .await
        }
        path::TXN => {
            unary(request, move |call: tonic::Request<TxnRequest>, now| {
                let token = token(call.metadata());
                model.state(|s| s.txn(call.get_ref(), token.as_deref(), now))
            })
            .await
        }
        path::DELETE_RANGE => {
            unary(
                request,
                move |call: tonic::Request<DeleteRangeRequest>, now| {
                    let token = token(call.metadata());
                    model.state(|s| s.delete_range(call.get_ref(), token.as_deref(), now))
                },
            )
            .await
        }
        path::LEASE_GRANT => {
            unary(
                request,
                move |call: tonic::Request<LeaseGrantRequest>, now| {
                    let token = token(call.metadata());
                    model.state(|s| s.lease_grant(call.get_ref(), 0, token.as_deref(), now))
                },
            )
            .await
        }
        path::LEASE_REVOKE => {
            unary(request, move |call: tonic::Request<LeaseId>, now| {
                let token = token(call.metadata());
                model
                    .state(|s| s.lease_revoke(call.get_ref().id, token.as_deref(), now))
                    .map(|()| Empty {})
            })
            .await
        }
        path::LEASE_TIME_TO_LIVE => {
            unary(request, move |call: tonic::Request<LeaseId>, now| {
                let ttl = model.state(|s| s.time_to_live(call.get_ref().id, now));
                Ok(LeaseTimeToLiveResponse { ttl })
            })
            .await
        }
        path::AUTHENTICATE => {
            unary(
                request,
                move |call: tonic::Request<AuthenticateRequest>, now| {
                    model.state(|s| s.authenticate(call.get_ref(), now))
                },
            )
            .await
        }
        path::WATCH => {
            streaming(
                request,
                move |call: tonic::Request<tonic::Streaming<WatchRequest>>| {
                    let token = token(call.metadata());
                    let (outbox, answers) =
                        mpsc::unbounded_channel::<Result<WatchResponse, Status>>();
                    let stream =
                        model.state(|s| s.open_watch_stream(outbox.clone(), token, Instant::now()));
                    spawn(read_watches(model, stream, call.into_inner(), outbox));
                    UnboundedReceiverStream::new(answers)
                },
            )
            .await
        }
        path::LEASE_KEEP_ALIVE => {
            streaming(
                request,
                move |call: tonic::Request<tonic::Streaming<LeaseId>>| {
                    let (outbox, answers) = mpsc::unbounded_channel();
                    spawn(keep_alive(model, call.into_inner(), outbox));
                    UnboundedReceiverStream::new(answers)
                },
            )
            .await
        }
        other => error::unknown_path(other).into_http(),
    }
}

/// The reader of watch stream `stream`: hands each creation and cancel to the state machine.
/// When the client closes its side, the stream stays open for the answers (as etcd's does),
/// until the client goes or the streams are broken.
async fn read_watches(
    model: Model,
    stream: u64,
    mut inbound: tonic::Streaming<WatchRequest>,
    outbox: mpsc::UnboundedSender<Result<WatchResponse, Status>>,
) {
    let mut breaks = model.breaks();
    let mut reading = true;
    loop {
        let message = tokio::select! {
            biased;
            _ = breaks.changed() => break,
            () = outbox.closed() => break,
            message = inbound.message(), if reading => message,
        };
        match message {
            Ok(Some(request)) => {
                model.state(|s| s.watch_request(stream, &request, Instant::now()));
            }
            Ok(None) => reading = false,
            Err(_) => break,
        }
    }
    model.state(|s| s.close_watch_stream(stream));
}

/// The keep-alive stream: each keep-alive answered in turn with the lease's TTL, or 0 if it is
/// gone; one whose lease expired waits for its revocation, then answers 0. Ends when the client
/// closes its side (etcd ends the call then), goes, or the streams are broken.
async fn keep_alive(
    model: Model,
    mut inbound: tonic::Streaming<LeaseId>,
    outbox: mpsc::UnboundedSender<Result<LeaseKeepAliveResponse, Status>>,
) {
    let mut breaks = model.breaks();
    loop {
        let message = tokio::select! {
            biased;
            _ = breaks.changed() => return,
            () = outbox.closed() => return,
            message = inbound.message() => message,
        };
        let id = match message {
            Ok(Some(LeaseId { id })) => id,
            Ok(None) | Err(_) => return,
        };
        let (renewal, mut revocations) =
            model.state(|s| (s.renew(id, Instant::now()), s.revocations()));
        let ttl = match renewal {
            Renewal::Renewed(ttl) => ttl,
            Renewal::Gone => 0,
            Renewal::Expired => {
                while model.state(|s| s.has_lease(id)) {
                    tokio::select! {
                        biased;
                        _ = breaks.changed() => return,
                        () = outbox.closed() => return,
                        changed = revocations.changed() => if changed.is_err() { return },
                    }
                }
                0
            }
        };
        if outbox.send(Ok(LeaseKeepAliveResponse { id, ttl })).is_err() {
            return;
        }
    }
}

/// Serves one unary call of `request` with `handler` (given the call and the time).
async fn unary<Req, Resp, F>(request: http::Request<Incoming>, handler: F) -> http::Response<Body>
where
    Req: prost::Message + Default + Send + 'static,
    Resp: prost::Message + Send + 'static,
    F: FnOnce(tonic::Request<Req>, Instant) -> Result<Resp, Status> + Send + 'static,
{
    let mut grpc = tonic::server::Grpc::new(ProstCodec::<Resp, Req>::default());
    grpc.unary(Unary(Some(handler)), request).await
}

/// Serves one bidirectional stream of `request` with `handler`, which returns the answers.
async fn streaming<Req, Resp, F>(
    request: http::Request<Incoming>,
    handler: F,
) -> http::Response<Body>
where
    Req: prost::Message + Default + Send + 'static,
    Resp: prost::Message + Send + 'static,
    F: FnOnce(
            tonic::Request<tonic::Streaming<Req>>,
        ) -> UnboundedReceiverStream<Result<Resp, Status>>
        + Send
        + 'static,
{
    let mut grpc = tonic::server::Grpc::new(ProstCodec::<Resp, Req>::default());
    grpc.streaming(Streaming(Some(handler)), request).await
}

/// A unary handler as the tower service tonic's server takes.
struct Unary<F>(Option<F>);

impl<Req, Resp, F> tower_service::Service<tonic::Request<Req>> for Unary<F>
where
    F: FnOnce(tonic::Request<Req>, Instant) -> Result<Resp, Status>,
{
    type Response = tonic::Response<Resp>;
    type Error = Status;
    type Future = std::future::Ready<Result<tonic::Response<Resp>, Status>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Status>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: tonic::Request<Req>) -> Self::Future {
        let answer = match self.0.take() {
            Some(handler) => handler(request, Instant::now()).map(tonic::Response::new),
            None => Err(Status::internal("the call was served already")),
        };
        std::future::ready(answer)
    }
}

/// A streaming handler as the tower service tonic's server takes.
struct Streaming<F>(Option<F>);

type Answers<Resp> = UnboundedReceiverStream<Result<Resp, Status>>;

impl<Req, Resp, F> tower_service::Service<tonic::Request<tonic::Streaming<Req>>> for Streaming<F>
where
    F: FnOnce(tonic::Request<tonic::Streaming<Req>>) -> Answers<Resp>,
{
    type Response = tonic::Response<Answers<Resp>>;
    type Error = Status;
    type Future = std::future::Ready<Result<tonic::Response<Answers<Resp>>, Status>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Status>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: tonic::Request<tonic::Streaming<Req>>) -> Self::Future {
        let answer = match self.0.take() {
            Some(handler) => Ok(tonic::Response::new(handler(request))),
            None => Err(Status::internal("the call was served already")),
        };
        std::future::ready(answer)
    }
}
