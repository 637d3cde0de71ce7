//! HTTP plumbing shared by the Consul (`lease-consul`) and etcd (`lease-etcd`, over gRPC, without
//! the `reqwest` feature) backends of [lease-core](https://docs.rs/lease-core): how a client is
//! built ([`ClientConfig`]), the one
//! retry loop for brief trouble ([`retry_transient`]), why a call failed ([`ApiError`], which
//! each backend turns into the public error through its [`ErrorContext`]), why a request got no
//! answer ([`Cause`]), an error's chain as text ([`DisplayChain`]), how a connection is opened
//! ([`dial`]) and TLS over it ([`tls`]), a client's background task ([`Task`]), the executor of
//! its HTTP connections' tasks ([`Executor`]), the loop of a task that keeps a stream open
//! ([`reopen`]), and its probe of a server found unreachable ([`Probe`]).
//!
//! It is a support crate: an application uses the backend crates, which re-export what it needs.
//! A third-party HTTP backend may use it too; it follows lease-core's versions.
//!
//! Brief server trouble is not loss: a 5xx or a leader election inside the server is not loss. Reads, releases and
//! revocations are retried with the crate's [`Backoff`]; whether the trouble has lasted too long
//! is decided by the caller's deadline (for a held lease, by its self-fencing deadline).

use std::fmt;
use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use lease_core::backoff::Backoff;
use lease_core::metrics::RequestError;

pub mod dial;
mod error;
mod task;
pub mod tls;

pub use error::{ApiError, ErrorContext, grpc};
pub use task::{Executor, PROBE_EVERY, Probe, Reopen, Task, reopen};

/// A backend call's error, as far as the retry loop needs to know it.
pub trait Retryable: fmt::Display {
    /// Worth retrying: the server or the network may answer differently in a moment.
    fn is_transient(&self) -> bool;
    /// The error of an attempt that did not answer before the caller's deadline.
    fn timed_out() -> Self;
}

/// The backoff of HTTP backend calls: 50 ms doubling up to 1 s, jittered.
pub fn backoff() -> Backoff {
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
pub async fn retry_transient<T, E, F, Fut>(give_up: Option<Instant>, mut op: F) -> Result<T, E>
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
pub fn retry_pause(ttl: Duration) -> Duration {
    (ttl / 20).clamp(Duration::from_millis(100), Duration::from_secs(1))
}

/// A deadline `after` from now, for clean-up calls that must not hang forever.
pub fn within(after: Duration) -> Option<Instant> {
    Some(Instant::now() + after)
}

/// Why a request did not get an answer, as far as the transport error tells.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    /// Nothing listens at the address.
    Refused,
    /// The host name did not resolve.
    Dns,
    /// The server closed or reset the connection (what a Consul agent does past its connection
    /// limit).
    Dropped,
    /// The TLS handshake failed: a certificate not trusted or not for this name, or a client
    /// certificate missing or refused.
    Tls,
    /// The request or its connection timed out.
    TimedOut,
    /// Anything else.
    Other,
}

