//! The connections one [`Amqp`](crate::Amqp) spreads its leases over, and how many channels each
//! has given out.
//!
//! A held lease keeps one channel open (its `A[L]` consumer and its probes run on it), and a
//! connection carries at most the `channel_max` negotiated with the broker: the lower of the
//! broker's (RabbitMQ's default is 2047, `channel_max` in rabbitmq.conf) and the URL's
//! `?channel_max=`. lapin refuses to open a channel beyond it (`ChannelsLimitReached`) without
//! harming the connection, so that refusal never costs a held lease; but an acquire that met it
//! would fail. So every channel is reserved here before it is opened, on the first connection
//! with room, or on a new connection, up to `max_connections`:
//!
//! - a [`Use::Lease`] channel (an acquire's, kept by the lease it wins) may take a connection up
//!   to `channel_max - HEADROOM`. When every connection allowed is that full, the reservation
//!   fails at once with [`AmqpError::ChannelsExhausted`](crate::AmqpError::ChannelsExhausted), which names both settings to change;
//! - a [`Use::Brief`] channel (an administration, a sequencer check: closed when done) may also
//!   take half the headroom, so a full connection can still check and administer its leases;
//!   when even that is taken it waits, up to the operation timeout, for one to be given back.
//!
//! The last `HEADROOM / 2` channels of every connection are never reserved: they are for the
//! uncounted channels that must be on a given connection (deleting a holder queue when the
//! lease's own channel failed, or after a cancelled acquire) and for channels lapin has not
//! forgotten yet because their close is still in flight.
//!
//! A connection also loses channel ids for good. When the broker closes a channel (a lost race
//! for a holder queue or a settle queue, an administration mutex taken elsewhere), lapin keeps
//! that error against the channel's id for the rest of the connection's life, and refuses the
//! next channel it gives that id ([`open_channel`] then opens another). The refused channel
//! keeps the id, so each such id is *retired*: it comes off the connection's room. A connection
//! that has retired half its ids is *worn*: it takes new channels only when no other connection
//! has room and no new one may be opened, and it is closed when nothing is reserved on it, so a
//! long-lived, contended process does not run out of channels (seen with lapin 4.12;
//! `channel_ids_lapin_refuses_are_retired_and_a_worn_connection_is_replaced`).

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use lapin::options::ConfirmSelectOptions;
use lapin::protocol::constants::REPLY_SUCCESS;
use lapin::tcp::OwnedTLSConfig;
use lapin::types::ShortString;
use lapin::uri::{AMQPScheme, AMQPUri};
use lapin::{AsyncTcpStream, Channel, Connection, ConnectionProperties, ErrorKind};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::config::AmqpConfig;
use super::wire::{self, Failure};
use lease_core::Error;
use lease_core::backend::{Reachability, ReachabilityTracker};
use lease_core::backoff::Backoff;

/// Channels of every connection that leases never take; see the module docs.
pub(crate) const HEADROOM: u32 = 8;

/// What a reserved channel is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Use {
    /// An acquire's channel, kept open by the lease it wins for as long as it is held.
    Lease,
    /// A channel closed when one operation is done.
    Brief,
}

/// The connections of one [`Amqp`](crate::Amqp), in the order they were opened.
pub(crate) struct ConnectionPool {
    /// Locked across a connect, so concurrent reservations that find every connection full open
    /// one new connection between them, not one each.
    connections: tokio::sync::Mutex<Vec<Arc<PooledConnection>>>,
    /// Told whenever a reservation is given back, for brief reservations waiting for room.
    given_back: Arc<Notify>,
    /// Whether the broker is reachable: see [`ConnectionPool::reachability`].
    reachability: ReachabilityTracker,
}

impl ConnectionPool {
    pub(crate) fn new() -> Self {
        ConnectionPool {
            connections: tokio::sync::Mutex::new(Vec::new()),
            given_back: Arc::new(Notify::new()),
            reachability: ReachabilityTracker::default(),
        }
    }

    /// Reachable while a connection of the pool is up; with none, what the last attempt to
    /// connect found (a refused login is an answer: reachable). Unknown before the first connect.
    /// A connection the broker closed counts from when this is next asked, or the pool next
    /// looks at it.
    pub(crate) fn reachability(&self) -> Reachability {
        if let Ok(connections) = self.connections.try_lock() {
            if !connections.is_empty() {
                self.reachability.answered(
                    connections
                        .iter()
                        .any(|pooled| pooled.connection.status().connected()),
                );
            }
        }
        self.reachability.get()
    }

