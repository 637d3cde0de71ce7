//! Why a Consul call failed, before it is given the context of what the caller was doing.

use std::fmt;
use std::sync::Arc;

use reqwest::StatusCode;

use super::ConsulHttp;
use crate::Error;

/// Why a call failed, before it is given the context of what the caller was doing.
#[derive(Clone, Debug)]
pub(crate) enum ApiError {
    /// Shared, so the one failure of a batch of requests is the source of every error it
    /// causes (the URL, which may carry a key, is stripped).
    Transport(Arc<reqwest::Error>),
    Status(StatusCode, String),
    Malformed(String),
    /// No answer before the caller's deadline (see `retry_transient`).
    TimedOut,
}

impl ApiError {
    pub(super) fn transport(error: reqwest::Error) -> Self {
        ApiError::Transport(Arc::new(error.without_url()))
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
                hint: "start an agent, or point CONSUL_HTTP_ADDR at one",
                source: Box::new(source),
            },
            ApiError::Status(StatusCode::FORBIDDEN, message) => Error::PermissionDenied {
                operation: operation.to_string(),
                message,
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
            ApiError::Transport(e) => write!(f, "{}", DisplayChain(e)),
            ApiError::Status(status, body) => write!(f, "{status}: {body}"),
            ApiError::Malformed(m) => write!(f, "unexpected answer: {m}"),
            ApiError::TimedOut => f.write_str("no answer in the time left"),
        }
    }
}

struct DisplayChain<'a>(&'a (dyn std::error::Error + 'static));

impl fmt::Display for DisplayChain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(s) = source {
            write!(f, ": {s}")?;
            source = s.source();
        }
        Ok(())
    }
}
