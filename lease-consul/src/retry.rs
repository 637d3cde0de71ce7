//! Retrying brief trouble in Consul calls: the crate's one retry loop
//! ([`lease_http::retry_transient`]), taught what a Consul error is.

pub(crate) use lease_http::{backoff, retry_transient, within};

use super::http::ApiError;

impl lease_http::Retryable for ApiError {
    fn is_transient(&self) -> bool {
        ApiError::is_transient(self)
    }

    fn timed_out() -> Self {
        ApiError::TimedOut
    }
}
