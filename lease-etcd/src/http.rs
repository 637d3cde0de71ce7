//! etcd's v3 JSON gateway, one method per call this crate makes, and what its errors mean.
//!
//! Every call is a `POST /v3/...` with a JSON body (see `wire`). Requests go to one endpoint at a
//! time; a transport failure moves the client on to the next of its endpoints, so the retry that
//! follows ([`lease_http::retry_transient`]) reaches another member. With a user and password the
//! client authenticates first and sends etcd's token in `Authorization`; a token etcd no longer
//! knows (they expire after five idle minutes by default) is replaced once, transparently.

use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use reqwest::{StatusCode, Url};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::wire::{
    B64, LeaseGrantResponse, LeaseKeepAliveResponse, LeaseTimeToLiveResponse, RangeRequest,
    RangeResponse, Status, Streamed, TxnRequest, TxnResponse, WatchResponse,
};
use lease_core::backend::ReachabilityTracker;
use lease_core::backend::{Keepers, Reachability};
use lease_core::{BackendKind, Error};
pub(crate) use lease_http::ApiError;
use lease_http::{Cause, ClientConfig, ErrorContext, grpc};

/// Timeout of every request but a watch.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// An error answer of etcd's: the HTTP status, the gRPC code (0 if the body carried none, which
/// [`ApiError::is_transient`] reads as "judge by the status"), and etcd's message.
fn error_answer(status: StatusCode, code: i32, message: String) -> ApiError {
    ApiError::Status {
        status,
        grpc_code: Some(code),
        message,
    }
}

/// Whether etcd says the lease (or the thing asked about) does not exist.
fn is_not_found(error: &ApiError) -> bool {
    matches!(
        error,
        ApiError::Status {
            grpc_code: Some(grpc::NOT_FOUND),
            ..
        }
    )
}

/// Whether etcd refused the call's permission or credentials.
fn is_permission(error: &ApiError) -> bool {
    match error {
        ApiError::Status {
            grpc_code: Some(grpc::PERMISSION_DENIED | grpc::UNAUTHENTICATED),
            ..
        } => true,
        // A wrong user or password is InvalidArgument, and only its message says so.
        ApiError::Status { message, .. } => message.contains("authentication failed"),
        _ => false,
    }
}

/// What the user should do about `error`, for errors and warnings.
fn hint(error: &ApiError) -> &'static str {
    match error {
        ApiError::Transport(source) => match Cause::of(&**source) {
            Cause::Refused => "is it running? Start etcd, or point ETCD_ENDPOINTS at it",
            Cause::Dns => {
                "the host name did not resolve (DNS): check ETCD_ENDPOINTS and the resolver"
            }
            Cause::Dropped => {
                "etcd closed the connection: is it an etcd client URL (not a peer URL), with \
                 https:// if it serves TLS?"
            }
            Cause::TimedOut => "no answer in time: etcd or the network is overloaded",
            Cause::Tls => {
                "the TLS handshake failed: trust the CA that signed etcd's certificate \
                 (ETCD_CACERT), connect by a name the certificate carries, and give a client \
                 certificate if etcd verifies clients (ETCD_CERT and ETCD_KEY)"
            }
            Cause::Other => "is it running? Check ETCD_ENDPOINTS",
        },
        ApiError::TimedOut => "no answer in time: etcd or the network is overloaded",
        ApiError::Status { .. } | ApiError::Malformed(_) => "",
    }
}

impl ErrorContext for EtcdHttp {
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

/// etcd's gateway, as this crate uses it.
pub(crate) struct EtcdHttp {
    client: reqwest::Client,
    tls: ClientConfig,
    endpoints: Vec<Url>,
    /// The endpoint requests go to; moved on by a transport failure.
    current: AtomicUsize,
    credentials: Option<Credentials>,
    token: Mutex<Option<String>>,
    /// The holder tasks of every lease this client (and its clones) acquired.
    keepers: Keepers,
    requests: AtomicU64,
    /// This client on a connection pool of the clean-up runtime, built by the first clean-up
    /// that needs it (see [`EtcdHttp::detached`]).
    detached: OnceLock<Option<Arc<EtcdHttp>>>,
    reachability: ReachabilityTracker,
}

impl fmt::Debug for EtcdHttp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdHttp")
            .field("endpoints", &self.address())
            .field("credentials", &self.credentials)
            .finish_non_exhaustive()
    }
}

