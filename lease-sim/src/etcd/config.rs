//! How the model's etcd is configured: etcd's defaults, and the knobs the simulation draws.

use std::time::Duration;

use crate::rng::Rng;

/// How the model's etcd is configured, and the knobs the simulation draws.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Config {
    /// The seed of every random draw: lease IDs, tokens, the sync loop's phase, the progress
    /// intervals' jitter.
    pub seed: u64,
    /// How long after its expiry an expired lease is revoked. etcd's lessor looks every 500 ms
    /// and revokes through raft, so anywhere in [0, 500 ms]; [`Config::new`] draws it from the
    /// seed.
    pub revoke_late: Duration,
    /// The shortest TTL a lease gets, in seconds: etcd's `⌈1.5 × election timeout⌉`, 2 with its
    /// default timers (heartbeat 100 ms, election 1 s).
    pub min_lease_ttl: i64,
    /// How much longer than its TTL a new leader's lessor lets every lease live (`Promote`):
    /// the election timeout, 1 s by default.
    pub election_timeout: Duration,
    /// How many revisions of history are kept (the model compacts as it writes); `None`, as
    /// etcd's default (no auto-compaction): all of it.
    pub history: Option<i64>,
    /// The period of the watch sync loop, which sends a watch from a past revision its history
    /// (etcd's `syncWatchersLoop`: 100 ms). The differential test shortens it, so that the
    /// model's watches are never the ones still waiting for theirs.
    pub sync_interval: Duration,
    /// The interval of progress notifications (`--experimental-watch-progress-notify-interval`,
    /// 10 minutes by default); each stream's is up to a tenth longer.
    pub progress_interval: Duration,
    /// Authentication on, with this root user; off (etcd's default) if `None`.
    pub auth: Option<Credentials>,
    /// How long an unused simple token stays valid (`--auth-token-ttl`, 300 s).
    pub token_ttl: Duration,
}

/// A user and password of the model's etcd.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Credentials {
    /// The user's name.
    pub user: String,
    /// The user's password.
    pub password: String,
}

impl Config {
    /// etcd's defaults, with `seed` and the lateness of revocations drawn from it.
    pub fn new(seed: u64) -> Config {
        let mut rng = Rng::new(seed ^ 0x6c65_6173_652d_7369);
        Config {
            seed,
            revoke_late: Duration::from_millis(rng.below(501)),
            min_lease_ttl: 2,
            election_timeout: Duration::from_secs(1),
            history: None,
            sync_interval: Duration::from_millis(100),
            progress_interval: Duration::from_secs(600),
            auth: None,
            token_ttl: Duration::from_secs(300),
        }
    }

    /// With revocations `late` after expiry.
    #[must_use]
    pub fn revoke_late(mut self, late: Duration) -> Config {
        self.revoke_late = late;
        self
    }

    /// With the shortest lease TTL `seconds` (1 for the test support's etcd, whose timers are
    /// 50 ms and 500 ms).
    #[must_use]
    pub fn min_lease_ttl(mut self, seconds: i64) -> Config {
        self.min_lease_ttl = seconds;
        self
    }

    /// With `timeout` as the election timeout (what `Promote` adds to every lease).
    #[must_use]
    pub fn election_timeout(mut self, timeout: Duration) -> Config {
        self.election_timeout = timeout;
        self
    }

    /// Keeping only the last `revisions` revisions of history.
    #[must_use]
    pub fn history(mut self, revisions: i64) -> Config {
        self.history = Some(revisions);
        self
    }

    /// With the watch sync loop running every `interval`.
    #[must_use]
    pub fn sync_interval(mut self, interval: Duration) -> Config {
        self.sync_interval = interval;
        self
    }

    /// With progress notifications every `interval` (and up to a tenth more).
    #[must_use]
    pub fn progress_interval(mut self, interval: Duration) -> Config {
        self.progress_interval = interval;
        self
    }

    /// With authentication on, for the root user `user` with `password`.
    #[must_use]
    pub fn auth(mut self, user: impl Into<String>, password: impl Into<String>) -> Config {
        self.auth = Some(Credentials {
            user: user.into(),
            password: password.into(),
        });
        self
    }
}
