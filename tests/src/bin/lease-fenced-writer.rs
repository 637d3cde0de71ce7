//! A lease holder that writes to PostgreSQL through the fence (`lease_postgres::fence`), for the
//! process-level fence tests (`tests/postgres_fence.rs`). Appends what happened to a history file
//! (`lease_tests::history`) and its writes to the table `fenced_writes`.
//!
//! ```text
//! lease-fenced-writer (--consul URL | --etcd URLS | --postgres-leases URL) --key KEY
//!                     --postgres URL --history FILE
//!                     [--ttl SECS] [--lock-delay MS] [--write-every-ms MS]
//!                     [--stop-at N --stop-where before-fence|after-fence]
//!                     [--idle-in-transaction-timeout-ms MS]
//!                     [--advance] [--fence index|held] [--unchecked] [--first-write-after-ms MS]
//! ```
//!
//! It acquires the leader lease `KEY` (waiting forever) and logs `acquired`; then, after
//! `--first-write-after-ms` (default 0: a new leader loading its state first), every
//! `--write-every-ms` (default 20), writes one fenced transaction, numbered from 1:
//!
//! 1. `BEGIN`; check `Lease::is_held()` (false: log `lost`, roll back, stop writing), unless
//!    `--unchecked`: then it writes on under a lost lease, as a holder paused between its check
//!    and its commit does at every write, and the fence alone must stop it;
//! 2. at transaction `--stop-at N`, `--stop-where before-fence`: log `stopping` and stop this
//!    whole process with SIGSTOP (`kill -STOP` of itself), to be resumed by the test's SIGCONT;
//! 3. `lease_fence.fence(key, generation, index, holder)` (`--fence index`, the default), or
//!    `lease.fence_held(holder, index)` (`--fence held`, leases on PostgreSQL only);
//! 4. at `--stop-at N`, `--stop-where after-fence`: the same, holding the fence's row lock;
//! 5. insert `(lease_key, lease_index, holder, pid, attempt)` into `fenced_writes`; `COMMIT`.
//!
//! It logs `write` (detail `attempt=N`) for a commit, `refused` for a fence refusal (and stops
//! writing: its lease is gone), `failed` for any other error of the transaction (and stops writing
//! when the connection is gone). The transaction is *not* run under `Lease::run`, so that a holder
//! resumed after its lease expired goes on with the write it had checked for, as a holder
//! paused between its check and its commit does: the fence, not the lease, must stop it.
//!
//! `--advance` registers the holder with the fence when it acquires, before `acquired` is
//! logged: through `fence::tokio_postgres::advance_on_acquire` (on a connection of its own to
//! `--postgres`) for Consul and etcd leases, in the acquiring transaction
//! (`PostgresBuilder::advance_fence`) for leases on PostgreSQL (`--postgres-leases`, which must
//! then be the database of `--postgres`).
//!
//! `--idle-in-transaction-timeout-ms` sets PostgreSQL's `idle_in_transaction_session_timeout` on
//! its session, the setting the fence's docs recommend below the lease TTL.
//!
//! A panic anywhere in the process is recorded (`lease_tests::panics`): a `panic` line in the
//! history, and a record in `$LEASE_TESTS_PANIC_DIR`.
//!
//! The table is created (if missing) by the test, not here. SIGTERM: log `exit`, exit 0. Exit 2
//! for bad arguments or a backend or database that cannot be reached at start.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use lease_core::{Backend, Lease, LeaseSpec, Wait};
use lease_postgres::fence;
use lease_tests::history::Recorder;
use lease_tests::postgres::with_sources;
use tokio::signal::unix::{SignalKind, signal};
use tokio_postgres::{Client, NoTls};

const USAGE: &str = "usage: lease-fenced-writer (--consul URL | --etcd URLS | --postgres-leases URL) \
--key KEY --postgres URL --history FILE [--ttl SECS] [--lock-delay MS] [--write-every-ms MS] \
[--stop-at N --stop-where before-fence|after-fence] [--idle-in-transaction-timeout-ms MS] \
[--advance] [--fence index|held] [--unchecked] [--first-write-after-ms MS]";

/// Where the writer stops itself within transaction `--stop-at`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum StopWhere {
    BeforeFence,
    AfterFence,
}

