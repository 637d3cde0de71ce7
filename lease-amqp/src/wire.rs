//! The broker operations the semaphore is built from, and how their failures become [`Error`]s.
//!
//! Every operation is bounded by the configured operation timeout. Existence probes are mandatory
//! publishes with publisher confirms: a missing queue returns the message (no channel-closing
//! NOT_FOUND), and every queue we declare has `x-max-length = 0`, so a probe that does reach a
//! queue is dropped at once and nothing accumulates (amqp-locks: "probing leaves nothing behind").

use std::future::Future;
use std::time::Duration;

use lapin::options::{BasicPublishOptions, QueueDeclareOptions, QueueDeleteOptions};
use lapin::protocol::{AMQPErrorKind, AMQPHardError, AMQPSoftError};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Channel, ErrorKind};

use super::config::AmqpConfig;
use super::naming::MAX_QUEUE_NAME;
use lease_core::metrics::RequestError;
use lease_core::{BackendKind, Error, LostReason};

pub(crate) const BACKEND: &str = "RabbitMQ";

/// What to do when the broker refuses an operation on a semaphore's queues.
pub(crate) const QUEUE_PERMISSION_HINT: &str = "give the URL's user configure, write and read \
    permissions on the semaphore's queues in this vhost, and write permission on the default \
    exchange `amq.default`, which probes publish to (`rabbitmqctl set_permissions -p <vhost> \
    <user> <configure> <write> <read>`)";
/// What to do when the broker refuses the connection's login.
pub(crate) const LOGIN_HINT: &str = "check the user and password in the URL, and that the user \
    may use its vhost (`rabbitmqctl list_permissions -p <vhost>`)";
/// What to do when the broker refuses the connection and the URL names the empty vhost.
pub(crate) const EMPTY_VHOST_HINT: &str = "the URL's path is a bare `/`, which names the empty \
    vhost \"\"; the default vhost `/` is written %2f (amqp://user:password@host:5672/%2f), or \
    leave the path out";

/// What a failed broker operation means for the semaphore.
#[derive(Debug)]
pub(crate) enum Failure {
    /// 404: the queue does not exist.
    NotFound,
    /// 405: an exclusive queue owned by another connection.
    ResourceLocked,
    /// The channel or connection is closed (or closed because of this operation's error).
    Closed(lapin::Error),
    /// No answer within the operation timeout.
    TimedOut,
    /// Anything else, already a typed error.
    Other(Error),
}

impl Failure {
    /// The error to hand a caller doing `operation`.
    pub(crate) fn into_error(self, operation: &str, config: &AmqpConfig) -> Error {
        match self {
            Failure::Other(error) => error,
            Failure::NotFound => Error::Backend {
                backend: BACKEND,
                operation: operation.to_owned(),
                message: "NOT_FOUND".to_owned(),
                transient: false,
            },
            Failure::ResourceLocked => Error::Backend {
                backend: BACKEND,
                operation: operation.to_owned(),
                message: "RESOURCE_LOCKED: the queue is exclusive to another connection".to_owned(),
                transient: true,
            },
            Failure::Closed(source) => Error::Unreachable {
                backend: BACKEND,
                address: config.described_url(),
                hint: config.unreachable_hint(),
                source: Box::new(source),
            },
            Failure::TimedOut => Error::Unreachable {
                backend: BACKEND,
                address: config.described_url(),
                hint: config.unreachable_hint(),
                source: format!("no answer to {operation} in time").into(),
            },
        }
    }

    /// The loss reason this failure means for a held slot.
    pub(crate) fn lost_reason(&self) -> LostReason {
        match self {
            Failure::NotFound => LostReason::SlotRemoved,
            _ => LostReason::ConnectionClosed,
        }
    }
}

/// Classifies a lapin error from an operation on `queue`.
pub(crate) fn classify(error: lapin::Error, queue: &str) -> Failure {
    let amqp = match error.kind() {
        ErrorKind::ProtocolError(amqp) => amqp,
        // lapin refuses the channel itself, before the broker sees it; the connection is fine.
        // Reservations (see `pool`) keep this from happening to acquires; it is left for the few
        // uncounted channels, should they ever outnumber the headroom.
        ErrorKind::ChannelsLimitReached => {
            return Failure::Other(Error::Backend {
                backend: BACKEND,
                operation: "open a channel".to_owned(),
                message: format!(
                    "{error} (the negotiated channel_max); the connection and its leases are \
                     unaffected"
                ),
                transient: true,
            });
        }
        _ => return Failure::Closed(error),
    };
    let message = amqp.get_message().to_string();
    match amqp.kind() {
        AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND) => Failure::NotFound,
        AMQPErrorKind::Soft(AMQPSoftError::RESOURCELOCKED) => Failure::ResourceLocked,
        AMQPErrorKind::Soft(AMQPSoftError::PRECONDITIONFAILED) => Failure::Other(
            crate::AmqpError::QueueMismatch {
                queue: queue.to_owned(),
                message,
            }
            .into(),
        ),
        AMQPErrorKind::Soft(AMQPSoftError::ACCESSREFUSED)
        | AMQPErrorKind::Hard(AMQPHardError::NOTALLOWED) => {
            Failure::Other(Error::PermissionDenied {
                operation: format!("use queue {queue:?}"),
                message,
                hint: QUEUE_PERMISSION_HINT,
            })
        }
        _ => Failure::Closed(error),
    }
}

