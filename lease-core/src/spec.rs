//! What to acquire and how: the [`LeaseSpec`] every backend's `acquire` takes.
//!
//! A spec names the lease ([`Target`]: a leader key or a semaphore), how long to wait for it
//! ([`Wait`]), and the session options (TTL, lock-delay, the value advertised to others). The same
//! spec means the same thing on every backend; [`LeaseSpec::validate`] enforces Consul's ranges
//! everywhere, so a spec that works on the embedded memory backend also works on Consul.

use std::time::Duration;

use tokio::time::Instant;

use crate::Error;
use crate::limits::{MAX_LOCK_DELAY, MAX_TTL, MIN_TTL, far_future};

/// Which lease to take.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Target {
    /// Exclusive: at most one holder of `key` (leader election).
    Leader {
        /// The key, e.g. `service/api/leader`. Relative: no leading `/`.
        key: String,
    },
    /// At most `limit` holders under `prefix`.
    Semaphore {
        /// The semaphore's prefix (Consul) or name (AMQP), e.g. `semaphores/reports`.
        prefix: String,
        /// The number of slots. Every contender must agree on it.
        limit: u32,
    },
}

impl Target {
    /// What a backend answers a target it does not know: one a later version of lease-core added
    /// (the enum is `#[non_exhaustive]`, so every backend has this arm).
    pub fn unsupported(&self, backend: &'static str) -> crate::Error {
        crate::Error::Unsupported {
            backend,
            operation: "this kind of lease (a target newer than the backend crate)",
        }
    }

    /// The key or prefix this target names.
    pub fn key(&self) -> &str {
        match self {
            Target::Leader { key } => key,
            Target::Semaphore { prefix, .. } => prefix,
        }
    }
}

/// How long `acquire` waits for a lease held elsewhere.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Wait {
    /// Until it is acquired (or the backend fails).
    #[default]
    Forever,
    /// Up to this long, then [`Error::Busy`].
    UpTo(Duration),
    /// Not at all: one attempt, then [`Error::Busy`]. An attempt the backend does not answer
    /// within [`ATTEMPT_BOUND`](crate::backend::ATTEMPT_BOUND) (a server or network down or
    /// slow) answers [`Error::AcquireTimedOut`].
    Never,
}

impl Wait {
    /// When an acquire that started at `started` gives up: `None` for [`Wait::Forever`]. A wait
    /// too long to add to `started` (up to [`Duration::MAX`]) saturates to a far future instead of
    /// overflowing.
    pub fn deadline(self, started: Instant) -> Option<Instant> {
        match self {
            Wait::Forever => None,
            Wait::UpTo(wait) => Some(started.checked_add(wait).unwrap_or_else(far_future)),
            Wait::Never => Some(started),
        }
    }
}

/// The request: which lease, how long to wait for it, and the session it is held by.
///
/// Built with [`LeaseSpec::leader`] or [`LeaseSpec::semaphore`] and `#[must_use]` setters.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use lease_core::{LeaseSpec, Wait};
///
/// let spec = LeaseSpec::leader("service/billing/leader")
///     .wait(Wait::UpTo(Duration::from_secs(5)))
///     .ttl(Duration::from_secs(15))
///     .lock_delay(Duration::ZERO)
///     .value("10.0.0.7:8080");
/// assert!(spec.validate().is_ok());
///
/// let jobs = LeaseSpec::semaphore("semaphores/reports", 3).wait(Wait::Never);
/// assert!(jobs.validate().is_ok());
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseSpec {
    target: Target,
    wait: Wait,
    ttl: Duration,
    lock_delay: Duration,
    value: Vec<u8>,
    session_name: Option<String>,
    settle: Duration,
    fence_lead: Duration,
    min_hold: Duration,
    max_run: Option<Duration>,
}

impl LeaseSpec {
    /// The default session TTL, as `consul lock` uses.
    pub const DEFAULT_TTL: Duration = Duration::from_secs(15);
    /// The default lock-delay, as Consul and `consul lock` use.
    pub const DEFAULT_LOCK_DELAY: Duration = Duration::from_secs(15);
    /// The default settle time: well above the loss-to-cancel p99 measured for a holder on a
    /// loaded machine (see [`LeaseSpec::settle`]).
    pub const DEFAULT_SETTLE: Duration = Duration::from_millis(100);

    fn new(target: Target) -> Self {
        LeaseSpec {
            target,
            wait: Wait::Forever,
            ttl: Self::DEFAULT_TTL,
            lock_delay: Self::DEFAULT_LOCK_DELAY,
            value: Vec::new(),
            session_name: None,
            settle: Self::DEFAULT_SETTLE,
            fence_lead: Duration::ZERO,
            min_hold: Duration::ZERO,
            max_run: None,
        }
    }

