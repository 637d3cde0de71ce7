//! etcd's v3 gRPC API over two HTTP/2 connections per endpoint: the unary calls this crate
//! makes, the opening of its two streams (watch, keep-alive), and what their errors mean.
//!
//! Every call goes to one endpoint at a time; a transport failure moves the client on to the next
//! of its endpoints, so the retry that follows ([`lease_http::retry_transient`]) reaches another
//! member. An endpoint's channels are HTTP/2 connections (tonic's, over our TCP or TLS: the
//! `channels` and `connect` modules): one shared by every call, one by the watch stream (the
//! `watch` module) and the keep-alive stream (the `pool` module); a process's leases cost no
//! connection of their own. With a user and password the client authenticates first and sends
//! etcd's token as the `token` metadata; a token etcd no longer knows (they expire after five
//! idle minutes by default) is replaced once, transparently.
//!
//! Errors are lease-http's [`ApiError`], which fits gRPC as it fits etcd's JSON gateway: an
//! answer with a gRPC status is `Status` with that code (and HTTP 200, which is what gRPC answers
//! with), and a call that got no answer (no connection, a reset, a GOAWAY) is `Transport`, whose
//! cause lease-http reads from the I/O error underneath. So the one retry loop and the error
//! hints stay shared with Consul.
//!
//! The calls and both streams report to one tracker whether they were answered: what
//! `Backend::reachability` reports for `Etcd` (probing etcd in the background while no endpoint
//! answers: `EtcdClient::probed_reachability`).

mod channels;
mod connect;
mod error;
pub mod proto;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use http::uri::PathAndQuery;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::client::Grpc;
use tonic_prost::ProstCodec;

pub(crate) use channels::{Channels, Endpoint, REQUEST_TIMEOUT, Use};
use error::{hint, is_permission};
pub(crate) use error::{is_not_found, moved, status_error};
use lease_core::backend::Reachability;
use lease_core::backend::ReachabilityTracker;
use lease_core::{BackendKind, Error};
pub(crate) use lease_http::ApiError;
use lease_http::tls::Tls;
use lease_http::{ClientConfig, ErrorContext, grpc};
use proto::{
    AuthenticateRequest, AuthenticateResponse, DeleteRangeRequest, DeleteRangeResponse, Empty,
    LeaseGrantRequest, LeaseGrantResponse, LeaseId, LeaseKeepAliveResponse,
    LeaseTimeToLiveResponse, RangeRequest, RangeResponse, TxnRequest, TxnResponse, WatchRequest,
    WatchResponse, path,
};

impl ErrorContext for Wire {
    fn public_error(&self, error: ApiError, operation: impl fmt::Display) -> Error {
        let transient = error.is_transient();
        let permission = is_permission(&error);
        let hint = hint(&error);
        match error {
            ApiError::Transport(source) => Error::Unreachable {
                backend: "etcd",
                address: self.address(),
                hint,
                source: lease_http::unreachable_source(&*source),
            },
            ApiError::Status { message, .. } if permission => Error::PermissionDenied {
                operation: operation.to_string(),
                message,
                hint: "use credentials (ETCD_USER and ETCD_PASSWORD, or EtcdBuilder::user) whose \
                       role allows it",
            },
            ApiError::Status { .. } | ApiError::Malformed(_) => Error::Backend {
                backend: "etcd",
                operation: operation.to_string(),
                message: error.to_string(),
                transient,
            },
            ApiError::TimedOut => Error::Backend {
                backend: "etcd",
                operation: operation.to_string(),
                message: "no answer in the time left; etcd may be overloaded".to_owned(),
                transient,
            },
        }
    }
}

