//! One node of a lease test: acquires a lease, does guarded work, and appends what happened to a
//! history file (see `lease_tests::history` for the format and the verdicts).
//!
//! ```text
//! lease-worker (--consul URL | --amqp URL | --etcd URLS | --postgres URL | --redis URL) --key KEY [--limit N]
//!              --history FILE
//!              [--ttl SECS] [--lock-delay MS] [--write-every-ms MS] [--hold-ms MS] [--mode MODE]
//!              [--fenced-writes POSTGRES_URL]
//! ```
//!
//! `--limit N` makes the lease a semaphore of N slots, else it is a leader key. `--etcd` takes one
//! client URL or several, comma-separated; `--postgres` a `postgres://` URL (the chaos driver
//! adds `application_name` to tell the workers' sessions apart). TTL and lock-delay default to
//! lease-core's defaults (15 s, 15 s; etcd ignores the lock-delay). One guarded work writes a
//! `write` line every `--write-every-ms` (default 5) for `--hold-ms` (default: until the lease is
//! lost).
//!
//! Modes:
//! - `loop` (default): forever acquire (waiting forever), run the work under `Lease::run`,
//!   release (logging what `release()` answered), repeat. SIGTERM: release (or drop the acquire
//!   in progress), shut the backend down, as the README asks of a service, then exit.
//! - `campaign-select`: `select!` between `Campaign::run_until` and SIGTERM, then return from
//!   `main` at once (no explicit release).
//! - `campaign-signal`: the README's way: a campaign spawned with `run_until`, stepped down when
//!   `lease_core::shutdown_signal()` completes (SIGTERM or SIGINT), then awaited before `main`
//!   returns.
//!
//!   Both campaign modes also log `leader - <sequencer>` each time the campaign sees a new leader
//!   (`LeaderEvent::LeaderChanged`), itself or another process.
//! - `drop-at-exit`: acquire, write until SIGTERM, then return from `main` with the lease still
//!   in a local (dropped as `main` ends).
//! - `wait-then-exit`: acquire (waiting forever); on SIGTERM return from `main` at once, dropping
//!   the acquire future.
//! - `hold-many`: acquire `--count N` leases at once (`KEY/0` … `KEY/N-1`, each a semaphore of
//!   `--limit` if given), print `held N` on stdout; on SIGTERM print `still held M` (how many are
//!   still held), shut the backend down and exit.
//! - `hold-many-drop-at-exit`: as `hold-many`, but on SIGTERM return from `main` with the leases
//!   still held (dropped as `main` ends), as a service that exits normally would.
//! - `one-after-another`: first acquire `--preheld M` leases (`KEY/held/0` …, default 0) and keep
//!   them; then, for each of `KEY/0` … `KEY/N-1` in turn (`--count N`), acquire it, run the
//!   guarded work until the lease is lost (an operator takes it), and go on to the next. Each new
//!   key may need a new or wider prefix watch: this is how a process that acquires leases one
//!   after another while it holds others behaves. Prints `done` on stdout after the last key.
//! - `loop-stdin`: reads key numbers from stdin, one a line, and runs `loop` on `KEY/<number>`
//!   for each, all at once in one process (so its waits share the process's watches).
//!
//! `--fenced-writes URL` (mode `loop` only; the chaos suite's fenced scenarios): each write is a
//! row of `chaos_writes` in the PostgreSQL database at `URL`, written by a transaction that calls
//! `lease_fence.fence` with the lease's sequencer first (see `FencedDb::write`). The guarded
//! work then checks nothing of the lease: no `is_held()` before a write, and it does not run
//! under `Lease::run`, so a holder that lost its lease (paused past its TTL, its session
//! destroyed, its etcd lease revoked) goes on writing until its hold ends, and the fence alone
//! must stop it. A write the fence refuses logs `refused` (and ends the work: the lease is gone);
//! any other failed transaction logs `failed` (and the next write reconnects if the connection
//! broke). The driver creates the tables and installs the fence before it starts the workers.
//!
//! A panic anywhere in the process is recorded (`lease_tests::panics`): a `panic` line in the
//! history, and a record in `$LEASE_TESTS_PANIC_DIR`. Test-only: `LEASE_TESTS_PANIC_AT=acquired`
//! makes the first acquisition of `loop` panic in a spawned task (the process runs on).
//!
//! In `loop` mode a task reads `Backend::reachability()` every 100 ms and logs each change as a
//! `reachability - reachable|unreachable|unknown` line (the chaos suite judges that it comes
//! back after a fault heals).
//!
//! Exit status: 0 after SIGTERM, 2 for bad arguments or a backend that cannot be configured.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use lease_core::CancellationToken;
use lease_core::backend::Reachability;
use lease_core::leader::{Campaign, LeaderEvent};
use lease_core::{
    Backend, BoxError, BoxFuture, Lease, LeaseSpec, LeaseWatcher, LostReason, Sequencer, Wait,
};
use lease_postgres::fence;
// The writing side of `lease_tests::history`, shared with the other worker binaries.
use lease_tests::history::Recorder as History;
use lease_tests::postgres::with_sources;
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio_postgres::{Client, NoTls};