#[derive(Debug)]
struct Args {
    consul: Option<String>,
    etcd: Option<String>,
    postgres_leases: Option<String>,
    advance: bool,
    /// `--fence held`: `lease.fence_held` instead of `lease_fence.fence`.
    fence_held: bool,
    unchecked: bool,
    first_write_after: Duration,
    key: String,
    postgres: String,
    history: PathBuf,
    ttl: Option<Duration>,
    lock_delay: Option<Duration>,
    write_every: Duration,
    stop: Option<(u64, StopWhere)>,
    idle_timeout: Option<Duration>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = std::env::args().skip(1);
    let (mut consul, mut etcd, mut key, mut postgres, mut history) = (None, None, None, None, None);
    let (mut ttl, mut lock_delay, mut idle_timeout) = (None, None, None);
    let (mut stop_at, mut stop_where) = (None, None);
    let mut write_every = Duration::from_millis(20);
    let (mut postgres_leases, mut advance, mut fence_held, mut unchecked) =
        (None, false, false, false);
    let mut first_write_after = Duration::ZERO;
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{flag} needs a value"));
        let number = |v: String| {
            v.parse::<u64>()
                .map_err(|_| format!("{flag}: {v:?} is not a whole number"))
        };
        match flag.as_str() {
            "--consul" => consul = Some(value()?),
            "--etcd" => etcd = Some(value()?),
            "--postgres-leases" => postgres_leases = Some(value()?),
            "--advance" => advance = true,
            "--unchecked" => unchecked = true,
            "--fence" => {
                fence_held = match value()?.as_str() {
                    "index" => false,
                    "held" => true,
                    other => return Err(format!("unknown --fence {other:?}")),
                };
            }
            "--first-write-after-ms" => {
                first_write_after = Duration::from_millis(number(value()?)?);
            }
            "--key" => key = Some(value()?),
            "--postgres" => postgres = Some(value()?),
            "--history" => history = Some(PathBuf::from(value()?)),
            "--ttl" => ttl = Some(Duration::from_secs(number(value()?)?)),
            "--lock-delay" => lock_delay = Some(Duration::from_millis(number(value()?)?)),
            "--write-every-ms" => write_every = Duration::from_millis(number(value()?)?),
            "--stop-at" => stop_at = Some(number(value()?)?),
            "--stop-where" => {
                stop_where = Some(match value()?.as_str() {
                    "before-fence" => StopWhere::BeforeFence,
                    "after-fence" => StopWhere::AfterFence,
                    other => return Err(format!("unknown --stop-where {other:?}")),
                });
            }
            "--idle-in-transaction-timeout-ms" => {
                idle_timeout = Some(Duration::from_millis(number(value()?)?));
            }
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    let backends = [&consul, &etcd, &postgres_leases];
    if backends.iter().filter(|b| b.is_some()).count() != 1 {
        return Err("give exactly one of --consul, --etcd and --postgres-leases".into());
    }
    if fence_held && postgres_leases.is_none() {
        return Err("--fence held needs --postgres-leases".into());
    }
    let stop = match (stop_at, stop_where) {
        (Some(n), Some(place)) => Some((n, place)),
        (None, None) => None,
        _ => return Err("--stop-at and --stop-where go together".into()),
    };
    Ok(Args {
        consul,
        etcd,
        postgres_leases,
        advance,
        fence_held,
        unchecked,
        first_write_after,
        key: key.ok_or("--key is required")?,
        postgres: postgres.ok_or("--postgres is required")?,
        history: history.ok_or("--history is required")?,
        ttl,
        lock_delay,
        write_every,
        stop,
        idle_timeout,
    })
}

/// The lease backend; with `--advance`, one that registers each acquisition with the fence.
async fn backend(args: &Args) -> Result<Arc<dyn Backend>, lease_core::BoxError> {
    if let Some(url) = &args.postgres_leases {
        let postgres = lease_postgres::Postgres::builder()
            .url(url)
            .advance_fence(args.advance)
            .build()?;
        return Ok(Arc::new(postgres));
    }
    // parse_args makes sure exactly one backend is given.
    let backend = lease_tests::workers::worker_backend(
        args.consul.as_deref(),
        args.etcd.as_deref(),
        None,
        None,
        None,
    )?;
    if !args.advance {
        return Ok(backend);
    }
    let (client, connection) = tokio_postgres::connect(&args.postgres, NoTls).await?;
    tokio::spawn(connection);
    Ok(Arc::new(fence::tokio_postgres::advance_on_acquire(
        backend,
        Arc::new(client),
    )))
}

fn exit_with(message: &str) -> ! {
    eprintln!("{message}");
    std::process::exit(2);
}

#[tokio::main]
async fn main() {
    lease_tests::panics::install();
    // First of all, so a SIGTERM never meets the default action.
    let mut sigterm = signal(SignalKind::terminate()).expect("cannot handle SIGTERM");
    let args = parse_args().unwrap_or_else(|message| exit_with(&format!("{message}\n{USAGE}")));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| lease_tests::log_filter("info").into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .try_init();
    let history = Recorder::open(&args.history)
        .unwrap_or_else(|e| exit_with(&format!("cannot open {}: {e}", args.history.display())));
    lease_tests::panics::record_in(&history);
    let backend = backend(&args)
        .await
        .unwrap_or_else(|e| exit_with(&with_sources(&*e)));
    let (client, connection) = tokio_postgres::connect(&args.postgres, NoTls)
        .await
        .unwrap_or_else(|e| exit_with(&format!("cannot connect to {}: {e:?}", args.postgres)));
    let connection = tokio::spawn(connection);
    if let Some(timeout) = args.idle_timeout {
        let set = format!(
            "SET idle_in_transaction_session_timeout = {}",
            timeout.as_millis()
        );
        client
            .batch_execute(&set)
            .await
            .unwrap_or_else(|e| exit_with(&format!("{set}: {e:?}")));
    }

    tokio::select! {
        () = run(&args, backend.as_ref(), client, &history) => {
            // Stopped writing; stay until the test is done with this process.
            sigterm.recv().await;
        }
        _ = sigterm.recv() => {}
    }
    history.log("exit", "-", "");
    connection.abort();
}

/// Acquires the lease and writes fenced transactions until one cannot be written.
async fn run(args: &Args, backend: &dyn Backend, mut client: Client, history: &Recorder) {
    let mut spec = LeaseSpec::leader(args.key.clone())
        .wait(Wait::Forever)
        .value(format!("pid-{}", std::process::id()));
    if let Some(ttl) = args.ttl {
        spec = spec.ttl(ttl);
    }
    if let Some(delay) = args.lock_delay {
        spec = spec.lock_delay(delay);
    }
    history.log("waiting", "-", "");
    let lease = match backend.acquire(&spec).await {
        Ok(lease) => lease,
        Err(e) => {
            history.log("error", "-", &format!("acquire: {e}"));
            return;
        }
    };
    let seq = lease.sequencer().to_string();
    history.log("acquired", &seq, "");
    tokio::time::sleep(args.first_write_after).await;
    for attempt in 1.. {
        match write_once(args, &lease, &mut client, attempt, history).await {
            Ok(true) => history.log("write", &seq, &format!("attempt={attempt}")),
            Ok(false) => {
                history.log(
                    "lost",
                    &seq,
                    &format!("attempt={attempt}: is_held() is false"),
                );
                return;
            }
            Err(e) => {
                let refused = e
                    .downcast_ref::<fence::Error>()
                    .is_some_and(fence::Error::is_refused);
                let event = if refused { "refused" } else { "failed" };
                history.log(
                    event,
                    &seq,
                    &format!("attempt={attempt}: {}", with_sources(&*e)),
                );
                if refused || client.is_closed() {
                    return;
                }
            }
        }
        tokio::time::sleep(args.write_every).await;
    }
}

/// One fenced transaction; `Ok(false)` if the lease was no longer held at the check.
async fn write_once(
    args: &Args,
    lease: &Lease,
    client: &mut Client,
    attempt: u64,
    history: &Recorder,
) -> Result<bool, lease_core::BoxError> {
    let seq = lease.sequencer();
    let tx = client.transaction().await?;
    if !args.unchecked && !lease.is_held() {
        return Ok(false);
    }
    let stop_here = |place| {
        if args.stop == Some((attempt, place)) {
            history.log(
                "stopping",
                &seq.to_string(),
                &format!("attempt={attempt} {place:?}"),
            );
            stop_this_process();
        }
    };
    stop_here(StopWhere::BeforeFence);
    if args.fence_held {
        fence::tokio_postgres::fence_held(&tx, seq).await?;
    } else {
        fence::tokio_postgres::fence(&tx, seq).await?;
    }
    stop_here(StopWhere::AfterFence);
    let index = i64::try_from(seq.index())?;
    let pid = i64::from(std::process::id());
    let attempt = i64::try_from(attempt)?;
    tx.execute(
        "INSERT INTO fenced_writes (lease_key, lease_index, holder, pid, attempt) \
         VALUES ($1, $2, $3, $4, $5)",
        &[&seq.key(), &index, &seq.holder(), &pid, &attempt],
    )
    .await?;
    tx.commit().await?;
    Ok(true)
}

/// SIGSTOP to this whole process (every thread: the lease's keep-alive too), returning once the
/// test has sent SIGCONT. Blocking on purpose: nothing of this process runs meanwhile anyway.
fn stop_this_process() {
    let status = std::process::Command::new("kill")
        .arg("-STOP")
        .arg(std::process::id().to_string())
        .status();
    if !matches!(status, Ok(s) if s.success()) {
        exit_with(&format!("kill -STOP of itself failed: {status:?}"));
    }
}
