//! The connections of the wire client: per endpoint, one HTTP/2 channel for the calls and one for
//! the two streams (tonic's, over [`Connector`]'s TCP or TLS); the endpoint calls go to, and the
//! move to the next one after a transport failure, which the streams follow.
//!
//! The calls' connection carries at most 128 calls in flight (a burst of thousands of
//! acquisitions waits parked); the other carries the one `Watch` stream and the one
//! `LeaseKeepAlive` stream, so keep-alives and loss never queue behind calls. A lease or a waiter
//! costs no connection and no stream of its own.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::mpsc;
use tonic::transport::Channel;

use super::connect::Connector;
use lease_http::dial::Dial;
use lease_http::tls::Tls;
use lease_http::{ApiError, Executor};

/// Timeout of every unary call.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// How often the connection is pinged while idle, to find a dead one before a request does.
/// etcd refuses pings more often than every 5 s (`--grpc-keepalive-min-time`).
const PING_EVERY: Duration = Duration::from_secs(10);

/// The most unary calls in flight on an endpoint's connection; etcd batches its writes, so more
/// would not make them faster.
const MAX_CALLS_IN_FLIGHT: usize = 128;

/// One of the cluster's client URLs.
#[derive(Clone, Debug)]
pub(crate) struct Endpoint {
    /// `http://host:port` or `https://host:port`, for messages.
    pub(crate) url: String,
    pub(crate) host: String,
    pub(crate) port: u16,
    pub(crate) https: bool,
}

/// What a connection carries.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Use {
    /// The unary calls.
    Calls = 0,
    /// The watch stream and the keep-alive stream.
    Streams = 1,
}

/// An endpoint's channel, and a sentinel that tells whether the runtime its connection task runs
/// on is still there: a channel made on a runtime that ended (a test's, a CLI's first one) is
/// made again on the current one.
struct Conn {
    channel: Channel,
    alive: mpsc::Sender<()>,
}

/// The endpoints and their connections.
pub(crate) struct Channels {
    endpoints: Vec<Endpoint>,
    tls: Option<Tls>,
    dial: Arc<dyn Dial>,
    /// The endpoint calls go to; moved on by a transport failure.
    current: AtomicUsize,
    /// Per endpoint, the connection of the calls and that of the two streams.
    conns: Mutex<Vec<[Option<Conn>; 2]>>,
    /// Bumped when calls move on to another endpoint, so the streams follow them there.
    moved: tokio::sync::watch::Sender<u64>,
}

impl Channels {
    /// No connection yet (each is made on first use).
    pub(crate) fn new(endpoints: Vec<Endpoint>, tls: Option<Tls>, dial: Arc<dyn Dial>) -> Channels {
        let conns = endpoints.iter().map(|_| [None, None]).collect();
        Channels {
            endpoints,
            tls,
            dial,
            current: AtomicUsize::new(0),
            conns: Mutex::new(conns),
            moved: tokio::sync::watch::Sender::new(0),
        }
    }

    pub(crate) fn endpoints(&self) -> &[Endpoint] {
        &self.endpoints
    }

    /// The current endpoint's index and the channel for `use_` there (made if there is none, or
    /// if the runtime of the one there ended).
    ///
    /// Calls and streams have a connection each, so a burst of calls (thousands of acquisitions
    /// at once) never queues the keep-alives and watch events behind it: at most two connections
    /// per endpoint.
    pub(crate) fn channel(&self, use_: Use) -> Result<(usize, Channel), ApiError> {
        let i = self.current.load(Ordering::Relaxed) % self.endpoints.len();
        let mut conns = self.conns.lock().unwrap_or_else(PoisonError::into_inner);
        let conn = &mut conns[i][use_ as usize];
        if let Some(conn) = conn {
            if !conn.alive.is_closed() {
                return Ok((i, conn.channel.clone()));
            }
        }
        let endpoint = &self.endpoints[i];
        let scheme_less = format!("http://{}:{}", endpoint.host, endpoint.port);
        let channel = tonic::transport::Endpoint::from_shared(scheme_less)
            .map_err(|e| ApiError::Malformed(format!("endpoint {}: {e}", endpoint.url)))?
            .connect_timeout(lease_http::DEFAULT_CONNECT_TIMEOUT)
            .executor(Executor)
            .http2_keep_alive_interval(PING_EVERY)
            .keep_alive_timeout(REQUEST_TIMEOUT)
            .keep_alive_while_idle(true);
        // Calls beyond the limit wait (parked) for one in flight to end: thousands of
        // acquisitions at once then queue here rather than in the runtime's run queue, which
        // would delay the stream tasks (keep-alives, loss) behind them by seconds.
        let channel = match use_ {
            Use::Calls => channel.concurrency_limit(MAX_CALLS_IN_FLIGHT),
            Use::Streams => channel,
        }
        .connect_with_connector_lazy(Connector {
            host: endpoint.host.clone(),
            port: endpoint.port,
            dial: Arc::clone(&self.dial),
            tls: if endpoint.https {
                self.tls.clone()
            } else {
                None
            },
        });
        let (alive, mut sentinel) = mpsc::channel(1);
        // Ends with the runtime (closing `alive`), or when the channel is replaced.
        lease_core::runtime::spawn(async move { sentinel.recv().await });
        *conn = Some(Conn {
            channel: channel.clone(),
            alive,
        });
        Ok((i, channel))
    }

    /// After a transport failure at endpoint `i` on the connection for `use_`: calls and
    /// streams go to the next endpoint (on fresh connections), or, with one endpoint, that
    /// connection is made again (the failed one may be half-dead).
    pub(crate) fn move_on(&self, i: usize, use_: Use) {
        let next = (i + 1) % self.endpoints.len();
        let mut conns = self.conns.lock().unwrap_or_else(PoisonError::into_inner);
        if next == i {
            conns[i][use_ as usize] = None;
            return;
        }
        if self
            .current
            .compare_exchange(i, next, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            conns[i] = [None, None];
            drop(conns);
            self.moved.send_modify(|generation| *generation += 1);
        }
    }

    /// Completes when calls have moved on from endpoint `i` to another one: a stream on `i`
    /// then opens again where the calls go. (With one endpoint it never completes.)
    pub(crate) async fn moved_from(&self, i: usize) {
        let mut moved = self.moved.subscribe();
        loop {
            if self.current.load(Ordering::Relaxed) % self.endpoints.len() != i {
                return;
            }
            if moved.changed().await.is_err() {
                return std::future::pending().await;
            }
        }
    }
}