/// A user and password for etcd's authentication.
#[derive(Clone)]
pub(crate) struct Credentials {
    pub(crate) user: String,
    pub(crate) password: String,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("user", &self.user)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// The opening of a stream: etcd's answer, then the stream of its messages.
pub(crate) type Opening<Resp> =
    Pin<Box<dyn Future<Output = Result<tonic::Streaming<Resp>, tonic::Status>> + Send>>;

/// etcd's gRPC API, as this crate uses it: the wire client, which every call, stream and
/// clean-up goes through.
pub(crate) struct Wire {
    /// The endpoints and their connections.
    channels: Channels,
    tls_config: ClientConfig,
    credentials: Option<Credentials>,
    /// etcd's token; `Some("")` when the cluster has authentication off.
    token: Mutex<Option<String>>,
    authenticating: tokio::sync::Mutex<()>,
    requests: AtomicU64,
    reachability: ReachabilityTracker,
}

impl fmt::Debug for Wire {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Wire")
            .field("endpoints", &self.address())
            .field("credentials", &self.credentials)
            .finish_non_exhaustive()
    }
}

impl Wire {
    pub(crate) fn new(
        tls_config: ClientConfig,
        endpoints: Vec<Endpoint>,
        credentials: Option<Credentials>,
    ) -> Result<Wire, lease_core::BoxError> {
        let tls = if endpoints.iter().any(|e| e.https) {
            Tls::new(&tls_config, "h2")?
        } else {
            None
        };
        Ok(Wire {
            channels: Channels::new(endpoints, tls, tls_config.dialer()),
            tls_config,
            credentials,
            token: Mutex::new(None),
            authenticating: tokio::sync::Mutex::new(()),
            requests: AtomicU64::new(0),
            reachability: ReachabilityTracker::default(),
        })
    }

    /// The same wire client on connections of its own (for the clean-ups that run on the
    /// detached runtime).
    pub(crate) fn twin(&self) -> Result<Wire, lease_core::BoxError> {
        Wire::new(
            self.tls_config.clone(),
            self.channels.endpoints().to_vec(),
            self.credentials.clone(),
        )
    }

    /// The endpoints, comma-separated, for messages (URLs never carry credentials here).
    pub(crate) fn address(&self) -> String {
        let urls: Vec<&str> = self
            .channels
            .endpoints()
            .iter()
            .map(|e| e.url.as_str())
            .collect();
        urls.join(",")
    }

    /// The endpoints' connections, for the streams.
    pub(crate) fn channels(&self) -> &Channels {
        &self.channels
    }

    /// Whether an endpoint answered this client's last request.
    pub(crate) fn reachability(&self) -> Reachability {
        self.reachability.get()
    }

    pub(crate) fn reachability_tracker(&self) -> &ReachabilityTracker {
        &self.reachability
    }

    pub(crate) fn requests_sent(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// Counts a request (a call, or a message on a stream) for [`Wire::requests_sent`] and the
    /// metrics.
    pub(crate) fn count_request(&self, write: bool) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        lease_core::metrics::backend_request(BackendKind::Etcd, write);
    }

    fn set_token(&self, token: Option<String>) {
        *self.token.lock().unwrap_or_else(PoisonError::into_inner) = token;
    }

    fn cached_token(&self) -> Option<String> {
        self.token
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The token to send (authenticating first if there is none yet); `None` without
    /// credentials or with authentication off.
    pub(crate) async fn token(&self) -> Result<Option<String>, ApiError> {
        let Some(credentials) = &self.credentials else {
            return Ok(None);
        };
        if let Some(token) = self.cached_token() {
            return Ok(Some(token).filter(|t| !t.is_empty()));
        }
        let _one_at_a_time = self.authenticating.lock().await;
        if let Some(token) = self.cached_token() {
            return Ok(Some(token).filter(|t| !t.is_empty()));
        }
        let request = AuthenticateRequest {
            name: credentials.user.clone(),
            password: credentials.password.clone(),
        };
        let token = match self
            .call::<_, AuthenticateResponse>(path::AUTHENTICATE, request, None, false)
            .await
        {
            Ok(answer) => answer.token,
            // Authentication is off on the cluster: calls need no token.
            Err(ApiError::Status { message, .. })
                if message.contains("authentication is not enabled") =>
            {
                String::new()
            }
            Err(error) => return Err(error),
        };
        self.set_token(Some(token.clone()));
        Ok(Some(token).filter(|t| !t.is_empty()))
    }

    /// Forgets a token etcd refused, so the next call authenticates again.
    pub(crate) fn token_refused(&self) {
        if self.credentials.is_some() {
            self.set_token(None);
        }
    }

    /// A request with the token as metadata.
    fn request<T>(&self, message: T, token: Option<&str>) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        if let Some(token) = token {
            if let Ok(value) = token.parse() {
                request.metadata_mut().insert("token", value);
            }
        }
        request
    }

