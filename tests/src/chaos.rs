//! The randomized fault-injection suite: real workers contend for one lease while a driver
//! injects faults at times drawn from a printed seed, and a checker judges the promise from the
//! histories alone.
//!
//! - A [`Scenario`] names the backend and target (a Consul leader key or semaphore, an AMQP
//!   semaphore, an etcd election or semaphore, or `consul lock` as the reference), how many
//!   workers, the TTL, how long, and the seed.
//! - [`run`] starts the workers (`lease-worker --mode loop`, each Consul or etcd worker behind its
//!   own [`Proxy`]), plays the fault schedule drawn from the seed, logs every fault as a line of
//!   `faults.history` (pid 0, event `fault`, so it merges into the interleaving), then stops:
//!   SIGTERM to all, a hang is a worker still running 2 s later, and a leak is a session, a held
//!   key, a holder queue, an etcd lease or a key under the scenario's etcd prefix still there once
//!   the TTL of the last crashed worker has run out.
//! - The checker ([`judge`]) reads only the histories: the most sequencers writing at once
//!   against the limit, stale writes, hand-off gaps. On a violation the [`Report`] carries the seed
//!   and the merged interleaving around it.
//! - Liveness (issue 33, [`judge_recovery`]): after every fault heals ([`episodes`]: a pause at
//!   its SIGCONT, a proxy fault when forwarding resumes, a removed slot when it is back, a killed
//!   server at its restart, every other fault the instant it is made), a holder writes again
//!   within [`Scenario::recovery_bound`]: the longest a dead holder's claim may outlive its last
//!   renewal, plus the lock-delay or settle time, one retry pause and a margin. Faults overlap;
//!   one in force before a holder ran moves the deadline to its own heal plus the bound. Once
//!   the schedule is over the driver waits, bounded, for a holder after the last heal (usually
//!   one is writing already), so that a lease left without a holder for good is caught.
//! - Reachability comes back ([`judge_reachability`]): each worker logs its backend's
//!   `reachability()` when it changes; after a fault on a worker heals, that worker must not
//!   read `unreachable` at the heal plus the same bound.
//! - No panic: every worker records its panics (see [`crate::panics`]); each record is a
//!   violation, with the interleaving around it.
//!
//! One thing no library can close is exempted and counted apart: a process stopped between its
//! `is_held()` check and its write makes that one write after SIGCONT (see `lease-worker`'s
//! `work`). Only the first write of a pid after its SIGCONT, at most one per pause, is exempt;
//! a holder that did not self-fence writes again 10 ms later and is caught.
//!
//! A fenced scenario ([`Scenario::fenced`]: `consul-leader-fenced`, `etcd-leader-fenced`; issue
//! 28) is the same run with every write going through the PostgreSQL fence of `lease-postgres`
//! (`lease-worker --fenced-writes`): the workers do not check the lease before a write and do not
//! run the work under `Lease::run`, so a holder that lost its lease writes on until its hold ends
//! and only the fence can stop it. Each write is a row of `chaos_writes` in a database of the
//! scenario's own; the verdict reads that table ([`stale_rows`]): no row may carry an index below
//! one committed before it for its key. The histories are judged as well, with no write exempted
//! after a SIGCONT: a fenced worker logs its `write` while it holds the fence's lock, so a resumed
//! holder's write can land after a newer holder's only if the fence let it through.
//!
//! etcd (`etcd-leader`, `etcd-sem2`) runs one etcd server per scenario, started by the driver as
//! the Consul dev agent is. Its faults are Consul's with the etcd operator's actions: revoke the
//! holder's lease (the holder is the lease ID in its sequencer `etcd:<revision>:<lease>:<key>`)
//! and delete the holder's own key (`<election>/<lease>` for a leader, the sequencer's key for a
//! semaphore). A crashed worker's lease expires one TTL after its last keep-alive.
//!
//! PostgreSQL (`postgres-leader`, `postgres-sem2`) runs in a database of the scenario's own on the
//! test server (`crate::postgres`), each worker behind its own proxy and connecting with
//! `application_name=chaos-<worker>`. Its operator faults: delete the holder's row from the lease
//! table (the backend's own `Postgres::delete_holder`, as an administrator's `DELETE`) and `pg_terminate_backend` of the holder's
//! sessions ([`crate::postgres::terminate_sessions`]); its network faults: blackhole and cut (no
//! HTTP to answer 500 to). A leak is a row left in the lease table under the scenario's key, or a
//! worker's session still open after it exited.
//!
//! Redis (`redis-leader`, `redis-sem2`, `redis-leader-fenced`) runs one `redis-server` per
//! scenario (append-only, fsync on every write), each worker behind its own proxy. Its operator
//! faults: `DEL` of the holder's key (the backend's own `Redis::revoke`), `CLIENT KILL` of every
//! client connection, and the server killed (`kill -9`) and started again at once from its
//! append-only file; its network faults: blackhole and cut. A leak is a holder key left under
//! the scenario's name.
//!
//! The reference's violations, liveness included (its `consul lock` sessions have a TTL and a
//! lock-delay of 15 s, and its bound is derived from those), are reported, not failed on.
//!
//! The `consul lock` reference runs `consul lock [-n N] PREFIX <child>` in a shell loop; the
//! child shell appends `write` lines stamped with `date +%s%N`. Its token is per child process
//! (`consul:<child pid>:cl<child pid>:<key>`), not Consul's LockIndex: the column detects two
//! children writing at once and a superseded child still writing (stale), which is what a
//! `consul lock` user would suffer; it cannot see which session a child ran under, and pauses
//! stop the `consul` process only (its child runs on, as a real child would). Each `consul lock`
//! loop reaches the agent through its own proxy (`CONSUL_HTTP_ADDR`), so it gets the network
//! faults ours get.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::time::Duration;

use lease_core::Sequencer;
use tokio::process::Command;
use tokio::time::Instant;

use crate::cluster::Cluster;
use crate::consul::{Agent, Api, consul_bin};
use crate::etcd::Server as EtcdServer;
use crate::history::{History, Kind, Line, gap_percentiles};
use crate::overlap::now_ns;
use crate::postgres::{self as pg, TestDb};
use crate::proxy::{Mode, Proxy};
use crate::redis::Server as RedisServer;
use crate::workers::{Run, signal};

/// The seed used when `CHAOS_SEED` is not set.
pub const DEFAULT_SEED: u64 = 20_251_122;

/// The seed from `CHAOS_SEED`, else [`DEFAULT_SEED`].
pub fn seed_from_env() -> u64 {
    std::env::var("CHAOS_SEED")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(DEFAULT_SEED)
}

/// SplitMix64: small, seeded, and the same on every platform, so a seed replays its schedule.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// Uniform in `lo..=hi` milliseconds.
    pub fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.below(hi - lo + 1))
    }
}

/// Where the workers contend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// `lease-worker`s on a Consul dev agent, each through its own proxy.
    Consul,
    /// `lease-worker`s on the RabbitMQ of [`crate::amqp`].
    Amqp,
    /// `consul lock` (`-n N` for a semaphore) on a Consul dev agent, each through its own proxy:
    /// the reference, under the same faults as [`Backend::Consul`].
    ConsulLock,
    /// `lease-worker`s on the client agent of a 3-server [`Cluster`] (no proxy), for faults of
    /// the servers.
    ConsulCluster,
    /// `lease-worker`s on a single etcd server, each through its own proxy.
    Etcd,
    /// `lease-worker`s on the test PostgreSQL server (a database of the scenario's own), each
    /// through its own proxy.
    Postgres,
    /// `lease-worker`s on a `redis-server` of the scenario's own (append-only file, fsync on
    /// every write, so a restart keeps what it acknowledged), each through its own proxy.
    Redis,
}

/// One kind of fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Fault {
    /// `kill -9` of a worker (a new one takes its place).
    Kill9,
    /// SIGSTOP for longer than the TTL, then SIGCONT.
    Pause,
    /// An operator destroys a holder's session (PostgreSQL: `pg_terminate_backend` of the
    /// holder's sessions; Redis: `CLIENT KILL` of every client connection).
    DestroySession,
    /// An operator deletes the leader key, the semaphore's `.lock`, or a contender key (etcd: the
    /// holder's own key; PostgreSQL: the holder's row; Redis: the holder key, `DEL`).
    DeleteKey,
    /// An operator revokes a holder's etcd lease (`etcdctl lease revoke`).
    RevokeLease,
    /// The worker's proxy stops forwarding for a while.
    Blackhole,
    /// The worker's proxy resets every connection.
    Cut,
    /// The worker's proxy answers 500 for a while.
    Http500,
    /// The broker closes a worker's connection (`rabbitmqctl close_connection`).
    CloseConnection,
    /// The administrator removes a slot, and adds it back a moment later.
    RemoveSlot,
    /// `kill -9` of the server that is raft leader; it is restarted a few seconds later.
    RaftLeaderKill,
    /// `kill -9` of the Redis server, started again at once from its append-only file.
    ServerRestart,
}

impl Fault {
    /// Its short name, as in the faults file and the table.
    pub fn name(self) -> &'static str {
        match self {
            Fault::Kill9 => "kill9",
            Fault::Pause => "pause",
            Fault::DestroySession => "destroy",
            Fault::DeleteKey => "delete",
            Fault::RevokeLease => "revoke",
            Fault::Blackhole => "blackhole",
            Fault::Cut => "cut",
            Fault::Http500 => "http500",
            Fault::CloseConnection => "close-conn",
            Fault::RemoveSlot => "rm-slot",
            Fault::RaftLeaderKill => "raft-kill",
            Fault::ServerRestart => "restart",
        }
    }
}

/// One scenario of the suite.
#[derive(Clone, Debug)]
pub struct Scenario {
    /// Its name (files, table rows).
    pub name: String,
    /// Where the workers contend.
    pub backend: Backend,
    /// A semaphore of this many slots, else a leader key.
    pub limit: Option<u32>,
    /// How many workers contend at any time.
    pub workers: usize,
    /// Session TTL (Consul) or lease TTL (etcd); for AMQP the heartbeat is [`AMQP_HEARTBEAT_SECS`].
    pub ttl_secs: u64,
    /// Consul lock-delay.
    pub lock_delay_ms: u64,
    /// How long faults are injected.
    pub duration: Duration,
    /// The mean time between two faults.
    pub mean_gap: Duration,
    /// How long a worker holds before it releases and acquires again.
    pub hold_ms: u64,
    /// The seed of the fault schedule.
    pub seed: u64,
    /// Every write goes through the PostgreSQL fence, unchecked by the worker (see the module
    /// docs); the table is judged too. Leader keys on Consul and etcd only.
    pub fenced: bool,
    /// Test-only: every worker panics in a spawned task at this point (`lease-worker`'s
    /// `LEASE_TESTS_PANIC_AT`), to prove that a panic fails the run.
    pub panic_at: Option<String>,
}

