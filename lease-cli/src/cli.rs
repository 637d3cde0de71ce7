//! The command line: clap's derive definitions, and the argv normalisation that lets
//! `consul lock`'s single-dash long flags (`-try 5s`, `-name=x`) through.

use std::ffi::OsString;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::duration;

/// Exit codes, shown at the end of `lease --help` and `lease lock --help`.
pub(crate) const EXIT_CODES: &str = "\
Exit codes of `lease lock`:
  (child's)  the command's own exit code; 128+N if it was killed by signal N
  64         bad usage: unknown option, missing `--`, invalid key, duration or URL, or two
             backends configured (refused before any backend is asked; nothing started)
  75         busy: -try/-timeout ran out while the lease was held elsewhere (nothing started)
  124        lost: the lease was lost while the command ran; the command was stopped
  125        backend error: Consul, etcd, RabbitMQ, PostgreSQL or Redis failed, could not be reached,
             or refused what it was given (a database that does not exist, a role or token
             without rights) (nothing started)
  126, 127   the command could not be run / was not found
  128+N      `lease` itself got signal N while waiting for the lease (nothing started)
`lease status`: 0 held, 1 not held, 2 error. `lease check`: 0 current, 1 stale, 2 error.
`lease amqp`: 0 done, 75 busy (wait ran out, semaphore in use), 125 error.
`lease gc`: 0 done, 64 bad usage, 125 Consul could not be asked.";

const LOCK_ABOUT: &str = "\
Run a command while holding a lease, and stop it before the lease could be given away.

On Consul, KEY is what `consul lock` calls the prefix: the lock is KEY/.lock, and with -n N
the semaphore lives under KEY, in `consul lock -n`'s format, so `lease lock` and `consul lock`
exclude each other. On RabbitMQ (--amqp), KEY is the semaphore's name.

On etcd (--etcd URL, or LEASE_ETCD_ENDPOINTS), KEY is the lock's name as `etcdctl lock KEY`
takes it: each contender holds an etcd lease and creates KEY/<lease ID in hex> with it (or
KEY/<lease ID in hex>_<n> when contenders of one process share the lease), and the
key with the lowest create revision holds, so `lease lock` and `etcdctl lock` (and
`etcdctl elect`) exclude each other on the same KEY. With -n N, KEY is this tool's own FIFO
semaphore under KEY/ (etcdctl has no semaphore: do not share that KEY with `etcdctl lock`).
etcd has no lock-delay (--lock-delay is not used): after a holder's key went without a release
(deleted, or its etcd lease revoked), a waiting `lease lock` leaves the lock alone for 100 ms and
`etcdctl lock` not at all, so the next command may start while the old one is still within its
--grace: fence such work with LEASE_SEQUENCER, whose create revision only rises.

On PostgreSQL (--postgres URL, or LEASE_POSTGRES_URL; not DATABASE_URL), KEY is the lease's key
in the lease table the backend keeps in that database; with -n N, a semaphore of N slots on KEY.
Expiry is judged by the database's clock, so the hosts' clocks do not matter, and a holder whose
row is deleted loses the lease; the key then stays barred for --lock-delay (15s by default), so
the old command is stopped before the next one starts. Only `lease` and programs using
lease-postgres share these leases. TLS follows the URL's sslmode: prefer (the default) encrypts when the server offers TLS,
require (or verify-full) also verifies its certificate; sslrootcert=PATH names a private CA.

On Redis or Valkey (--redis URL, or LEASE_REDIS_URL; not REDIS_URL), KEY is the lease's key: the
hash lease:{KEY} holds its holder and fencing token; with -n N, a semaphore of N slots on KEY.
Expiry is judged by the server's clock; a holder whose key is deleted, overwritten or evicted
learns it within milliseconds (client-side tracking, Redis 6 or later) and the key then stays
barred for --lock-delay. rediss:// speaks TLS; redis+sentinel://HOST:26379/MASTER finds the
master through Sentinel. Only `lease` and programs using lease-redis share these leases.

When the lease is lost (the session destroyed or expired, the key taken, the agent unreachable),
the command's process group gets SIGTERM, then SIGKILL after --grace. `lease` treats the lease as
lost --grace earlier than the session's TTL would allow (its self-fencing deadline is moved
earlier by the grace), so the command is gone before the server could give the lease to anyone
else, even through a network partition. `consul lock` keeps its child running in that case.