impl EtcdHttp {
    pub(crate) fn new(
        client: reqwest::Client,
        tls: ClientConfig,
        endpoints: Vec<Url>,
        credentials: Option<Credentials>,
    ) -> Arc<Self> {
        Arc::new(EtcdHttp {
            client,
            tls,
            endpoints,
            current: AtomicUsize::new(0),
            credentials,
            token: Mutex::new(None),
            keepers: Keepers::new(),
            requests: AtomicU64::new(0),
            detached: OnceLock::new(),
            reachability: ReachabilityTracker::default(),
        })
    }

    /// The same client on its own connection pool, for the clean-ups that run on the detached
    /// runtime. Built once and shared by every clean-up of this client: a runtime that shuts
    /// down with many leases hands over a clean-up for each, and building a TLS-capable client
    /// costs about a quarter of a second of CPU.
    pub(crate) fn detached(&self) -> Option<Arc<EtcdHttp>> {
        self.detached.get_or_init(|| self.build_detached()).clone()
    }

    fn build_detached(&self) -> Option<Arc<EtcdHttp>> {
        let client = self.tls.build().ok()?;
        Some(EtcdHttp::new(
            client,
            self.tls.clone(),
            self.endpoints.clone(),
            self.credentials.clone(),
        ))
    }

    pub(crate) fn keepers(&self) -> &Keepers {
        &self.keepers
    }

    /// The endpoints, comma-separated, for messages (URLs never carry credentials here).
    pub(crate) fn address(&self) -> String {
        let urls: Vec<&str> = self
            .endpoints
            .iter()
            .map(|u| u.as_str().trim_end_matches('/'))
            .collect();
        urls.join(",")
    }

    /// Whether an endpoint answered this client's last request.
    pub(crate) fn reachability(&self) -> Reachability {
        self.reachability.get()
    }

