//! Why an HTTP backend's call failed ([`ApiError`]), and how a backend turns that into the public
//! error ([`ErrorContext`]).

use std::fmt;
use std::sync::Arc;

use http::StatusCode;

use lease_core::metrics::RequestError;

use crate::{Cause, DisplayChain, Retryable};

/// gRPC status codes, as a gRPC gateway (etcd's) gives them in an error body's `code`.
pub mod grpc {
    /// The call was cancelled: by etcd, when its shutdown cancels the calls in flight.
    pub const CANCELLED: i32 = 1;
    /// The deadline passed before the operation completed.
    pub const DEADLINE_EXCEEDED: i32 = 4;
    /// The thing asked about does not exist.
    pub const NOT_FOUND: i32 = 5;
    /// The caller may not do this.
    pub const PERMISSION_DENIED: i32 = 7;
    /// A quota or a limit ran out, or the server is overloaded.
    pub const RESOURCE_EXHAUSTED: i32 = 8;
    /// Aborted by a conflict: may succeed if retried.
    pub const ABORTED: i32 = 10;
    /// The service cannot answer now (no leader, shutting down).
    pub const UNAVAILABLE: i32 = 14;
    /// The caller's credentials are missing, invalid or expired.
    pub const UNAUTHENTICATED: i32 = 16;
}

/// Why an HTTP backend's call failed, before it is given the context of what the caller was
/// doing ([`ApiError::into_error`]).
#[derive(Clone, Debug)]
pub enum ApiError {
    /// No answer: the connection failed, was dropped, or the request timed out. Shared, so the
    /// one failure of a batch of requests can be the source of every error it causes. Built by
    /// `ApiError::transport` (feature `reqwest`), which strips the request's URL (it may carry a
    /// key), or [`ApiError::pool`].
    Transport(Arc<dyn std::error::Error + Send + Sync>),
    /// An error answer, or an error message in a streamed answer (whose status is then 200).
    Status {
        /// The HTTP status.
        status: StatusCode,
        /// The gRPC status code of a gRPC gateway's answer (etcd's; see [`grpc`]): `Some(0)`
        /// (gRPC's OK, never an error's code) when its body carried none. `None` from a plain
        /// HTTP API (Consul's).
        grpc_code: Option<i32>,
        /// What the server said (its error body, or the message in it).
        message: String,
    },
    /// An answer that could not be read, or a request that could not be written.
    Malformed(String),
    /// No answer before the caller's deadline (see [`retry_transient`](crate::retry_transient)).
    TimedOut,
}

impl ApiError {
    /// A request that got no answer, without its URL (which may carry a key).
    #[cfg(feature = "reqwest")]
    pub fn transport(error: reqwest::Error) -> Self {
        ApiError::Transport(Arc::new(error.without_url()))
    }

    /// A failure of a backend's own connections (Consul's counted pool, etcd's gRPC channel),
    /// whose errors carry no URL.
    pub fn pool(error: lease_core::BoxError) -> Self {
        ApiError::Transport(Arc::from(error))
    }

    /// The `error` label of this failure in the metrics.
    pub fn metric_kind(&self) -> RequestError {
        match self {
            ApiError::Transport(source) => Cause::metric_kind(&**source),
            ApiError::Status { .. } => RequestError::Status,
            ApiError::Malformed(_) => RequestError::Malformed,
            ApiError::TimedOut => RequestError::TimedOut,
        }
    }

    /// Worth retrying: the server or the network may answer differently in a moment (a leader
    /// election in the server, an overloaded server, the network). A transport failure and no
    /// answer in time are; an unreadable answer is not. An error answer with a gRPC code is if
    /// the code is CANCELLED, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, ABORTED or UNAVAILABLE, or
    /// is 0 (none given) with a 5xx status; one without (a plain HTTP API) is if its status is 5xx or 429.
    pub fn is_transient(&self) -> bool {
        match self {
            ApiError::Transport(_) | ApiError::TimedOut => true,
            ApiError::Status {
                status,
                grpc_code: Some(code),
                ..
            } => {
                matches!(
                    *code,
                    grpc::CANCELLED
                        | grpc::DEADLINE_EXCEEDED
                        | grpc::RESOURCE_EXHAUSTED
                        | grpc::ABORTED
                        | grpc::UNAVAILABLE
                ) || (*code == 0 && status.is_server_error())
            }
            ApiError::Status {
                status,
                grpc_code: None,
                ..
            } => status.is_server_error() || *status == StatusCode::TOO_MANY_REQUESTS,
            ApiError::Malformed(_) => false,
        }
    }

    /// The public error, saying what the caller was doing: `backend`'s
    /// [`ErrorContext::public_error`].
    pub fn into_error(
        self,
        backend: &impl ErrorContext,
        operation: impl fmt::Display,
    ) -> lease_core::Error {
        backend.public_error(self, operation)
    }