const USAGE: &str = "usage: lease-worker (--consul URL | --amqp URL | --etcd URLS | --postgres URL | --redis URL) \
--key KEY [--limit N] \
--history FILE [--ttl SECS] [--lock-delay MS] [--write-every-ms MS] [--hold-ms MS] \
[--mode loop|campaign-select|campaign-signal|drop-at-exit|wait-then-exit|hold-many|hold-many-drop-at-exit|\
one-after-another|loop-stdin] [--count N] [--preheld M] [--fenced-writes POSTGRES_URL]";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Loop,
    CampaignSelect,
    CampaignSignal,
    DropAtExit,
    WaitThenExit,
    HoldMany(HoldManyExit),
    OneAfterAnother,
    LoopStdin,
}

/// How `hold-many` ends on SIGTERM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum HoldManyExit {
    Shutdown,
    DropAtExit,
}

#[derive(Clone, Debug)]
struct Args {
    consul: Option<String>,
    amqp: Option<String>,
    etcd: Option<String>,
    postgres: Option<String>,
    redis: Option<String>,
    key: String,
    limit: Option<u32>,
    history: PathBuf,
    ttl: Option<Duration>,
    lock_delay: Option<Duration>,
    write_every: Duration,
    hold: Option<Duration>,
    mode: Mode,
    count: u64,
    preheld: u64,
    fenced_writes: Option<String>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = std::env::args().skip(1);
    let (mut consul, mut amqp, mut key, mut limit, mut history) = (None, None, None, None, None);
    let (mut etcd, mut postgres, mut redis) = (None, None, None);
    let (mut ttl, mut lock_delay, mut hold) = (None, None, None);
    let mut write_every = Duration::from_millis(5);
    let mut mode = Mode::Loop;
    let (mut count, mut preheld) = (1, 0);
    let mut fenced_writes = None;
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{flag} needs a value"));
        let number = |v: String| {
            v.parse::<u64>()
                .map_err(|_| format!("{flag}: {v:?} is not a whole number"))
        };
        match flag.as_str() {
            "--consul" => consul = Some(value()?),
            "--amqp" => amqp = Some(value()?),
            "--etcd" => etcd = Some(value()?),
            "--postgres" => postgres = Some(value()?),
            "--redis" => redis = Some(value()?),
            "--key" => key = Some(value()?),
            "--limit" => {
                let n = number(value()?)?;
                limit = Some(u32::try_from(n).map_err(|_| format!("--limit {n} is too large"))?);
            }
            "--history" => history = Some(PathBuf::from(value()?)),
            "--ttl" => ttl = Some(Duration::from_secs(number(value()?)?)),
            "--lock-delay" => lock_delay = Some(Duration::from_millis(number(value()?)?)),
            "--write-every-ms" => write_every = Duration::from_millis(number(value()?)?),
            "--hold-ms" => hold = Some(Duration::from_millis(number(value()?)?)),
            "--mode" => {
                mode = match value()?.as_str() {
                    "loop" => Mode::Loop,
                    "campaign-select" => Mode::CampaignSelect,
                    "campaign-signal" => Mode::CampaignSignal,
                    "drop-at-exit" => Mode::DropAtExit,
                    "wait-then-exit" => Mode::WaitThenExit,
                    "hold-many" => Mode::HoldMany(HoldManyExit::Shutdown),
                    "hold-many-drop-at-exit" => Mode::HoldMany(HoldManyExit::DropAtExit),
                    "one-after-another" => Mode::OneAfterAnother,
                    "loop-stdin" => Mode::LoopStdin,
                    other => return Err(format!("unknown mode {other:?}")),
                }
            }
            "--count" => count = number(value()?)?,
            "--preheld" => preheld = number(value()?)?,
            "--fenced-writes" => fenced_writes = Some(value()?),
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if [
        consul.is_some(),
        amqp.is_some(),
        etcd.is_some(),
        postgres.is_some(),
        redis.is_some(),
    ]
    .iter()
    .filter(|given| **given)
    .count()
        != 1
    {
        return Err("give exactly one of --consul, --amqp, --etcd, --postgres and --redis".into());
    }
    if fenced_writes.is_some() && mode != Mode::Loop {
        return Err("--fenced-writes works in --mode loop only".into());
    }
    Ok(Args {
        consul,
        amqp,
        etcd,
        postgres,
        redis,
        key: key.ok_or("--key is required")?,
        limit,
        history: history.ok_or("--history is required")?,
        ttl,
        lock_delay,
        write_every,
        hold,
        mode,
        count,
        preheld,
        fenced_writes,
    })
}

/// The guarded work: a `write` line now and every `every` until `hold` has passed (or forever).
/// The guarded work: a write every `every`, for `hold` or forever.
///
/// `run` checks the lease (and its fence deadline) before every poll; a pause that falls inside a
/// poll, between that check and the write, is the window no library can close. Like any code with
/// a side effect to protect, the work checks `is_held()` immediately before each write, which
/// shrinks that window to the few instructions between the two.
async fn work(lease: LeaseWatcher, history: History, every: Duration, hold: Option<Duration>) {
    let seq = lease.sequencer().to_string();
    let end = hold.map(|h| tokio::time::Instant::now() + h);
    loop {
        if !lease.is_held() {
            // `run` drops this future at its next poll with the reason.
            return std::future::pending().await;
        }
        history.log("write", &seq, "");
        if end.is_some_and(|end| tokio::time::Instant::now() >= end) {
            return;
        }
        tokio::time::sleep(every).await;
    }
}

/// The row of one fenced write, in the table the chaos driver creates (`lease_tests::chaos`).
///
/// `commit_order` comes from the one-row counter `chaos_commit_order`, updated in the same
/// transaction: the update holds the counter's row lock until the transaction ends, so of two
/// transactions that both commit, the one that commits first took the lower number, whatever the
/// fence does. The verdict orders the rows by it.
const FENCED_INSERT: &str = "WITH c AS (UPDATE chaos_commit_order SET n = n + 1 RETURNING n) \
INSERT INTO chaos_writes (commit_order, lease_key, lease_index, holder, pid) \
SELECT c.n, $1::text, $2::bigint, $3::text, $4::bigint FROM c RETURNING commit_order";

/// The PostgreSQL side of `--fenced-writes`: one connection, made again after it broke.
struct FencedDb {
    url: String,
    client: Option<Client>,
}

impl FencedDb {
    async fn connect(url: &str) -> Result<FencedDb, BoxError> {
        let mut db = FencedDb {
            url: url.to_owned(),
            client: None,
        };
        db.client().await?;
        Ok(db)
    }