    pub(crate) fn requests_sent(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    fn endpoint(&self) -> (usize, &Url) {
        let i = self.current.load(Ordering::Relaxed) % self.endpoints.len();
        (i, &self.endpoints[i])
    }

    /// After a transport failure at endpoint `i`: the next request goes to the next endpoint.
    fn move_on(&self, i: usize) {
        let next = (i + 1) % self.endpoints.len();
        let _ = self
            .current
            .compare_exchange(i, next, Ordering::Relaxed, Ordering::Relaxed);
    }

    fn token(&self) -> Option<String> {
        self.token
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn set_token(&self, token: Option<String>) {
        *self.token.lock().unwrap_or_else(PoisonError::into_inner) = token;
    }

    /// Sends `body` to `path` and returns the successful answer, or why there was none. With
    /// `timeout` `None`, the request may last forever (a watch), and the response is returned
    /// unread.
    async fn send(
        &self,
        path: &str,
        body: &[u8],
        timeout: Option<Duration>,
    ) -> Result<reqwest::Response, ApiError> {
        let mut renewed_token = false;
        loop {
            let token = match (&self.credentials, self.token()) {
                (None, _) => None,
                (Some(_), Some(token)) => Some(token),
                (Some(credentials), None) => Some(self.authenticate(credentials).await?),
            };
            let (i, base) = self.endpoint();
            let mut url = base.clone();
            url.set_path(path);
            self.requests.fetch_add(1, Ordering::Relaxed);
            lease_core::metrics::backend_request(BackendKind::Etcd, is_write(path));
            let mut request = self.client.post(url).body(body.to_vec());
            if let Some(timeout) = timeout {
                request = request.timeout(timeout);
            }
            if let Some(token) = &token {
                request = request.header("Authorization", token);
            }
            // A watch answers with its headers at once, as every other request does.
            let in_flight = self.reachability.sending();
            let sent = request.send().await;
            drop(in_flight);
            let response = match sent {
                Ok(response) => response,
                Err(error) => {
                    self.move_on(i);
                    self.reachability.answered(false);
                    let error = ApiError::transport(error);
                    lease_core::metrics::backend_error(BackendKind::Etcd, error.metric_kind());
                    return Err(error);
                }
            };
            self.reachability.answered(true);
            if response.status().is_success() {
                return Ok(response);
            }
            let error = status_error(response).await;
            lease_core::metrics::backend_error(BackendKind::Etcd, error.metric_kind());
            if matches!(
                error,
                ApiError::Status {
                    grpc_code: Some(grpc::UNAUTHENTICATED),
                    ..
                }
            ) && self.credentials.is_some()
                && !renewed_token
            {
                // The token expired (or the member restarted): authenticate again, once.
                self.set_token(None);
                renewed_token = true;
                continue;
            }
            return Err(error);
        }
    }

    async fn authenticate(&self, credentials: &Credentials) -> Result<String, ApiError> {
        #[derive(Serialize)]
        struct Authenticate<'a> {
            name: &'a str,
            password: &'a str,
        }
        #[derive(serde::Deserialize)]
        struct Authenticated {
            #[serde(default)]
            token: String,
        }
        let body = to_json(&Authenticate {
            name: &credentials.user,
            password: &credentials.password,
        })?;
        let (i, base) = self.endpoint();
        let mut url = base.clone();
        url.set_path("/v3/auth/authenticate");
        self.requests.fetch_add(1, Ordering::Relaxed);
        let response = match self
            .client
            .post(url)
            .body(body)
            .timeout(REQUEST_TIMEOUT)
            .send()
            .await
        {
            Ok(response) => response,
            Err(error) => {
                self.move_on(i);
                return Err(ApiError::transport(error));
            }
        };
        if !response.status().is_success() {
            return Err(status_error(response).await);
        }
        let answer: Authenticated = read_json(response).await?;
        if answer.token.is_empty() {
            // Authentication is not enabled on the cluster: requests need no token.
            return Ok(String::new());
        }
        self.set_token(Some(answer.token.clone()));
        Ok(answer.token)
    }

    /// One request and its JSON answer.
    async fn call<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        path: &str,
        body: &Req,
    ) -> Result<Resp, ApiError> {
        let body = to_json(body)?;
        let response = self.send(path, &body, Some(REQUEST_TIMEOUT)).await?;
        read_json(response).await
    }

    /// `POST /v3/kv/range`, linearizable.
    pub(crate) async fn range(&self, request: &RangeRequest) -> Result<RangeResponse, ApiError> {
        self.call("/v3/kv/range", request).await
    }

    /// `POST /v3/kv/txn`.
    pub(crate) async fn txn(&self, request: &TxnRequest) -> Result<TxnResponse, ApiError> {
        self.call("/v3/kv/txn", request).await
    }

    /// `POST /v3/kv/deleterange` of `key`, or of every key under `key/` too.
    pub(crate) async fn delete(&self, key: &str, with_dir: bool) -> Result<i64, ApiError> {
        #[derive(Serialize)]
        struct DeleteRange {
            key: B64,
            #[serde(skip_serializing_if = "Option::is_none")]
            range_end: Option<B64>,
        }
        #[derive(serde::Deserialize)]
        struct Deleted {
            #[serde(default)]
            deleted: Option<String>,
        }
        let mut count = 0;
        let mut requests = vec![DeleteRange {
            key: key.into(),
            range_end: None,
        }];
        if with_dir {
            let (start, end) = super::wire::dir_range(key);
            requests.push(DeleteRange {
                key: start,
                range_end: Some(end),
            });
        }
        for request in &requests {
            let deleted: Deleted = self.call("/v3/kv/deleterange", request).await?;
            count += deleted.deleted.and_then(|d| d.parse().ok()).unwrap_or(0);
        }
        Ok(count)
    }