/// The AMQP heartbeat the workers ask for: a stopped worker's connection is dropped by the
/// broker after about two of them.
pub const AMQP_HEARTBEAT_SECS: u64 = 3;
/// How long a worker has to exit after SIGTERM before it counts as hung.
pub const EXIT_WITHIN: Duration = Duration::from_secs(2);
/// The longest pause between a waiter's retries, part of [`Scenario::recovery_bound`]: Consul's
/// budget gate backs off to 2 s, the other backends to 1 s, and the worker waits 200 ms after a
/// failed acquire.
pub const RETRY_PAUSE: Duration = Duration::from_millis(2200);
/// The part of [`Scenario::recovery_bound`] for everything after the lease is free: a
/// replacement worker's start, its acquire's round trips and its first write, on a loaded
/// two-core machine.
pub const RECOVERY_MARGIN: Duration = Duration::from_secs(5);

impl Scenario {
    /// A scenario with the defaults the CI short mode uses: 3 workers, TTL 10 s, lock-delay
    /// 1 s, a hold of 300 ms, a fault every 2.5 s on average.
    pub fn new(name: &str, backend: Backend, limit: Option<u32>, duration: Duration) -> Self {
        Scenario {
            name: name.to_owned(),
            backend,
            limit,
            workers: if limit.is_some_and(|l| l > 1) { 4 } else { 3 },
            ttl_secs: 10,
            lock_delay_ms: 1000,
            duration,
            // A raft leader kill takes a server out for its restart and rejoin: fewer of them.
            mean_gap: Duration::from_millis(if backend == Backend::ConsulCluster {
                7000
            } else {
                2500
            }),
            hold_ms: 300,
            seed: seed_from_env(),
            fenced: false,
            panic_at: None,
        }
    }

    /// The same scenario with every write going through the PostgreSQL fence (see the module
    /// docs). Panics for a semaphore or a backend other than Consul and etcd: the fence takes a
    /// leader's sequencer whose index rises with every acquisition.
    pub fn fenced(mut self) -> Self {
        assert!(
            self.limit.is_none()
                && matches!(
                    self.backend,
                    Backend::Consul | Backend::Etcd | Backend::Redis
                ),
            "a fenced scenario is a leader key on Consul, etcd or Redis"
        );
        self.fenced = true;
        self
    }

    /// The same scenario with another seed.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// The faults this backend can be given.
    pub fn fault_kinds(&self) -> Vec<Fault> {
        match self.backend {
            // Fenced, no operator deletes the leader key: Consul's LockIndex restarts at 1 when
            // the key is re-created, below the index the fence has recorded, so the fence would
            // (rightly) refuse every later holder until an operator clears its record, and the
            // run would stop writing. That is the documented limit of fencing with a LockIndex
            // (lease-postgres's `fence.sql`), not something a chaos run can judge. A destroyed
            // session leaves the key, and its LockIndex, in place: that fault stays. (etcd keeps
            // its delete: a re-created key gets a new, higher revision.)
            Backend::Consul if self.fenced => vec![
                Fault::Kill9,
                Fault::Pause,
                Fault::DestroySession,
                Fault::Blackhole,
                Fault::Cut,
                Fault::Http500,
            ],
            Backend::Consul => vec![
                Fault::Kill9,
                Fault::Pause,
                Fault::DestroySession,
                Fault::DeleteKey,
                Fault::Blackhole,
                Fault::Cut,
                Fault::Http500,
            ],
            // The same faults as ours: `consul lock` talks to the agent through its own proxy.
            Backend::ConsulLock => vec![
                Fault::Kill9,
                Fault::Pause,
                Fault::DestroySession,
                Fault::DeleteKey,
                Fault::Blackhole,
                Fault::Cut,
                Fault::Http500,
            ],
            // Only brief trouble: every loss in this scenario is a false one.
            Backend::ConsulCluster => vec![Fault::RaftLeaderKill],
            Backend::Amqp => vec![
                Fault::Kill9,
                Fault::Pause,
                Fault::CloseConnection,
                Fault::RemoveSlot,
            ],
            // Consul's, with the etcd operator's revoke in place of a session destroy.
            Backend::Etcd => vec![
                Fault::Kill9,
                Fault::Pause,
                Fault::RevokeLease,
                Fault::DeleteKey,
                Fault::Blackhole,
                Fault::Cut,
                Fault::Http500,
            ],
            // The operator's DEL and CLIENT KILL, and the server restarted; no HTTP, so no 500s.
            // (Tokens rise through a DEL: they follow the server's clock, so a fenced run keeps
            // its deletes.)
            Backend::Redis => vec![
                Fault::Kill9,
                Fault::Pause,
                Fault::DestroySession,
                Fault::DeleteKey,
                Fault::Blackhole,
                Fault::Cut,
                Fault::ServerRestart,
            ],
            // The operator's row delete and session kill; no HTTP, so no 500s.
            Backend::Postgres => vec![
                Fault::Kill9,
                Fault::Pause,
                Fault::DestroySession,
                Fault::DeleteKey,
                Fault::Blackhole,
                Fault::Cut,
            ],
        }
    }

    fn limit_n(&self) -> usize {
        self.limit.unwrap_or(1) as usize
    }

    /// How long a pause lasts: past the TTL (Consul, etcd) or two heartbeats and more (AMQP).
    fn pause_range_ms(&self) -> (u64, u64) {
        match self.backend {
            Backend::Amqp => (AMQP_HEARTBEAT_SECS * 2500, AMQP_HEARTBEAT_SECS * 4000),
            // `consul lock`'s session (TTL 15 s) may live up to twice its TTL: outlast that.
            Backend::ConsulLock => (31_000, 33_000),
            Backend::Consul
            | Backend::ConsulCluster
            | Backend::Etcd
            | Backend::Postgres
            | Backend::Redis => (self.ttl_secs * 1000 + 1000, self.ttl_secs * 1000 + 3000),
        }
    }

    /// How long after a fault heals a holder must run again (a `write` by any worker): the
    /// liveness bound of this scenario, derived from its parameters (see [`judge_recovery`]).
    ///
    /// Once a fault has healed, what can still stand between the waiters and the lease is a
    /// claim nobody renews any more: a killed, paused or cut-off holder's session, lease, row or
    /// queue. Its last renewal came no later than the heal (a kill heals at once; a pause or a
    /// blackhole began before it healed), so the backend drops it at the latest
    /// `crash_expiry` after the heal: Consul 2 × TTL (+1 s), since
    /// Consul invalidates a TTL session between one and two TTLs after its last renewal; etcd
    /// and PostgreSQL one TTL (+3 s for their expiry checks); RabbitMQ three heartbeats. Then the
    /// key may stay barred for the lock-delay (Consul; PostgreSQL after an operator deleted the
    /// holder's row: the workers' lock-delay, lease-core's default 15 s, as the driver passes
    /// none) or the settle time (etcd, RabbitMQ: 100 ms). Then a waiter's next try may sit out
    /// one retry pause (the backends' longest is Consul's 2 s budget gate; the worker adds
    /// 200 ms after a failed acquire), and [`RECOVERY_MARGIN`] covers the rest: a replacement
    /// worker's start, its acquire's round trips and its first write, on a loaded machine.
    /// `consul lock` (the reference) has its own session: TTL 15 s and lock-delay 15 s.
    pub fn recovery_bound(&self) -> Duration {
        let bar = match self.backend {
            Backend::Consul | Backend::ConsulCluster => Duration::from_millis(self.lock_delay_ms),
            Backend::ConsulLock => Duration::from_secs(15),
            Backend::Postgres | Backend::Redis => lease_core::LeaseSpec::DEFAULT_LOCK_DELAY,
            Backend::Etcd | Backend::Amqp => lease_core::LeaseSpec::DEFAULT_SETTLE,
        };
        self.crash_expiry() + bar + RETRY_PAUSE + RECOVERY_MARGIN
    }

    /// How long after a crash the backend may keep the crashed worker's session or queue.
    fn crash_expiry(&self) -> Duration {
        match self.backend {
            Backend::Amqp => Duration::from_secs(AMQP_HEARTBEAT_SECS * 3),
            // Consul invalidates a TTL session between TTL and 2 × TTL after its last renewal.
            Backend::Consul | Backend::ConsulCluster => Duration::from_secs(self.ttl_secs * 2 + 1),
            // `consul lock` sessions have a 15 s TTL.
            Backend::ConsulLock => Duration::from_secs(31),
            // etcd expires a lease one TTL after its last keep-alive (checked every 500 ms).
            Backend::Etcd => Duration::from_secs(self.ttl_secs + 3),
            // A row expires one TTL after its last renewal, by the database's clock; a Redis key
            // by the server's.
            Backend::Postgres | Backend::Redis => Duration::from_secs(self.ttl_secs + 3),
        }
    }
}

/// One planned fault: when (from the start of the schedule), what, and on which worker slot.
#[derive(Clone, Debug)]
pub struct Planned {
    /// Offset from the start.
    pub at: Duration,
    /// The fault.
    pub fault: Fault,
    /// The worker slot it hits (or picks a holder with).
    pub pick: u64,
    /// How long it lasts (pause, blackhole, 500s, a removed slot).
    pub lasts: Duration,
}

/// The schedule drawn from the scenario's seed: faults at gaps uniform in 0.4–1.6 × the mean gap,
/// the first after one mean gap; none in the last 2 s (restorations, such as the end of a pause,
/// may fall later and extend the run). Each kind comes once first, in a seeded order; after that
/// kills and pauses are the rarer half.
pub fn schedule(scenario: &Scenario) -> Vec<Planned> {
    let mut rng = Rng::new(scenario.seed);
    let kinds = scenario.fault_kinds();
    let mean = scenario.mean_gap.as_millis() as u64;
    let end = scenario.duration.saturating_sub(Duration::from_secs(2));
    let mut at = scenario.mean_gap;
    let mut plan = Vec::new();
    let (pause_lo, pause_hi) = scenario.pause_range_ms();
    // Every kind once first, in a seeded order, so even a short run meets each of them.
    let mut first_round = kinds.clone();
    for i in (1..first_round.len()).rev() {
        first_round.swap(i, rng.below(i as u64 + 1) as usize);
    }
    first_round.reverse();
    while at < end {
        // Kill and pause take a worker out for a TTL; give them half the weight of the others.
        let fault = if let Some(k) = first_round.pop() {
            k
        } else {
            loop {
                let k = kinds[rng.below(kinds.len() as u64) as usize];
                if !matches!(k, Fault::Kill9 | Fault::Pause) || rng.below(2) == 0 {
                    break k;
                }
            }
        };
        let lasts = match fault {
            Fault::Pause => rng.millis(pause_lo, pause_hi),
            Fault::Blackhole => rng.millis(500, scenario.ttl_secs * 1000 + 4000),
            Fault::Http500 => rng.millis(300, 6000),
            Fault::RemoveSlot => rng.millis(200, 2000),
            // How long the killed server stays down.
            Fault::RaftLeaderKill => rng.millis(2000, 6000),
            _ => Duration::ZERO,
        };
        plan.push(Planned {
            at,
            fault,
            pick: rng.next_u64(),
            lasts,
        });
        at += rng.millis(mean * 2 / 5, mean * 8 / 5);
    }
    plan
}