    /// The public error for one of several requests that failed alike.
    pub fn to_error(
        &self,
        backend: &impl ErrorContext,
        operation: impl fmt::Display,
    ) -> lease_core::Error {
        self.clone().into_error(backend, operation)
    }
}

/// The transport error's chain; `<status>: <message>` or, with a gRPC code,
/// `<status> (gRPC code <code>): <message>`; `unexpected answer: <what>`; or
/// `no answer in the time left`.
impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ApiError::Transport(e) => write!(f, "{}", DisplayChain(&**e)),
            ApiError::Status {
                status,
                grpc_code: None,
                message,
            } => write!(f, "{status}: {message}"),
            ApiError::Status {
                status,
                grpc_code: Some(code),
                message,
            } => write!(f, "{status} (gRPC code {code}): {message}"),
            ApiError::Malformed(m) => write!(f, "unexpected answer: {m}"),
            ApiError::TimedOut => f.write_str("no answer in the time left"),
        }
    }
}

impl Retryable for ApiError {
    fn is_transient(&self) -> bool {
        ApiError::is_transient(self)
    }

    fn timed_out() -> Self {
        ApiError::TimedOut
    }
}

/// What one backend makes of an [`ApiError`] as a public error: its name, its address, its
/// permission rules and the hints that name its own settings. Implemented by each backend's
/// client, so a call site reads `error.into_error(client, operation)`.
pub trait ErrorContext {
    /// The public error for `error`, saying what the caller was doing (`operation`).
    fn public_error(&self, error: ApiError, operation: impl fmt::Display) -> lease_core::Error;
}

/// A shared client is its client's context (the backends hold theirs in an `Arc`).
impl<T: ErrorContext> ErrorContext for Arc<T> {
    fn public_error(&self, error: ApiError, operation: impl fmt::Display) -> lease_core::Error {
        (**self).public_error(error, operation)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(status: u16, grpc_code: Option<i32>) -> ApiError {
        ApiError::Status {
            status: StatusCode::from_u16(status).expect("a status code"),
            grpc_code,
            message: "m".to_owned(),
        }
    }

    #[test]
    fn a_plain_http_answer_is_retried_if_5xx_or_429() {
        for (code, transient) in [
            (500, true),
            (503, true),
            (429, true),
            (400, false),
            (403, false),
            (404, false),
        ] {
            assert_eq!(status(code, None).is_transient(), transient, "{code}");
        }
    }

    #[test]
    fn a_grpc_answer_is_retried_by_its_code_or_if_5xx_without_one() {
        for transient in [
            grpc::CANCELLED,
            grpc::DEADLINE_EXCEEDED,
            grpc::RESOURCE_EXHAUSTED,
            grpc::ABORTED,
            grpc::UNAVAILABLE,
        ] {
            assert!(status(200, Some(transient)).is_transient(), "{transient}");
            assert!(status(400, Some(transient)).is_transient(), "{transient}");
        }
        for not in [
            grpc::NOT_FOUND,
            grpc::PERMISSION_DENIED,
            grpc::UNAUTHENTICATED,
            3,
        ] {
            assert!(!status(500, Some(not)).is_transient(), "{not}");
        }
        assert!(status(502, Some(0)).is_transient());
        // A 429 is retried by its code (RESOURCE_EXHAUSTED), not by its status.
        assert!(!status(429, Some(0)).is_transient());
        assert!(!status(400, Some(0)).is_transient());
    }

    #[test]
    fn the_rest_is_retried_unless_unreadable() {
        assert!(ApiError::TimedOut.is_transient());
        assert!(ApiError::pool("refused".into()).is_transient());
        assert!(!ApiError::Malformed("x".into()).is_transient());
    }

    #[test]
    fn messages() {
        let plain = status(503, None);
        assert_eq!(plain.to_string(), "503 Service Unavailable: m");
        let grpc = status(400, Some(grpc::NOT_FOUND));
        assert_eq!(grpc.to_string(), "400 Bad Request (gRPC code 5): m");
        assert_eq!(
            ApiError::Malformed("no index".into()).to_string(),
            "unexpected answer: no index"
        );
        assert_eq!(ApiError::TimedOut.to_string(), "no answer in the time left");
        assert_eq!(ApiError::pool("refused".into()).to_string(), "refused");
    }

    #[test]
    fn metric_kinds() {
        assert_eq!(status(500, None).metric_kind(), RequestError::Status);
        assert_eq!(
            ApiError::Malformed(String::new()).metric_kind(),
            RequestError::Malformed
        );
        assert_eq!(ApiError::TimedOut.metric_kind(), RequestError::TimedOut);
        assert_eq!(
            ApiError::pool("refused".into()).metric_kind(),
            RequestError::Unreachable
        );
    }
}