    /// `Lease/LeaseKeepAlive`, the keep-alive stream carrying `outgoing` (see [`Wire::streaming`]).
    pub(crate) async fn lease_keep_alive(
        &self,
        outgoing: mpsc::UnboundedReceiver<LeaseId>,
    ) -> Result<(usize, Opening<LeaseKeepAliveResponse>), ApiError> {
        self.streaming(path::LEASE_KEEP_ALIVE, outgoing).await
    }

    /// `Watch/Watch`, the watch stream carrying `outgoing` (see [`Wire::streaming`]).
    pub(crate) async fn watch(
        &self,
        outgoing: mpsc::UnboundedReceiver<WatchRequest>,
    ) -> Result<(usize, Opening<WatchResponse>), ApiError> {
        self.streaming(path::WATCH, outgoing).await
    }

    /// A bidirectional stream of `path` carrying `outgoing`, on the current endpoint's stream
    /// connection, with the token: the endpoint's index, and its opening (etcd's answer, then the
    /// stream of its messages) to await.
    async fn streaming<Req, Resp>(
        &self,
        path: &'static str,
        outgoing: mpsc::UnboundedReceiver<Req>,
    ) -> Result<(usize, Opening<Resp>), ApiError>
    where
        Req: prost::Message + Send + Sync + 'static,
        Resp: prost::Message + Default + Send + Sync + 'static,
    {
        let token = self.token().await?;
        let (i, channel) = self.channels.channel(Use::Streams)?;
        let mut grpc = Grpc::new(channel);
        let request = self.request(UnboundedReceiverStream::new(outgoing), token.as_deref());
        let opening = Box::pin(async move {
            grpc.ready()
                .await
                .map_err(|e| tonic::Status::from_error(e.into()))?;
            let response = grpc
                .streaming(
                    request,
                    PathAndQuery::from_static(path),
                    ProstCodec::<Req, Resp>::default(),
                )
                .await?;
            Ok(response.into_inner())
        });
        Ok((i, opening))
    }

    /// One unary call to the current endpoint, with `token`.
    async fn call<Req, Resp>(
        &self,
        path: &'static str,
        message: Req,
        token: Option<&str>,
        write: bool,
    ) -> Result<Resp, ApiError>
    where
        Req: prost::Message + Send + Sync + 'static,
        Resp: prost::Message + Default + Send + Sync + 'static,
    {
        let (i, channel) = self.channels.channel(Use::Calls)?;
        self.count_request(write);
        let mut grpc = Grpc::new(channel);
        let mut request = self.request(message, token);
        request.set_timeout(REQUEST_TIMEOUT);
        let in_flight = self.reachability.sending();
        let answer = tokio::time::timeout(REQUEST_TIMEOUT, async {
            grpc.ready()
                .await
                .map_err(|e| tonic::Status::from_error(e.into()))?;
            grpc.unary(
                request,
                PathAndQuery::from_static(path),
                ProstCodec::<Req, Resp>::default(),
            )
            .await
        })
        .await;
        drop(in_flight);
        let error = match answer {
            Ok(Ok(response)) => {
                self.reachability.answered(true);
                return Ok(response.into_inner());
            }
            Ok(Err(status)) => status_error(status),
            // The request's own timeout (tonic's, the same) usually ends it first, as a transport
            // error: this one, a hair later, must not read differently ("etcd refused").
            Err(_) => ApiError::pool(Box::new(tonic::TimeoutExpired(()))),
        };
        let unanswered = matches!(error, ApiError::Transport(_) | ApiError::TimedOut);
        if unanswered {
            self.channels.move_on(i, Use::Calls);
        }
        self.reachability.answered(!unanswered);
        lease_core::metrics::backend_error(BackendKind::Etcd, error.metric_kind());
        Err(error)
    }