/// What a scenario showed.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// The scenario's name.
    pub scenario: String,
    /// Its seed.
    pub seed: u64,
    /// The limit judged against.
    pub limit: usize,
    /// `acquired` lines.
    pub acquisitions: usize,
    /// `write` lines.
    pub writes: usize,
    /// Faults injected, by kind (a fault with nothing to hit, e.g. no holder, is not counted).
    pub faults: BTreeMap<&'static str, usize>,
    /// The most sequencers writing at once.
    pub max_concurrent: usize,
    /// Writes after the writer was superseded.
    pub stale_writes: usize,
    /// Single writes right after a SIGCONT (the window no library can close), exempted.
    pub resumed_writes: usize,
    /// What was left behind after the run.
    pub leaks: Vec<String>,
    /// Workers not gone 2 s after SIGTERM (or that died on their own).
    pub hangs: Vec<String>,
    /// `lost` lines in a scenario whose faults are all brief trouble (raft leader kills): every
    /// one is false; `None` where losses are expected.
    pub false_losses: Option<usize>,
    /// How long each raft election took, from the `kill -9` to a new leader (ms).
    pub elections_ms: Vec<f64>,
    /// Hand-off gaps, p50 and p99 (ms); NaN for a semaphore of more than one slot.
    pub handoff_ms: (f64, f64),
    /// A fenced scenario's table: rows, stale rows, writes refused by the fence.
    pub fenced: Option<FencedCounts>,
    /// From each fault's heal to the next write by any worker (ms), for every heal followed
    /// by a write (see [`judge_recovery`]).
    pub recovery_ms: Vec<f64>,
    /// The bound those are judged against ([`Scenario::recovery_bound`]).
    pub recovery_bound: Duration,
    /// Heals after which no holder ran within the bound.
    pub recovery_violations: usize,
    /// Panic records of the workers (see [`crate::panics`]); any is a violation.
    pub panics: usize,
    /// From a heal to the next `reachable` of the worker it left unreachable (ms; see
    /// [`judge_reachability`]).
    pub reachable_ms: Vec<f64>,
    /// Workers still unreachable at their deadline after a heal.
    pub reachability_violations: usize,
    /// Every violation, each with the interleaving around it.
    pub violations: Vec<String>,
    /// Where the files are.
    pub files: String,
}

impl Report {
    /// The header of [`row`](Report::row).
    pub fn header() -> String {
        format!(
            "{:<22} {:>10} {:>6} {:>7} {:<56} {:>7} {:>6} {:>5} {:>5} {:>5} {:>5} {:>15} {:>17} {:>25} {:>26} {:>5} {:>6} {:>14} {:>5}",
            "scenario",
            "seed",
            "acq",
            "writes",
            "faults",
            "max/lim",
            "stale",
            "resum",
            "leaks",
            "hangs",
            "false",
            "elect p50/max",
            "hand-off p50/p99",
            "fenced rows/stale/refused",
            "recovery p50/p99/max (bound)",
            "live",
            "panics",
            "reach p50/max",
            "unrch"
        )
    }

    /// One line of the table.
    pub fn row(&self) -> String {
        let faults: Vec<String> = self
            .faults
            .iter()
            .map(|(k, n)| format!("{k}:{n}"))
            .collect();
        format!(
            "{:<22} {:>10} {:>6} {:>7} {:<56} {:>7} {:>6} {:>5} {:>5} {:>5} {:>5} {:>15} {:>17} {:>25} {:>26} {:>5} {:>6} {:>14} {:>5}",
            self.scenario,
            self.seed,
            self.acquisitions,
            self.writes,
            faults.join(" "),
            format!("{}/{}", self.max_concurrent, self.limit),
            self.stale_writes,
            self.resumed_writes,
            self.leaks.len(),
            self.hangs.len(),
            self.false_losses
                .map_or_else(|| "-".to_owned(), |n| n.to_string()),
            if self.elections_ms.is_empty() {
                "-".to_owned()
            } else {
                let mut sorted = self.elections_ms.clone();
                sorted.sort_by(f64::total_cmp);
                let p50 = sorted[sorted.len() / 2];
                let max = sorted[sorted.len() - 1];
                format!("{p50:.0}/{max:.0} ms")
            },
            if self.handoff_ms.0.is_nan() {
                "-".to_owned()
            } else {
                format!("{:.0}/{:.0} ms", self.handoff_ms.0, self.handoff_ms.1)
            },
            self.fenced.as_ref().map_or_else(
                || "-".to_owned(),
                |f| format!("{}/{}/{}", f.rows, f.stale_rows, f.refused)
            ),
            if self.recovery_ms.is_empty() {
                "-".to_owned()
            } else {
                format!(
                    "{} ({:.0} s)",
                    summary_ms(&self.recovery_ms, &[50.0, 99.0]),
                    self.recovery_bound.as_secs_f64()
                )
            },
            self.recovery_violations,
            self.panics,
            summary_ms(&self.reachable_ms, &[50.0]),
            self.reachability_violations
        )
    }

    /// Panics with the seed and the interleavings if anything was violated.
    pub fn assert_clean(&self) {
        if self.violations.is_empty() {
            return;
        }
        panic!(
            "chaos scenario {} with seed {} (replay: CHAOS_SEED={}): {} violation(s)\n{}\n({})",
            self.scenario,
            self.seed,
            self.seed,
            self.violations.len(),
            self.violations.join("\n\n"),
            self.files
        );
    }
}

/// `samples` at `percentiles`, then their max: `p…/max ms`; `-` if there are none.
fn summary_ms(samples: &[f64], percentiles: &[f64]) -> String {
    if samples.is_empty() {
        return "-".to_owned();
    }
    let mut parts: Vec<String> = (percentiles.iter())
        .map(|p| format!("{:.0}", crate::stats::percentile(samples, *p)))
        .collect();
    parts.push(format!(
        "{:.0}",
        samples.iter().copied().fold(f64::MIN, f64::max)
    ));
    format!("{} ms", parts.join("/"))
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}\n{}", Report::header(), self.row())
    }
}

/// The verdicts of the histories: counts, and violations with the interleaving around each.
///
/// `resumes` are `(pid, SIGCONT instant)`: the first write of that pid after it, if stale, is
/// the unclosable window (see the module docs) and is counted in `resumed_writes` instead.
pub fn judge(
    history: &History,
    limit: usize,
    shared_slots: bool,
    resumes: &[(u32, u128)],
) -> Report {
    let stale_of = |h: &History| {
        if shared_slots {
            h.stale_writes_shared(limit)
        } else {
            h.stale_writes()
        }
    };
    // Judge without the resumed writes; count as resumed only those that were stale.
    let (judged, exempt) = history.without_resumed_writes(resumes);
    let stale_with: Vec<u128> = stale_of(history).iter().map(|w| w.t).collect();
    let resumed_writes = exempt.iter().filter(|l| stale_with.contains(&l.t)).count();
    let mut report = Report {
        limit,
        resumed_writes,
        ..Report::default()
    };
    report.acquisitions = history
        .lines()
        .iter()
        .filter(|l| l.kind == Kind::Acquired)
        .count();
    report.writes = history
        .lines()
        .iter()
        .filter(|l| l.kind == Kind::Write)
        .count();
    let over = judged.max_concurrent_writers(limit);
    report.max_concurrent = over.count;
    if over.exceeds_limit() {
        report.violations.push(format!(
            "{over}\n--- interleaving (faults are pid 0):\n{}",
            history.around(over.at, 12)
        ));
    }
    let stale = stale_of(&judged);
    report.stale_writes = stale.len();
    if let Some(first) = stale.first() {
        report.violations.push(format!(
            "{} stale write(s); the first: {first}\n--- interleaving (faults are pid 0):\n{}",
            stale.len(),
            history.around(first.t, 12)
        ));
    }
    // With more than one slot, holders overlap by design: the gap says nothing there.
    report.handoff_ms = if limit == 1 {
        gap_percentiles(&judged.handoff_gaps())
    } else {
        (f64::NAN, f64::NAN)
    };
    report
}

/// One fault as the faults log tells it (see [`episodes`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Episode {
    /// The fault line's text (`pause w1 pid 123 … for 11.2s`).
    pub text: String,
    /// When it was injected (ns).
    pub start: u128,
    /// When it healed (ns); `None` if it had not when the run stopped.
    pub heal: Option<u128>,
}

/// The faults of a run and when each healed, from the `fault` lines of `faults.history` (pid 0).
///
/// "Heals" per kind: a fault that lasts heals at its end line: a pause at `end pause w<s>` (the
/// SIGCONT), a blackhole or 500s at `end proxy fault w<s>` (a second proxy fault on the same
/// worker replaces the first's end, so that end heals both), a removed slot at `end rm-slot`, a
/// killed raft leader at `restart s<i>` (back, or given up). Every other fault heals the instant it
/// is made: `kill9` (a replacement worker starts at once: the crashed one is gone, though the
/// backend may keep its claim until it expires), `destroy`, `delete`, `revoke`,
/// `pg_terminate_backend`, `cut`, `close-conn`. Informational lines
/// (`seed`, `election:`, `settled:`, `stop:`) are not faults.
pub fn episodes(history: &History) -> Vec<Episode> {
    let mut found: Vec<Episode> = Vec::new();
    let mut open: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    let fault_lines = (history.lines().iter())
        .filter(|l| l.pid == 0 && l.kind == Kind::Other("fault".to_owned()));
    for line in fault_lines {
        let words: Vec<&str> = line.detail.split_whitespace().collect();
        let word = |i: usize| words.get(i).copied().unwrap_or("");
        // What a lasting fault's end line names: the same key heals it.
        let ends = match (word(0), word(1)) {
            ("seed" | "election:" | "settled:" | "stop:", _) => continue,
            ("end", "pause") => Some(format!("pause {}", word(2))),
            ("end", "proxy") => Some(format!("proxy {}", word(3))),
            ("end", _) => Some("rm-slot".to_owned()),
            ("restart", server) => Some(format!("server {}", server.trim_end_matches(':'))),
            _ => None,
        };
        if let Some(key) = ends {
            for i in open.remove(&key).unwrap_or_default() {
                found[i].heal = Some(line.t);
            }
            continue;
        }
        let lasting = match word(0) {
            "pause" => Some(format!("pause {}", word(1))),
            "blackhole" | "http500" => Some(format!("proxy {}", word(1))),
            "rm-slot" => Some("rm-slot".to_owned()),
            "raft-kill" => Some(format!("server {}", word(1))),
            _ => None,
        };
        found.push(Episode {
            text: line.detail.clone(),
            start: line.t,
            heal: if lasting.is_some() {
                None
            } else {
                Some(line.t)
            },
        });
        if let Some(key) = lasting {
            open.entry(key).or_default().push(found.len() - 1);
        }
    }
    found
}

/// When the run stopped: the `stop:` fault line, else the last line.
fn stop_of(history: &History) -> u128 {
    (history.lines().iter())
        .find(|l| l.pid == 0 && l.detail.starts_with("stop:"))
        .or(history.lines().last())
        .map_or(0, |l| l.t)
}

