//! What a call's error means: etcd's gRPC status, or no answer at all, as lease-http's
//! [`ApiError`]; which errors are etcd's "not found" or a refused permission; and the hint the
//! public error gives.

use std::fmt;

use lease_http::{ApiError, Cause, grpc};

/// Whether etcd says the lease (or the thing asked about) does not exist.
pub(crate) fn is_not_found(error: &ApiError) -> bool {
    matches!(
        error,
        ApiError::Status {
            grpc_code: Some(grpc::NOT_FOUND),
            ..
        }
    )
}

/// Whether etcd refused the call's permission or credentials.
pub(crate) fn is_permission(error: &ApiError) -> bool {
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
pub(crate) fn hint(error: &ApiError) -> &'static str {
    match error {
        ApiError::Transport(source) => match cause_of(&**source) {
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

/// What went wrong under a call that got no answer: lease-http's [`Cause`], and tonic's own
/// timeout (its connect timeout expiring, which carries no I/O error kind), a timeout too.
fn cause_of(error: &(dyn std::error::Error + 'static)) -> Cause {
    let mut source = Some(error);
    while let Some(e) = source {
        if e.is::<tonic::TimeoutExpired>() {
            return Cause::TimedOut;
        }
        source = e.source();
    }
    Cause::of(error)
}

/// The error of a call that ended with `status`: `Transport` if no answer came (tonic gives such
/// a status the local error as its source), else etcd's own status.
pub(crate) fn status_error(status: tonic::Status) -> ApiError {
    if std::error::Error::source(&status).is_some() {
        return ApiError::pool(Box::new(NoAnswer(status)));
    }
    ApiError::Status {
        status: http::StatusCode::OK,
        grpc_code: Some(status.code() as i32),
        message: status.message().to_owned(),
    }
}

/// Why a stream left an endpoint that calls had moved away from.
pub(crate) fn moved() -> ApiError {
    ApiError::Status {
        status: http::StatusCode::OK,
        grpc_code: Some(grpc::UNAVAILABLE),
        message: "calls moved on to another etcd endpoint; following them".into(),
    }
}

/// A call that got no answer: its message is the chain of the local error under the status
/// (what lease-http's `Cause` reads), not the status's own rendering of it.
#[derive(Debug)]
struct NoAnswer(tonic::Status);

impl fmt::Display for NoAnswer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("no answer from etcd")
    }
}

impl std::error::Error for NoAnswer {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        std::error::Error::source(&self.0)
    }
}