    /// `POST /v3/lease/grant`: a new lease of `ttl`; returns its ID.
    pub(crate) async fn lease_grant(&self, ttl: Duration) -> Result<i64, ApiError> {
        #[derive(Serialize)]
        struct Grant {
            #[serde(rename = "TTL")]
            ttl: String,
        }
        let granted: LeaseGrantResponse = self
            .call(
                "/v3/lease/grant",
                &Grant {
                    ttl: ttl.as_secs().to_string(),
                },
            )
            .await?;
        if !granted.error.is_empty() {
            return Err(ApiError::Malformed(granted.error));
        }
        if granted.id <= 0 || granted.ttl <= 0 {
            return Err(ApiError::Malformed(format!(
                "lease/grant answered ID {} and TTL {}",
                granted.id, granted.ttl
            )));
        }
        Ok(granted.id)
    }

    /// `POST /v3/lease/revoke`: deletes the lease and every key attached to it. `false` if the
    /// lease was already gone.
    pub(crate) async fn lease_revoke(&self, id: i64) -> Result<bool, ApiError> {
        match self
            .call::<_, serde_json::Value>("/v3/lease/revoke", &LeaseId::new(id))
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if is_not_found(&e) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// `POST /v3/lease/keepalive`, one message on the keep-alive stream: the lease's TTL from
    /// now, or 0 if it no longer exists.
    pub(crate) async fn lease_keep_alive(&self, id: i64) -> Result<i64, ApiError> {
        let answer: Streamed<LeaseKeepAliveResponse> =
            self.call("/v3/lease/keepalive", &LeaseId::new(id)).await?;
        match (answer.result, answer.error) {
            (Some(result), _) => Ok(result.ttl),
            (None, error) => Err(stream_error(error)),
        }
    }

    /// `POST /v3/lease/timetolive`: the seconds the lease has left, or -1 if it is gone.
    pub(crate) async fn lease_time_to_live(&self, id: i64) -> Result<i64, ApiError> {
        let answer: LeaseTimeToLiveResponse =
            self.call("/v3/lease/timetolive", &LeaseId::new(id)).await?;
        Ok(answer.ttl)
    }

    /// `POST /v3/watch`: a stream of changes to `range` from `start_revision` on, each event with
    /// the key as it was before (`prev_kv`). The first message (the watch's creation) has been
    /// read when this returns.
    pub(crate) async fn watch(
        &self,
        range: &RangeRequest,
        start_revision: i64,
    ) -> Result<WatchStream, ApiError> {
        #[derive(Serialize)]
        struct Create<'a> {
            key: &'a B64,
            #[serde(skip_serializing_if = "Option::is_none")]
            range_end: Option<&'a B64>,
            start_revision: String,
            prev_kv: bool,
        }
        #[derive(Serialize)]
        struct Watch<'a> {
            create_request: Create<'a>,
        }
        let body = to_json(&Watch {
            create_request: Create {
                key: &range.key,
                range_end: range.range_end.as_ref(),
                start_revision: start_revision.to_string(),
                prev_kv: true,
            },
        })?;
        let response = self.send("/v3/watch", &body, None).await?;
        let mut stream = WatchStream {
            response,
            buffer: Vec::new(),
            queued: None,
        };
        let created = tokio::time::timeout(REQUEST_TIMEOUT, stream.next_message())
            .await
            .unwrap_or(Err(ApiError::TimedOut))?;
        if created.canceled {
            return Err(cancelled(&created));
        }
        if !created.events.is_empty() {
            stream.queued = Some(created);
        }
        Ok(stream)
    }
}

/// `{"ID": "<id>"}`, the body of every lease call.
#[derive(Serialize)]
struct LeaseId {
    #[serde(rename = "ID")]
    id: String,
}

impl LeaseId {
    fn new(id: i64) -> Self {
        LeaseId { id: id.to_string() }
    }
}

/// An open watch: newline-delimited JSON messages on one long response.
#[derive(Debug)]
pub(crate) struct WatchStream {
    response: reqwest::Response,
    buffer: Vec<u8>,
    /// Events that came with the watch's creation, returned by the first `next`.
    queued: Option<WatchResponse>,
}