    async fn client(&mut self) -> Result<&mut Client, BoxError> {
        if self.client.as_ref().is_none_or(Client::is_closed) {
            let (client, connection) = tokio_postgres::connect(&self.url, NoTls).await?;
            tokio::spawn(async move {
                // Ends with the client; a broken connection shows in the next write.
                let _ = connection.await;
            });
            self.client = Some(client);
        }
        Ok(self.client.as_mut().expect("connected above"))
    }

    /// One fenced write: `BEGIN`; `lease_fence.fence(key, index, holder)` with `seq`; insert the
    /// row; log `write` (detail `order=N`); `COMMIT`.
    ///
    /// The `write` line is logged between the fence call and the commit, while this transaction
    /// holds the fence's row lock for the key: the fenced transactions of a key run one at a
    /// time from their fence call to their end, so the lines of committed writes are in commit
    /// order too (a line logged after the commit could be overtaken by the next holder's). A
    /// commit that then fails leaves a `write` line without a row: the histories' verdicts
    /// count one write too many, never one too few.
    async fn write(&mut self, seq: &Sequencer, history: &History) -> Result<(), BoxError> {
        let token = fence::Token::new(seq)?;
        let tx = self.client().await?.transaction().await?;
        fence::tokio_postgres::fence(&tx, seq).await?;
        let pid = i64::from(std::process::id());
        let row = tx
            .query_one(
                FENCED_INSERT,
                &[&token.key(), &token.index(), &token.holder(), &pid],
            )
            .await?;
        let order: i64 = row.get(0);
        history.log("write", &seq.to_string(), &format!("order={order}"));
        tx.commit().await?;
        Ok(())
    }
}

/// The guarded work of `--fenced-writes`: a fenced write now and every `every` until `hold` has
/// passed (or forever), or until the fence refuses one. It never looks at the lease (no
/// `is_held()`, no `Lease::run` around it): a holder that lost its lease writes on, and the fence
/// alone must stop it.
async fn fenced_work(
    db: &mut FencedDb,
    seq: &Sequencer,
    history: &History,
    every: Duration,
    hold: Option<Duration>,
) {
    let end = hold.map(|h| tokio::time::Instant::now() + h);
    loop {
        if let Err(error) = db.write(seq, history).await {
            let refused =
                (error.downcast_ref::<fence::Error>()).is_some_and(fence::Error::is_refused);
            let event = if refused { "refused" } else { "failed" };
            history.log(event, &seq.to_string(), &with_sources(&*error));
            if refused {
                return;
            }
        }
        if end.is_some_and(|end| tokio::time::Instant::now() >= end) {
            return;
        }
        tokio::time::sleep(every).await;
    }
}

fn spec(args: &Args) -> LeaseSpec {
    let mut spec = match args.limit {
        Some(n) => LeaseSpec::semaphore(args.key.clone(), n),
        None => LeaseSpec::leader(args.key.clone()),
    }
    .wait(Wait::Forever)
    .value(format!("pid-{}", std::process::id()));
    if let Some(ttl) = args.ttl {
        spec = spec.ttl(ttl);
    }
    if let Some(delay) = args.lock_delay {
        spec = spec.lock_delay(delay);
    }
    spec
}

fn backend(args: &Args) -> Result<Arc<dyn Backend>, lease_core::Error> {
    lease_tests::workers::worker_backend(
        args.consul.as_deref(),
        args.etcd.as_deref(),
        args.postgres.as_deref(),
        args.redis.as_deref(),
        args.amqp.as_deref(),
    )
}

fn release_detail(result: &Result<(), lease_core::Error>) -> String {
    match result {
        Ok(()) => "ok".to_owned(),
        Err(e) => format!("err {e}"),
    }
}

#[tokio::main]
async fn main() {
    lease_tests::panics::install();
    // First of all, so a SIGTERM never meets the default action (death without clean-up).
    let mut sigterm = signal(SignalKind::terminate()).expect("cannot handle SIGTERM");
    let args = match parse_args() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("{message}\n{USAGE}");
            std::process::exit(2);
        }
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| lease_tests::log_filter("info").into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .try_init();
    let history = match History::open(&args.history) {
        Ok(h) => h,
        Err(e) => {
            eprintln!("cannot open {}: {e}", args.history.display());
            std::process::exit(2);
        }
    };
    lease_tests::panics::record_in(&history);
    let backend = match backend(&args) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    match args.mode {
        Mode::Loop => run_loop(&args, backend, history, &mut sigterm).await,
        Mode::CampaignSelect => campaign_select(&args, backend, history, &mut sigterm).await,
        Mode::CampaignSignal => campaign_signal(&args, backend, history).await,
        Mode::DropAtExit => drop_at_exit(&args, backend, history, &mut sigterm).await,
        Mode::WaitThenExit => wait_then_exit(&args, backend, history, &mut sigterm).await,
        Mode::HoldMany(exit) => hold_many(&args, backend, &mut sigterm, exit).await,
        Mode::OneAfterAnother => one_after_another(&args, backend, history, &mut sigterm).await,
        Mode::LoopStdin => loop_stdin(&args, backend, history, &mut sigterm).await,
    }
}