    /// Connects once, for a probe of a broker found unreachable: the connections that closed are
    /// dropped first (their leases are already lost), so that the answer, not them, is what
    /// [`reachability`](Self::reachability) reports; the new connection is closed at once.
    pub(crate) async fn probe(&self, config: &AmqpConfig) {
        self.connections
            .lock()
            .await
            .retain(|pooled| pooled.connection.status().connected());
        let connection = connect(config).await;
        self.reachability.answered(matches!(
            &connection,
            Ok(_) | Err(Error::PermissionDenied { .. })
        ));
        if let Ok(connection) = connection {
            close(&connection, "reachability probe", config.operation_timeout).await;
        }
    }

    /// Reserves a channel for `use_`; see the module docs.
    ///
    /// A lease reservation never waits: an acquire already holding one cannot wait for room it
    /// would have to give back itself.
    pub(crate) async fn reserve(
        &self,
        config: &AmqpConfig,
        use_: Use,
    ) -> Result<Reservation, Error> {
        let deadline = Instant::now() + config.operation_timeout;
        loop {
            // Registered before looking, so a give-back between the look and the wait is seen.
            let given_back = self.given_back.notified();
            let full = match self.try_reserve(config, use_).await? {
                Ok(reservation) => return Ok(reservation),
                Err(full) => full,
            };
            if use_ == Use::Lease || tokio::time::timeout_at(deadline, given_back).await.is_err() {
                return Err(full);
            }
        }
    }

    /// A reservation on the first connection with room, or on a new one; `Ok(Err(_))` if every
    /// connection allowed is full.
    async fn try_reserve(
        &self,
        config: &AmqpConfig,
        use_: Use,
    ) -> Result<Result<Reservation, Error>, Error> {
        let mut connections = self.connections.lock().await;
        // A closed connection's leases are already lost (their holders saw it close); it only
        // has to stop taking new ones. A worn one nobody uses any more goes too.
        let mut worn_out = Vec::new();
        connections.retain(|pooled| {
            let connected = pooled.connection.status().connected();
            if connected && pooled.worn() && pooled.unreserved() {
                worn_out.push(Arc::clone(pooled));
                return false;
            }
            connected
        });
        for pooled in worn_out {
            lease_core::runtime::spawn(pooled.close_worn(config.operation_timeout));
        }
        if let Some(reservation) = connections
            .iter()
            .filter(|pooled| !pooled.worn())
            .find_map(|pooled| pooled.try_reserve(use_))
        {
            return Ok(Ok(reservation));
        }
        let max_connections = config.max_connections;
        if connections.len() >= max_connections as usize {
            if let Some(reservation) = connections
                .iter()
                .find_map(|pooled| pooled.try_reserve(use_))
            {
                return Ok(Ok(reservation));
            }
            let channel_max = connections.first().map_or(0, |p| p.channel_max());
            return Ok(Err(crate::AmqpError::ChannelsExhausted {
                connections: max_connections,
                leases_per_connection: channel_max.saturating_sub(HEADROOM),
                channel_max,
            }
            .into()));
        }
        let connection = connect(config).await;
        self.reachability.answered(matches!(
            &connection,
            Ok(_) | Err(Error::PermissionDenied { .. })
        ));
        let connection = connection?;
        let pooled = Arc::new(PooledConnection::new(
            connection,
            Arc::clone(&self.given_back),
        ));
        let reservation = match pooled.try_reserve(use_) {
            Some(reservation) if pooled.channel_max() > HEADROOM => reservation,
            _ => {
                return Err(Error::config(format!(
                    "the channel_max negotiated with {} is {}, which leaves no channel for a \
                     lease after the {HEADROOM} this client keeps for acquiring and releasing; \
                     raise channel_max in rabbitmq.conf, or the URL's ?channel_max=, above \
                     {HEADROOM}",
                    config.redacted_url(),
                    pooled.channel_max()
                )));
            }
        };
        tracing::debug!(
            connections = connections.len() + 1,
            channel_max = pooled.channel_max(),
            "opened another connection to RabbitMQ"
        );
        connections.push(pooled);
        Ok(Ok(reservation))
    }

