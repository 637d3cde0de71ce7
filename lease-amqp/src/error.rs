//! The RabbitMQ backend's own failures, reached through [`lease_core::Error::Other`].

use lease_core::{BackendError, Error, ErrorKind};

/// A failure only the RabbitMQ backend has. It comes as [`Error::Other`]; reach it with
/// `error.backend_error().and_then(|e| e.downcast_ref::<AmqpError>())`.
///
/// ```
/// use lease_amqp::AmqpError;
/// use lease_core::{Error, ErrorKind};
///
/// let error = Error::from(AmqpError::Contended { key: "jobs".into(), attempts: 17 });
/// assert_eq!(error.kind(), ErrorKind::Busy);
/// assert!(matches!(
///     error.backend_error().and_then(|e| e.downcast_ref::<AmqpError>()),
///     Some(AmqpError::Contended { attempts: 17, .. })
/// ));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AmqpError {
    /// A queue exists with other arguments than this client declares it with (RabbitMQ's
    /// PRECONDITION_FAILED names the argument that differs).
    #[error(
        "queue {queue:?} exists with different arguments: {message}; every client of the \
         semaphore must declare its queues the same way: delete the queue or use another name"
    )]
    QueueMismatch {
        /// The queue.
        queue: String,
        /// The broker's message, naming the argument that differs.
        message: String,
    },

    /// Acquire lost the race for a free slot too many times in a row (AMQP: RESOURCE_LOCKED on
    /// the holder queue); slots may be free, but others keep taking them first.
    #[error(
        "lost the race for a free slot of {key:?} {attempts} times in a row; retry, or allow more \
         retries (AmqpBuilder::race_retries)"
    )]
    Contended {
        /// The semaphore's name.
        key: String,
        /// How many races were lost.
        attempts: u32,
    },

    /// Every connection an AMQP backend may open carries as many leases as its channels allow: a
    /// held lease keeps one channel open, and a connection has at most the `channel_max`
    /// negotiated with the broker. Nothing held was touched; the acquire was refused before it
    /// opened a channel. Room comes back as leases are released.
    #[error(
        "all {connections} RabbitMQ connection(s) of this backend are full: each carries at most \
         {leases_per_connection} leases (its negotiated channel_max of {channel_max}, less the \
         channels kept for acquiring and releasing); release leases, allow more connections \
         (AmqpBuilder::max_connections), or raise channel_max in rabbitmq.conf (and in the URL's \
         ?channel_max= if it sets one)"
    )]
    ChannelsExhausted {
        /// How many connections the backend may open (`AmqpBuilder::max_connections`).
        connections: u32,
        /// How many leases one connection carries.
        leases_per_connection: u32,
        /// The `channel_max` negotiated with the broker: the lower of the broker's and the URL's.
        channel_max: u32,
    },
}

impl AmqpError {
    /// What kind of failure it is, for [`Error::kind`].
    pub fn kind(&self) -> ErrorKind {
        match self {
            AmqpError::QueueMismatch { .. } => ErrorKind::Conflict,
            AmqpError::Contended { .. } => ErrorKind::Busy,
            AmqpError::ChannelsExhausted { .. } => ErrorKind::Backend,
        }
    }

    /// Whether retrying later can help: a race may be won, and released leases make room.
    pub fn is_transient(&self) -> bool {
        !matches!(self, AmqpError::QueueMismatch { .. })
    }
}

impl From<AmqpError> for Error {
    fn from(error: AmqpError) -> Error {
        let (kind, transient) = (error.kind(), error.is_transient());
        Error::Other(BackendError::new("RabbitMQ", kind, transient, error))
    }
}
