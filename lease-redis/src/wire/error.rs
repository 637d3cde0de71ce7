//! A failed request ([`RedisFailure`]), before it is judged in lease terms: whether a retry may
//! cure it, whether the server answered (for reachability), whether the connection under it is
//! done for, its metric, and the lease error it becomes, naming the address and what to do.

use std::fmt;
use std::sync::Arc;

use lease_core::Error;
use lease_core::metrics::RequestError;

/// The backend's name in errors.
pub(crate) const BACKEND: &str = "Redis";

/// A failed request, before it is judged in lease terms.
#[derive(Debug, Clone)]
pub(crate) enum RedisFailure {
    /// redis-rs's error: the server's error reply, or the connection under the request.
    Redis(redis::RedisError),
    /// Connecting failed before redis-rs had a stream: TCP, or a sentinel that named no master.
    Connect(Arc<std::io::Error>),
    /// The TLS handshake failed: TLS off on the server, a certificate not trusted, a name not
    /// on it. Not retried.
    #[cfg_attr(not(feature = "rustls"), allow(dead_code))]
    Tls(Arc<std::io::Error>),
    /// No connection came up within the caller's bound.
    NotConnected,
    /// No answer in time.
    TimedOut,
    /// An answer this client cannot read.
    Malformed(String),
    /// The acquisition reached fewer replicas than the server has (`WAIT`).
    Replicas { acknowledged: usize, wanted: usize },
}

impl fmt::Display for RedisFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RedisFailure::Redis(e) => write!(f, "{e}"),
            RedisFailure::Connect(e) => write!(f, "{e}"),
            RedisFailure::Tls(e) => write!(f, "TLS handshake failed: {e}"),
            RedisFailure::NotConnected => f.write_str("no connection to the server"),
            RedisFailure::TimedOut => f.write_str("no answer in time"),
            RedisFailure::Malformed(what) => write!(f, "unexpected answer: {what}"),
            RedisFailure::Replicas {
                acknowledged,
                wanted,
            } => write!(
                f,
                "the acquisition reached {acknowledged} of the server's {wanted} replica(s) in time"
            ),
        }
    }
}

impl std::error::Error for RedisFailure {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RedisFailure::Redis(e) => Some(e),
            RedisFailure::Connect(e) | RedisFailure::Tls(e) => Some(&**e),
            _ => None,
        }
    }
}

/// Server error codes a retry can cure: a server loading its data set, a script running too
/// long, a failover under way (a master turned replica, a replica without its master), a
/// cluster resharding.
const TRANSIENT_CODES: [&str; 8] = [
    "LOADING",
    "BUSY",
    "READONLY",
    "MASTERDOWN",
    "TRYAGAIN",
    "CLUSTERDOWN",
    "NOREPLICAS",
    "UNBLOCKED",
];

/// Server error codes that say this client may not do what it asks.
const DENIED_CODES: [&str; 3] = ["NOAUTH", "WRONGPASS", "NOPERM"];

impl From<redis::RedisError> for RedisFailure {
    fn from(error: redis::RedisError) -> Self {
        RedisFailure::Redis(error)
    }
}

impl RedisFailure {
    fn code(&self) -> Option<&str> {
        match self {
            RedisFailure::Redis(e) => e.code(),
            _ => None,
        }
    }

    /// Whether another attempt may succeed.
    pub(crate) fn is_transient(&self) -> bool {
        match self {
            RedisFailure::Redis(e) => {
                if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() {
                    return true;
                }
                matches!(e.code(), Some(code) if TRANSIENT_CODES.contains(&code))
            }
            RedisFailure::Connect(_)
            | RedisFailure::NotConnected
            | RedisFailure::TimedOut
            | RedisFailure::Replicas { .. } => true,
            RedisFailure::Tls(_) | RedisFailure::Malformed(_) => false,
        }
    }

