//! Errors and loss reasons.
//!
//! [`Error`] is what an operation that talks to a backend can fail with; every variant says what
//! to do about it. [`LostReason`] is why a held lease stopped being held; it is what
//! [`Lease::lost`](crate::Lease::lost) resolves to and what [`Lease::run`](crate::Lease::run)
//! returns when it cancels the work.

use std::time::Duration;

use crate::spec::{MAX_LOCK_DELAY, MAX_TTL, MIN_TTL};

/// A boxed error from a transport or client library, kept as the `source` of an [`Error`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why an operation on a lease or backend failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The lease is held elsewhere and the spec said not to wait, or the wait ran out.
    #[error("lease {key:?} is held elsewhere (waited {waited:?}); retry later or wait longer")]
    Busy {
        /// The key or prefix.
        key: String,
        /// How long acquire waited.
        waited: Duration,
    },

    /// The lease was lost (see the reason).
    #[error("lease lost: {0}")]
    Lost(#[from] LostReason),

    /// The key or prefix breaks the key rule of [`LeaseSpec::validate`](crate::LeaseSpec::validate).
    #[error("invalid lease key {key:?}: {reason}")]
    InvalidKey {
        /// The key as given.
        key: String,
        /// What is wrong with it.
        reason: &'static str,
    },

    /// A session TTL outside Consul's range, or not a whole number of seconds.
    #[error("invalid session TTL {ttl:?}: use whole seconds from {MIN_TTL:?} to {MAX_TTL:?}")]
    InvalidTtl {
        /// The TTL given.
        ttl: Duration,
    },

    /// A lock-delay (or settle time) above Consul's maximum lock-delay (Consul 1.8 accepts a
    /// longer one silently and clamps it).
    #[error("invalid lock-delay or settle time {lock_delay:?}: use at most {MAX_LOCK_DELAY:?}")]
    InvalidLockDelay {
        /// The lock-delay given.
        lock_delay: Duration,
    },

    /// A [`fence_lead`](crate::LeaseSpec::fence_lead) that leaves a confirmation of the session
    /// good for less than half its TTL, so the lease would self-fence between two healthy
    /// confirmations.
    #[error(
        "fence lead {lead:?} is too long for a session TTL of {ttl:?}: the lease would be given up \
         between two healthy renewals; use a shorter lead or a TTL of at least 2.5 times the lead"
    )]
    InvalidFenceLead {
        /// The lead given.
        lead: Duration,
        /// The session TTL.
        ttl: Duration,
    },

    /// A [`max_run`](crate::LeaseSpec::max_run) of zero, or shorter than the
    /// [`min_hold`](crate::LeaseSpec::min_hold).
    #[error(
        "invalid schedule: max_run {max_run:?} must be above zero and at least min_hold \
         {min_hold:?}; raise max_run or lower min_hold"
    )]
    InvalidSchedule {
        /// The minimum hold given.
        min_hold: Duration,
        /// The maximum run given.
        max_run: Duration,
    },

    /// A semaphore limit of zero, or a value the backend cannot represent.
    #[error("invalid semaphore limit {limit} for {key:?}: use at least 1")]
    InvalidLimit {
        /// The semaphore's prefix or name.
        key: String,
        /// The limit given.
        limit: u64,
    },

    /// The name is used by another kind of lock: a leader lock was asked for where a semaphore
    /// is, or a semaphore where a leader lock is. A name is used by one kind of lock at a time,
    /// and no holder of the other kind will ever make room, so this is answered at once, however
    /// long the spec may wait, and is not transient. Neither lock is touched.
    ///
    /// `expected` is the kind asked for and `found` the kind in the way, as Consul's flags (the
    /// ones `consul lock` puts on its keys): [`Error::LEADER_FLAGS`] for a leader lock,
    /// [`Error::SEMAPHORE_FLAGS`] for a semaphore. Per backend:
    ///
    /// - **Consul**: `found` is the flags on `key`, the key that shows the other kind: the leader
    ///   key when a semaphore is asked for on it, the semaphore's `<prefix>/.lock` when a leader
    ///   lock is asked for on its prefix (or, as with `consul lock`, the key itself when the two
    ///   use the same key). A key with other flags (0 for `consul kv put`, or another tool's) is
    ///   refused as a leader key or lock key the same way, and the message shows the flags in hex.
    ///   These keys outlive their holders: a released leader key keeps its name a leader lock's
    ///   until it is deleted (`Consul::remove_unheld_key`, which `lease lock` calls on
    ///   exit), a semaphore's `.lock` until `Consul::destroy_semaphore`.
    /// - **memory**: as on Consul, whose keys it models.
    /// - **etcd**: keys carry no flags; `found` is the constant of the kind of the contenders found
    ///   under `key`, the name asked for. Contender keys go with their holders and waiters, so a
    ///   name is another kind's only while that kind holds or waits for it.
    /// - **RabbitMQ**: a leader lock is a one-slot semaphore and the queues do not say which it
    ///   is. A leader lock asked for on a semaphore of more slots is refused with this error
    ///   (`found` is [`Error::SEMAPHORE_FLAGS`]); a semaphore asked for on a leader lock's name
    ///   gets [`Error::LimitMismatch`] with `stored: 1`, or, asking for one slot, shares it.
    #[error("{}", flags_conflict(.key, .found, .expected))]
    FlagsConflict {
        /// The key that shows the other kind of lock (see above), or the name asked for where no
        /// key does.
        key: String,
        /// The other kind of lock, as flags: [`Error::LEADER_FLAGS`], [`Error::SEMAPHORE_FLAGS`],
        /// or (Consul) whatever flags the key carries.
        found: u64,
        /// The kind of lock asked for, as flags: [`Error::LEADER_FLAGS`] or
        /// [`Error::SEMAPHORE_FLAGS`].
        expected: u64,
    },

    /// The semaphore exists with another limit.
    #[error(
        "semaphore {key:?} has limit {stored}, but this contender asked for {requested}; \
         every contender must use the same limit"
    )]
    LimitMismatch {
        /// The semaphore's prefix or name.
        key: String,
        /// The limit stored in the semaphore.
        stored: u64,
        /// The limit requested.
        requested: u64,
    },

    /// The semaphore still has live holders, so it was not destroyed.
    #[error(
        "semaphore {key:?} still has {holders} live holder(s); release them (or wait) before destroying it"
    )]
    SemaphoreInUse {
        /// The semaphore's prefix or name.
        key: String,
        /// How many live holders remain.
        holders: usize,
    },

    /// The semaphore's coordinating value cannot be read; it is left untouched.
    #[error(
        "semaphore lock key {key:?} holds a value that cannot be read ({reason}); \
         it was left untouched: inspect or delete it"
    )]
    CorruptLockValue {
        /// The lock key.
        key: String,
        /// What is wrong with the value.
        reason: String,
    },

    /// The backend refused the operation for lack of permission.
    #[error("permission denied to {operation}: {message}; {hint}")]
    PermissionDenied {
        /// What was attempted, naming the key, queue or session.
        operation: String,
        /// The backend's message.
        message: String,
        /// What to do, in the backend's terms: a Consul ACL token, etcd credentials, or a
        /// RabbitMQ user's permissions.
        hint: &'static str,
    },

    /// The backend could not be reached.
    #[error("cannot reach {backend} at {address}: {source}; {hint}")]
    Unreachable {
        /// `Consul`, `etcd` or `RabbitMQ`.
        backend: &'static str,
        /// The address tried (never carries credentials).
        address: String,
        /// What to do: start the service, fix the address or DNS, or raise the connection limit
        /// the service enforces, depending on how the connection failed.
        hint: &'static str,
        /// The transport error.
        #[source]
        source: BoxError,
    },

    /// The backend answered something this client does not expect.
    #[error("{backend} refused to {operation}: {message}")]
    Backend {
        /// `Consul` or `RabbitMQ`.
        backend: &'static str,
        /// What was attempted.
        operation: String,
        /// The status and body of the answer, or the protocol error.
        message: String,
        /// Whether a later attempt may succeed (a 5xx or 429 from Consul, a timeout), as decided
        /// where the status was known; see [`Error::is_transient`].
        transient: bool,
    },

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

    /// The client configuration (environment or builder) is invalid.
    #[error("invalid configuration: {0}")]
    Config(String),

    /// The backend does not offer this operation.
    #[error("{backend} does not support {operation}; use a backend that does")]
    Unsupported {
        /// The backend's type name.
        backend: &'static str,
        /// What was attempted.
        operation: &'static str,
    },

    /// A [`LeaderObserver`](crate::leader::LeaderObserver) stopped receiving updates: the backend's
    /// watch of the key ended.
    #[error("the observation of leader key {key:?} ended; observe the key again")]
    ObserverClosed {
        /// The leader key.
        key: String,
    },

    /// A release (or the clean-up after a loss) did not finish in time; the lease is no longer
    /// held here, and the backend frees it when its session or connection expires.
    #[error(
        "the release did not finish within {after:?}; the backend frees the lease when its session expires"
    )]
    ReleaseTimedOut {
        /// The bound that passed.
        after: Duration,
    },
    /// Guarded work ran past its spec's [`max_run`](crate::LeaseSpec::max_run) and was cancelled
    /// (what [`GuardError::TimedOut`](crate::GuardError::TimedOut) becomes with `?`).
    #[error("the work on lease {key:?} ran past its max_run of {max_run:?} and was cancelled")]
    WorkTimedOut {
        /// The key or prefix.
        key: String,
        /// The bound that passed.
        max_run: Duration,
    },

    /// The task asking for the lease already holds it: a guarded call (or a campaign) nested in
    /// guarded work on the same key or semaphore. Waiting would wait for itself forever, and
    /// "held elsewhere" would be untrue, so nothing is acquired.
    #[error(
        "lease {key:?} is already held by this task (a guarded call nested in guarded work on the \
         same key or semaphore); the outer call already holds it: call the unguarded work \
         directly, or guard the inner work with another key"
    )]
    AlreadyHeld {
        /// The key or prefix.
        key: String,
    },

    /// No backend was given, none is in scope and no process-wide default is set.
    #[error(
        "no lease backend: pass one explicitly (`backend = ...`), call \
         lease_core::set_default_backend at start-up, or run the call inside \
         lease_core::with_default_backend"
    )]
    NoDefaultBackend,
}