If `lease` itself dies (SIGKILL, the OOM killer, a crash), the command's whole process group is
killed with it within milliseconds, before the lease can pass to anyone else: on Linux the command
runs under a supervisor (`lease` itself) that the kernel signals when `lease` dies. Other systems
have no such signal; there a command whose `lease` was killed runs on until it ends.

The command gets LEASE_SEQUENCER (the fencing token, e.g. consul:57.7:<session>:jobs/backup/.lock
etcd:<create revision>:<lease ID>:jobs/backup, postgres:<index>:<holder>:jobs/backup or
redis:<token>:<holder>:jobs/backup; check it
with `lease check`), LEASE_KEY and LEASE_HOLDER in its environment. It also gets the backend a
flag named, in the variable `lease` reads for it, so `lease check \"$LEASE_SEQUENCER\"` inside it
reaches the same server: --consul as CONSUL_HTTP_ADDR, --etcd as LEASE_ETCD_ENDPOINTS,
--postgres as LEASE_POSTGRES_URL, --redis as LEASE_REDIS_URL (RabbitMQ's sequencers cannot be checked from another
process). A backend chosen by a variable is inherited as it is, as are the credentials `lease`
reads only from the environment (CONSUL_HTTP_TOKEN, ETCD_PASSWORD…): none is added. A password
in --postgres's URL goes to the command with the URL (it could read it on `lease`'s command line
already, as can every user of the host); set LEASE_POSTGRES_URL instead of the flag to keep it
off command lines.

SIGINT, SIGTERM and SIGHUP sent to `lease` are forwarded to the command's process group; after
a SIGINT or SIGTERM, a group still running --grace later is killed (SIGKILL). SIGHUP is only
forwarded (many programs read it as a reload). When the command exits, whatever it left running
in its group (a background child) gets SIGTERM, then SIGKILL after --grace; then the lease is
released at once (the next holder does not wait for the lock-delay) and `lease` exits with the
command's code. A process that leaves the group (setsid, a daemon) is out of `lease`'s reach.

Single-dash long flags are accepted as `consul lock` spells them (-try 5s, -name=x, -shell,
-pass-stdin, -timeout 1m, -http-addr=ADDR); they are read as their `--` forms.";

const LOCK_EXAMPLES: &str = "\
Examples:
  # A cron job that runs on one node at a time; others skip it (exit 75) after 10 s.
  lease lock -try 10s jobs/backup -- /usr/local/bin/backup --full
  # At most 3 at once, sharing the slots with `consul lock -n 3 jobs/reports`.
  lease lock -n 3 jobs/reports -- ./report.sh
  # A shell pipeline, with a child that needs 30 s to stop cleanly.
  lease lock --shell --grace 30s --ttl 90s jobs/migrate -- 'pg_dump db | gzip > /backups/db.gz'
  # Over RabbitMQ.
  lease lock --amqp amqp://guest:guest@127.0.0.1:5672/%2f jobs/backup -- ./backup.sh
  # Over etcd, excluding `etcdctl lock jobs/backup` (LEASE_ETCD_ENDPOINTS instead of --etcd).
  lease lock --etcd http://127.0.0.1:2379 jobs/backup -- ./backup.sh
  # Over PostgreSQL (LEASE_POSTGRES_URL instead of --postgres).
  lease lock --postgres postgres://lease@db.internal:5432/app jobs/backup -- ./backup.sh
  # Over Redis (LEASE_REDIS_URL instead of --redis).
  lease lock --redis redis://cache.internal:6379 jobs/backup -- ./backup.sh";