    /// Whether the server answered (an error reply counts): for reachability.
    pub(crate) fn answered(&self) -> bool {
        match self {
            RedisFailure::Redis(e) => {
                !(e.is_io_error() || e.is_timeout() || e.is_connection_dropped())
            }
            RedisFailure::Tls(_) | RedisFailure::Malformed(_) | RedisFailure::Replicas { .. } => {
                true
            }
            RedisFailure::Connect(_) | RedisFailure::NotConnected | RedisFailure::TimedOut => false,
        }
    }

    /// Whether the connection that carried the request is done for: it broke, hung, or the
    /// server behind it is no longer the master (a failover): the connection task then opens
    /// another (asking the sentinels again, if there are any).
    pub(crate) fn breaks_connection(&self) -> bool {
        match self {
            RedisFailure::Redis(e) => {
                e.is_io_error()
                    || e.is_timeout()
                    || e.is_connection_dropped()
                    || matches!(e.code(), Some("READONLY" | "MASTERDOWN" | "LOADING"))
            }
            RedisFailure::TimedOut => true,
            _ => false,
        }
    }

    /// The kind of failure, for the `lease_backend_errors_total` metric.
    pub(crate) fn metric(&self) -> RequestError {
        match self {
            RedisFailure::Redis(e) if e.is_timeout() => RequestError::TimedOut,
            RedisFailure::TimedOut => RequestError::TimedOut,
            RedisFailure::Redis(e) if e.is_io_error() || e.is_connection_dropped() => {
                RequestError::Unreachable
            }
            RedisFailure::Connect(_) | RedisFailure::NotConnected => RequestError::Unreachable,
            RedisFailure::Malformed(_) => RequestError::Malformed,
            RedisFailure::Redis(_) => RequestError::Status,
            _ => RequestError::Other,
        }
    }

    /// The lease error for this failure of `what` (`acquire "jobs/a"`) on the server at
    /// `address`.
    pub(crate) fn into_error(self, address: &str, what: fmt::Arguments<'_>) -> Error {
        if let Some(code) = self.code().filter(|code| DENIED_CODES.contains(code)) {
            let hint = if code == "NOPERM" {
                "grant the user EVAL/EVALSHA, the script's commands on the prefix's keys, and \
                 SUBSCRIBE (ACL SETUSER … +@scripting +@pubsub ~lease:* &lease:*)"
            } else {
                "check the password (and user) in the URL"
            };
            return Error::PermissionDenied {
                operation: format!("{what} on {address}"),
                message: self.to_string(),
                hint,
            };
        }
        if let RedisFailure::Tls(_) = self {
            return Error::config_caused_by(
                format!(
                    "the TLS connection to {address} failed ({self}): check that the server \
                     speaks TLS on that port (rediss://) and that its certificate is trusted \
                     (RedisBuilder::ca_cert) and names the host of the URL"
                ),
                self,
            );
        }
        if self.is_transient() && !self.answered() {
            return Error::Unreachable {
                backend: BACKEND,
                address: address.to_owned(),
                hint: "check that redis-server runs and listens there (redis-cli -h HOST -p \
                       PORT ping)",
                source: Box::new(self),
            };
        }
        Error::Backend {
            backend: BACKEND,
            operation: what.to_string(),
            transient: self.is_transient(),
            message: self.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(code: &str) -> RedisFailure {
        RedisFailure::Redis(redis::make_extension_error(code.to_owned(), None))
    }

    #[test]
    fn a_failover_is_retried_and_reconnects_and_a_denial_is_final() {
        let readonly = server("READONLY");
        assert!(readonly.is_transient() && readonly.answered() && readonly.breaks_connection());
        let loading = server("LOADING");
        assert!(loading.is_transient() && loading.breaks_connection());
        let busy = server("BUSY");
        assert!(busy.is_transient() && !busy.breaks_connection());
        let denied = server("NOPERM");
        assert!(!denied.is_transient());
        assert!(matches!(
            denied.into_error("h:1", format_args!("acquire")),
            Error::PermissionDenied { .. }
        ));
        let gone = RedisFailure::NotConnected;
        assert!(matches!(
            gone.into_error("h:1", format_args!("acquire")),
            Error::Unreachable { .. }
        ));
    }
}