    /// Closes every connection (after a shutdown gave the leases back), each within `timeout`:
    /// the pool would keep them open for as long as the backend lives. A reservation that comes
    /// later opens a new connection. (A process's end finding a connect still under way is
    /// [`connect_resolved`]'s matter: that connection is not in the pool yet.)
    pub(crate) async fn close_all(&self, timeout: Duration) {
        let closing = std::mem::take(&mut *self.connections.lock().await);
        for pooled in closing {
            close(&pooled.connection, "shutdown", timeout).await;
        }
    }

    /// Stops reserving channels on `pooled` (its leases are being given up).
    pub(crate) async fn remove(&self, pooled: &Arc<PooledConnection>) {
        let mut connections = self.connections.lock().await;
        connections.retain(|other| !Arc::ptr_eq(other, pooled));
    }
}

/// Closes `connection` with `reason`, waiting for the broker's close-ok at most `timeout` (a
/// connection that is already closed, or a broker that does not answer, leaves nothing to do).
async fn close(connection: &Connection, reason: &str, timeout: Duration) {
    let close = connection.close(REPLY_SUCCESS, ShortString::from(reason));
    let _ = tokio::time::timeout(timeout, close).await;
}

/// Opens a new connection to the broker (the pool decides when).
pub(crate) async fn connect(config: &AmqpConfig) -> Result<Connection, Error> {
    let mut properties = ConnectionProperties::default();
    if let Some(name) = &config.connection_name {
        properties = properties.with_connection_name(name.as_str().into());
    }
    let connect = connect_resolved(config.uri.clone(), properties);
    let failure = match tokio::time::timeout(config.connect_timeout, connect).await {
        Ok(Ok(connection)) => {
            tracing::debug!(url = %config.redacted_url(), "connected to RabbitMQ");
            return Ok(connection);
        }
        Ok(Err(error)) => wire::classify(error, ""),
        Err(_) => Failure::TimedOut,
    };
    Err(match failure {
        Failure::Other(Error::PermissionDenied { message, .. }) => Error::PermissionDenied {
            operation: format!("connect to {}", config.described_url()),
            message,
            hint: if config.uri.vhost.is_empty() {
                wire::EMPTY_VHOST_HINT
            } else {
                wire::LOGIN_HINT
            },
        },
        other => other.into_error("connect", config),
    })
}

/// lapin's `Connection::connect_uri`, but with the broker's host resolved here, on the caller's
/// task, and not on lapin's I/O thread.
///
/// lapin starts a connection's I/O thread (`lapin-io-loop`) when the connect is first polled,
/// and that thread connects by itself, whoever still waits for the connection: lapin's own
/// connect resolves the host there by awaiting a blocking task of the tokio runtime
/// (amq-protocol-tcp's `connect_with_config_async`, async-rs's `SocketAddrsResolver`: a
/// `spawn_blocking`). When the runtime ends first, as a process's exit ends it for an acquire it
/// dropped while that acquire was connecting, the runtime cancels that task, and async-rs 0.8
/// panics on the I/O thread ("Task did not complete: task N was cancelled"). Closing the pooled
/// connections at shutdown cannot help: this one is not in the pool yet. So the I/O thread is
/// handed the addresses, and awaits no task of the runtime: only its socket, whose I/O fails
/// once the runtime is gone, an error lapin expects and ends the I/O loop on
/// (`tests/tests/amqp_exit.rs`). lapin calls `connect` once: we ask for no automatic recovery,
/// so no reconnection retries it.
async fn connect_resolved(
    uri: AMQPUri,
    properties: ConnectionProperties,
) -> lapin::Result<Connection> {
    let addrs: Vec<SocketAddr> =
        tokio::net::lookup_host((uri.authority.host.as_str(), uri.authority.port))
            .await?
            .collect();
    let runtime = lapin::runtime::default_runtime()?;
    // lapin's own default (the `rustls` or `native-tls` feature picks the library).
    let tls = OwnedTLSConfig::default();
    let connect = async move |uri: AMQPUri, runtime| {
        let stream = AsyncTcpStream::connect(&runtime, addrs.clone()).await?;
        Ok(match uri.scheme {
            AMQPScheme::AMQP => stream,
            AMQPScheme::AMQPS => stream.into_tls(&uri.authority.host, tls.as_ref()).await?,
        })
    };
    Connection::connector(uri, runtime, connect, properties).await
}

