//! Errors and loss reasons.
//!
//! [`Error`] is what an operation that talks to a backend can fail with; every variant says what
//! to do about it. [`LostReason`] is why a held lease stopped being held; it is what
//! [`Lease::lost`](crate::Lease::lost) resolves to and what [`Lease::run`](crate::Lease::run)
//! returns when it cancels the work.

use std::time::Duration;

use crate::limits::{MAX_LOCK_DELAY, MAX_TTL, MIN_TTL};

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
    ///   until it is deleted (`Consul::remove_unheld_key`; `consul lock` deletes it on
    ///   exit, `lease lock` keeps it), a semaphore's `.lock` until `Consul::destroy_semaphore`.
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

    /// A failure particular to one backend: [`BackendError::kind`] says what it means, and
    /// [`BackendError::downcast_ref`] reaches the backend crate's own error type (for example
    /// `lease_amqp::AmqpError`) with its details. Its message and source are the backend error's.
    #[error(transparent)]
    Other(BackendError),

    /// The client configuration (environment or builder) is invalid. Build it with
    /// [`Error::config`] or, when another error showed it, [`Error::config_caused_by`].
    #[error("invalid configuration: {message}")]
    Config {
        /// What is wrong, and what to change.
        message: String,
        /// The error that showed it (a file that cannot be read, an address that does not
        /// parse), if any; its text is in `message` too.
        #[source]
        source: Option<BoxError>,
    },

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

    /// An acquire with [`Wait::UpTo`](crate::Wait::UpTo) that the backend did not answer within
    /// its wait (and [`ACQUIRE_SLACK`](crate::backend::ACQUIRE_SLACK)), or with
    /// [`Wait::Never`](crate::Wait::Never) within
    /// [`ATTEMPT_BOUND`](crate::backend::ATTEMPT_BOUND): the server or the network is down,
    /// slow or overloaded. Nothing was taken (whatever the backend had begun is
    /// given back); [`Backend::reachability`](crate::Backend::reachability) says more.
    #[error(
        "no answer acquiring lease {key:?} within its wait ({waited:?}): the server or the network \
         is down, slow or overloaded; nothing was taken; retry later, or wait longer"
    )]
    AcquireTimedOut {
        /// The key or prefix.
        key: String,
        /// How long acquire waited.
        waited: Duration,
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

    /// [`Error::Config`]: the configuration is invalid, as `message` says.
    pub fn config(message: impl Into<String>) -> Error {
        Error::Config {
            message: message.into(),
            source: None,
        }
    }

    /// [`Error::Config`] shown by `source` (its text belongs in `message` too, which is what
    /// most callers print).
    pub fn config_caused_by(message: impl Into<String>, source: impl Into<BoxError>) -> Error {
        Error::Config {
            message: message.into(),
            source: Some(source.into()),
        }
    }

    /// True for [`Error::Busy`]: the lease is held elsewhere.
    pub fn is_busy(&self) -> bool {
        matches!(self, Error::Busy { .. })
    }

    /// Whether retrying the same operation later can help: the lease is held elsewhere or was
    /// lost, the backend is unreachable or briefly in trouble (a 5xx, a 429, a timeout), or a
    /// backend's own failure says so (a race for a slot lost, connections full until leases are
    /// released). False for everything a retry cannot fix: an invalid key or spec, a limit
    /// mismatch, a key used by another kind of lock, a permission denial, a configuration error,
    /// an answer the client cannot read.
    ///
    /// [`Campaign`](crate::leader::Campaign) retries exactly the transient errors.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Backend { transient, .. } => *transient,
            Error::Other(other) => other.transient,
            // One classification: the kind decides, so a new variant is transient or not by the
            // kind it is given.
            _ => matches!(
                self.kind(),
                ErrorKind::Busy
                    | ErrorKind::Lost
                    | ErrorKind::Unreachable
                    | ErrorKind::Closed
                    | ErrorKind::TimedOut
            ),
        }
    }
}

impl Error {
    /// What kind of failure this is, whichever backend it came from: what to match on to decide
    /// what to do (the variants carry the details).
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Busy { .. } => ErrorKind::Busy,
            Error::Lost(_) => ErrorKind::Lost,
            Error::InvalidKey { .. }
            | Error::InvalidTtl { .. }
            | Error::InvalidLockDelay { .. }
            | Error::InvalidFenceLead { .. }
            | Error::InvalidSchedule { .. }
            | Error::InvalidLimit { .. }
            | Error::Config { .. } => ErrorKind::InvalidInput,
            Error::FlagsConflict { .. }
            | Error::LimitMismatch { .. }
            | Error::SemaphoreInUse { .. }
            | Error::CorruptLockValue { .. } => ErrorKind::Conflict,
            Error::PermissionDenied { .. } => ErrorKind::PermissionDenied,
            Error::Unreachable { .. } => ErrorKind::Unreachable,
            Error::Backend { .. } => ErrorKind::Backend,
            Error::Other(other) => other.kind,
            Error::Unsupported { .. } => ErrorKind::Unsupported,
            Error::ObserverClosed { .. } => ErrorKind::Closed,
            Error::AcquireTimedOut { .. }
            | Error::ReleaseTimedOut { .. }
            | Error::WorkTimedOut { .. } => ErrorKind::TimedOut,
            Error::AlreadyHeld { .. } | Error::NoDefaultBackend => ErrorKind::Usage,
        }
    }

    /// The backend's own error, for [`Error::Other`].
    pub fn backend_error(&self) -> Option<&BackendError> {
        match self {
            Error::Other(other) => Some(other),
            _ => None,
        }
    }
}