/// `args`'s spec, on `key` instead of `--key`.
fn spec_on(args: &Args, key: String) -> LeaseSpec {
    let mut spec = match args.limit {
        Some(n) => LeaseSpec::semaphore(key, n),
        None => LeaseSpec::leader(key),
    };
    let base = self::spec(args);
    spec = spec
        .wait(Wait::Forever)
        .ttl(base.session_ttl())
        .lock_delay(base.session_lock_delay())
        .value(format!("pid-{}", std::process::id()));
    spec
}

async fn one_after_another(
    args: &Args,
    backend: Arc<dyn Backend>,
    history: History,
    sigterm: &mut Signal,
) {
    let mut held = Vec::new();
    for i in 0..args.preheld {
        match backend
            .acquire(&spec_on(args, format!("{}/held/{i}", args.key)))
            .await
        {
            Ok(lease) => held.push(lease),
            Err(error) => {
                history.log("error", "-", &format!("acquire: {error}"));
                std::process::exit(2);
            }
        }
    }
    for i in 0..args.count {
        let spec = spec_on(args, format!("{}/{i}", args.key));
        history.log("waiting", "-", "");
        let lease = tokio::select! {
            acquired = backend.acquire(&spec) => match acquired {
                Ok(lease) => lease,
                Err(error) => {
                    history.log("error", "-", &format!("acquire: {error}"));
                    std::process::exit(2);
                }
            },
            _ = sigterm.recv() => break,
        };
        if guard_until_sigterm(&lease, args, &history, sigterm).await {
            break;
        }
    }
    let still = held.iter().filter(|l| l.is_held()).count();
    println!("done; {still} of {} preheld still held", held.len());
    let _ = sigterm.recv().await;
    history.log("exit", "-", "");
    backend.shutdown().await;
}