/// One connection of the pool.
pub(crate) struct PooledConnection {
    connection: Connection,
    /// The negotiated `channel_max`.
    channel_max: u32,
    reserved: AtomicU32,
    /// Channel ids lapin will not open again; see the module docs.
    retired: AtomicU32,
    given_back: Arc<Notify>,
}

impl fmt::Debug for PooledConnection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PooledConnection")
            .field("channel_max", &self.channel_max)
            .field("reserved", &self.reserved.load(Ordering::Relaxed))
            .field("retired", &self.retired.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl PooledConnection {
    fn new(connection: Connection, given_back: Arc<Notify>) -> Self {
        let channel_max = u32::from(connection.configuration().channel_max());
        PooledConnection {
            connection,
            channel_max,
            reserved: AtomicU32::new(0),
            retired: AtomicU32::new(0),
            given_back,
        }
    }

    pub(crate) fn connection(&self) -> &Connection {
        &self.connection
    }

    /// The `channel_max` negotiated for this connection.
    fn channel_max(&self) -> u32 {
        self.channel_max
    }

    /// Counts one more channel id lapin will not open again, and returns how many there are.
    pub(crate) fn retire_channel_id(&self) -> u32 {
        self.retired.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// Whether half the connection's channel ids are retired; see the module docs.
    fn worn(&self) -> bool {
        self.retired.load(Ordering::Acquire).saturating_mul(2) >= self.channel_max
    }

    /// Closes a worn connection the pool has let go of. Dropping it would not do: lapin's
    /// refused channels keep it open.
    async fn close_worn(self: Arc<Self>, timeout: Duration) {
        tracing::debug!(
            retired = self.retired.load(Ordering::Acquire),
            channel_max = self.channel_max,
            "closing a connection that lapin will open few channels on any more"
        );
        close(
            &self.connection,
            "worn: too many channel ids retired",
            timeout,
        )
        .await;
    }

    /// Whether no channel is reserved on this connection.
    fn unreserved(&self) -> bool {
        self.reserved.load(Ordering::Acquire) == 0
    }

    fn try_reserve(self: &Arc<Self>, use_: Use) -> Option<Reservation> {
        let kept_back = match use_ {
            Use::Lease => HEADROOM,
            Use::Brief => HEADROOM / 2,
        };
        let limit = self
            .channel_max
            .saturating_sub(kept_back)
            .saturating_sub(self.retired.load(Ordering::Acquire));
        self.reserved
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |reserved| {
                (reserved < limit).then_some(reserved + 1)
            })
            .ok()
            .map(|_| Reservation {
                pooled: Arc::clone(self),
            })
    }
}

/// Opens a channel in confirm mode (needed by [`probe`](wire::probe)).
///
/// lapin forgets a closed channel a moment after its close-ok (in its own background task), so
/// right after many channels closed it may count more open than the pool's reservations do and
/// refuse one (`ChannelsLimitReached`). That refusal harms nothing, so it is retried until
/// `timeout`. So is a channel id lapin will not open again (see the loop), which is retired.
pub(crate) async fn open_channel(
    pooled: &PooledConnection,
    timeout: Duration,
) -> Result<Channel, Failure> {
    let deadline = Instant::now() + timeout;
    let mut backoff = Backoff::new(Duration::from_millis(1), Duration::from_millis(50));
    let channel = loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(remaining, pooled.connection().create_channel()).await {
            Ok(Ok(channel)) => break channel,
            Ok(Err(error)) if matches!(error.kind(), ErrorKind::ChannelsLimitReached) => {
                let pause = backoff.next_pause();
                if Instant::now() + pause >= deadline {
                    return Err(wire::classify(error, ""));
                }
                tracing::debug!(?pause, "lapin still counts closed channels; retrying");
                tokio::time::sleep(pause).await;
            }
            // `channel.open` has no soft error of its own: this one is the error the broker
            // closed an earlier channel with (a lost race: RESOURCE_LOCKED, NOT_FOUND), which
            // lapin keeps against that channel's id for as long as the connection lives and
            // hands to the next channel given the id, before the broker hears of it. The refused
            // channel keeps the id, so the next attempt gets another; the id is lost to this
            // connection, and the pool counts it.
            Ok(Err(error)) if wire::is_soft(&error) => {
                let retired = pooled.retire_channel_id();
                tracing::debug!(
                    %error,
                    retired,
                    "lapin refused a channel id that a channel closed by the broker left behind; \
                     opening another"
                );
            }
            Ok(Err(error)) => return Err(wire::classify(error, "")),
            Err(_) => return Err(Failure::TimedOut),
        }
    };
    wire::bounded(
        timeout,
        "",
        channel.confirm_select(ConfirmSelectOptions::default()),
    )
    .await?;
    Ok(channel)
}