impl Error {
    /// The flags of a leader lock's key, as `consul lock` (and Consul's Go `api.Lock`) sets them;
    /// in [`Error::FlagsConflict`], a leader lock on every backend.
    pub const LEADER_FLAGS: u64 = 0x2ddc_cbc0_58a5_0c18;

    /// The flags of a semaphore's keys, as `consul lock -n` (and Consul's Go `api.Semaphore`) sets
    /// them; in [`Error::FlagsConflict`], a semaphore on every backend.
    pub const SEMAPHORE_FLAGS: u64 = 0xe0f6_9a2b_aa41_4de0;

    /// The refusal of a semaphore on a name a leader lock uses ([`Error::FlagsConflict`], found
    /// [`Error::LEADER_FLAGS`]); `key` is the key that shows the leader lock, or the name. What
    /// every backend answers, and a backend of your own should too.
    pub fn leader_lock_in_the_way(key: impl Into<String>) -> Error {
        Error::FlagsConflict {
            key: key.into(),
            found: Error::LEADER_FLAGS,
            expected: Error::SEMAPHORE_FLAGS,
        }
    }

    /// The refusal of a leader lock on a name a semaphore uses ([`Error::FlagsConflict`], found
    /// [`Error::SEMAPHORE_FLAGS`]); `key` is the key that shows the semaphore, or the name.
    pub fn semaphore_in_the_way(key: impl Into<String>) -> Error {
        Error::FlagsConflict {
            key: key.into(),
            found: Error::SEMAPHORE_FLAGS,
            expected: Error::LEADER_FLAGS,
        }
    }