/// What kind of failure an [`Error`] is ([`Error::kind`]), the same for every backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The lease is held elsewhere (or the race for it was lost): retry later or wait longer.
    Busy,
    /// The lease was lost.
    Lost,
    /// The spec or the client's configuration is invalid: fix it.
    InvalidInput,
    /// The name is used in a way this request does not fit: another kind of lock, another
    /// limit, queues declared otherwise, a record that cannot be read, holders still there.
    Conflict,
    /// The credentials do not allow the operation.
    PermissionDenied,
    /// The server did not answer.
    Unreachable,
    /// The server answered with a failure, or a resource of the client or server ran out.
    Backend,
    /// The backend does not offer the operation.
    Unsupported,
    /// An observation ended: observe again.
    Closed,
    /// An acquire, a release or the guarded work did not finish in time.
    TimedOut,
    /// The library was used in a way it cannot serve (a nested guard on the same key, no
    /// default backend).
    Usage,
}

/// A failure particular to one backend ([`Error::Other`]): its kind, whether a retry can help,
/// and the backend crate's own error, which gives the message and the source.
///
/// ```
/// use lease_core::{BackendError, Error, ErrorKind};
///
/// #[derive(Debug, thiserror::Error)]
/// #[error("the lock directory is full")]
/// struct Full;
///
/// let error = Error::Other(BackendError::new("file lock", ErrorKind::Backend, true, Full));
/// assert_eq!(error.to_string(), "the lock directory is full");
/// assert!(error.is_transient());
/// assert!(error.backend_error().and_then(|e| e.downcast_ref::<Full>()).is_some());
/// ```
#[derive(Debug)]
pub struct BackendError {
    backend: &'static str,
    kind: ErrorKind,
    transient: bool,
    error: BoxError,
}

impl BackendError {
    /// `error`, from `backend` (its name in messages, as in [`Error::Unreachable`]), of `kind`;
    /// `transient` if retrying the operation later can help.
    pub fn new(
        backend: &'static str,
        kind: ErrorKind,
        transient: bool,
        error: impl Into<BoxError>,
    ) -> BackendError {
        BackendError {
            backend,
            kind,
            transient,
            error: error.into(),
        }
    }

    /// The backend's name.
    pub fn backend(&self) -> &'static str {
        self.backend
    }

    /// What kind of failure it is.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The backend's own error.
    pub fn get_ref(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.error
    }

    /// The backend's own error as `T`, if it is one.
    pub fn downcast_ref<T: std::error::Error + 'static>(&self) -> Option<&T> {
        self.error.downcast_ref()
    }
}

impl std::fmt::Display for BackendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.error.fmt(f)
    }
}

impl std::error::Error for BackendError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.error.source()
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
    /// This process did not run for a while (it was stopped, as by `SIGSTOP` or a suspended VM,
    /// or its runtime was blocked), and the lease went unconfirmed for nearly a TTL meanwhile;
    /// it was given up before the backend could hand it to someone else. The backend may have
    /// been fine throughout: the timers of this process ran `paused_for` late, which is how the
    /// pause is known (see [`Fence`](crate::backend::Fence)).
    ///
    /// Like [`SelfFenced`](LostReason::SelfFenced), a self-fencing:
    /// [`is_self_fenced`](LostReason::is_self_fenced) is true for both.
    #[error(
        "this process was paused for at least {} (its timers ran {} late), leaving the lease \
         unconfirmed for {}; self-fenced before the session TTL could expire",
        seconds(*.paused_for),
        seconds(*.paused_for),
        seconds(*.unconfirmed_for)
    )]
    ProcessPaused {
        /// How late this process's timers ran: at least how long it did not run.
        paused_for: Duration,
        /// How long since the session was last confirmed.
        unconfirmed_for: Duration,
    },
    /// The lease was released by its holder (an explicit release, or a drop).
    #[error("the lease was released")]
    Released,
}

impl LostReason {
    /// Whether this process gave the lease up on its own clock, before the backend could hand
    /// it on: [`SelfFenced`](LostReason::SelfFenced) (nothing confirmed it) or
    /// [`ProcessPaused`](LostReason::ProcessPaused) (this process did not run).
    pub fn is_self_fenced(&self) -> bool {
        matches!(
            self,
            LostReason::SelfFenced { .. } | LostReason::ProcessPaused { .. }
        )
    }
}

/// A duration in seconds with two decimals, as the loss reasons show them (`20.55 s`).
fn seconds(duration: Duration) -> String {
    format!("{:.2} s", duration.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_agree_with_what_a_retry_can_do() {
        let busy = Error::Busy {
            key: "k".into(),
            waited: Duration::ZERO,
        };
        assert_eq!((busy.kind(), busy.is_transient()), (ErrorKind::Busy, true));
        let invalid = Error::config("bad");
        assert_eq!(
            (invalid.kind(), invalid.is_transient()),
            (ErrorKind::InvalidInput, false)
        );
        let conflict = Error::leader_lock_in_the_way("k");
        assert_eq!(
            (conflict.kind(), conflict.is_transient()),
            (ErrorKind::Conflict, false)
        );
        #[derive(Debug, thiserror::Error)]
        #[error("full")]
        struct Full;
        let other = Error::Other(BackendError::new("x", ErrorKind::Backend, true, Full));
        assert_eq!(
            (other.kind(), other.is_transient()),
            (ErrorKind::Backend, true)
        );
        assert_eq!(other.to_string(), "full");
        let backend = other.backend_error().expect("a backend error");
        assert_eq!(backend.backend(), "x");
        assert!(backend.downcast_ref::<Full>().is_some());
        assert!(busy.backend_error().is_none());
    }

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