impl WatchStream {
    /// The next batch of events (at least one). Errors when etcd cancels the watch (a revision
    /// compacted away, a lost permission) or the stream ends.
    pub(crate) async fn next(&mut self) -> Result<WatchResponse, ApiError> {
        if let Some(queued) = self.queued.take() {
            return Ok(queued);
        }
        loop {
            let message = self.next_message().await?;
            if message.canceled {
                return Err(cancelled(&message));
            }
            if !message.events.is_empty() {
                return Ok(message);
            }
        }
    }

    async fn next_message(&mut self) -> Result<WatchResponse, ApiError> {
        loop {
            if let Some(end) = self.buffer.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buffer.drain(..=end).collect();
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                let message: Streamed<WatchResponse> = serde_json::from_slice(&line)
                    .map_err(|e| ApiError::Malformed(format!("watch message: {e}")))?;
                return match (message.result, message.error) {
                    (Some(result), _) => Ok(result),
                    (None, error) => Err(stream_error(error)),
                };
            }
            match self.response.chunk().await {
                Ok(Some(chunk)) => self.buffer.extend_from_slice(&chunk),
                Ok(None) => {
                    return Err(error_answer(
                        StatusCode::OK,
                        grpc::UNAVAILABLE,
                        "the watch stream ended".into(),
                    ));
                }
                Err(error) => return Err(ApiError::transport(error)),
            }
        }
    }
}

fn cancelled(message: &WatchResponse) -> ApiError {
    let reason = if message.compact_revision > 0 {
        format!(
            "the watch's start revision was compacted (compact revision {})",
            message.compact_revision
        )
    } else {
        format!("etcd cancelled the watch: {}", message.cancel_reason)
    };
    // Compaction is "retry from a fresh read"; a cancellation for permission is not transient.
    let code =
        if message.cancel_reason.contains("auth") || message.cancel_reason.contains("permission") {
            grpc::PERMISSION_DENIED
        } else {
            grpc::UNAVAILABLE
        };
    error_answer(StatusCode::OK, code, reason)
}

fn stream_error(error: Option<serde_json::Value>) -> ApiError {
    match error.map(serde_json::from_value::<Status>) {
        Some(Ok(status)) => {
            let message = if status.message.is_empty() {
                status.error
            } else {
                status.message
            };
            error_answer(StatusCode::OK, status.code, message)
        }
        _ => ApiError::Malformed("a stream message with neither result nor error".into()),
    }
}

/// Whether a call to `path` changes state in etcd (a txn, a delete, a lease grant, renewal or
/// revocation), for the metrics.
fn is_write(path: &str) -> bool {
    !matches!(
        path,
        "/v3/kv/range" | "/v3/watch" | "/v3/lease/timetolive" | "/v3/auth/authenticate"
    )
}

fn to_json<T: Serialize>(value: &T) -> Result<Vec<u8>, ApiError> {
    serde_json::to_vec(value).map_err(|e| ApiError::Malformed(e.to_string()))
}

async fn read_json<T: DeserializeOwned>(response: reqwest::Response) -> Result<T, ApiError> {
    let bytes = response.bytes().await.map_err(ApiError::transport)?;
    serde_json::from_slice(&bytes).map_err(|e| {
        ApiError::Malformed(format!(
            "{e} in {:?}",
            String::from_utf8_lossy(&bytes[..bytes.len().min(200)])
        ))
    })
}

async fn status_error(response: reqwest::Response) -> ApiError {
    let status = response.status();
    let bytes = response.bytes().await.unwrap_or_default();
    // The body is JSON, sometimes followed by a gRPC trailer on the same chunked stream.
    let json_end = bytes.iter().rposition(|b| *b == b'}').map_or(0, |i| i + 1);
    match serde_json::from_slice::<Status>(&bytes[..json_end]) {
        Ok(s) => {
            let message = if s.message.is_empty() {
                s.error
            } else {
                s.message
            };
            error_answer(status, s.code, message)
        }
        Err(_) => error_answer(
            status,
            0,
            String::from_utf8_lossy(&bytes[..bytes.len().min(200)]).into_owned(),
        ),
    }
}