    /// An exclusive lease on `key`.
    pub fn leader(key: impl Into<String>) -> Self {
        Self::new(Target::Leader { key: key.into() })
    }

    /// One of `limit` slots of the semaphore at `prefix`.
    pub fn semaphore(prefix: impl Into<String>, limit: u32) -> Self {
        Self::new(Target::Semaphore {
            prefix: prefix.into(),
            limit,
        })
    }

    /// How long to wait when the lease is held elsewhere. Default: [`Wait::Forever`].
    #[must_use]
    pub fn wait(mut self, wait: Wait) -> Self {
        self.wait = wait;
        self
    }

    /// Session TTL, 10 s to 24 h. Default 15 s. The session is confirmed alive every TTL/2 (on
    /// Consul by the process's heartbeat check, or by renewing the session itself), and the
    /// lease is treated as lost (self-fenced) if nothing was confirmed for nearly a TTL.
    #[must_use]
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Lock-delay, 0 to 60 s. Default 15 s. After the holder's session is invalidated, the lease
    /// cannot be re-acquired for this long. Zero really means zero. An explicit release is not
    /// subject to it.
    #[must_use]
    pub fn lock_delay(mut self, lock_delay: Duration) -> Self {
        self.lock_delay = lock_delay;
        self
    }

    /// How long this contender leaves a lease alone after its previous holder lost it in a way
    /// the backend does not delay: the key (or a semaphore's `.lock`, or a holder's contender
    /// key) was deleted, or the session was invalidated under a lock-delay of 0. Default
    /// [`DEFAULT_SETTLE`](Self::DEFAULT_SETTLE).
    ///
    /// The old holder notices such a loss within milliseconds and drops its work, but not
    /// before; taking the lease at once would let both run for that moment. Contenders of this
    /// library wait `settle` after an invalidation whose lock-delay was shorter, and
    /// [`settle_after_removal`](Self::settle_after_removal) after a deletion. A clean release is
    /// not a loss: the next holder takes it at once. `consul lock` does not wait, so against its
    /// holders the window remains; fence downstream writes with the sequencer where that matters.
    ///
    /// On RabbitMQ, which has no lock-delay at all, the *holder's* settle time is what protects
    /// it: a slot freed by anything but a clean release (the broker dropped the connection, the
    /// process died) is not taken by anyone for `settle` after the drop, as the broker counts it.
    /// On etcd, which has no lock-delay either, waiters wait `settle` after a holding key went
    /// without a release (deleted, its lease revoked or expired); a release announces itself
    /// and is taken at once.
    ///
    /// The memory backend loses a lease only by release or expiry and does not wait.
    #[must_use]
    pub fn settle(mut self, settle: Duration) -> Self {
        self.settle = settle;
        self
    }

    /// Moves the self-fencing deadline earlier by `lead`: the lease is treated as lost `lead`
    /// sooner than [`fence_after`](Self::fence_after) would otherwise allow. Default zero.
    ///
    /// For a holder that needs time to stop its work after the loss is declared, such as a
    /// supervisor that sends its child SIGTERM and waits a grace period before SIGKILL: with
    /// `lead` at least that long, the work is gone before the backend could give the lease to
    /// someone else. [`validate`](Self::validate) refuses a lead that leaves no time at all.
    ///
    /// Applies to TTL-backed leases (Consul, etcd, memory); the AMQP backend fences on its heartbeat
    /// and does not read it.
    #[must_use]
    pub fn fence_lead(mut self, lead: Duration) -> Self {
        self.fence_lead = lead;
        self
    }

    /// For scheduled jobs (ShedLock's `lockAtLeastFor`): keep the lease at least `min_hold` after
    /// the guarded work started, even if the work finished sooner, so the same job fired on
    /// another node a little later (a skewed clock or schedule) finds the lease taken and skips,
    /// instead of running the job a second time. Default zero: released as soon as the work ends.
    ///
    /// Read by [`guarded`](crate::guarded) and the attributes (`min_hold = "30s"`); plain
    /// [`Backend::acquire`](crate::Backend::acquire) and campaigns ignore it. The guarded call
    /// returns as soon as the work ends; the lease is released in the background when
    /// `min_hold` has passed since the work started (after a loss there is nothing to keep).
    ///
    /// The lease outlives its process where the backend can keep it on its server
    /// ([`Lease::release_at`](crate::Lease::release_at)): a process that ends before `min_hold`
    /// has passed ([`Backend::shutdown`](crate::Backend::shutdown), or `main` returning) does not
    /// give the lease back, so a job fired a second later by a new process on another node still
    /// skips. The shutdown does not wait out the schedule; what is left of it is the server's:
    ///
    /// - PostgreSQL: the row's expiry is set to the end of `min_hold` instead of a delete;
    /// - etcd: the key moves onto an etcd lease of its own, granted for what is left of
    ///   `min_hold` rounded up to the second, which etcd lets expire;
    /// - Consul (leader keys): the key moves to a session nothing renews, whose TTL is what is
    ///   left of `min_hold` (at least Consul's 10 s); Consul frees the key one to two TTLs later
    ///   (1.8 waits two): never early, up to about 20 s late for a short `min_hold`;
    /// - memory (the process is the store), RabbitMQ (a slot is an exclusive queue, which goes
    ///   with its connection) and Consul semaphores: given back at the shutdown.
    ///
    /// A process killed outright (`kill -9`) keeps the lease only until its TTL runs out.
    #[must_use]
    pub fn min_hold(mut self, min_hold: Duration) -> Self {
        self.min_hold = min_hold;
        self
    }

