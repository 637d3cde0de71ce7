//! Why a Consul call failed, before it is given the context of what the caller was doing.

use std::fmt;
use std::sync::Arc;

use reqwest::StatusCode;

use super::ConsulHttp;
use crate::config::AddressOrigin;
use lease_core::Error;
use lease_core::metrics::RequestError;
use lease_http::{Cause, DisplayChain};

/// Why a call failed, before it is given the context of what the caller was doing.
#[derive(Clone, Debug)]
pub(crate) enum ApiError {
    /// Shared, so the one failure of a batch of requests is the source of every error it
    /// causes (the URL, which may carry a key, is stripped).
    Transport(Arc<dyn std::error::Error + Send + Sync>),
    Status(StatusCode, String),
    Malformed(String),
    /// No answer before the caller's deadline (see `retry_transient`).
    TimedOut,
}

impl ApiError {
    pub(super) fn transport(error: reqwest::Error) -> Self {
        ApiError::Transport(Arc::new(error.without_url()))
    }

    /// A failure of the counted pool, whose errors carry no URL.
    pub(super) fn pool(error: lease_core::BoxError) -> Self {
        ApiError::Transport(Arc::from(error))
    }

    /// The `error` label of this failure in the metrics.
    pub(crate) fn metric_kind(&self) -> RequestError {
        match self {
            ApiError::Transport(source) => Cause::metric_kind(&**source),
            ApiError::Status(..) => RequestError::Status,
            ApiError::Malformed(_) => RequestError::Malformed,
            ApiError::TimedOut => RequestError::TimedOut,
        }
    }

    /// Worth retrying: the agent or the network may answer differently in a moment.
    pub(crate) fn is_transient(&self) -> bool {
        match self {
            ApiError::Transport(_) | ApiError::TimedOut => true,
            ApiError::Status(status, _) => {
                status.is_server_error() || *status == StatusCode::TOO_MANY_REQUESTS
            }
            ApiError::Malformed(_) => false,
        }
    }

    /// What the user should do about this failure, for errors and warnings. It names the
    /// setting the address came from (`origin`): `CONSUL_HTTP_ADDR` only if it was read; and
    /// over `https`, what an agent that verifies clients does to a client without a certificate.
    pub(crate) fn hint(&self, origin: AddressOrigin, https: bool) -> &'static str {
        let env = origin.setting() == "CONSUL_HTTP_ADDR";
        let default = matches!(origin, AddressOrigin::Default { .. });
        match self {
            ApiError::Transport(source) => match (Cause::of(&**source), env, default) {
                (Cause::Tls, ..) => TLS_HINT,
                (Cause::Other, ..) if https => {
                    "is it running? Check its address; an agent that verifies clients \
                     (verify_incoming) closes the connection of a client without a certificate \
                     (CONSUL_CLIENT_CERT and CONSUL_CLIENT_KEY, or ConsulBuilder::client_cert)"
                }
                (Cause::Refused, true, false) => {
                    "is it running? Start an agent, or point CONSUL_HTTP_ADDR at one"
                }
                (Cause::Refused, true, true) => {
                    "is it running? Start an agent here, or set CONSUL_HTTP_ADDR to its address"
                }
                (Cause::Refused, false, false) => {
                    "is it running? Start an agent, or give ConsulBuilder::address its address"
                }
                (Cause::Refused, false, true) => {
                    "is it running? Start an agent here, or give ConsulBuilder::address its address"
                }
                (Cause::Dns, true, _) => {
                    "the host name did not resolve (DNS): check CONSUL_HTTP_ADDR and the resolver"
                }
                (Cause::Dns, false, _) => {
                    "the host name did not resolve (DNS): check the address given to \
                     ConsulBuilder::address and the resolver"
                }
                (Cause::Dropped, ..) => LIMIT_HINT,
                (Cause::TimedOut, ..) => {
                    "no answer in time: the agent or the network is overloaded"
                }
                (Cause::Other, true, _) => "is it running? Check CONSUL_HTTP_ADDR",
                (Cause::Other, false, _) => {
                    "is it running? Check the address given to ConsulBuilder::address"
                }
            },
            ApiError::Status(StatusCode::TOO_MANY_REQUESTS, _) => LIMIT_HINT,
            ApiError::Status(..) | ApiError::Malformed(_) => "",
            ApiError::TimedOut => "no answer in time: the agent or the network is overloaded",
        }
    }

    /// The public error for one of several requests that failed alike.
    pub(crate) fn to_error(&self, http: &ConsulHttp, operation: impl fmt::Display) -> Error {
        self.clone().into_error(http, operation)
    }

    /// The public error, saying what we were doing.
    pub(crate) fn into_error(self, http: &ConsulHttp, operation: impl fmt::Display) -> Error {
        match self {
            ApiError::Transport(source) => Error::Unreachable {
                backend: "Consul",
                address: http.address(),
                hint: ApiError::Transport(Arc::clone(&source)).hint(http.origin(), http.https()),
                source: lease_http::unreachable_source(&*source),
            },
            ApiError::Status(StatusCode::FORBIDDEN, message) => Error::PermissionDenied {
                operation: operation.to_string(),
                message,
                hint: "use an ACL token (CONSUL_HTTP_TOKEN, or ConsulBuilder::token) whose policy \
                       allows it",
            },
            ApiError::Status(StatusCode::TOO_MANY_REQUESTS, message) => Error::Backend {
                backend: "Consul",
                operation: operation.to_string(),
                message: format!("429 Too Many Requests: {message}; {LIMIT_HINT}"),
                transient: true,
            },
            ApiError::Status(status, message) => Error::Backend {
                backend: "Consul",
                operation: operation.to_string(),
                message: format!("{status}: {message}"),
                transient: status.is_server_error() || status == StatusCode::TOO_MANY_REQUESTS,
            },
            ApiError::Malformed(message) => Error::Backend {
                backend: "Consul",
                operation: operation.to_string(),
                message: format!("unexpected answer: {message}"),
                transient: false,
            },
            ApiError::TimedOut => Error::Backend {
                backend: "Consul",
                operation: operation.to_string(),
                message: "no answer in the time left; the agent may be overloaded".to_owned(),
                transient: true,
            },
        }
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ApiError::Transport(e) => write!(f, "{}", DisplayChain(&**e)),
            ApiError::Status(status, body) => write!(f, "{status}: {body}"),
            ApiError::Malformed(m) => write!(f, "unexpected answer: {m}"),
            ApiError::TimedOut => f.write_str("no answer in the time left"),
        }
    }
}

/// What to check when the TLS handshake with the agent fails.
const TLS_HINT: &str = "the TLS handshake failed: trust the CA that signed the agent's certificate \
    (CONSUL_CACERT, or ConsulBuilder::ca_cert), connect by a name the certificate carries or set \
    that name (CONSUL_TLS_SERVER_NAME, or ConsulBuilder::tls_server_name), and give a client \
    certificate if the agent verifies clients (CONSUL_CLIENT_CERT and CONSUL_CLIENT_KEY, or \
    ConsulBuilder::client_cert)";

/// What to change when the agent refuses or drops connections.
const LIMIT_HINT: &str = "the agent refused or dropped the connection: it allows each client IP \
    `limits.http_max_conns_per_client` connections (default 200), shared by every process on \
    this host; raise that limit in the agent's configuration, or lower \
    `ConsulBuilder::max_connections` (default 8) of the processes here";
