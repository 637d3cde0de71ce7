//! The connections one [`Amqp`] spreads its leases over, and how many channels each has given out.
//!
//! A held lease keeps one channel open (its `A[L]` consumer and its probes run on it), and a
//! connection carries at most the `channel_max` negotiated with the broker: the lower of the
//! broker's (RabbitMQ's default is 2047, `channel_max` in rabbitmq.conf) and the URL's
//! `?channel_max=`. lapin refuses to open a channel beyond it (`ChannelsLimitReached`, the
//! connection unharmed), so that refusal never costs a held lease, but an acquire that met it
//! would fail. So every lease, acquire, administration and sequencer check first reserves its
//! channel here: on the first connection with room, or on a new connection, up to
//! `max_connections`. Beyond that, [`ConnectionPool::reserve`] fails with
//! [`Error::ChannelsExhausted`], which names both settings to change.
//!
//! [`HEADROOM`] channels of every connection are never reserved: they are for the short-lived
//! channels that must be on a given connection and are not counted (deleting a holder queue when
//! the lease's own channel failed, or after a cancelled acquire), and for channels lapin has not
//! forgotten yet because their close is still in flight.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use lapin::Connection;

use super::Amqp;
use crate::Error;

/// Channels of every connection kept out of reservations; see the module docs.
pub(crate) const HEADROOM: u32 = 8;

/// The connections of one [`Amqp`], in the order they were opened.
pub(crate) struct ConnectionPool {
    /// Locked across a connect, so concurrent reservations that find every connection full open
    /// one new connection between them, not one each.
    connections: tokio::sync::Mutex<Vec<Arc<PooledConnection>>>,
}

impl ConnectionPool {
    pub(crate) fn new() -> Self {
        ConnectionPool {
            connections: tokio::sync::Mutex::new(Vec::new()),
        }
    }

    /// Reserves a channel on the first open connection with room, opening a connection when none
    /// has any and fewer than `max_connections` are open.
    ///
    /// Never waits for room: a full pool is [`Error::ChannelsExhausted`] at once, so an acquire
    /// that already holds a reservation cannot wait on one it would have to give back itself.
    pub(crate) async fn reserve(&self, amqp: &Amqp) -> Result<Reservation, Error> {
        let mut connections = self.connections.lock().await;
        // A closed connection's leases are already lost (their holders saw it close); it only
        // has to stop taking new ones.
        connections.retain(|pooled| pooled.connection.status().connected());
        if let Some(reservation) = connections.iter().find_map(PooledConnection::try_reserve) {
            return Ok(reservation);
        }
        let max_connections = amqp.config().max_connections;
        if connections.len() >= max_connections as usize {
            let channel_max = connections.first().map_or(0, |pooled| pooled.channel_max());
            return Err(Error::ChannelsExhausted {
                connections: max_connections,
                leases_per_connection: channel_max.saturating_sub(HEADROOM),
                channel_max,
            });
        }
        let pooled = Arc::new(PooledConnection::new(amqp.connect().await?));
        let Some(reservation) = pooled.try_reserve() else {
            return Err(Error::Config(format!(
                "the negotiated channel_max of {} is {}, which leaves no channel for a lease after \
                 the {HEADROOM} this client keeps for acquiring and releasing; raise channel_max in \
                 rabbitmq.conf or the URL's ?channel_max= above {HEADROOM}",
                amqp.redacted_url(),
                pooled.channel_max()
            )));
        };
        tracing::debug!(
            connections = connections.len() + 1,
            channel_max = pooled.channel_max(),
            "opened another connection to RabbitMQ"
        );
        connections.push(pooled);
        Ok(reservation)
    }

    /// Stops reserving channels on `pooled` (its leases are being given up).
    pub(crate) async fn remove(&self, pooled: &Arc<PooledConnection>) {
        let mut connections = self.connections.lock().await;
        connections.retain(|other| !Arc::ptr_eq(other, pooled));
    }
}

/// One connection of the pool.
pub(crate) struct PooledConnection {
    connection: Connection,
    /// How many channels reservations may take: the negotiated `channel_max` less [`HEADROOM`].
    capacity: u32,
    reserved: AtomicU32,
}

impl fmt::Debug for PooledConnection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PooledConnection")
            .field("capacity", &self.capacity)
            .field("reserved", &self.reserved.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl PooledConnection {
    fn new(connection: Connection) -> Self {
        let capacity = u32::from(connection.configuration().channel_max()).saturating_sub(HEADROOM);
        PooledConnection {
            connection,
            capacity,
            reserved: AtomicU32::new(0),
        }
    }

    pub(crate) fn connection(&self) -> &Connection {
        &self.connection
    }

    /// The `channel_max` negotiated for this connection.
    fn channel_max(&self) -> u32 {
        u32::from(self.connection.configuration().channel_max())
    }

    fn try_reserve(self: &Arc<Self>) -> Option<Reservation> {
        self.reserved
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |reserved| {
                (reserved < self.capacity).then_some(reserved + 1)
            })
            .ok()
            .map(|_| Reservation {
                pooled: Arc::clone(self),
            })
    }
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
    }
}
