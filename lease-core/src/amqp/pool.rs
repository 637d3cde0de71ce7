//! The connections one [`Amqp`] spreads its leases over, and how many channels each has given out.
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
//!   fails at once with [`Error::ChannelsExhausted`], which names both settings to change;
//! - a [`Use::Brief`] channel (an administration, a sequencer check: closed when done) may also
//!   take half the headroom, so a full connection can still check and administer its leases;
//!   when even that is taken it waits, up to the operation timeout, for one to be given back.
//!
//! The last `HEADROOM / 2` channels of every connection are never reserved: they are for the
//! uncounted channels that must be on a given connection (deleting a holder queue when the
//! lease's own channel failed, or after a cancelled acquire) and for channels lapin has not
//! forgotten yet because their close is still in flight.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use lapin::Connection;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::Amqp;
use crate::Error;

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

/// The connections of one [`Amqp`], in the order they were opened.
pub(crate) struct ConnectionPool {
    /// Locked across a connect, so concurrent reservations that find every connection full open
    /// one new connection between them, not one each.
    connections: tokio::sync::Mutex<Vec<Arc<PooledConnection>>>,
    /// Told whenever a reservation is given back, for brief reservations waiting for room.
    given_back: Arc<Notify>,
}

impl ConnectionPool {
    pub(crate) fn new() -> Self {
        ConnectionPool {
            connections: tokio::sync::Mutex::new(Vec::new()),
            given_back: Arc::new(Notify::new()),
        }
    }

    /// Reserves a channel for `use_`; see the module docs.
    ///
    /// A lease reservation never waits: an acquire already holding one cannot wait for room it
    /// would have to give back itself.
    pub(crate) async fn reserve(&self, amqp: &Amqp, use_: Use) -> Result<Reservation, Error> {
        let deadline = Instant::now() + amqp.config().operation_timeout;
        loop {
            // Registered before looking, so a give-back between the look and the wait is seen.
            let given_back = self.given_back.notified();
            let full = match self.try_reserve(amqp, use_).await? {
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
        amqp: &Amqp,
        use_: Use,
    ) -> Result<Result<Reservation, Error>, Error> {
        let mut connections = self.connections.lock().await;
        // A closed connection's leases are already lost (their holders saw it close); it only
        // has to stop taking new ones.
        connections.retain(|pooled| pooled.connection.status().connected());
        if let Some(reservation) = connections
            .iter()
            .find_map(|pooled| pooled.try_reserve(use_))
        {
            return Ok(Ok(reservation));
        }
        let max_connections = amqp.config().max_connections;
        if connections.len() >= max_connections as usize {
            let channel_max = connections.first().map_or(0, |p| p.channel_max());
            return Ok(Err(Error::ChannelsExhausted {
                connections: max_connections,
                leases_per_connection: channel_max.saturating_sub(HEADROOM),
                channel_max,
            }));
        }
        let connection = amqp.connect().await?;
        let pooled = Arc::new(PooledConnection::new(
            connection,
            Arc::clone(&self.given_back),
        ));
        let reservation = match pooled.try_reserve(use_) {
            Some(reservation) if pooled.channel_max() > HEADROOM => reservation,
            _ => {
                return Err(Error::Config(format!(
                    "the channel_max negotiated with {} is {}, which leaves no channel for a \
                     lease after the {HEADROOM} this client keeps for acquiring and releasing; \
                     raise channel_max in rabbitmq.conf, or the URL's ?channel_max=, above \
                     {HEADROOM}",
                    amqp.redacted_url(),
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

    /// Stops reserving channels on `pooled` (its leases are being given up).
    pub(crate) async fn remove(&self, pooled: &Arc<PooledConnection>) {
        let mut connections = self.connections.lock().await;
        connections.retain(|other| !Arc::ptr_eq(other, pooled));
    }
}

/// One connection of the pool.
pub(crate) struct PooledConnection {
    connection: Connection,
    /// The negotiated `channel_max`.
    channel_max: u32,
    reserved: AtomicU32,
    given_back: Arc<Notify>,
}

impl fmt::Debug for PooledConnection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PooledConnection")
            .field("channel_max", &self.channel_max)
            .field("reserved", &self.reserved.load(Ordering::Relaxed))
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

    fn try_reserve(self: &Arc<Self>, use_: Use) -> Option<Reservation> {
        let kept_back = match use_ {
            Use::Lease => HEADROOM,
            Use::Brief => HEADROOM / 2,
        };
        let limit = self.channel_max.saturating_sub(kept_back);
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