/// Distributed leases for shell commands: run a command on one node (or N) at a time.
#[derive(Debug, Parser)]
#[command(
    name = "lease",
    version,
    after_long_help = EXIT_CODES,
    after_help = "See `lease help lock` for the guard's semantics and exit codes."
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Run a command while holding a lease (a `consul lock` replacement).
    #[command(long_about = LOCK_ABOUT, after_help = EXIT_CODES, after_long_help = format!("{LOCK_EXAMPLES}\n\n{EXIT_CODES}"))]
    Lock(LockArgs),
    /// Print who holds a lock or semaphore (exit 0 held, 1 not held, 2 error).
    #[command(
        after_help = "Examples:\n  lease status jobs/backup\n  lease status -n 3 --json jobs/reports"
    )]
    Status(StatusArgs),
    /// Check that a sequencer is still current (exit 0 current, 1 stale, 2 error).
    #[command(
        long_about = "Check that a sequencer (a LEASE_SEQUENCER handed to a command) still names \
                      the current holder, with one consistent read. A script fences its own \
                      critical step with it.",
        after_help = "Example:\n  lease check \"$LEASE_SEQUENCER\" && mv new.db current.db"
    )]
    Check(CheckArgs),
    /// Administer RabbitMQ persistent semaphores (create, destroy, add, remove, wait).
    #[command(subcommand)]
    Amqp(AmqpCommand),
    /// Remove the Consul leader keys nobody holds under a prefix (exit 0 done, 125 error).
    #[command(long_about = GC_ABOUT, after_help = GC_EXAMPLES)]
    Gc(GcArgs),
}

const GC_ABOUT: &str = "\
Remove the Consul leader keys under PREFIX that nobody holds.