async fn loop_stdin(
    args: &Args,
    backend: Arc<dyn Backend>,
    history: History,
    sigterm: &mut Signal,
) {
    use tokio::io::AsyncBufReadExt;
    let stop = CancellationToken::new();
    let mut loops = tokio::task::JoinSet::new();
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    loop {
        let line = tokio::select! {
            line = lines.next_line() => line,
            _ = sigterm.recv() => break,
        };
        let Ok(Some(line)) = line else {
            // Stdin closed: keep looping on the keys we have until SIGTERM.
            let _ = sigterm.recv().await;
            break;
        };
        let spec = spec_on(args, format!("{}/{}", args.key, line.trim()));
        let (backend, history, stop) = (Arc::clone(&backend), history.clone(), stop.clone());
        let args = args.clone();
        loops.spawn(async move { loop_on(backend, spec, history, &args, None, stop).await });
    }
    stop.cancel();
    while loops.join_next().await.is_some() {}
    history.log("exit", "-", "");
}

async fn hold_many(
    args: &Args,
    backend: Arc<dyn Backend>,
    sigterm: &mut Signal,
    exit: HoldManyExit,
) {
    let mut acquiring = tokio::task::JoinSet::new();
    for i in 0..args.count {
        let (backend, mut spec) = (Arc::clone(&backend), spec(args));
        spec = match args.limit {
            Some(n) => LeaseSpec::semaphore(format!("{}/{i}", args.key), n),
            None => LeaseSpec::leader(format!("{}/{i}", args.key)),
        }
        .wait(Wait::Forever)
        .ttl(spec.session_ttl());
        acquiring.spawn(async move { backend.acquire(&spec).await });
    }
    let mut leases = Vec::new();
    while let Some(acquired) = acquiring.join_next().await {
        match acquired {
            Ok(Ok(lease)) => leases.push(lease),
            Ok(Err(e)) => eprintln!("acquire failed: {e}"),
            Err(e) => eprintln!("acquire panicked: {e}"),
        }
    }
    println!("held {}", leases.len());
    sigterm.recv().await;
    let held = leases.iter().filter(|l| l.is_held()).count();
    println!("still held {held}");
    if exit == HoldManyExit::DropAtExit {
        // `leases` is still a local here: each is dropped as `main` returns.
        return;
    }
    backend.shutdown().await;
}