/// The deadline of the heal at `healed` (see [`judge_recovery`]): `healed + bound`, moved to
/// `heal + bound` of each of `episodes` in force after `healed` that began before the deadline
/// and before `recovered_at`, until none moves it; with the faults that moved it.
fn deadline(
    healed: u128,
    bound_ns: u128,
    episodes: &[Episode],
    stop: u128,
    recovered_at: u128,
) -> (u128, Vec<String>) {
    let mut deadline = healed + bound_ns;
    let mut moved_by = Vec::new();
    loop {
        let before = deadline;
        for other in episodes {
            let other_heal = other.heal.unwrap_or(stop);
            let in_force = other.start < recovered_at.min(deadline) && other_heal > healed;
            if in_force && other_heal + bound_ns > deadline {
                deadline = other_heal + bound_ns;
                moved_by.push(other.text.clone());
            }
        }
        if deadline == before {
            return (deadline, moved_by);
        }
    }
}

/// What [`judge_recovery`] found.
#[derive(Clone, Debug, Default)]
pub struct Recovery {
    /// From each heal to the next write (ms), for every heal followed by one.
    pub times_ms: Vec<f64>,
    /// Each heal after which no holder ran in time, with the interleaving around it.
    pub violations: Vec<String>,
    /// Heals whose deadline fell after the run stopped, with no write after them: not judged.
    pub undecided: usize,
}

/// The liveness verdict: after every fault heals ([`episodes`]), a holder runs again (a `write`
/// line in `judged`, the history without the exempt resumed writes) within `bound`.
///
/// Faults overlap: with a fault every few seconds, the next often begins before the last has
/// healed, or before the lease found a holder again. A fault that is still in force at the heal,
/// or that begins after it but before any holder ran, may keep the lease from a holder until it
/// heals in turn: the deadline of the heal `h` is `h + bound`, moved to `heal + bound` of each
/// such fault (one not healed when the run stopped counts as healed at the stop), repeated until
/// no fault moves it. A fault that healed before `h` needs nothing more: whatever claim it left
/// behind is gone `bound` after its own heal, before `h + bound`. So a backend that recovers
/// between faults is judged heal by heal, and one that never recovers fails at the latest on the
/// last heal, which the driver leaves time for (it waits, bounded, for a holder before it stops
/// the workers). The run's stop is the `stop:` fault line, else the last line.
pub fn judge_recovery(history: &History, judged: &History, bound: Duration) -> Recovery {
    let bound_ns = bound.as_nanos();
    let episodes = episodes(history);
    let stop = stop_of(history);
    let writes: Vec<u128> = (judged.lines().iter())
        .filter(|l| l.kind == Kind::Write)
        .map(|l| l.t)
        .collect();
    let mut recovery = Recovery::default();
    for episode in &episodes {
        let Some(healed) = episode.heal.filter(|&h| h < stop) else {
            continue;
        };
        let next_write = writes.get(writes.partition_point(|&w| w < healed)).copied();
        if let Some(w) = next_write {
            recovery.times_ms.push((w - healed) as f64 / 1e6);
        }
        let recovered_at = next_write.unwrap_or(u128::MAX);
        let (deadline, moved_by) = deadline(healed, bound_ns, &episodes, stop, recovered_at);
        match next_write {
            Some(w) if w <= deadline => {}
            None if deadline > stop => recovery.undecided += 1,
            _ => {
                let came = next_write.map_or_else(
                    || "no holder ran before the run stopped".to_owned(),
                    |w| {
                        format!(
                            "the next write came {:.3} s after it",
                            (w - healed) as f64 / 1e9
                        )
                    },
                );
                let moved = if moved_by.is_empty() {
                    String::new()
                } else {
                    format!(
                        "; the deadline moved to {:.3} s after it by faults in force before a \
                         holder ran: {}",
                        (deadline - healed) as f64 / 1e9,
                        moved_by.join("; ")
                    )
                };
                recovery.violations.push(format!(
                    "no holder ran within {bound:?} of the heal of `{}`: {came}{moved}\n\
                     --- interleaving (faults are pid 0; >> marks the heal):\n{}",
                    episode.text,
                    history.around(healed, 12)
                ));
            }
        }
    }
    recovery
}

/// The worker process a fault line names (`… w<s> pid <pid> …`), if any.
fn pid_of(text: &str) -> Option<u32> {
    let mut words = text.split_whitespace();
    words.find(|w| *w == "pid")?;
    words.next()?.parse().ok()
}

/// What [`judge_reachability`] found.
#[derive(Clone, Debug, Default)]
pub struct ReachabilityVerdict {
    /// From each heal of a fault on a worker that left it `unreachable` to its next
    /// `reachable` line (ms).
    pub back_ms: Vec<f64>,
    /// Workers still `unreachable` at their deadline after a heal, with the interleaving.
    pub violations: Vec<String>,
}

/// Reachability comes back (issue 33): after a fault on one worker heals (a pause, a proxy fault,
/// a cut, a closed connection: the faults whose line names its pid; a killed worker is gone),
/// that worker's `Backend::reachability()`, which `lease-worker` logs as `reachability` lines,
/// must not read `unreachable` at `heal + bound`. The deadline moves, as in [`judge_recovery`],
/// for the faults on the same worker in force before it. A worker that logs no reachability,
/// is killed before its deadline, or whose deadline falls after the run stopped is not judged.
pub fn judge_reachability(history: &History, bound: Duration) -> ReachabilityVerdict {
    let bound_ns = bound.as_nanos();
    let episodes = episodes(history);
    let stop = stop_of(history);
    let reach = Kind::Other("reachability".to_owned());
    let mut verdict = ReachabilityVerdict::default();
    for episode in &episodes {
        let (Some(healed), Some(pid)) = (episode.heal, pid_of(&episode.text)) else {
            continue;
        };
        let states: Vec<&Line> = history.of_pid(pid).filter(|l| l.kind == reach).collect();
        if healed >= stop || states.is_empty() || episode.text.starts_with("kill9") {
            continue;
        }
        let state_at = |t: u128| {
            (states.iter().rev())
                .find(|l| l.t <= t)
                .map_or("unknown", |l| l.detail.as_str())
        };
        if state_at(healed) == "unreachable" {
            if let Some(back) = (states.iter()).find(|l| l.t >= healed && l.detail == "reachable") {
                verdict.back_ms.push((back.t - healed) as f64 / 1e6);
            }
        }
        let same: Vec<Episode> = (episodes.iter())
            .filter(|e| pid_of(&e.text) == Some(pid))
            .cloned()
            .collect();
        let (deadline, _) = deadline(healed, bound_ns, &same, stop, u128::MAX);
        let killed = (same.iter()).any(|e| e.text.starts_with("kill9") && e.start < deadline);
        if killed || deadline > stop || state_at(deadline) != "unreachable" {
            continue;
        }
        verdict.violations.push(format!(
            "pid {pid} still read unreachable {:.3} s after the heal of `{}` (bound {bound:?})\n\
             --- interleaving (faults are pid 0; >> marks the heal):\n{}",
            (deadline - healed) as f64 / 1e9,
            episode.text,
            history.around(healed, 12)
        ));
    }
    verdict
}

/// What a fenced scenario's table showed (see [`stale_rows`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FencedCounts {
    /// Committed rows of `chaos_writes`.
    pub rows: usize,
    /// Rows whose index is below (or, under another holder, equal to) the highest index
    /// committed before them for their key. Must be 0.
    pub stale_rows: usize,
    /// Writes the fence refused (`refused` history lines: `LF001` stale, `LF002` index reused),
    /// rolled back with their transaction.
    pub refused: usize,
    /// Fenced transactions that failed otherwise (`failed` lines: a connection lost, ...).
    pub failed: usize,
}

/// One committed row of a fenced scenario's `chaos_writes`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FencedRow {
    /// Its place in commit order (see [`stale_rows`]).
    pub commit_order: i64,
    /// The lease key of the sequencer it was fenced with.
    pub key: String,
    /// That sequencer's index.
    pub index: i64,
    /// That sequencer's holder (Consul session, etcd lease).
    pub holder: String,
    /// The writing process.
    pub pid: i64,
}

/// The stale rows of a fenced table, each with the row it is stale against. Taking `rows` in
/// commit order, a row is stale if its index is below the highest index committed before it for
/// its key, or equal to it under another holder (two acquisitions claiming one index, which the
/// fence refuses with `LF002`).
///
/// Why `commit_order` is the commit order: each writing transaction, after its fence call, takes
/// the next number from a one-row counter (`UPDATE chaos_commit_order SET n = n + 1 RETURNING
/// n`) and stores it in its row. That update holds the counter's row lock until the transaction
/// commits or rolls back, and a concurrent update waits for it and then reads the committed
/// value (READ COMMITTED). So of two committed transactions, the one that committed first took
/// the lower number; a rolled-back one leaves neither its row nor its number. The order rests on
/// PostgreSQL's row locking alone, not on the fence it judges. (A bigserial would not do: it is
/// drawn when the row is inserted, and two transactions may commit in the other order; it equals
/// commit order only as long as the fence serialises the writers, which is what is on trial.)
pub fn stale_rows(rows: &[FencedRow]) -> Vec<(FencedRow, FencedRow)> {
    let mut highest: BTreeMap<&str, &FencedRow> = BTreeMap::new();
    let mut stale = Vec::new();
    let mut sorted: Vec<&FencedRow> = rows.iter().collect();
    sorted.sort_by_key(|r| r.commit_order);
    for row in sorted {
        match highest.get(row.key.as_str()) {
            Some(top)
                if row.index < top.index
                    || (row.index == top.index && row.holder != top.holder) =>
            {
                stale.push((row.clone(), (*top).clone()));
            }
            Some(top) if row.index == top.index => {}
            _ => {
                highest.insert(&row.key, row);
            }
        }
    }
    stale
}

/// The database of a fenced scenario: the fence installed, `chaos_writes` and its commit counter
/// created empty.
async fn fenced_db(scenario: &Scenario) -> TestDb {
    let db = TestDb::create(&format!("chaos_{}", scenario.name)).await;
    let client = db.connect().await;
    lease_postgres::fence::tokio_postgres::install(&client)
        .await
        .unwrap_or_else(|e| panic!("cannot install the fence in {}: {e}", db.name()));
    client
        .batch_execute(
            "CREATE TABLE chaos_commit_order (n bigint NOT NULL); \
             INSERT INTO chaos_commit_order VALUES (0); \
             CREATE TABLE chaos_writes (commit_order bigint PRIMARY KEY, \
               lease_key text NOT NULL, lease_index bigint NOT NULL, holder text NOT NULL, \
               pid bigint NOT NULL, written_at timestamptz NOT NULL DEFAULT clock_timestamp())",
        )
        .await
        .unwrap_or_else(|e| panic!("cannot create the tables in {}: {e}", db.name()));
    db
}