Consul keeps a lock's key after its release: `lease lock` and lease-consul keep it on purpose,
since its LockIndex (the sequencer's index) rises only while the key lives. A service with a
lease per customer or per job therefore leaves a key per name for ever. `lease gc` removes
them: only keys with the leader lock's flags (those of `lease lock`, lease-consul and `consul
lock`) and no session, each with a compare-and-set on the ModifyIndex it was listed at, so a key
acquired, released or written in between is never deleted. Semaphores are not touched (`lease
lock -n` removes a semaphore's key when its last holder leaves).

Consul's KV keeps no timestamps, so --older-than DUR is a watch: the keys are listed, and after
DUR only those that nobody acquired, released or wrote during the wait are removed.

A removed key that is taken again is created anew and starts its LockIndex at 1, with a higher
CreateIndex. Sequencers that carry the key's CreateIndex before its LockIndex
(consul:<CreateIndex>.<LockIndex>:…) order the new holders after the old ones, and a fence that
compares them so accepts the new and refuses the old; a fence or check that compares the
LockIndex alone would refuse the new holders until its record of the key is cleared.";

const GC_EXAMPLES: &str = "\
Examples:
  # What would go: the released leader keys under customers/.
  lease gc --dry-run customers/
  # Remove those nobody acquires, releases or writes during a 10-minute watch.
  lease gc --older-than 10m customers/";

#[derive(Debug, Args)]
pub(crate) struct GcArgs {
    /// The Consul agent: host:port or a URL. Default: CONSUL_HTTP_ADDR (and the other CONSUL_*
    /// variables), else 127.0.0.1:8500.
    #[arg(long, value_name = "URL", alias = "http-addr")]
    pub(crate) consul: Option<String>,
    /// Remove only keys unchanged (not acquired, released or written) during a watch of this
    /// long. Default: those unheld when listed.
    #[arg(long, value_name = "DURATION", value_parser = duration::parse)]
    pub(crate) older_than: Option<Duration>,
    /// List what would be removed, and remove nothing.
    #[arg(long)]
    pub(crate) dry_run: bool,
    /// The prefix of the keys (as Consul's KV reads a prefix: `jobs/` covers `jobs/a/.lock`).
    #[arg(value_name = "PREFIX")]
    pub(crate) prefix: String,
}

/// Where the lease lives.
#[derive(Debug, Args)]
pub(crate) struct BackendArgs {
    /// The Consul agent: host:port or a URL. Default: CONSUL_HTTP_ADDR (and CONSUL_HTTP_TOKEN,
    /// CONSUL_HTTP_TOKEN_FILE, CONSUL_HTTP_SSL, CONSUL_CACERT, CONSUL_DATACENTER), else
    /// 127.0.0.1:8500.
    #[arg(long, value_name = "URL", alias = "http-addr")]
    pub(crate) consul: Option<String>,
    /// Use RabbitMQ at this URL (amqp://user:pass@host:5672/vhost) instead of Consul.
    #[arg(long, value_name = "URL", conflicts_with_all = ["consul", "etcd"])]
    pub(crate) amqp: Option<String>,
    /// Use etcd (v3, 3.4+) at this client URL instead of Consul; comma-separated URLs for a
    /// cluster. Default: LEASE_ETCD_ENDPOINTS, if set (and neither --consul nor --amqp is given).
    /// Credentials and TLS: ETCD_USER, ETCD_PASSWORD, ETCD_CACERT, ETCD_CERT, ETCD_KEY.
    #[arg(long, value_name = "URL", conflicts_with = "consul")]
    pub(crate) etcd: Option<String>,
    /// Use PostgreSQL at this URL (postgres://user:password@host:5432/database) instead of
    /// Consul. Default: LEASE_POSTGRES_URL, if set (and no other backend flag is given).
    #[arg(long, value_name = "URL", conflicts_with_all = ["consul", "amqp", "etcd"])]
    pub(crate) postgres: Option<String>,
    /// Use Redis or Valkey (6+) at this URL (redis://host:6379/db, redis://:password@host:6379;
    /// rediss:// for TLS; redis+sentinel://host:26379/master) instead of Consul. Default: LEASE_REDIS_URL, if
    /// set (and no other backend flag is given).
    #[arg(long, value_name = "URL", conflicts_with_all = ["consul", "amqp", "etcd", "postgres"])]
    pub(crate) redis: Option<String>,
}

#[derive(Debug, Args)]
pub(crate) struct LockArgs {
    #[command(flatten)]
    pub(crate) backend: BackendArgs,
    /// At most N holders: KEY is a semaphore of N slots (as `consul lock -n N`; on etcd, this
    /// tool's own semaphore, which `etcdctl lock` does not share).
    #[arg(short = 'n', value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) limit: u32,
    /// The session's name, for operators listing sessions. Default: `lease lock KEY: CMD`.
    #[arg(long, value_name = "NAME")]
    pub(crate) name: Option<String>,
    /// Wait at most this long for the lease, then exit 75 without running the command
    /// (0: one attempt). Default: wait until it is acquired.
    #[arg(long = "try", value_name = "DURATION", value_parser = duration::parse)]
    pub(crate) try_for: Option<Duration>,
    /// Same as -try (`consul lock`'s newer name for it).
    #[arg(long, value_name = "DURATION", value_parser = duration::parse, conflicts_with = "try_for")]
    pub(crate) timeout: Option<Duration>,
    /// Run the command with $SHELL -c (default /bin/sh), its words joined by spaces.
    #[arg(long)]
    pub(crate) shell: bool,
    /// Give the command lease's stdin (default: /dev/null, as `consul lock`).
    #[arg(long)]
    pub(crate) pass_stdin: bool,
    /// Session TTL (10s to 24h, whole seconds). The command is stopped if the session cannot be
    /// confirmed for about TTL less a tenth less --grace.
    #[arg(long, value_name = "DURATION", default_value = "15s", value_parser = duration::parse)]
    pub(crate) ttl: Duration,
    /// After a lost (not released) lease, nobody may take it for this long (0 to 60s). Consul:
    /// the session's lock-delay (after the session is invalidated), and how long waiters leave
    /// a key alone after it was deleted under its holder. PostgreSQL: how long a holder's row
    /// deleted under it (by an operator) bars its key, the settle time; an expired row is taken
    /// at once. etcd and RabbitMQ have no lock-delay: not used there.
    #[arg(long, value_name = "DURATION", default_value = "15s", value_parser = duration::parse)]
    pub(crate) lock_delay: Duration,
    /// Time between SIGTERM and SIGKILL to the command's process group: on loss, after a
    /// forwarded SIGINT or SIGTERM, and for what the command left running when it exited. The
    /// lease is given up this much earlier, so TTL must be at least 2.5 times the grace.
    /// [default: 5s, or TTL/2.5 if that is shorter]
    #[arg(long, value_name = "DURATION", value_parser = duration::parse)]
    pub(crate) grace: Option<Duration>,
    /// The value advertised in the key, shown to those waiting. Default: `<host> pid <pid>`.
    #[arg(long, value_name = "TEXT")]
    pub(crate) value: Option<String>,
    /// Accepted for `consul lock` compatibility; the command's exit code is always passed on.
    #[arg(long, hide = true)]
    pub(crate) child_exit_code: bool,
    /// The lock's prefix (Consul, as `consul lock PREFIX`), the lock's name (etcd, as
    /// `etcdctl lock NAME`), the semaphore's name (AMQP) or the lease's key (PostgreSQL).
    #[arg(value_name = "KEY")]
    pub(crate) key: String,
    /// The command and its arguments, after `--`.
    #[arg(last = true, value_name = "CMD")]
    pub(crate) command: Vec<String>,
}

/// The grace when none is given: 5 s, or as long as `--ttl` allows (TTL / 2.5).
const DEFAULT_GRACE: Duration = Duration::from_secs(5);

impl LockArgs {
    /// The grace given, or the default that fits the TTL.
    pub(crate) fn grace(&self) -> Duration {
        self.grace
            .unwrap_or_else(|| DEFAULT_GRACE.min(self.ttl.mul_f64(0.4)))
    }
}

#[derive(Debug, Args)]
pub(crate) struct StatusArgs {
    #[command(flatten)]
    pub(crate) backend: BackendArgs,
    /// KEY is a semaphore of N slots.
    #[arg(short = 'n', value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) limit: u32,
    /// Print JSON instead of text.
    #[arg(long)]
    pub(crate) json: bool,
    /// The lock's prefix or name (as given to `lease lock`), or the AMQP semaphore's name.
    #[arg(value_name = "KEY")]
    pub(crate) key: String,
}

#[derive(Debug, Args)]
pub(crate) struct CheckArgs {
    #[command(flatten)]
    pub(crate) backend: BackendArgs,
    /// The sequencer's text, e.g. "$LEASE_SEQUENCER".
    #[arg(value_name = "SEQUENCER")]
    pub(crate) sequencer: String,
}

#[derive(Debug, Subcommand)]
pub(crate) enum AmqpCommand {
    /// Create semaphore NAME with SLOTS slots (succeeds if it exists with as many).
    Create {
        #[command(flatten)]
        url: AmqpUrl,
        /// The semaphore.
        name: String,
        /// How many slots.
        #[arg(value_parser = clap::value_parser!(u32).range(1..))]
        slots: u32,
    },
    /// Destroy semaphore NAME (refused, exit 75, while it has holders).
    Destroy {
        #[command(flatten)]
        url: AmqpUrl,
        /// The semaphore.
        name: String,
    },
    /// Add COUNT slots to semaphore NAME; prints the new number of slots.
    Add {
        #[command(flatten)]
        url: AmqpUrl,
        /// The semaphore.
        name: String,
        /// How many slots to add.
        #[arg(value_parser = clap::value_parser!(u32).range(1..))]
        count: u32,
    },
    /// Remove COUNT slots (the highest) from NAME; their holders lose the lease. Prints the new
    /// number of slots.
    Remove {
        #[command(flatten)]
        url: AmqpUrl,
        /// The semaphore.
        name: String,
        /// How many slots to remove.
        #[arg(value_parser = clap::value_parser!(u32).range(1..))]
        count: u32,
    },
    /// Wait until slot SLOT of NAME has no holder (after `remove`); exit 75 after --timeout.
    Wait {
        #[command(flatten)]
        url: AmqpUrl,
        /// The semaphore.
        name: String,
        /// The slot number (1-based).
        #[arg(value_parser = clap::value_parser!(u32).range(1..))]
        slot: u32,
        /// How long to wait.
        #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = duration::parse)]
        timeout: Duration,
    },
}

/// The broker of `lease amqp …`.
#[derive(Debug, Args)]
pub(crate) struct AmqpUrl {
    /// The broker. Default: AMQP_URL, else amqp://guest:guest@127.0.0.1:5672/%2f.
    #[arg(long = "amqp", value_name = "URL")]
    pub(crate) url: Option<String>,
}

/// The long flags that may be written with one dash, as `consul lock` (Go's flag package)
/// writes them.
const SINGLE_DASH_LONG: &[&str] = &[
    "name",
    "try",
    "timeout",
    "shell",
    "pass-stdin",
    "child-exit-code",
    "http-addr",
    "ttl",
    "lock-delay",
    "grace",
    "value",
    "consul",
    "amqp",
    "etcd",
    "postgres",
    "redis",
    "json",
    "older-than",
    "dry-run",
];

/// Rewrites `-try`, `-name=x` and the other long flags in [`SINGLE_DASH_LONG`] to their `--`
/// forms, up to the first `--` (what follows it is the command's, untouched).
pub(crate) fn normalise(args: impl IntoIterator<Item = OsString>) -> Vec<OsString> {
    let mut out = Vec::new();
    let mut passthrough = false;
    for arg in args {
        if passthrough {
            out.push(arg);
            continue;
        }
        if arg == "--" {
            passthrough = true;
            out.push(arg);
            continue;
        }
        let rewritten = arg.to_str().and_then(|text| {
            let flag = text.strip_prefix('-')?;
            if flag.starts_with('-') {
                return None;
            }
            let name = flag.split_once('=').map_or(flag, |(name, _)| name);
            SINGLE_DASH_LONG
                .contains(&name)
                .then(|| OsString::from(format!("-{text}")))
        });
        out.push(rewritten.unwrap_or(arg));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn norm(args: &[&str]) -> Vec<String> {
        normalise(args.iter().map(OsString::from))
            .into_iter()
            .map(|a| a.into_string().unwrap_or_default())
            .collect()
    }

    /// `--ttl 10s` alone once failed: the default grace of 5 s needs a TTL of 12.5 s.
    #[test]
    fn the_default_grace_fits_every_ttl() {
        use clap::Parser;
        let grace = |args: &[&str]| {
            let mut all = vec!["lease", "lock"];
            all.extend_from_slice(args);
            all.extend(["k", "--", "true"]);
            match Cli::try_parse_from(all).map(|cli| cli.command) {
                Ok(Command::Lock(lock)) => lock.grace(),
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(grace(&[]), Duration::from_secs(5));
        assert_eq!(grace(&["--ttl", "10s"]), Duration::from_secs(4));
        assert_eq!(
            grace(&["--ttl", "10s", "--grace", "1s"]),
            Duration::from_secs(1)
        );
    }

    #[test]
    fn single_dash_long_flags_become_double_dash_before_the_command_only() {
        assert_eq!(
            norm(&[
                "lease", "lock", "-try", "5s", "-name=x", "-n", "3", "k", "--", "-try"
            ]),
            [
                "lease", "lock", "--try", "5s", "--name=x", "-n", "3", "k", "--", "-try"
            ]
        );
        assert_eq!(
            norm(&["lease", "lock", "-shell", "--grace", "1s"]),
            ["lease", "lock", "--shell", "--grace", "1s"]
        );
        assert_eq!(norm(&["lease", "lock", "-x"]), ["lease", "lock", "-x"]);
    }

    #[test]
    fn the_definitions_are_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
