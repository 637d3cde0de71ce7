//! A failed request ([`PgError`]), before it is judged in lease terms: whether a retry may cure
//! it, whether it may have reached the server, whether the server answered (for reachability),
//! its metric, and the lease error it becomes, naming the address and what to do.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use lease_core::Error;
use lease_core::metrics::RequestError;

use super::sqlstate::{Stage, Verdict, judge};
use super::tls;

/// The longest a request may go unanswered before it counts as failed (and is retried, within
/// the caller's bound). Far above a healthy answer, below the shortest TTL's renewal period.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);

/// A failed request, before it is judged in lease terms.
#[derive(Debug)]
pub(crate) enum PgError {
    /// Connecting failed.
    Connect(tokio_postgres::Error),
    /// TLS failed while connecting: refused by the server, or a certificate not accepted.
    Tls(tokio_postgres::Error),
    /// A statement failed (the server's error, or the connection under it).
    Query(tokio_postgres::Error),
    /// No answer within [`REQUEST_TIMEOUT`].
    TimedOut,
    /// An answer this client cannot read.
    Malformed(String),
    /// The failure of a statement several requests shared (a batch of attempts).
    Batch(Arc<PgError>),
}

impl fmt::Display for PgError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PgError::Connect(e) | PgError::Tls(e) | PgError::Query(e) => {
                write!(f, "{}", with_sources(e))
            }
            PgError::TimedOut => write!(f, "no answer within {REQUEST_TIMEOUT:?}"),
            PgError::Malformed(what) => write!(f, "unexpected answer: {what}"),
            PgError::Batch(shared) => shared.fmt(f),
        }
    }
}

pub(super) fn with_sources(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

impl PgError {
    /// A failure to connect: TLS's own, or any other.
    pub(crate) fn connecting(error: tokio_postgres::Error) -> PgError {
        if tls::is_tls_failure(&error) {
            PgError::Tls(error)
        } else {
            PgError::Connect(error)
        }
    }

    fn sqlstate(&self) -> Option<&str> {
        match self {
            PgError::Connect(e) | PgError::Query(e) => e.code().map(|c| c.code()),
            PgError::Batch(shared) => shared.sqlstate(),
            _ => None,
        }
    }

    /// The verdict on the server's code ([`judge`]), if it answered one.
    fn verdict(&self) -> Option<Verdict> {
        match self {
            PgError::Connect(e) => e.code().map(|c| judge(c.code(), Stage::Connecting)),
            PgError::Query(e) => e.code().map(|c| judge(c.code(), Stage::Statement)),
            PgError::Batch(shared) => shared.verdict(),
            _ => None,
        }
    }

    /// Whether another attempt may succeed: the server did not answer (or the connection
    /// broke), or answered a code a retry can cure ([`judge`]).
    pub(crate) fn is_transient(&self) -> bool {
        match (self, self.verdict()) {
            (PgError::Batch(shared), _) => shared.is_transient(),
            (_, Some(verdict)) => verdict != Verdict::Permanent,
            (_, None) => !matches!(self, PgError::Malformed(_) | PgError::Tls(_)),
        }
    }

    /// Whether the statement may have reached the server: anything but a failure to connect.
    pub(crate) fn maybe_sent(&self) -> bool {
        match self {
            PgError::Batch(shared) => shared.maybe_sent(),
            PgError::Connect(_) | PgError::Tls(_) => false,
            _ => true,
        }
    }

    /// Whether the server answered, for reachability: a code that says the database cannot be
    /// used now ([`Verdict::Unusable`]) is no answer.
    pub(crate) fn answered(&self) -> bool {
        match (self, self.verdict()) {
            (PgError::Batch(shared), _) => shared.answered(),
            (_, Some(verdict)) => verdict != Verdict::Unusable,
            (_, None) => matches!(self, PgError::Malformed(_) | PgError::Tls(_)),
        }
    }

    pub(super) fn metric(&self) -> RequestError {
        match (self, self.verdict()) {
            (PgError::TimedOut, _) => RequestError::TimedOut,
            (PgError::Malformed(_), _) => RequestError::Malformed,
            (PgError::Batch(shared), _) => shared.metric(),
            (_, Some(Verdict::Unusable) | None) => RequestError::Unreachable,
            (_, Some(_)) => RequestError::Status,
        }
    }

    /// The error in lease terms, for `operation` (what was attempted, naming the key).
    pub(crate) fn into_error(self, address: &str, operation: impl fmt::Display) -> Error {
        let operation = operation.to_string();
        match self {
            PgError::Batch(error) => match Arc::try_unwrap(error) {
                Ok(error) => error.into_error(address, operation),
                Err(error) => error.describe(address, operation),
            },
            PgError::Connect(e) | PgError::Query(e) if e.code().is_none() => Error::Unreachable {
                backend: "PostgreSQL",
                address: address.to_owned(),
                hint: UNREACHABLE_HINT,
                source: Box::new(e),
            },
            other => other.describe(address, operation),
        }
    }

    /// [`into_error`](PgError::into_error) without taking the database's error along as the
    /// source (its text is in the message).
    fn describe(&self, address: &str, operation: String) -> Error {
        let code = self.sqlstate();
        let text = self.to_string();
        match (self, code) {
            (PgError::Batch(error), _) => error.describe(address, operation),
            (PgError::Tls(_), _) => tls::tls_failure(address, &text),
            (_, Some(code)) if code.starts_with("28") || code == "42501" => {
                Error::PermissionDenied {
                    operation,
                    message: text,
                    hint: "check the user and password of the PostgreSQL URL; the role needs \
                           USAGE on the lease schema and SELECT, INSERT, UPDATE, DELETE on its \
                           tables (lease-postgres's sql/lease.sql says which)",
                }
            }
            (_, Some(code)) if self.verdict() == Some(Verdict::Unusable) => Error::Unreachable {
                backend: "PostgreSQL",
                address: address.to_owned(),
                hint: UNUSABLE_HINT,
                source: format!("SQLSTATE {code}: {text}").into(),
            },
            (PgError::Connect(_), Some("3D000")) => Error::config(format!(
                "the database of the PostgreSQL URL does not exist ({}: {text}): create it or \
                 fix the URL",
                address
            )),
            (_, Some(code)) => Error::Backend {
                backend: "PostgreSQL",
                operation,
                message: format!("SQLSTATE {code}: {text}"),
                transient: self.verdict() == Some(Verdict::Transient),
            },
            (PgError::Connect(_) | PgError::Query(_), None) => Error::Unreachable {
                backend: "PostgreSQL",
                address: address.to_owned(),
                hint: UNREACHABLE_HINT,
                source: text.into(),
            },
            (PgError::TimedOut, None) => Error::Backend {
                backend: "PostgreSQL",
                operation,
                message: format!("no answer within {REQUEST_TIMEOUT:?}"),
                transient: true,
            },
            (PgError::Malformed(what), None) => Error::Backend {
                backend: "PostgreSQL",
                operation,
                message: format!("unexpected answer: {what}"),
                transient: false,
            },
        }
    }
}

/// What to do when the server answers that the database cannot be used now.
const UNUSABLE_HINT: &str = "the server is up but does not take connections to this database \
                             now (starting up, shutting down or in recovery; closed with \
                             ALTER DATABASE ... ALLOW_CONNECTIONS false; or out of connection \
                             slots): requests are retried until it does; if this lasts, see the \
                             server's log";

/// What to do when the server does not answer.
const UNREACHABLE_HINT: &str = "start PostgreSQL, or fix the host and port of the URL \
                                (Postgres::from_env reads LEASE_POSTGRES_URL, else DATABASE_URL)";