/// Judges a fenced scenario's table, and counts its refusals, into `report`.
async fn judge_fenced(db: &TestDb, history: &History, report: &mut Report) {
    let client = db.connect().await;
    let rows: Vec<FencedRow> = client
        .query(
            "SELECT commit_order, lease_key, lease_index, holder, pid FROM chaos_writes \
             ORDER BY commit_order",
            &[],
        )
        .await
        .unwrap_or_else(|e| panic!("cannot read chaos_writes of {}: {e}", db.name()))
        .iter()
        .map(|r| FencedRow {
            commit_order: r.get(0),
            key: r.get(1),
            index: r.get(2),
            holder: r.get(3),
            pid: r.get(4),
        })
        .collect();
    let count = |word: &str| {
        (history.lines().iter())
            .filter(|l| l.kind == Kind::Other(word.to_owned()))
            .count()
    };
    let stale = stale_rows(&rows);
    if let Some((row, top)) = stale.first() {
        let around: Vec<String> = (rows.iter())
            .filter(|r| (r.commit_order - row.commit_order).abs() <= 5)
            .map(|r| format!("{r:?}"))
            .collect();
        report.violations.push(format!(
            "{} stale row(s) in chaos_writes; the first: {row:?}, committed after {top:?}\n\
             --- rows around it, in commit order:\n{}",
            stale.len(),
            around.join("\n")
        ));
    }
    if rows.is_empty() {
        report
            .violations
            .push("no row was written through the fence: the run proves nothing".to_owned());
    }
    // Every row has its `write` line, logged before its commit.
    if rows.len() > report.writes {
        report.violations.push(format!(
            "{} rows but only {} write lines: rows written behind the histories' back",
            rows.len(),
            report.writes
        ));
    }
    report.fenced = Some(FencedCounts {
        rows: rows.len(),
        stale_rows: stale.len(),
        refused: count("refused"),
        failed: count("failed"),
    });
}

/// The fault log: one history line per fault, pid 0, event `fault`.
#[derive(Debug)]
struct FaultLog {
    file: std::fs::File,
}

impl FaultLog {
    fn log(&mut self, what: &str) {
        use std::io::Write;
        let line = format!("{} 0 fault - {what}\n", now_ns());
        self.file
            .write_all(line.as_bytes())
            .expect("cannot append to the fault log");
    }
}

/// A contending process and what hits it.
#[derive(Debug)]
struct Slot {
    /// Index into the run's processes of the current incarnation.
    process: usize,
    generation: usize,
    proxy: Option<Proxy>,
    paused_until: Option<Instant>,
}

/// Restorations the driver owes: end a pause, lift a proxy fault, give a slot back.
#[derive(Debug)]
enum Restore {
    Cont(usize),
    Forward(usize),
    AddSlot,
    /// Start the killed server `i` again.
    Restart(usize),
}

/// A PostgreSQL scenario's database, the operator's session for its own statements
/// (`pg_terminate_backend`, the leftovers), and the backend handle whose operator actions delete
/// holders' rows.
#[derive(Debug)]
struct PgServices {
    db: TestDb,
    admin: tokio_postgres::Client,
    operator: lease_postgres::Postgres,
}

/// The services one scenario runs against.
#[derive(Debug)]
struct Services {
    agent: Option<Agent>,
    cluster: Option<Cluster>,
    amqp: Option<lease_amqp::Amqp>,
    amqp_url: String,
    etcd: Option<EtcdServer>,
    key: String,
    /// A fenced scenario's database.
    db: Option<TestDb>,
    /// A PostgreSQL scenario's database and the operator's handles on it.
    postgres: Option<PgServices>,
    /// A Redis scenario's server, and the operator's backend handle on it.
    redis: Option<(RedisServer, lease_redis::Redis)>,
}

impl Services {
    /// The operator API: the dev agent's, or the cluster's client agent's.
    fn api(&self) -> Option<&Api> {
        match (&self.agent, &self.cluster) {
            (Some(agent), _) => Some(agent),
            (None, Some(cluster)) => Some(cluster),
            (None, None) => None,
        }
    }
}