/// Runs a broker operation within `timeout`, classifying its failure: the one place every
/// broker operation passes, so the one place they are counted.
pub(crate) async fn bounded<T>(
    timeout: Duration,
    queue: &str,
    operation: impl Future<Output = Result<T, lapin::Error>>,
) -> Result<T, Failure> {
    lease_core::metrics::backend_request(BackendKind::Amqp, false);
    let result = match tokio::time::timeout(timeout, operation).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(error)) => Err(classify(error, queue)),
        Err(_) => Err(Failure::TimedOut),
    };
    if let Err(failure) = &result {
        let kind = match failure {
            Failure::Closed(_) => RequestError::Unreachable,
            Failure::TimedOut => RequestError::TimedOut,
            Failure::NotFound | Failure::ResourceLocked => RequestError::Status,
            Failure::Other(_) => RequestError::Other,
        };
        lease_core::metrics::backend_error(BackendKind::Amqp, kind);
    }
    result
}

/// Counts a broker operation that changes the broker's state (a declaration, a deletion); it is
/// counted as a request by [`bounded`].
fn count_write() {
    lease_core::metrics::backend_request_is_write(BackendKind::Amqp);
}

/// The arguments every queue of a semaphore is declared with. All clients must agree on them
/// (RabbitMQ refuses a redeclaration with others: PRECONDITION_FAILED).
fn queue_arguments() -> FieldTable {
    let mut arguments = FieldTable::default();
    // Probes publish into these queues to test their existence; a zero-length queue drops them.
    arguments.insert(ShortString::from("x-max-length"), AMQPValue::LongInt(0));
    arguments
}

/// Whether `error` is an AMQP soft (channel-level) error.
pub(crate) fn is_soft(error: &lapin::Error) -> bool {
    matches!(
        error.kind(),
        ErrorKind::ProtocolError(amqp) if matches!(amqp.kind(), AMQPErrorKind::Soft(_))
    )
}

/// Whether `queue` exists, without closing the channel and without leaving a message behind.
///
/// `channel` must be in confirm mode.
pub(crate) async fn probe(
    channel: &Channel,
    queue: &str,
    timeout: Duration,
) -> Result<bool, Failure> {
    if queue.len() > MAX_QUEUE_NAME {
        // No queue has such a name (scans step past a semaphore's last slot into this).
        return Ok(false);
    }
    let publish = async {
        let confirm = channel
            .basic_publish(
                ShortString::from(""),
                ShortString::from(queue),
                BasicPublishOptions {
                    mandatory: true,
                    immediate: false,
                },
                b"",
                BasicProperties::default(),
            )
            .await?;
        confirm.await
    };
    let confirmation = bounded(timeout, queue, publish).await?;
    // An unroutable mandatory message comes back before its confirm.
    Ok(confirmation.take_message().is_none())
}

/// Declares a durable slot queue `A[L]` (administration).
pub(crate) async fn declare_slot(
    channel: &Channel,
    queue: &str,
    timeout: Duration,
) -> Result<(), Failure> {
    let options = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    declare(channel, queue, options, timeout).await
}

/// Declares an exclusive queue: a holder queue `B[L]` or the administration mutex.
///
/// Fails with [`Failure::ResourceLocked`] (and the channel closes) when another connection has it.
pub(crate) async fn declare_exclusive(
    channel: &Channel,
    queue: &str,
    timeout: Duration,
) -> Result<(), Failure> {
    let options = QueueDeclareOptions {
        exclusive: true,
        ..QueueDeclareOptions::default()
    };
    declare(channel, queue, options, timeout).await
}

/// Declares a settle queue `C[L]`: RabbitMQ deletes it `settle` after its last consumer (the
/// holder's) went away, and not before (`x-expires`; a consumer keeps a queue in use).
///
/// Sent without waiting for the broker's declare-ok (`nowait`), so that the consume sent right
/// after it reaches the broker in the same breath: `C[L]` starts expiring when it is declared,
/// and a round trip in between can take longer than a short settle time on a loaded broker. A
/// failed declare closes the channel, which the consume then reports.
pub(crate) async fn declare_settle(
    channel: &Channel,
    queue: &str,
    settle: Duration,
    timeout: Duration,
) -> Result<(), Failure> {
    let mut arguments = queue_arguments();
    // x-expires must be a positive number of milliseconds.
    let expires = i32::try_from(settle.as_millis()).unwrap_or(i32::MAX).max(1);
    count_write();
    arguments.insert(ShortString::from("x-expires"), AMQPValue::LongInt(expires));
    bounded(
        timeout,
        queue,
        channel.queue_declare(
            ShortString::from(queue),
            QueueDeclareOptions {
                nowait: true,
                ..QueueDeclareOptions::default()
            },
            arguments,
        ),
    )
    .await
    .map(drop)
}

/// Declares `queue` with the arguments every client uses (so a mismatch is a typed error).
async fn declare(
    channel: &Channel,
    queue: &str,
    options: QueueDeclareOptions,
    timeout: Duration,
) -> Result<(), Failure> {
    count_write();
    bounded(
        timeout,
        queue,
        channel.queue_declare(ShortString::from(queue), options, queue_arguments()),
    )
    .await
    .map(drop)
}

/// Deletes `queue` and waits for the broker's delete-ok. Deleting a missing queue succeeds.
pub(crate) async fn delete(
    channel: &Channel,
    queue: &str,
    timeout: Duration,
) -> Result<(), Failure> {
    count_write();
    bounded(
        timeout,
        queue,
        channel.queue_delete(ShortString::from(queue), QueueDeleteOptions::default()),
    )
    .await
    .map(drop)
}

/// Closes a channel politely, bounded; a channel that is already gone is fine.
pub(crate) async fn close_channel(channel: &Channel, timeout: Duration) {
    if channel.status().connected() {
        let _ = tokio::time::timeout(timeout, channel.close(200, ShortString::from("done"))).await;
    }
}