    /// True for [`Error::Busy`]: the lease is held elsewhere.
    pub fn is_busy(&self) -> bool {
        matches!(self, Error::Busy { .. })
    }

    /// Whether retrying the same operation later can help: the lease is held elsewhere or was
    /// lost, the backend is unreachable or briefly in trouble (a 5xx, a 429, a timeout), a
    /// race was lost, or the AMQP connections are full (releases make room). False for everything a retry cannot fix: an invalid key or spec, a limit
    /// mismatch, a key used by another kind of lock, a permission denial, a configuration error,
    /// an answer the client cannot read.
    ///
    /// [`Campaign`](crate::leader::Campaign) retries exactly the transient errors.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Busy { .. }
            | Error::Lost(_)
            | Error::Unreachable { .. }
            | Error::Contended { .. }
            | Error::ChannelsExhausted { .. }
            | Error::ObserverClosed { .. }
            | Error::ReleaseTimedOut { .. }
            | Error::WorkTimedOut { .. } => true,
            Error::Backend { transient, .. } => *transient,
            Error::InvalidKey { .. }
            | Error::InvalidTtl { .. }
            | Error::InvalidLockDelay { .. }
            | Error::InvalidFenceLead { .. }
            | Error::InvalidSchedule { .. }
            | Error::InvalidLimit { .. }
            | Error::FlagsConflict { .. }
            | Error::LimitMismatch { .. }
            | Error::SemaphoreInUse { .. }
            | Error::CorruptLockValue { .. }
            | Error::PermissionDenied { .. }
            | Error::QueueMismatch { .. }
            | Error::Config(_)
            | Error::Unsupported { .. }
            | Error::AlreadyHeld { .. }
            | Error::NoDefaultBackend => false,
        }
    }
}

/// The kind of lock that `flags` mark, if they are one of ours (and `consul lock`'s).
fn kind_of_lock(flags: u64) -> Option<&'static str> {
    match flags {
        Error::LEADER_FLAGS => Some("a leader lock"),
        Error::SEMAPHORE_FLAGS => Some("a semaphore"),
        _ => None,
    }
}