/// One channel of a pooled connection, spoken for until dropped.
pub(crate) struct Reservation {
    pooled: Arc<PooledConnection>,
}

impl fmt::Debug for Reservation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Reservation").field(&self.pooled).finish()
    }
}

impl Reservation {
    /// The connection the reserved channel is to be opened on.
    pub(crate) fn pooled(&self) -> &Arc<PooledConnection> {
        &self.pooled
    }

    pub(crate) fn connection(&self) -> &Connection {
        &self.pooled.connection
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.pooled.reserved.fetch_sub(1, Ordering::AcqRel);
        self.pooled.given_back.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    // A failed expectation in a test is a panic by design.
    #![allow(clippy::unwrap_used)]

    use lapin::options::BasicConsumeOptions;
    use lapin::types::FieldTable;
    use lease_tests::amqp::{require_broker, url_with_channel_max};

    use super::*;
    use crate::Amqp;

    const T: Duration = Duration::from_secs(10);

    /// Makes the broker close a fresh channel of `pooled` (a consume of a queue that does not
    /// exist: NOT_FOUND), as a lost race does.
    async fn channel_closed_by_the_broker(pooled: &PooledConnection) {
        let channel = open_channel(pooled, T).await.unwrap();
        let consume = channel.basic_consume(
            ShortString::from("lease-test-no-such-queue"),
            ShortString::from(""),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        );
        let failure = wire::bounded(T, "lease-test-no-such-queue", consume).await;
        assert!(matches!(failure, Err(Failure::NotFound)), "{failure:?}");
    }

    #[tokio::test]
    async fn channel_ids_lapin_refuses_are_retired_and_a_worn_connection_is_replaced() {
        require_broker().await;
        let amqp = Amqp::builder(url_with_channel_max(20))
            .max_connections(2)
            .build()
            .unwrap();
        let reservation = amqp.reserve_channel(Use::Brief).await.unwrap();
        let pooled = Arc::clone(reservation.pooled());
        assert_eq!(pooled.channel_max(), 20);

        // Channel ids 1..=10 closed by the broker: lapin keeps their error.
        for _ in 0..10 {
            channel_closed_by_the_broker(&pooled).await;
        }
        // Round the 20 ids twice: each of those ten is refused once, retired, and never given
        // again; every open succeeds.
        for _ in 0..40 {
            let channel = open_channel(&pooled, T).await.unwrap();
            wire::close_channel(&channel, T).await;
        }
        assert_eq!(pooled.retired.load(Ordering::Acquire), 10);
        assert!(pooled.worn());
        // Its room shrank by the retired ids: 20 less 4 kept back less 10.
        let brief: Vec<Reservation> = std::iter::from_fn(|| pooled.try_reserve(Use::Brief))
            .take(20)
            .collect();
        assert_eq!(brief.len(), 20 - 4 - 10 - 1, "one is reserved already");
        drop(brief);

        // While the worn connection is in use, the next reservation goes on a new one.
        let next = amqp.reserve_channel(Use::Lease).await.unwrap();
        assert!(!Arc::ptr_eq(next.pooled(), &pooled));
        // Once nothing is reserved on it, the next reservation closes it.
        drop(reservation);
        let again = amqp.reserve_channel(Use::Lease).await.unwrap();
        assert!(Arc::ptr_eq(again.pooled(), next.pooled()));
        tokio::time::timeout(T, async {
            while pooled.connection().status().connected() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("the worn connection was not closed");
    }
}