    /// One unary call, authenticated if the client has credentials; a refused token is
    /// replaced once.
    async fn unary<Req, Resp>(
        &self,
        path: &'static str,
        message: Req,
        write: bool,
    ) -> Result<Resp, ApiError>
    where
        Req: prost::Message + Clone + Send + Sync + 'static,
        Resp: prost::Message + Default + Send + Sync + 'static,
    {
        let mut renewed_token = false;
        loop {
            let token = self.token().await?;
            match self
                .call(path, message.clone(), token.as_deref(), write)
                .await
            {
                Err(ApiError::Status {
                    grpc_code: Some(grpc::UNAUTHENTICATED),
                    ..
                }) if self.credentials.is_some() && !renewed_token => {
                    // The token expired (or the member restarted): authenticate again, once.
                    self.token_refused();
                    renewed_token = true;
                }
                other => return other,
            }
        }
    }

    /// `KV/Range`, linearizable.
    pub(crate) async fn range(&self, request: &RangeRequest) -> Result<RangeResponse, ApiError> {
        self.unary(path::RANGE, request.clone(), false).await
    }

    /// `KV/Txn`.
    pub(crate) async fn txn(&self, request: &TxnRequest) -> Result<TxnResponse, ApiError> {
        self.unary(path::TXN, request.clone(), true).await
    }

    /// `KV/DeleteRange` of `key`, or of every key under `key/` too.
    pub(crate) async fn delete(&self, key: &str, with_dir: bool) -> Result<i64, ApiError> {
        let mut requests = vec![DeleteRangeRequest {
            key: key.as_bytes().to_vec(),
            range_end: Vec::new(),
        }];
        if with_dir {
            let (key, range_end) = proto::dir_range(key);
            requests.push(DeleteRangeRequest { key, range_end });
        }
        let mut count = 0;
        for request in requests {
            let deleted: DeleteRangeResponse =
                self.unary(path::DELETE_RANGE, request, true).await?;
            count += deleted.deleted;
        }
        Ok(count)
    }

    /// `Lease/LeaseGrant`: a new lease of `ttl`; returns its ID.
    pub(crate) async fn lease_grant(&self, ttl: Duration) -> Result<i64, ApiError> {
        let request = LeaseGrantRequest {
            ttl: i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX),
        };
        let granted: LeaseGrantResponse = self.unary(path::LEASE_GRANT, request, true).await?;
        if !granted.error.is_empty() {
            return Err(ApiError::Malformed(granted.error));
        }
        if granted.id <= 0 || granted.ttl <= 0 {
            return Err(ApiError::Malformed(format!(
                "LeaseGrant answered ID {} and TTL {}",
                granted.id, granted.ttl
            )));
        }
        Ok(granted.id)
    }

    /// `Lease/LeaseRevoke`: deletes the lease and every key attached to it. `false` if the
    /// lease was already gone.
    pub(crate) async fn lease_revoke(&self, id: i64) -> Result<bool, ApiError> {
        match self
            .unary::<_, Empty>(path::LEASE_REVOKE, LeaseId { id }, true)
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if is_not_found(&e) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// `Lease/LeaseTimeToLive`: the seconds the lease has left, or -1 if it is gone.
    pub(crate) async fn lease_time_to_live(&self, id: i64) -> Result<i64, ApiError> {
        let answer: LeaseTimeToLiveResponse = self
            .unary(path::LEASE_TIME_TO_LIVE, LeaseId { id }, false)
            .await?;
        Ok(answer.ttl)
    }
}

