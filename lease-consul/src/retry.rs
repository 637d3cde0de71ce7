//! Retrying brief trouble in Consul calls: the crate's one retry loop
//! ([`crate::transport::retry_transient`]), taught what a Consul error is.

pub(crate) use crate::transport::{backoff, retry_transient, within};

use super::http::ApiError;

impl crate::transport::Retryable for ApiError {
    fn is_transient(&self) -> bool {
        ApiError::is_transient(self)
    }

    fn timed_out() -> Self {
        ApiError::TimedOut
    }
}
