//! What to acquire and how: the [`LeaseSpec`] every backend's `acquire` takes.
//!
//! A spec names the lease ([`Target`]: a leader key or a semaphore), how long to wait for it
//! ([`Wait`]), and the session options (TTL, lock-delay, the value advertised to others). The same
//! spec means the same thing on every backend; [`LeaseSpec::validate`] enforces Consul's ranges
//! everywhere, so a spec that works on the embedded memory backend also works on Consul.

use std::time::Duration;

use crate::Error;

/// The shortest session TTL Consul accepts.
pub const MIN_TTL: Duration = Duration::from_secs(10);
/// The longest session TTL Consul accepts.
pub const MAX_TTL: Duration = Duration::from_secs(86_400);
/// The longest lock-delay Consul honours.
pub const MAX_LOCK_DELAY: Duration = Duration::from_secs(60);

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
    /// Not at all: one attempt, then [`Error::Busy`].
    Never,
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
}

impl LeaseSpec {
    /// The default session TTL, as `consul lock` uses.
    pub const DEFAULT_TTL: Duration = Duration::from_secs(15);
    /// The default lock-delay, as Consul and `consul lock` use.
    pub const DEFAULT_LOCK_DELAY: Duration = Duration::from_secs(15);

    fn new(target: Target) -> Self {
        LeaseSpec {
            target,
            wait: Wait::Forever,
            ttl: Self::DEFAULT_TTL,
            lock_delay: Self::DEFAULT_LOCK_DELAY,
            value: Vec::new(),
            session_name: None,
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

    /// Session TTL, 10 s to 24 h. Default 15 s. The holder renews every TTL/2 and treats the lease
    /// as lost (self-fences) if it has not renewed for nearly a TTL.
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
        if self.lock_delay > MAX_LOCK_DELAY {
            return Err(Error::InvalidLockDelay {
                lock_delay: self.lock_delay,
            });
        }
        Ok(())
    }
}

/// The key rule of [`LeaseSpec::validate`].
pub(crate) fn validate_key(key: &str) -> Result<(), Error> {
    let reason = if key.is_empty() {
        "the key is empty"
    } else if key.starts_with('/') {
        "keys are relative: remove the leading '/'"
    } else if key.ends_with('/') {
        "remove the trailing '/'"
    } else if key.contains("//") {
        "the key contains an empty segment ('//')"
    } else if key.chars().any(char::is_control) {
        "the key contains a control character"
    } else {
        return Ok(());
    };
    Err(Error::InvalidKey {
        key: key.to_owned(),
        reason,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        assert!(LeaseSpec::leader("a/b").validate().is_ok());
        assert!(LeaseSpec::semaphore("a/b", 1).validate().is_ok());
    }

    #[test]
    fn rejects_out_of_range_values() {
        let s = || LeaseSpec::leader("k");
        assert!(matches!(
            s().ttl(Duration::from_secs(5)).validate(),
            Err(Error::InvalidTtl { .. })
        ));
        assert!(matches!(
            s().ttl(Duration::from_secs(86_401)).validate(),
            Err(Error::InvalidTtl { .. })
        ));
        assert!(matches!(
            s().ttl(Duration::from_millis(10_500)).validate(),
            Err(Error::InvalidTtl { .. })
        ));
        assert!(matches!(
            s().lock_delay(Duration::from_secs(61)).validate(),
            Err(Error::InvalidLockDelay { .. })
        ));
        assert!(s().lock_delay(Duration::ZERO).validate().is_ok());
        assert!(matches!(
            LeaseSpec::semaphore("k", 0).validate(),
            Err(Error::InvalidLimit { limit: 0, .. })
        ));
    }

    #[test]
    fn rejects_bad_keys() {
        for key in ["", "/k", "k/", "a//b", "a\nb"] {
            assert!(
                matches!(
                    LeaseSpec::leader(key).validate(),
                    Err(Error::InvalidKey { .. })
                ),
                "{key:?}"
            );
        }
    }
}