/// The message of [`Error::FlagsConflict`]: the kinds by name, the flags in hex only when they
/// are not a kind of lock (a foreign Consul key).
fn flags_conflict(key: &str, found: &u64, expected: &u64) -> String {
    let what = match (kind_of_lock(*found), kind_of_lock(*expected)) {
        (Some(found), Some(expected)) => {
            format!("another kind of lock ({found}; this is {expected})")
        }
        (None, Some(expected)) => {
            format!("another kind of lock or other data (flags {found:#x}; this is {expected})")
        }
        _ => format!("another kind of lock (flags {found:#x}, expected {expected:#x})"),
    };
    format!("key {key:?} is used by {what}: use a different key, or remove the other lock")
}

/// Why a held lease stopped being held.
///
/// Every variant but [`LostReason::Released`] means the lease was taken away; the work guarded by
/// it must stop, and [`Lease::run`](crate::Lease::run) has already dropped it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LostReason {
    /// The session was invalidated: destroyed by an operator, expired, or its health checks failed.
    #[error("the session was invalidated")]
    SessionInvalidated,
    /// The key was deleted.
    #[error("the key was deleted")]
    KeyDeleted,
    /// The lock on the key was released by someone else (an operator's `?release=`).
    #[error("the lock was released by someone else")]
    KeyReleased,
    /// The key is now held by another acquisition.
    #[error(
        "the key is now held by another acquisition (lock index {lock_index}, session {session})"
    )]
    KeyTaken {
        /// The new holder's LockIndex.
        lock_index: u64,
        /// The new holder's session.
        session: String,
    },
    /// A semaphore holder was removed from the holder set (pruned or removed by an operator).
    #[error("this holder was removed from the semaphore's holders")]
    HolderPruned,
    /// An AMQP semaphore slot was removed by an administrator.
    #[error("the semaphore slot was removed")]
    SlotRemoved,
    /// The connection or channel carrying the lease closed.
    #[error("the connection to the backend closed")]
    ConnectionClosed,
    /// The session could not be confirmed for nearly a TTL; the lease was given up before the
    /// backend could hand it to someone else.
    #[error(
        "the backend was unreachable for {unconfirmed_for:?}; self-fenced before the session TTL could expire"
    )]
    SelfFenced {
        /// How long since the session was last confirmed.
        unconfirmed_for: Duration,
    },
    /// The lease was released by its holder (an explicit release, or a drop).
    #[error("the lease was released")]
    Released,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permission_denied_says_what_to_do_in_the_backends_terms() {
        let denied = Error::PermissionDenied {
            operation: "use queue \"q\"".to_owned(),
            message: "ACCESS_REFUSED".to_owned(),
            hint: "give the user permissions",
        };
        assert_eq!(
            denied.to_string(),
            "permission denied to use queue \"q\": ACCESS_REFUSED; give the user permissions"
        );
    }

    #[test]
    fn the_refusals_name_the_key_that_shows_the_other_kind() {
        let (leader, semaphore) = (Error::LEADER_FLAGS, Error::SEMAPHORE_FLAGS);
        let refused = Error::semaphore_in_the_way("k/.lock");
        assert!(
            matches!(&refused, Error::FlagsConflict { key, found, expected } if key == "k/.lock" && *found == semaphore && *expected == leader)
        );
        assert!(!refused.is_transient());
        let refused = Error::leader_lock_in_the_way("k");
        assert!(
            matches!(&refused, Error::FlagsConflict { key, found, expected } if key == "k" && *found == leader && *expected == semaphore)
        );
    }

    #[test]
    fn a_flags_conflict_names_the_kinds_and_shows_only_foreign_flags_in_hex() {
        let conflict = |found, expected| {
            Error::FlagsConflict {
                key: "jobs".to_owned(),
                found,
                expected,
            }
            .to_string()
        };
        assert_eq!(
            conflict(Error::LEADER_FLAGS, Error::SEMAPHORE_FLAGS),
            "key \"jobs\" is used by another kind of lock (a leader lock; this is a semaphore): \
             use a different key, or remove the other lock"
        );
        assert_eq!(
            conflict(Error::SEMAPHORE_FLAGS, Error::LEADER_FLAGS),
            "key \"jobs\" is used by another kind of lock (a semaphore; this is a leader lock): \
             use a different key, or remove the other lock"
        );
        assert_eq!(
            conflict(0, Error::LEADER_FLAGS),
            "key \"jobs\" is used by another kind of lock or other data (flags 0x0; this is a \
             leader lock): use a different key, or remove the other lock"
        );
        assert_eq!(
            conflict(7, 8),
            "key \"jobs\" is used by another kind of lock (flags 0x7, expected 0x8): use a \
             different key, or remove the other lock"
        );
    }

    #[test]
    fn unsupported_names_no_backend_that_might_implement_it_some_day() {
        let text = Error::Unsupported {
            backend: "RabbitMQ",
            operation: "observing a leader key",
        }
        .to_string();
        assert_eq!(
            text,
            "RabbitMQ does not support observing a leader key; use a backend that does"
        );
        assert!(!text.contains("once it implements"), "{text}");
    }
}