    /// For scheduled jobs (ShedLock's `lockAtMostFor`): cancel the guarded work if it is still
    /// running `max_run` after it started; the lease is then released (after
    /// [`min_hold`](Self::min_hold), if that is longer). Default: no bound.
    ///
    /// The outcome is [`GuardError::TimedOut`](crate::GuardError::TimedOut), distinct from a
    /// loss: the lease was still held, the work was dropped at its next await point because it
    /// ran too long. Read by [`guarded`](crate::guarded) and the attributes (`max_run = "5m"`);
    /// plain [`Backend::acquire`](crate::Backend::acquire) and campaigns ignore it.
    #[must_use]
    pub fn max_run(mut self, max_run: Duration) -> Self {
        self.max_run = Some(max_run);
        self
    }

    /// The value the holder advertises in the key (for a leader, its address, so followers know
    /// whom to forward to).
    #[must_use]
    pub fn value(mut self, value: impl Into<Vec<u8>>) -> Self {
        self.value = value.into();
        self
    }

    /// The session's name, for operators listing sessions. Default: derived from the key.
    #[must_use]
    pub fn session_name(mut self, name: impl Into<String>) -> Self {
        self.session_name = Some(name.into());
        self
    }

    /// Which lease.
    pub fn target(&self) -> &Target {
        &self.target
    }

    /// The key (leader) or prefix (semaphore).
    pub fn key(&self) -> &str {
        self.target.key()
    }

    /// How long to wait.
    pub fn wait_policy(&self) -> Wait {
        self.wait
    }

    /// The session TTL.
    pub fn session_ttl(&self) -> Duration {
        self.ttl
    }

    /// The lock-delay.
    pub fn session_lock_delay(&self) -> Duration {
        self.lock_delay
    }

    /// How long a confirmation of the session keeps the lease safe on this side: the TTL less a
    /// tenth of it (at least a second), to cover request latency and clock drift between the
    /// client and the servers, less the [`fence_lead`](Self::fence_lead). The
    /// [`Fence`](crate::backend::Fence) of a TTL-backed lease.
    pub fn fence_after(&self) -> Duration {
        self.ttl
            .saturating_sub((self.ttl / 10).max(Duration::from_secs(1)))
            .saturating_sub(self.fence_lead)
    }

    /// The lead set by [`fence_lead`](Self::fence_lead).
    pub fn fence_lead_time(&self) -> Duration {
        self.fence_lead
    }

    /// The settle time (see [`LeaseSpec::settle`]): how long this contender waits after the
    /// session of the last holder was invalidated under a lock-delay shorter than it.
    pub fn settle_time(&self) -> Duration {
        self.settle
    }

    /// How long this contender waits after a lock was removed under its holder (a deleted key,
    /// `.lock` or contender key; a semaphore holder whose session is gone): its own lock-delay,
    /// or the settle time if that is longer. Consul applies no lock-delay to a deletion, so this
    /// is the lock-delay's promise carried over to it.
    pub fn settle_after_removal(&self) -> Duration {
        self.settle.max(self.lock_delay)
    }

    /// The time set by [`min_hold`](Self::min_hold); zero if none.
    pub fn min_hold_time(&self) -> Duration {
        self.min_hold
    }

    /// The bound set by [`max_run`](Self::max_run), if any.
    pub fn max_run_time(&self) -> Option<Duration> {
        self.max_run
    }

    /// The advertised value.
    pub fn advertised_value(&self) -> &[u8] {
        &self.value
    }

    /// The session name: the one set, or `lease:<key>`.
    pub fn session_name_or_default(&self) -> String {
        self.session_name
            .clone()
            .unwrap_or_else(|| format!("lease:{}", self.key()))
    }