/// Runs `scenario` with `worker_bin` (`env!("CARGO_BIN_EXE_lease-worker")`) and judges it.
pub async fn run(scenario: &Scenario, worker_bin: &Path) -> Report {
    let mut run = Run::new("chaos", &scenario.name, worker_bin);
    run.exit_within = EXIT_WITHIN;
    if let Some(point) = &scenario.panic_at {
        run.env(crate::panics::INJECT_ENV, point);
    }
    let mut services = match scenario.backend {
        Backend::Consul | Backend::ConsulLock => Services {
            agent: Some(Agent::start().await),
            cluster: None,
            amqp: None,
            amqp_url: String::new(),
            etcd: None,
            key: format!("chaos/{}", scenario.name),
            db: None,
            postgres: None,
            redis: None,
        },
        Backend::ConsulCluster => Services {
            agent: None,
            cluster: Some(Cluster::start(3).await),
            amqp: None,
            amqp_url: String::new(),
            etcd: None,
            key: format!("chaos/{}", scenario.name),
            db: None,
            postgres: None,
            redis: None,
        },
        Backend::Amqp => {
            crate::amqp::require_broker().await;
            let base = crate::amqp::url();
            let sep = if base.contains('?') { '&' } else { '?' };
            Services {
                agent: None,
                cluster: None,
                amqp: Some(crate::amqp::backend().0),
                amqp_url: format!("{base}{sep}heartbeat={AMQP_HEARTBEAT_SECS}"),
                etcd: None,
                key: crate::amqp::unique(&format!("chaos-{}", scenario.name)),
                db: None,
                postgres: None,
                redis: None,
            }
        }
        Backend::Etcd => Services {
            agent: None,
            cluster: None,
            amqp: None,
            amqp_url: String::new(),
            etcd: Some(EtcdServer::start().await),
            key: format!("chaos/{}", scenario.name),
            db: None,
            postgres: None,
            redis: None,
        },
        Backend::Postgres => {
            let db = TestDb::create(&format!("chaos_{}", scenario.name)).await;
            let admin = db.connect().await;
            // Not named `chaos-…`, so its sessions are not taken for a worker's leftovers.
            let operator = lease_postgres::Postgres::builder()
                .url(db.url())
                .application_name("lease-chaos-operator")
                .build()
                .unwrap_or_else(|e| panic!("the operator's PostgreSQL handle: {e}"));
            Services {
                agent: None,
                cluster: None,
                amqp: None,
                amqp_url: String::new(),
                etcd: None,
                key: format!("chaos/{}", scenario.name),
                db: None,
                postgres: Some(PgServices {
                    db,
                    admin,
                    operator,
                }),
                redis: None,
            }
        }
        Backend::Redis => {
            let server =
                RedisServer::with_args(&["--appendonly", "yes", "--appendfsync", "always"]).await;
            let operator = lease_redis::Redis::new(&server.url())
                .unwrap_or_else(|e| panic!("the operator's Redis handle: {e}"));
            Services {
                agent: None,
                cluster: None,
                amqp: None,
                amqp_url: String::new(),
                etcd: None,
                key: format!("chaos/{}", scenario.name),
                db: None,
                postgres: None,
                redis: Some((server, operator)),
            }
        }
    };
    if scenario.fenced {
        services.db = Some(fenced_db(scenario).await);
    }
    let mut faults = FaultLog {
        file: std::fs::File::create(run.dir.join("faults.history")).unwrap(),
    };
    faults.log(&format!(
        "seed {} scenario {}",
        scenario.seed, scenario.name
    ));

    let mut slots = Vec::new();
    for i in 0..scenario.workers {
        let upstream = match scenario.backend {
            Backend::Consul | Backend::ConsulLock => services.agent.as_ref().map(Agent::addr),
            Backend::Etcd => services.etcd.as_ref().map(EtcdServer::addr),
            Backend::Postgres => Some(pg::server_addr(&pg::url())),
            Backend::Redis => services.redis.as_ref().map(|(server, _)| server.addr()),
            Backend::ConsulCluster | Backend::Amqp => None,
        };
        let proxy = match upstream {
            Some(addr) => Some(Proxy::start(addr).await.unwrap()),
            None => None,
        };
        let mut slot = Slot {
            process: 0,
            generation: 0,
            proxy,
            paused_until: None,
        };
        slot.process = start(&mut run, scenario, &services, &slot, i);
        slots.push(slot);
    }

    let mut report_extra = Vec::new();
    // The clock starts at the first write, so a slow start does not eat the schedule.
    let first_write = tokio::time::timeout(Duration::from_secs(60), async {
        while !run.all().lines().iter().any(|l| l.kind == Kind::Write) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    if first_write.is_err() {
        report_extra.push(format!("no worker wrote within 60 s; {}", run.files()));
    }

    let start_at = Instant::now();
    let mut plan = schedule(scenario);
    plan.reverse();
    let mut owed: Vec<(Instant, Restore)> = Vec::new();
    let mut rng = Rng::new(scenario.seed ^ 0x5EED);
    let mut counts: BTreeMap<&'static str, usize> = BTreeMap::new();
    let mut resumes: Vec<(u32, u128)> = Vec::new();
    let mut last_crash: Option<Instant> = None;
    let mut elections: Vec<f64> = Vec::new();
    loop {
        let next_fault = plan.last().map(|p| start_at + p.at);
        let next_owed = owed.iter().map(|(t, _)| *t).min();
        let next = match (next_fault, next_owed) {
            (Some(a), Some(b)) => a.min(b),
            (Some(a), None) | (None, Some(a)) => a,
            (None, None) => break,
        };
        // Fault scheduling by the seeded clock: this sleep is the schedule, not a wait.
        tokio::time::sleep_until(next).await;
        let now = Instant::now();
        if let Some(i) = owed.iter().position(|(t, _)| *t <= now) {
            let (_, restore) = owed.swap_remove(i);
            match restore {
                Restore::Cont(s) => {
                    let pid = run.pid(slots[s].process);
                    if run.running(slots[s].process) {
                        let t = now_ns();
                        signal("CONT", &[pid]);
                        resumes.push((pid, t));
                        faults.log(&format!("end pause w{s} pid {pid}"));
                    }
                    slots[s].paused_until = None;
                }
                Restore::Forward(s) => {
                    if let Some(p) = &slots[s].proxy {
                        p.set_mode(Mode::Forward);
                        faults.log(&format!("end proxy fault w{s}"));
                    }
                }
                Restore::AddSlot => {
                    let detail = restore_slots(&services, scenario.limit.unwrap_or(1)).await;
                    faults.log(&format!("end rm-slot: {detail}"));
                }
                Restore::Restart(i) => {
                    if let Some(cluster) = services.cluster.as_mut() {
                        match cluster.restart(i).await {
                            Ok(took) => faults.log(&format!("restart s{i}: rejoined in {took:?}")),
                            Err(e) => {
                                faults.log(&format!("restart s{i}: {e}"));
                                report_extra.push(format!("server s{i} did not come back: {e}"));
                            }
                        }
                    }
                }
            }
            continue;
        }
        let Some(p) = plan.pop() else { continue };
        let s = (p.pick % slots.len() as u64) as usize;
        let injected = inject(
            &p,
            s,
            scenario,
            &mut services,
            &mut run,
            &mut slots,
            &mut faults,
            &mut owed,
            &mut rng,
            &mut elections,
        )
        .await;
        if injected {
            *counts.entry(p.fault.name()).or_default() += 1;
            if p.fault == Fault::Kill9 || p.fault == Fault::Pause {
                // The latest: a kill after a long pause began must not move it earlier.
                last_crash = last_crash.max(Some(Instant::now() + p.lasts));
            }
        }
    }

    // Every fault has healed: leave the lease time to find a holder (bounded), so that the
    // last heal is judged too (see `judge_recovery`). Usually one is writing already.
    let healed = now_ns();
    let settled = tokio::time::timeout(scenario.recovery_bound(), async {
        loop {
            let (judged, _) = run.all().without_resumed_writes(&resumes);
            if (judged.lines().iter()).any(|l| l.kind == Kind::Write && l.t >= healed) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    faults.log(&format!(
        "settled: {} {:.3} s after the last heal",
        if settled.is_ok() {
            "a holder ran"
        } else {
            "no holder ran"
        },
        (now_ns() - healed) as f64 / 1e9
    ));

    // A worker that died on its own is a finding, not a crash of the test.
    let mut hangs = Vec::new();
    for w in 0..run.workers.len() {
        if !run.workers[w].exited && !run.running(w) {
            let log = std::fs::read_to_string(&run.workers[w].log).unwrap_or_default();
            let tail: String = log.lines().rev().take(5).collect::<Vec<_>>().join("\n");
            hangs.push(format!(
                "{} (pid {}) exited by itself; the end of its log:\n{tail}",
                run.workers[w].name, run.workers[w].pid
            ));
            run.workers[w].exited = true;
        }
    }
    faults.log("stop: SIGTERM to every worker");
    if let Err(e) = stop(&mut run, scenario).await {
        hangs.push(e);
    }
    let leaks = leaks(scenario, &services, last_crash).await;

    let history = run.all();
    // Fenced, no write is exempt (see the module docs).
    let exempt = if scenario.fenced { &[][..] } else { &resumes };
    let mut report = judge(
        &history,
        scenario.limit_n(),
        scenario.limit.is_some() && scenario.backend != Backend::Amqp,
        exempt,
    );
    if let Some(db) = &services.db {
        judge_fenced(db, &history, &mut report).await;
    }
    let (judged, _) = history.without_resumed_writes(exempt);
    let recovery = judge_recovery(&history, &judged, scenario.recovery_bound());
    report.recovery_ms = recovery.times_ms;
    report.recovery_bound = scenario.recovery_bound();
    report.recovery_violations = recovery.violations.len();
    report.violations.extend(recovery.violations);
    let reachability = judge_reachability(&history, scenario.recovery_bound());
    report.reachable_ms = reachability.back_ms;
    report.reachability_violations = reachability.violations.len();
    report.violations.extend(reachability.violations);
    let panics = run.panics();
    report.panics = panics.len();
    for record in &panics {
        // Marked at the history's own line of it, if the hook could write one.
        let at = (history.lines().iter())
            .find(|l| l.kind == Kind::Panic && l.pid == record.pid && l.detail == record.detail)
            .map_or(record.t, |l| l.t);
        report.violations.push(format!(
            "panic in pid {}: {}\n--- interleaving (faults are pid 0):\n{}",
            record.pid,
            record.detail,
            history.around(at, 12)
        ));
    }
    report.scenario = scenario.name.clone();
    report.seed = scenario.seed;
    report.faults = counts;
    report.elections_ms = elections;
    // Brief trouble is not loss: where every fault is of that kind, each `lost` is false.
    if (scenario.fault_kinds().iter()).all(|f| *f == Fault::RaftLeaderKill) {
        let lost: Vec<Line> = (history.lines().iter())
            .filter(|l| l.kind == Kind::Lost)
            .cloned()
            .collect();
        report.false_losses = Some(lost.len());
        if let Some(first) = lost.first() {
            report.violations.push(format!(
                "{} false loss(es) under brief trouble only; the first: {first}\n\
                 --- interleaving (faults are pid 0):\n{}",
                lost.len(),
                history.around(first.t, 12)
            ));
        }
    }
    report.files = run.files();
    for h in &hangs {
        report.violations.push(format!("hang: {h}"));
    }
    for l in &leaks {
        report.violations.push(format!("leak: {l}"));
    }
    report.violations.extend(report_extra);
    if report.acquisitions == 0 {
        report
            .violations
            .push("nothing was acquired: the faults left no room to work".to_owned());
    }
    report.hangs = hangs;
    report.leaks = leaks;
    // The reference is expected to break the promise; its files are kept for reading, but a
    // run of `consul lock` is not a failure of ours.
    // `CHAOS_KEEP=1` keeps the files of a clean run too.
    let keep = std::env::var("CHAOS_KEEP").is_ok_and(|v| v == "1");
    if keep || !report.violations.is_empty() || scenario.backend == Backend::ConsulLock {
        run.keep = true;
    }
    if let Some(amqp) = &services.amqp {
        let _ = amqp.admin().destroy(&services.key).await;
        let _ =
            tokio::time::timeout(Duration::from_secs(5), lease_core::Backend::shutdown(amqp)).await;
    }
    report
}

/// Starts incarnation `slot.generation` of worker slot `i`; returns its process index.
fn start(run: &mut Run, scenario: &Scenario, services: &Services, slot: &Slot, i: usize) -> usize {
    let name = format!("w{i}.{}", slot.generation);
    let mut args: Vec<String> = Vec::new();
    match scenario.backend {
        Backend::Consul | Backend::ConsulCluster => {
            let url = match &services.cluster {
                Some(cluster) => cluster.url(),
                None => slot.proxy.as_ref().map(Proxy::url).unwrap_or_default(),
            };
            args.extend(["--consul".into(), url]);
            args.extend(["--ttl".into(), scenario.ttl_secs.to_string()]);
            args.extend(["--lock-delay".into(), scenario.lock_delay_ms.to_string()]);
        }
        Backend::Amqp => args.extend(["--amqp".into(), services.amqp_url.clone()]),
        Backend::Etcd => {
            let url = slot.proxy.as_ref().map(Proxy::url).unwrap_or_default();
            args.extend(["--etcd".into(), url]);
            args.extend(["--ttl".into(), scenario.ttl_secs.to_string()]);
        }
        Backend::Postgres => {
            let PgServices { db, .. } = services
                .postgres
                .as_ref()
                .expect("a PostgreSQL scenario has its database");
            let proxy = slot.proxy.as_ref().expect("each worker has its proxy");
            let url = pg::through(db.url(), proxy.addr(), &application_name(&name));
            args.extend(["--postgres".into(), url]);
            args.extend(["--ttl".into(), scenario.ttl_secs.to_string()]);
        }
        Backend::Redis => {
            let proxy = slot.proxy.as_ref().expect("each worker has its proxy");
            args.extend(["--redis".into(), format!("redis://{}", proxy.addr())]);
            args.extend(["--ttl".into(), scenario.ttl_secs.to_string()]);
        }
        Backend::ConsulLock => return start_consul_lock(run, scenario, services, slot, &name),
    }
    args.extend(["--key".into(), services.key.clone()]);
    if let Some(limit) = scenario.limit {
        args.extend(["--limit".into(), limit.to_string()]);
    }
    args.extend(["--write-every-ms".into(), "10".into()]);
    args.extend(["--hold-ms".into(), scenario.hold_ms.to_string()]);
    if let Some(db) = &services.db {
        args.extend(["--fenced-writes".into(), db.url().to_owned()]);
    }
    run.spawn(&name, &args)
}

/// The child `consul lock` runs: it appends history lines until it is signalled.
const CONSUL_LOCK_CHILD: &str = r#"trap 'echo "$(date +%s%N) $$ lost $TOK signalled" >> "$HIST"; exit 0' TERM INT
TOK="consul:$$:cl$$:$KEY_OF"
echo "$(date +%s%N) $$ acquired $TOK" >> "$HIST"
end=$(( $(date +%s%N) + HOLD_MS * 1000000 ))
while [ "$(date +%s%N)" -lt "$end" ]; do echo "$(date +%s%N) $$ write $TOK" >> "$HIST"; sleep 0.01; done
echo "$(date +%s%N) $$ released $TOK ok" >> "$HIST""#;

fn start_consul_lock(
    run: &mut Run,
    scenario: &Scenario,
    services: &Services,
    slot: &Slot,
    name: &str,
) -> usize {
    let agent = services
        .agent
        .as_ref()
        .expect("consul lock runs on an agent");
    let addr = slot.proxy.as_ref().map_or(agent.addr(), Proxy::addr);
    spawn_consul_lock_loop(
        run,
        name,
        addr,
        &services.key,
        scenario.limit,
        scenario.hold_ms,
    )
}

/// Starts, as the process called `name` of `run`, a shell loop that plays `lease-worker --mode
/// loop` with `consul lock [-n limit] key` on the agent at `addr`: one `consul lock` per
/// acquisition, whose child appends history lines for `hold_ms`. On SIGTERM it passes the signal
/// on, starts no other `consul lock`, and waits for the last one to give its session back.
pub fn spawn_consul_lock_loop(
    run: &mut Run,
    name: &str,
    addr: std::net::SocketAddr,
    key: &str,
    limit: Option<u32>,
    hold_ms: u64,
) -> usize {
    let history = run.history_path(name);
    let key_of = match limit {
        // The leader's key; a semaphore holder's "contender key" under the prefix.
        None => format!("{key}/.lock"),
        Some(_) => format!("{key}/cl$$"),
    };
    let n = limit.map(|n| format!("-n {n} ")).unwrap_or_default();
    // One started as the signal came is stopped at once.
    let script = format!(
        "stop=; trap 'stop=1; kill -TERM $c 2>/dev/null' TERM; \
         while [ -z \"$stop\" ]; do \"{consul}\" lock {n}{key} \"$CHILD\" & c=$!; \
         [ -n \"$stop\" ] && kill -TERM $c; wait $c; done; wait $c",
        consul = consul_bin().display(),
    );
    let child = CONSUL_LOCK_CHILD.replace("$KEY_OF", &key_of);
    let mut command = Command::new("bash");
    command
        .arg("-c")
        .arg(script)
        .env("CONSUL_HTTP_ADDR", addr.to_string())
        .env(
            "CHILD",
            format!("bash -c '{}'", child.replace('\'', "'\\''")),
        )
        .env("HIST", &history)
        .env("HOLD_MS", hold_ms.to_string());
    run.spawn_command(name, command)
}

/// The child processes of `pid` (from `/proc`).
fn children_of(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// The processes a kill or a pause hits: the worker, or for the reference the `consul lock`
/// process (the shell loop's child), never its child.
fn targets(scenario: &Scenario, pid: u32) -> Vec<u32> {
    match scenario.backend {
        Backend::ConsulLock => children_of(pid),
        _ => vec![pid],
    }
}

/// The `application_name` of worker `name`'s PostgreSQL sessions.
fn application_name(worker: &str) -> String {
    format!("chaos-{worker}")
}

/// The name of the worker that acquired `seq` (from the histories).
fn worker_of(run: &Run, seq: &str) -> Option<String> {
    let history = run.all();
    let pid = (history.lines().iter())
        .find(|l| l.kind == Kind::Acquired && l.seq == seq)?
        .pid;
    (run.workers.iter())
        .find(|w| w.pid == pid)
        .map(|w| w.name.clone())
}

/// The holder a fault with `pick` hits, if any: one of [`holders`], and its parsed sequencer.
fn pick_holder(run: &Run, pick: u64) -> Option<(String, Sequencer)> {
    let held = holders(run);
    if held.is_empty() {
        return None;
    }
    let seq = held[(pick % held.len() as u64) as usize].clone();
    let parsed = seq.parse::<Sequencer>().ok()?;
    Some((seq, parsed))
}

/// The holders now, from the histories: sequencers acquired and not yet lost or released, by a
/// process not killed since (a killed holder logs no loss, and an operator's action on its
/// sequencer would hit nothing, yet count as a fault).
fn holders(run: &Run) -> Vec<String> {
    let killed: Vec<u32> = (run.workers.iter())
        .filter(|w| w.exited)
        .map(|w| w.pid)
        .collect();
    let mut open: BTreeMap<String, bool> = BTreeMap::new();
    for l in run.all().lines() {
        if killed.contains(&l.pid) {
            continue;
        }
        match l.kind {
            Kind::Acquired => {
                open.insert(l.seq.clone(), true);
            }
            Kind::Lost | Kind::Released => {
                open.insert(l.seq.clone(), false);
            }
            _ => {}
        }
    }
    open.into_iter()
        .filter_map(|(seq, held)| held.then_some(seq))
        .collect()
}

#[allow(clippy::too_many_arguments)]
async fn inject(
    p: &Planned,
    s: usize,
    scenario: &Scenario,
    services: &mut Services,
    run: &mut Run,
    slots: &mut [Slot],
    faults: &mut FaultLog,
    owed: &mut Vec<(Instant, Restore)>,
    rng: &mut Rng,
    elections: &mut Vec<f64>,
) -> bool {
    let process = slots[s].process;
    let pid = run.pid(process);
    match p.fault {
        Fault::Kill9 => {
            if slots[s].paused_until.is_some() {
                return false;
            }
            let hit = targets(scenario, pid);
            if scenario.backend == Backend::ConsulLock {
                signal("KILL", &hit);
            } else {
                run.kill9(process).await;
            }
            faults.log(&format!("kill9 w{s} pid {pid} {hit:?}"));
            if scenario.backend != Backend::ConsulLock {
                slots[s].generation += 1;
                slots[s].process = start(run, scenario, services, &slots[s], s);
            }
            true
        }
        Fault::Pause => {
            // One pause at a time, so the others can take over.
            if slots.iter().any(|x| x.paused_until.is_some()) {
                return false;
            }
            let hit = targets(scenario, pid);
            if hit.is_empty() {
                return false;
            }
            signal("STOP", &hit);
            faults.log(&format!("pause w{s} pid {pid} {hit:?} for {:?}", p.lasts));
            let until = Instant::now() + p.lasts;
            slots[s].paused_until = Some(until);
            owed.push((until, Restore::Cont(s)));
            true
        }
        Fault::RevokeLease | Fault::DeleteKey if services.etcd.is_some() => {
            let Some(etcd) = &services.etcd else {
                return false;
            };
            let Some((seq, parsed)) = pick_holder(run, p.pick) else {
                return false;
            };
            if p.fault == Fault::RevokeLease {
                let existed = etcd.revoke(parsed.holder()).await;
                faults.log(&format!(
                    "revoke lease {} (holder {seq}; existed: {existed})",
                    parsed.holder()
                ));
            } else {
                // The holder's own key: `<election>/<lease>` for a leader, the sequencer's key
                // for a semaphore.
                let key = match scenario.limit {
                    None => format!("{}/{}", parsed.key(), parsed.holder()),
                    Some(_) => parsed.key().to_owned(),
                };
                let deleted = etcd.post_delete_one(&key).await;
                faults.log(&format!(
                    "delete key {key} (holder {seq}; deleted: {deleted})"
                ));
            }
            true
        }
        // Only etcd leases can be revoked.
        Fault::RevokeLease => false,
        Fault::DestroySession | Fault::DeleteKey if services.postgres.is_some() => {
            let Some(postgres) = &services.postgres else {
                return false;
            };
            let Some((seq, parsed)) = pick_holder(run, p.pick) else {
                return false;
            };
            if p.fault == Fault::DeleteKey {
                let deleted = postgres.operator.delete_holder(parsed.holder()).await;
                faults.log(&format!(
                    "delete row of {seq} (deleted: {})",
                    deleted.map_or_else(|e| e.to_string(), |found| found.to_string())
                ));
            } else {
                let Some(worker) = worker_of(run, &seq) else {
                    return false;
                };
                let name = application_name(&worker);
                let ended = pg::terminate_sessions(&postgres.admin, &name).await;
                faults.log(&format!(
                    "pg_terminate_backend of {name} (holder {seq}; sessions ended: {})",
                    ended.map_or_else(|e| pg::with_sources(&e), |n| n.to_string())
                ));
            }
            true
        }
        Fault::DestroySession | Fault::DeleteKey if services.redis.is_some() => {
            let Some((server, operator)) = &services.redis else {
                return false;
            };
            if p.fault == Fault::DestroySession {
                let killed = server.kill_clients().await;
                faults.log(&format!(
                    "client-kill of every client ({killed} connections)"
                ));
                return true;
            }
            let Some((seq, parsed)) = pick_holder(run, p.pick) else {
                return false;
            };
            let deleted = operator.revoke(&parsed).await;
            faults.log(&format!(
                "delete key of {seq} (deleted: {})",
                deleted.map_or_else(|e| e.to_string(), |found| found.to_string())
            ));
            true
        }
        Fault::ServerRestart => {
            let Some((server, _)) = services.redis.as_mut() else {
                return false;
            };
            let t0 = Instant::now();
            server.restart().await;
            faults.log(&format!("redis-restart (down {:?})", t0.elapsed()));
            true
        }
        Fault::DestroySession | Fault::DeleteKey => {
            let Some(agent) = services.api() else {
                return false;
            };
            let Some((seq, parsed)) = pick_holder(run, p.pick) else {
                return false;
            };
            let seq = &seq;
            if p.fault == Fault::DestroySession {
                let session = if scenario.backend == Backend::ConsulLock {
                    // The reference's token is not a session: destroy whoever holds the key.
                    let entry = agent.key(&format!("{}/.lock", services.key)).await;
                    match entry["Session"].as_str() {
                        Some(s) if scenario.limit.is_none() => s.to_owned(),
                        _ => match agent.sessions().await.first() {
                            Some(s) => s.clone(),
                            None => return false,
                        },
                    }
                } else {
                    parsed.holder().to_owned()
                };
                agent.destroy_session(&session).await;
                faults.log(&format!("destroy session {session} (holder {seq})"));
            } else {
                let key = match scenario.limit {
                    None => parsed.key().to_owned(),
                    Some(_) if rng.below(2) == 0 || scenario.backend == Backend::ConsulLock => {
                        format!("{}/.lock", services.key)
                    }
                    Some(_) => parsed.key().to_owned(),
                };
                agent.delete_key(&key).await;
                faults.log(&format!("delete key {key} (holder {seq})"));
            }
            true
        }
        Fault::Blackhole | Fault::Http500 | Fault::Cut => {
            let Some(proxy) = &slots[s].proxy else {
                return false;
            };
            match p.fault {
                Fault::Cut => {
                    proxy.cut_all();
                    faults.log(&format!("cut w{s} pid {pid}"));
                }
                fault => {
                    let mode = if fault == Fault::Blackhole {
                        Mode::Blackhole
                    } else {
                        Mode::Http500
                    };
                    proxy.set_mode(mode);
                    faults.log(&format!(
                        "{} w{s} pid {pid} for {:?}",
                        fault.name(),
                        p.lasts
                    ));
                    owed.retain(|(_, r)| !matches!(r, Restore::Forward(x) if *x == s));
                    owed.push((Instant::now() + p.lasts, Restore::Forward(s)));
                }
            }
            true
        }
        Fault::CloseConnection => {
            let name = format!("lease-worker-{pid}");
            let pids = tokio::task::spawn_blocking(move || crate::amqp::connection_pids(&name))
                .await
                .unwrap_or_default();
            if pids.is_empty() {
                return false;
            }
            for conn in &pids {
                let conn = conn.clone();
                let _ = tokio::task::spawn_blocking(move || {
                    crate::amqp::close_connection_pid(&conn);
                })
                .await;
            }
            faults.log(&format!(
                "close-conn w{s} pid {pid} ({} connections)",
                pids.len()
            ));
            true
        }
        Fault::RaftLeaderKill => {
            let Some(cluster) = services.cluster.as_mut() else {
                return false;
            };
            // One server down at a time: two would leave no quorum, which is not brief.
            if owed.iter().any(|(_, r)| matches!(r, Restore::Restart(_))) {
                return false;
            }
            let Some(leader) = cluster.leader().await else {
                return false;
            };
            let t0 = Instant::now();
            cluster.kill9(leader).await;
            faults.log(&format!("raft-kill s{leader} (the raft leader)"));
            match cluster
                .await_leader(Some(leader), Duration::from_secs(30))
                .await
            {
                Some(next) => {
                    let took = t0.elapsed();
                    elections.push(took.as_secs_f64() * 1000.0);
                    faults.log(&format!("election: s{next} leads after {took:?}"));
                }
                None => faults.log("election: no new leader within 30 s"),
            }
            owed.push((t0 + p.lasts, Restore::Restart(leader)));
            true
        }
        Fault::RemoveSlot => {
            let Some(amqp) = &services.amqp else {
                return false;
            };
            if owed.iter().any(|(_, r)| matches!(r, Restore::AddSlot)) {
                return false;
            }
            let result = amqp.admin().remove(&services.key, 1).await;
            faults.log(&format!("rm-slot {}: {result:?}", services.key));
            owed.push((Instant::now() + p.lasts, Restore::AddSlot));
            result.is_ok()
        }
    }
}

/// Gives the semaphore its `limit` slots back after a removal.
async fn restore_slots(services: &Services, limit: u32) -> String {
    let Some(amqp) = &services.amqp else {
        return String::new();
    };
    let admin = amqp.admin();
    let result = match admin.slots(&services.key).await {
        Ok(0) => admin.create(&services.key, limit).await.map(|()| limit),
        Ok(n) if n < limit => admin.add(&services.key, limit - n).await,
        other => other,
    };
    format!("{result:?}")
}

/// SIGCONT and SIGTERM to every process; a hang is one still running [`EXIT_WITHIN`] later.
async fn stop(run: &mut Run, scenario: &Scenario) -> Result<(), String> {
    if scenario.backend == Backend::ConsulLock {
        // Resume every stopped `consul lock` so the shell loop can pass SIGTERM on.
        let kids: Vec<u32> = (0..run.workers.len())
            .filter(|&w| !run.workers[w].exited)
            .flat_map(|w| children_of(run.pid(w)))
            .collect();
        signal("CONT", &kids);
    }
    run.terminate_all().await
}

/// What is left once the last crashed worker's session or connection has had time to expire:
/// sessions and held keys (Consul), holder and settle queues (AMQP), leases and keys under the
/// scenario's prefix (etcd). Waits, bounded, for them to go.
async fn leaks(
    scenario: &Scenario,
    services: &Services,
    last_crash: Option<Instant>,
) -> Vec<String> {
    let grace = Duration::from_secs(2);
    let deadline = last_crash
        .map(|t| t + scenario.crash_expiry())
        .unwrap_or_else(Instant::now)
        .max(Instant::now())
        + grace;
    loop {
        let found = leftovers(scenario, services).await;
        if found.is_empty() || Instant::now() >= deadline {
            return found;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn leftovers(scenario: &Scenario, services: &Services) -> Vec<String> {
    let mut found = Vec::new();
    if let Some(agent) = services.api() {
        for s in agent.sessions().await {
            found.push(format!("session {s}"));
        }
        for key in agent.keys(&services.key).await {
            let entry = agent.key(&key).await;
            let held = entry["Session"].as_str().is_some_and(|s| !s.is_empty());
            let contender = scenario.limit.is_some() && !key.ends_with("/.lock");
            if held || contender {
                found.push(format!("key {key}{}", if held { " (held)" } else { "" }));
            }
        }
    }
    if let Some(PgServices { db, admin, .. }) = &services.postgres {
        match pg::lease_rows(admin, &services.key).await {
            Ok(rows) => found.extend(rows.into_iter().map(|row| format!("row {row}"))),
            Err(e) => found.push(format!(
                "the lease table of {} cannot be read: {}",
                db.name(),
                pg::with_sources(&e)
            )),
        }
        for session in pg::sessions_named(admin, "chaos-%")
            .await
            .unwrap_or_default()
        {
            found.push(format!("session {session}"));
        }
    }
    if let Some((server, _)) = &services.redis {
        let keys: Vec<String> = server
            .cmd(redis::cmd("KEYS").arg(format!("lease:{{{}}}*", services.key)))
            .await;
        for key in keys {
            if key.ends_with('}') || key.contains("}:s:") {
                found.push(format!("key {key}"));
            }
        }
    }
    if let Some(etcd) = &services.etcd {
        for lease in etcd.leases().await {
            found.push(format!("etcd lease {lease}"));
        }
        for (key, value) in etcd.keys(&services.key).await {
            found.push(format!("key {key} ({value})"));
        }
    }
    if services.amqp.is_some() {
        let prefix = services.key.clone();
        let queues = tokio::task::spawn_blocking(move || crate::amqp::queues(&prefix))
            .await
            .unwrap_or_default();
        for (q, _) in queues {
            if q.ends_with("-B") || q.ends_with("-C") || q.ends_with("-admin") {
                found.push(format!("queue {q}"));
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_replays_its_schedule_and_another_seed_does_not() {
        let s = Scenario::new("t", Backend::Consul, None, Duration::from_secs(60)).seed(7);
        let a: Vec<_> = schedule(&s)
            .iter()
            .map(|p| (p.at, p.fault, p.pick))
            .collect();
        let b: Vec<_> = schedule(&s)
            .iter()
            .map(|p| (p.at, p.fault, p.pick))
            .collect();
        assert_eq!(a, b);
        assert!(a.len() > 10, "{a:?}");
        let c: Vec<_> = schedule(&s.clone().seed(8))
            .iter()
            .map(|p| (p.at, p.fault, p.pick))
            .collect();
        assert_ne!(a, c);
        assert!(a.iter().all(|(at, _, _)| *at < Duration::from_secs(58)));
        let mut first: Vec<Fault> = a[..s.fault_kinds().len()].iter().map(|p| p.1).collect();
        first.sort();
        assert_eq!(first, s.fault_kinds(), "every kind comes once first");
    }

    #[test]
    fn a_fenced_row_is_stale_below_an_index_committed_before_it_whatever_its_insert_order() {
        let row = |commit_order, key: &str, index, holder: &str| FencedRow {
            commit_order,
            key: key.to_owned(),
            index,
            holder: holder.to_owned(),
            pid: 1,
        };
        // Given out of order: judged by commit order. Key b is judged apart from key a.
        let clean = [
            row(3, "a", 7, "s7"),
            row(1, "a", 5, "s5"),
            row(2, "a", 5, "s5"),
            row(4, "b", 2, "t2"),
            row(5, "a", 7, "s7"),
        ];
        assert!(stale_rows(&clean).is_empty());
        let mut late = clean.to_vec();
        late.push(row(6, "a", 5, "s5"));
        let stale = stale_rows(&late);
        assert_eq!(stale.len(), 1);
        assert_eq!((stale[0].0.commit_order, stale[0].1.commit_order), (6, 3));
        // One index, two holders: the later one is stale too.
        let reused = [row(1, "a", 5, "s5"), row(2, "a", 5, "other")];
        assert_eq!(stale_rows(&reused).len(), 1);
    }

    #[test]
    fn fenced_consul_scenarios_never_delete_the_key_and_etcd_ones_do() {
        let consul = Scenario::new("c", Backend::Consul, None, Duration::from_secs(60));
        assert!(consul.fault_kinds().contains(&Fault::DeleteKey));
        let fenced = consul.fenced();
        assert!(!fenced.fault_kinds().contains(&Fault::DeleteKey));
        assert!(
            schedule(&fenced)
                .iter()
                .all(|p| p.fault != Fault::DeleteKey)
        );
        let etcd = Scenario::new("e", Backend::Etcd, None, Duration::from_secs(60)).fenced();
        assert!(etcd.fault_kinds().contains(&Fault::DeleteKey));
    }

    #[test]
    fn each_fault_heals_at_its_end_line_or_at_once() {
        let text = "100 0 fault - seed 1 scenario x\n\
            200 0 fault - pause w1 pid 5 [5] for 11s\n\
            300 0 fault - blackhole w2 pid 6 for 3s\n\
            400 0 fault - http500 w2 pid 6 for 2s\n\
            500 0 fault - kill9 w0 pid 4 [4]\n\
            550 7 write consul:1:a:k\n\
            600 0 fault - end proxy fault w2\n\
            700 0 fault - end pause w1 pid 5\n\
            800 0 fault - raft-kill s1 (the raft leader)\n\
            850 0 fault - election: s2 leads after 1s\n\
            900 0 fault - restart s1: rejoined in 2s\n\
            910 0 fault - rm-slot sem: Ok(())\n\
            950 0 fault - stop: SIGTERM to every worker\n";
        let found: Vec<(String, u128, Option<u128>)> = episodes(&History::parse(text).unwrap())
            .into_iter()
            .map(|e| {
                (
                    e.text.split(' ').next().unwrap().to_owned(),
                    e.start,
                    e.heal,
                )
            })
            .collect();
        let expected = [
            ("pause", 200, Some(700)),
            ("blackhole", 300, Some(600)),
            ("http500", 400, Some(600)),
            ("kill9", 500, Some(500)),
            ("raft-kill", 800, Some(900)),
            ("rm-slot", 910, None),
        ]
        .map(|(word, start, heal)| (word.to_owned(), start, heal));
        assert_eq!(found, expected);
    }

    #[test]
    fn a_heal_needs_a_holder_within_the_bound_unless_a_fault_in_force_moves_it() {
        let bound = Duration::from_nanos(1000);
        let judge = |text: &str| {
            let h = History::parse(text).unwrap();
            judge_recovery(&h, &h, bound)
        };
        // In time: 500 ns after the kill.
        let fine = judge("1000 0 fault - kill9 w0 pid 4\n1500 7 write s\n9000 0 fault - stop: x\n");
        assert!(fine.violations.is_empty(), "{:?}", fine.violations);
        assert_eq!(fine.times_ms, [500e-6]);
        // Late: 1,500 ns.
        let late = judge("1000 0 fault - kill9 w0 pid 4\n2500 7 write s\n9000 0 fault - stop: x\n");
        assert_eq!(late.violations.len(), 1);
        assert!(
            late.violations[0].contains("next write came"),
            "{}",
            late.violations[0]
        );
        assert!(late.violations[0].contains(">>"));
        // A blackhole that began before any holder ran and healed at 1,800 moves the kill's
        // deadline to 2,800; the blackhole's own heal is followed in time.
        let moved = judge(
            "1000 0 fault - kill9 w0 pid 4\n1200 0 fault - blackhole w1 pid 5 for 1s\n\
             1800 0 fault - end proxy fault w1\n2500 7 write s\n9000 0 fault - stop: x\n",
        );
        assert!(moved.violations.is_empty(), "{:?}", moved.violations);
        // Once a holder ran, a later fault moves nothing: the kill at 1,000 is judged alone.
        let after = judge(
            "1000 0 fault - kill9 w0 pid 4\n1100 7 write s\n1200 0 fault - cut w1 pid 5\n\
             3000 7 write s\n9000 0 fault - stop: x\n",
        );
        assert_eq!(
            after.violations.len(),
            1,
            "the cut's heal at 1,200: {:?}",
            after.violations
        );
        assert!(after.violations[0].contains("`cut w1 pid 5`"));
        // Never: no holder after the heal, the run went on past the deadline.
        let never = judge("1000 0 fault - delete key k\n9000 0 fault - stop: x\n");
        assert!(never.violations[0].contains("no holder ran before the run stopped"));
        // The run stopped before the deadline: not judged.
        let open = judge("1000 0 fault - delete key k\n1500 0 fault - stop: x\n");
        assert!(open.violations.is_empty());
        assert_eq!(open.undecided, 1);
    }

    #[test]
    fn a_worker_must_read_reachable_again_by_the_deadline_after_its_fault_heals() {
        let bound = Duration::from_nanos(1000);
        let run = |after: &str| {
            let text = format!(
                "100 5 reachability - reachable\n1000 0 fault - blackhole w1 pid 5 for 1s\n\
                 1100 5 reachability - unreachable\n2000 0 fault - end proxy fault w1\n{after}\
                 9000 0 fault - stop: x\n"
            );
            judge_reachability(&History::parse(&text).unwrap(), bound)
        };
        let back = run("2400 5 reachability - reachable\n");
        assert!(back.violations.is_empty(), "{:?}", back.violations);
        assert_eq!(back.back_ms, [400e-6]);
        let stuck = run("");
        assert_eq!(stuck.violations.len(), 1);
        assert!(stuck.violations[0].contains("pid 5 still read unreachable"));
        let late = run("3500 5 reachability - reachable\n");
        assert_eq!(late.violations.len(), 1, "back after the deadline (3,000)");
        // A worker killed before its deadline is not judged.
        let killed = run("2500 0 fault - kill9 w1 pid 5 [5]\n");
        assert!(killed.violations.is_empty());
    }

    #[test]
    fn the_first_write_after_a_resume_is_exempt_but_a_second_is_not() {
        let a = "consul:1:aaaa:k";
        let b = "consul:2:bbbb:k";
        let text = format!("10 1 write {a}\n20 2 write {b}\n30 1 write {a}\n40 2 write {b}\n");
        let h = History::parse(&text).unwrap();
        let one = judge(&h, 1, false, &[(1, 25)]);
        assert_eq!((one.stale_writes, one.resumed_writes), (0, 1));
        assert!(one.violations.is_empty(), "{:?}", one.violations);
        let two = History::parse(&format!("{text}50 1 write {a}\n")).unwrap();
        let judged = judge(&two, 1, false, &[(1, 25)]);
        assert_eq!(judged.stale_writes, 1);
        assert_eq!(judged.violations.len(), 2, "overlap and stale");
        assert!(judged.violations[1].contains(">>"));
    }
}