impl Cause {
    /// The `error` label in the metrics of a request that got no answer because of `error`.
    pub fn metric_kind(error: &(dyn std::error::Error + 'static)) -> RequestError {
        match Cause::of(error) {
            Cause::TimedOut => RequestError::TimedOut,
            _ => RequestError::Unreachable,
        }
    }

    /// Reads `error` and its sources: a reqwest timeout, an I/O error's kind, or the words of a
    /// DNS, TLS or dropped-connection failure.
    pub fn of(error: &(dyn std::error::Error + 'static)) -> Cause {
        #[cfg(feature = "reqwest")]
        if error
            .downcast_ref::<reqwest::Error>()
            .is_some_and(reqwest::Error::is_timeout)
        {
            return Cause::TimedOut;
        }
        let mut source = Some(error);
        while let Some(e) = source {
            if let Some(io) = e.downcast_ref::<std::io::Error>() {
                use std::io::ErrorKind::*;
                match io.kind() {
                    ConnectionRefused => return Cause::Refused,
                    TimedOut => return Cause::TimedOut,
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
            if ["certificate", "fatal alert", "handshake"]
                .iter()
                .any(|needle| text.contains(needle))
            {
                return Cause::Tls;
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

/// A transport error as the source of a public error: its whole chain as one message (what went
/// wrong in a TLS handshake is three sources down), with no further source.
pub fn unreachable_source(error: &(dyn std::error::Error + 'static)) -> lease_core::BoxError {
    DisplayChain(error).to_string().into()
}

/// An error and its sources, `: `-separated.
#[derive(Debug)]
pub struct DisplayChain<'a>(pub &'a (dyn std::error::Error + 'static));

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

/// The default time to establish a connection (TCP and TLS) to the server.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// What a backend's HTTP client is built from, kept to build it again for another runtime.
#[derive(Clone, Default)]
pub struct ClientConfig {
    /// Whether the server's address is `https`.
    pub https: bool,
    /// PEM CA certificates to trust beside the system's roots.
    pub ca_pem: Option<Vec<u8>>,
    /// A client certificate and its key, both PEM.
    pub identity_pem: Option<(Vec<u8>, Vec<u8>)>,
    /// Accept any server certificate (`CONSUL_HTTP_SSL_VERIFY=false`).
    pub skip_verify: bool,
    /// Connect every request here (host, port), whatever host its URL names: the URL then names
    /// the server's TLS name (`CONSUL_TLS_SERVER_NAME`).
    pub connect_to: Option<(String, u16)>,
    /// `None`: [`DEFAULT_CONNECT_TIMEOUT`].
    pub connect_timeout: Option<Duration>,
    /// The most connections kept open: Consul's pool never opens more; etcd's keeps no more
    /// idle.
    pub max_connections: usize,
    /// How connections are opened: `None`, TCP ([`dial::Tcp`]).
    pub dial: Option<std::sync::Arc<dyn dial::Dial>>,
}

impl fmt::Debug for ClientConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientConfig")
            .field("https", &self.https)
            .field("ca_cert", &self.ca_pem.is_some())
            .field("client_cert", &self.identity_pem.is_some())
            .field("skip_verify", &self.skip_verify)
            .field("connect_to", &self.connect_to)
            .field("connect_timeout", &self.connect_timeout)
            .field("dial", &self.dial)
            .finish_non_exhaustive()
    }
}

/// Whether this build can speak TLS: this crate's `rustls` feature (the default) or `native-tls`.
pub const TLS: bool = cfg!(any(feature = "rustls", feature = "native-tls"));

/// What to do when this build cannot speak TLS and `what` needs it.
pub fn tls_missing(what: &str) -> lease_core::Error {
    lease_core::Error::config(format!(
        "{what} needs TLS, which this build left out: enable the backend crate's `rustls` \
         feature (on by default) or `native-tls`"
    ))
}

impl ClientConfig {
    /// How connections are opened: [`dial`](ClientConfig::dial)'s, else TCP.
    pub fn dialer(&self) -> std::sync::Arc<dyn dial::Dial> {
        self.dial
            .clone()
            .unwrap_or_else(|| std::sync::Arc::new(dial::Tcp))
    }

    /// Whether anything here needs TLS.
    pub fn wants_tls(&self) -> bool {
        self.ca_pem.is_some() || self.identity_pem.is_some() || self.skip_verify
    }

    /// Builds a reqwest client (feature `reqwest`): rustls (with the platform's verifier) if this crate's
    /// `rustls` feature is on, else native-tls if `native-tls` is, else plain HTTP only. (Consul's is
    /// built by its own connection pool, which counts connections.)
    #[cfg(feature = "reqwest")]
    pub fn build(&self) -> Result<reqwest::Client, reqwest::Error> {
        let mut client = reqwest::Client::builder()
            .connect_timeout(self.connect_timeout.unwrap_or(DEFAULT_CONNECT_TIMEOUT))
            .tcp_nodelay(true)
            .pool_max_idle_per_host(self.max_connections)
            .pool_idle_timeout(Duration::from_secs(60));
        #[cfg(feature = "rustls")]
        {
            client = client.tls_backend_rustls();
        }
        #[cfg(all(feature = "native-tls", not(feature = "rustls")))]
        {
            client = client.tls_backend_native();
        }
        #[cfg(any(feature = "rustls", feature = "native-tls"))]
        if !self.https && !self.wants_tls() {
            // Plain HTTP: no roots to load. Loading the system's costs every client build a few
            // milliseconds of CPU (rustls) or about 80 ms (OpenSSL), which a short-lived CLI
            // process and a runtime's clean-ups would pay for nothing.
            client = client.tls_certs_only([]);
        } else {
            if let Some(pem) = &self.ca_pem {
                for certificate in reqwest::Certificate::from_pem_bundle(pem)? {
                    client = client.add_root_certificate(certificate);
                }
            }
            if let Some((cert, key)) = &self.identity_pem {
                client = client.identity(identity(cert, key)?);
            }
            if self.skip_verify {
                client = client.tls_danger_accept_invalid_certs(true);
            }
        }
        if let Some((host, port)) = &self.connect_to {
            client = client.dns_resolver(std::sync::Arc::new(ConnectTo {
                host: host.clone(),
                port: *port,
            }));
        }
        client.build()
    }
}

/// A client certificate and its key (PEM) as reqwest takes them: any key rustls reads (PKCS #8,
/// PKCS #1, SEC1).
#[cfg(all(feature = "reqwest", feature = "rustls"))]
fn identity(cert: &[u8], key: &[u8]) -> Result<reqwest::Identity, reqwest::Error> {
    let mut pem = cert.to_vec();
    pem.push(b'\n');
    pem.extend_from_slice(key);
    reqwest::Identity::from_pem(&pem)
}

/// A client certificate and its key (PEM) as reqwest takes them: native-tls needs a PKCS #8 key.
#[cfg(all(feature = "reqwest", feature = "native-tls", not(feature = "rustls")))]
fn identity(cert: &[u8], key: &[u8]) -> Result<reqwest::Identity, reqwest::Error> {
    reqwest::Identity::from_pkcs8_pem(cert, key)
}

/// Resolves every name to one host, so a URL can name the server's TLS name while the connection
/// goes to its address.
#[cfg(feature = "reqwest")]
struct ConnectTo {
    host: String,
    port: u16,
}

#[cfg(feature = "reqwest")]
impl reqwest::dns::Resolve for ConnectTo {
    fn resolve(&self, _name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let target = (self.host.clone(), self.port);
        Box::pin(async move {
            let addresses = tokio::net::lookup_host(target).await?;
            let addresses: reqwest::dns::Addrs = Box::new(addresses);
            Ok(addresses)
        })
    }
}

/// The examples of this crate's README (what crates.io shows), compiled as doctests so that the
/// front page cannot drift from the API; `tests/tests/readmes.rs` of the workspace checks the
/// features, commands and links it names.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