    /// Checks the spec against the rules every backend shares (Consul's ranges).
    ///
    /// Key rule: a key is relative. It must be non-empty, must not start or end with `/` and must
    /// not contain `//` or control characters. Keys are never rewritten, so the key in a
    /// [`Sequencer`](crate::Sequencer) is exactly the key you gave.
    pub fn validate(&self) -> Result<(), Error> {
        validate_key(self.key())?;
        if let Target::Semaphore { limit: 0, .. } = self.target {
            return Err(Error::InvalidLimit {
                key: self.key().to_owned(),
                limit: 0,
            });
        }
        if !(MIN_TTL..=MAX_TTL).contains(&self.ttl) {
            return Err(Error::InvalidTtl { ttl: self.ttl });
        }
        if self.ttl.subsec_nanos() != 0 {
            return Err(Error::InvalidTtl { ttl: self.ttl });
        }
        if self.lock_delay > MAX_LOCK_DELAY || self.settle > MAX_LOCK_DELAY {
            return Err(Error::InvalidLockDelay {
                lock_delay: self.lock_delay.max(self.settle),
            });
        }
        // A confirmation must stay good for at least half the TTL: the session is confirmed
        // every TTL/2, so a shorter fence would self-fence between two healthy confirmations.
        if self.fence_after() < self.ttl / 2 {
            return Err(Error::InvalidFenceLead {
                lead: self.fence_lead,
                ttl: self.ttl,
            });
        }
        if let Some(max_run) = self.max_run {
            if max_run.is_zero() || self.min_hold > max_run {
                return Err(Error::InvalidSchedule {
                    min_hold: self.min_hold,
                    max_run,
                });
            }
        }
        Ok(())
    }
}

/// Checks `key` (a leader key, or a semaphore's name or prefix) against the lease-key rule: not
/// empty, relative (no leading `/`), no trailing `/`, no empty segment (`//`), no `.` or `..`
/// segment, no control character. [`LeaseSpec::validate`] applies it, and every backend before it sends a key
/// anywhere; a backend written outside this crate should too, so its users meet the same rule.
///
/// ```
/// use lease_core::{Error, validate_key};
///
/// assert!(validate_key("jobs/nightly").is_ok());
/// let Err(Error::InvalidKey { reason, .. }) = validate_key("/jobs/nightly") else { panic!() };
/// assert_eq!(reason, "keys are relative: remove the leading '/'");
/// ```
///
/// # Errors
///
/// [`Error::InvalidKey`] with the reason [`key_rule_broken`] gives.
pub fn validate_key(key: &str) -> Result<(), Error> {
    match key_rule_broken(key) {
        None => Ok(()),
        Some(reason) => Err(Error::InvalidKey {
            key: key.to_owned(),
            reason,
        }),
    }
}

/// Why `key` breaks the lease-key rule (see [`validate_key`]), if it does. The one statement of
/// the rule: a `const fn`, so the attribute macros check literal keys with it at compile time.
pub const fn key_rule_broken(key: &str) -> Option<&'static str> {
    let bytes = key.as_bytes();
    let Some((&first, _)) = bytes.split_first() else {
        return Some("the key is empty");
    };
    if first == b'/' {
        return Some("keys are relative: remove the leading '/'");
    }
    if bytes[bytes.len() - 1] == b'/' {
        return Some("remove the trailing '/'");
    }
    let mut i = 0;
    while i + 1 < bytes.len() {
        if bytes[i] == b'/' && bytes[i + 1] == b'/' {
            return Some("the key contains an empty segment ('//')");
        }
        i += 1;
    }
    // A `.` or `..` segment: a URL path resolves it away, so Consul's KV API would read and
    // write another key than the one named (`jobs/./nightly` is `jobs/nightly` to it).
    let mut start = 0;
    let mut i = 0;
    while i <= bytes.len() {
        if i == bytes.len() || bytes[i] == b'/' {
            let len = i - start;
            if (len == 1 && bytes[start] == b'.')
                || (len == 2 && bytes[start] == b'.' && bytes[start + 1] == b'.')
            {
                return Some("the key contains a '.' or '..' segment, which paths resolve away");
            }
            start = i + 1;
        }
        i += 1;
    }
    // `char::is_control`: U+0000-U+001F and U+007F-U+009F (in UTF-8, C2 80 to C2 9F).
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        let c1 = b == 0xc2 && i + 1 < bytes.len() && bytes[i + 1] >= 0x80 && bytes[i + 1] <= 0x9f;
        if b < 0x20 || b == 0x7f || c1 {
            return Some("the key contains a control character");
        }
        i += 1;
    }
    None
}

#[cfg(test)]
mod tests;