#[cfg(test)]
mod tests {
    use lease_core::ErrorKind;
    use tonic::{Code, Status};

    use super::*;

    /// What etcd (3.4, `rpctypes`) answers while it elects a leader, stops, restarts or is
    /// overloaded, and a call that got no answer, are transient in the public error a campaign
    /// judges: a campaign never ends on them. Credentials, permissions and bad requests are not.
    #[tokio::test]
    async fn server_trouble_is_transient_and_nothing_else() {
        let etcd = crate::Etcd::builder()
            .endpoints(["http://127.0.0.1:1"])
            .build()
            .expect("a client");
        let refused = Status::from_error(Box::new(std::io::Error::from(
            std::io::ErrorKind::ConnectionRefused,
        )));
        // (the status, its kind, transient)
        let table = [
            (
                Status::new(Code::Unavailable, "etcdserver: no leader"),
                ErrorKind::Backend,
                true,
            ),
            (
                Status::new(Code::Unavailable, "etcdserver: leader changed"),
                ErrorKind::Backend,
                true,
            ),
            (
                Status::new(Code::Unavailable, "etcdserver: server stopped"),
                ErrorKind::Backend,
                true,
            ),
            (
                Status::new(Code::Unavailable, "etcdserver: request timed out"),
                ErrorKind::Backend,
                true,
            ),
            (
                Status::new(
                    Code::Unavailable,
                    "etcdserver: request timed out, possibly due to previous leader failure",
                ),
                ErrorKind::Backend,
                true,
            ),
            (
                Status::new(Code::Unavailable, "etcdserver: unhealthy cluster"),
                ErrorKind::Backend,
                true,
            ),
            (
                Status::new(Code::ResourceExhausted, "etcdserver: too many requests"),
                ErrorKind::Backend,
                true,
            ),
            (
                Status::new(
                    Code::ResourceExhausted,
                    "etcdserver: mvcc: database space exceeded",
                ),
                ErrorKind::Backend,
                true,
            ),
            (
                Status::new(Code::DeadlineExceeded, "context deadline exceeded"),
                ErrorKind::Backend,
                true,
            ),
            // What a stopping server answers a call its shutdown cancelled.
            (
                Status::new(Code::Cancelled, "context canceled"),
                ErrorKind::Backend,
                true,
            ),
            (refused, ErrorKind::Unreachable, true),
            (
                Status::new(Code::PermissionDenied, "etcdserver: permission denied"),
                ErrorKind::PermissionDenied,
                false,
            ),
            (
                Status::new(Code::Unauthenticated, "etcdserver: invalid auth token"),
                ErrorKind::PermissionDenied,
                false,
            ),
            (
                Status::new(
                    Code::InvalidArgument,
                    "etcdserver: authentication failed, invalid user ID or password",
                ),
                ErrorKind::PermissionDenied,
                false,
            ),
            (
                Status::new(Code::InvalidArgument, "etcdserver: request is too large"),
                ErrorKind::Backend,
                false,
            ),
            (
                Status::new(Code::NotFound, "etcdserver: requested lease not found"),
                ErrorKind::Backend,
                false,
            ),
            (
                Status::new(Code::Unimplemented, "unknown service etcdserverpb.KV"),
                ErrorKind::Backend,
                false,
            ),
        ];
        for (status, kind, transient) in table {
            let what = format!("{:?} {}", status.code(), status.message());
            let public = etcd
                .http
                .wire()
                .public_error(status_error(status), "acquire \"k\"");
            assert_eq!(
                (public.kind(), public.is_transient()),
                (kind, transient),
                "{what}: {public}"
            );
        }
    }
}