async fn run_loop(args: &Args, backend: Arc<dyn Backend>, history: History, sigterm: &mut Signal) {
    let fenced = match &args.fenced_writes {
        Some(url) => match FencedDb::connect(url).await {
            Ok(db) => Some(db),
            Err(e) => {
                eprintln!(
                    "--fenced-writes: cannot connect to {url}: {}",
                    with_sources(&*e)
                );
                std::process::exit(2);
            }
        },
        None => None,
    };
    let stop = CancellationToken::new();
    let reachability = tokio::spawn(log_reachability(Arc::clone(&backend), history.clone()));
    let on_sigterm = async {
        sigterm.recv().await;
        stop.cancel();
        reachability.abort();
    };
    tokio::join!(
        loop_on(
            Arc::clone(&backend),
            spec(args),
            history.clone(),
            args,
            fenced,
            stop.clone()
        ),
        on_sigterm
    );
    // Gives back what a dropped acquire left to the background (etcd: its pooled lease), as a
    // service does before it exits; without it that is left to expire with its TTL.
    backend.shutdown().await;
    history.log("exit", "-", "");
}

/// Logs `reachability - <state>` whenever `backend.reachability()` changes (read every 100 ms).
async fn log_reachability(backend: Arc<dyn Backend>, history: History) {
    let mut logged = "";
    loop {
        let now = match backend.reachability() {
            Reachability::Reachable => "reachable",
            Reachability::Unreachable { .. } => "unreachable",
            _ => "unknown",
        };
        if now != logged {
            history.log("reachability", "-", now);
            logged = now;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Forever: acquire `spec` (waiting forever), run the work under `Lease::run`, release (logging
/// what `release()` answered). Until `stop`: an acquire in progress is dropped, a lease held is
/// released first. With `fenced`, the work is [`fenced_work`], not under `Lease::run`; a lease
/// found lost once it ends is logged `lost` as `run` would have.
async fn loop_on(
    backend: Arc<dyn Backend>,
    spec: LeaseSpec,
    history: History,
    args: &Args,
    mut fenced: Option<FencedDb>,
    stop: CancellationToken,
) {
    loop {
        history.log("waiting", "-", "");
        let acquired = tokio::select! {
            acquired = backend.acquire(&spec) => acquired,
            () = stop.cancelled() => return,
        };
        let lease = match acquired {
            Ok(lease) => lease,
            Err(error) => {
                history.log("error", "-", &format!("acquire: {error}"));
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(200)) => continue,
                    () = stop.cancelled() => return,
                }
            }
        };
        let seq = lease.sequencer().to_string();
        history.log("acquired", &seq, "");
        lease_tests::panics::inject_at("acquired");
        let outcome = if let Some(db) = fenced.as_mut() {
            let fenced = fenced_work(db, lease.sequencer(), &history, args.write_every, args.hold);
            tokio::select! {
                () = fenced => Some(if lease.is_held() {
                    Ok(())
                } else {
                    Err(lease.lost_reason().unwrap_or(LostReason::Released))
                }),
                () = stop.cancelled() => None,
            }
        } else {
            let guarded = work(
                lease.watcher(),
                history.clone(),
                args.write_every,
                args.hold,
            );
            tokio::select! {
                outcome = lease.run(guarded) => Some(outcome),
                () = stop.cancelled() => None,
            }
        };
        if let Some(Err(reason)) = &outcome {
            history.log("lost", &seq, &reason.to_string());
        }
        // On stop the work is already dropped: give the lease back, then leave.
        let result = lease.release().await;
        history.log("released", &seq, &release_detail(&result));
        if outcome.is_none() {
            return;
        }
    }
}

/// The campaign of `args`, logging its losses and releases, and the worker it runs: each term
/// logs `acquired` and runs the guarded work.
fn logged_campaign(
    args: &Args,
    backend: Arc<dyn Backend>,
    history: &History,
) -> (
    Campaign,
    impl FnMut(LeaseWatcher) -> BoxFuture<'static, Result<(), BoxError>> + Send + 'static,
) {
    let events = history.clone();
    let campaign = Campaign::new(backend, spec(args)).on_event(move |event| match event {
        LeaderEvent::Lost { sequencer, reason } => {
            events.log("lost", &sequencer.to_string(), &reason.to_string());
        }
        LeaderEvent::Released { sequencer } => {
            events.log("released", &sequencer.to_string(), "ok");
        }
        // Who leads, as this process's campaign sees it: a follower's first such line shows it
        // is up and campaigning.
        LeaderEvent::LeaderChanged {
            leader: Some(leader),
        } => {
            events.log("leader", "-", &leader.sequencer.to_string());
        }
        _ => {}
    });
    let (every, hold, history) = (args.write_every, args.hold, history.clone());
    let worker = move |lease: LeaseWatcher| -> BoxFuture<'static, Result<(), BoxError>> {
        let history = history.clone();
        Box::pin(async move {
            let seq = lease.sequencer().to_string();
            history.log("acquired", &seq, "");
            work(lease, history, every, hold).await;
            Ok(())
        })
    };
    (campaign, worker)
}

async fn campaign_select(
    args: &Args,
    backend: Arc<dyn Backend>,
    history: History,
    sigterm: &mut Signal,
) {
    let (campaign, worker) = logged_campaign(args, backend, &history);
    let shutdown = CancellationToken::new();
    tokio::select! {
        ended = campaign.run_until(shutdown, worker) => {
            history.log("campaign-ended", "-", &format!("{ended:?}"));
        }
        _ = sigterm.recv() => {}
    }
    history.log("exit", "-", "");
    // Returns at once: the campaign future was dropped above, and nothing waits for a release.
}

async fn campaign_signal(args: &Args, backend: Arc<dyn Backend>, history: History) {
    let (campaign, worker) = logged_campaign(args, backend, &history);
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(campaign.run_until(shutdown.clone(), worker));
    let signal = lease_core::shutdown_signal().await;
    shutdown.cancel();
    let ended = running.await;
    history.log("exit", "-", &format!("{signal:?}: {ended:?}"));
}

async fn drop_at_exit(
    args: &Args,
    backend: Arc<dyn Backend>,
    history: History,
    sigterm: &mut Signal,
) {
    let spec = spec(args);
    history.log("waiting", "-", "");
    let lease = tokio::select! {
        acquired = backend.acquire(&spec) => match acquired {
            Ok(lease) => lease,
            Err(error) => {
                history.log("error", "-", &format!("acquire: {error}"));
                std::process::exit(2);
            }
        },
        _ = sigterm.recv() => {
            history.log("exit", "-", "");
            return;
        }
    };
    if !guard_until_sigterm(&lease, args, &history, sigterm).await {
        let _ = sigterm.recv().await;
    }
    history.log("exit", "-", "");
    // `lease` is still a local here: it is dropped as `main` returns.
}

/// Logs the acquisition and runs the guarded work under `lease` until it ends, the lease is lost
/// (logged), or SIGTERM arrives. Returns whether SIGTERM ended it.
async fn guard_until_sigterm(
    lease: &Lease,
    args: &Args,
    history: &History,
    sigterm: &mut Signal,
) -> bool {
    let seq = lease.sequencer().to_string();
    history.log("acquired", &seq, "");
    let guarded = work(
        lease.watcher(),
        history.clone(),
        args.write_every,
        args.hold,
    );
    tokio::select! {
        outcome = lease.run(guarded) => {
            if let Err(reason) = outcome {
                history.log("lost", &seq, &reason.to_string());
            }
            false
        }
        _ = sigterm.recv() => true,
    }
}

async fn wait_then_exit(
    args: &Args,
    backend: Arc<dyn Backend>,
    history: History,
    sigterm: &mut Signal,
) {
    let spec = spec(args);
    history.log("waiting", "-", "");
    tokio::select! {
        acquired = backend.acquire(&spec) => {
            match acquired {
                Ok(lease) => {
                    guard_until_sigterm(&lease, args, &history, sigterm).await;
                    let seq = lease.sequencer().to_string();
                    let result = lease.release().await;
                    history.log("released", &seq, &release_detail(&result));
                }
                Err(error) => history.log("error", "-", &format!("acquire: {error}")),
            }
        }
        // The acquire future is dropped here, mid-wait; main returns at once.
        _ = sigterm.recv() => {}
    }
    history.log("exit", "-", "");
}
