//! What the HTTP backends (Consul, etcd) share about talking to a server over reqwest: the one
//! retry loop for brief trouble, why a request got no answer, whether the server answers lately
//! ([`ReachabilityTracker`]), and an error's chain as text.
//!
//! DESIGN rule 3: a 5xx or a leader election inside the server is not loss. Reads, releases and
//! revocations are retried with the crate's [`Backoff`]; whether the trouble has lasted too long
//! is decided by the caller's deadline (for a held lease, by its self-fencing deadline).

use std::fmt;
use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::Reachability;
use crate::backoff::Backoff;
use crate::metrics::RequestError;

/// A backend call's error, as far as the retry loop needs to know it.
pub(crate) trait Retryable: fmt::Display {
    /// Worth retrying: the server or the network may answer differently in a moment.
    fn is_transient(&self) -> bool;
    /// The error of an attempt that did not answer before the caller's deadline.
    fn timed_out() -> Self;
}

/// The backoff of HTTP backend calls: 50 ms doubling up to 1 s, jittered.
pub(crate) fn backoff() -> Backoff {
    Backoff::new(Duration::from_millis(50), Duration::from_secs(1))
}

/// How long past the caller's deadline one attempt may still run: the round trip of an answer
/// that was on its way. (Consul's blocking reads ask for at most 15/16 of the time left, so its
/// jitter of up to a sixteenth still answers them in time.)
const ATTEMPT_SLACK: Duration = Duration::from_millis(500);

/// Runs `op` until it succeeds, fails in a way retrying cannot help, or the next attempt would
/// start after `give_up` (never, if `None`). Each attempt is bounded too: one that has not
/// answered shortly after `give_up` ends with [`Retryable::timed_out`], so the total is bounded
/// whatever the request timeout.
pub(crate) async fn retry_transient<T, E, F, Fut>(
    give_up: Option<Instant>,
    mut op: F,
) -> Result<T, E>
where
    E: Retryable,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let mut backoff = backoff();
    loop {
        let attempt = match give_up {
            Some(give_up) => tokio::time::timeout_at(give_up + ATTEMPT_SLACK, op())
                .await
                .unwrap_or_else(|_| Err(E::timed_out())),
            None => op().await,
        };
        match attempt {
            Err(e) if e.is_transient() => {
                let pause = backoff.next_pause();
                if give_up.is_some_and(|g| Instant::now() + pause >= g) {
                    return Err(e);
                }
                tracing::debug!(error = %e, ?pause, "request failed; retrying");
                tokio::time::sleep(pause).await;
            }
            other => return other,
        }
    }
}

/// How soon a failed renewal of something that lives `ttl` (a Consul session or heartbeat pass,
/// an etcd keep-alive) is tried again: TTL/20, between 100 ms and 1 s.
pub(crate) fn retry_pause(ttl: Duration) -> Duration {
    (ttl / 20).clamp(Duration::from_millis(100), Duration::from_secs(1))
}

/// A deadline `after` from now, for clean-up calls that must not hang forever.
pub(crate) fn within(after: Duration) -> Option<Instant> {
    Some(Instant::now() + after)
}

/// Why a request did not get an answer, as far as the transport error tells.
pub(crate) enum Cause {
    /// Nothing listens at the address.
    Refused,
    /// The host name did not resolve.
    Dns,
    /// The server closed or reset the connection (what a Consul agent does past its connection
    /// limit).
    Dropped,
    TimedOut,
    Other,
}

impl Cause {
    /// The `error` label in the metrics of a request that got no answer because of `error`.
    pub(crate) fn metric_kind(error: &reqwest::Error) -> RequestError {
        match Cause::of(error) {
            Cause::TimedOut => RequestError::TimedOut,
            _ => RequestError::Unreachable,
        }
    }

    pub(crate) fn of(error: &reqwest::Error) -> Cause {
        if error.is_timeout() {
            return Cause::TimedOut;
        }
        let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
        while let Some(e) = source {
            if let Some(io) = e.downcast_ref::<std::io::Error>() {
                use std::io::ErrorKind::*;
                match io.kind() {
                    ConnectionRefused => return Cause::Refused,
                    ConnectionReset | ConnectionAborted | BrokenPipe | UnexpectedEof => {
                        return Cause::Dropped;
                    }
                    _ => {}
                }
            }
            let text = e.to_string();
            if text.contains("dns error") || text.contains("failed to lookup address") {
                return Cause::Dns;
            }
            if text.contains("connection closed before message completed")
                || text.contains("connection reset")
            {
                return Cause::Dropped;
            }
            source = e.source();
        }
        Cause::Other
    }
}

/// An error and its sources, `: `-separated.
pub(crate) struct DisplayChain<'a>(pub(crate) &'a (dyn std::error::Error + 'static));

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

/// The HTTP client of a backend handle, trusting `ca_pem` (a PEM certificate) beside the system's
/// roots and presenting `identity` (a client certificate) if given.
pub(crate) fn build_client(
    ca_pem: Option<&[u8]>,
    identity: Option<reqwest::Identity>,
    max_idle_connections: usize,
) -> Result<reqwest::Client, reqwest::Error> {
    let mut client = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(5))
        .tcp_nodelay(true)
        .pool_max_idle_per_host(max_idle_connections)
        .pool_idle_timeout(Duration::from_secs(60));
    if let Some(pem) = ca_pem {
        client = client.add_root_certificate(reqwest::Certificate::from_pem(pem)?);
    }
    if let Some(identity) = identity {
        client = client.identity(identity);
    }
    client.build()
}

/// Whether a client's requests have lately been answered: what [`Backend::reachability`]
/// reports. Fed by the one place each backend sends its requests.
///
/// [`Backend::reachability`]: crate::Backend::reachability
#[derive(Debug)]
pub(crate) struct ReachabilityTracker(std::sync::Mutex<Reachability>);

impl Default for ReachabilityTracker {
    fn default() -> Self {
        ReachabilityTracker(std::sync::Mutex::new(Reachability::Unknown))
    }
}

impl ReachabilityTracker {
    /// A request was `answered` (any answer), or went unanswered.
    pub(crate) fn answered(&self, answered: bool) {
        let mut current = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *current = match (*current, answered) {
            (_, true) => Reachability::Reachable,
            // The outage started with its first failure.
            (outage @ Reachability::Unreachable { .. }, false) => outage,
            (_, false) => Reachability::Unreachable {
                since: Instant::now(),
            },
        };
    }

    pub(crate) fn get(&self) -> Reachability {
        *self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
