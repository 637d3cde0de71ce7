//! Retrying brief trouble in Consul calls: the crate's one retry loop
//! ([`lease_http::retry_transient`]), which knows from [`lease_http::ApiError`] what is worth
//! retrying.

pub(crate) use lease_http::{backoff, retry_transient, within};
