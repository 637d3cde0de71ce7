//! The demo a newcomer runs first: leader failover and a shared job semaphore, with nothing to
//! install.
//!
//! Three simulated nodes (tasks sharing one backend) campaign for a leader-only scheduler and share
//! a 2-slot semaphore for jobs; a gateway that never campaigns observes who leads. After a few
//! seconds an operator invalidates the leader's session: the old leader's work is cancelled, the
//! lock-delay passes, another node is elected with a higher LockIndex. The demo then shuts every
//! node down (each releases at once) and prints a summary of what it measured: failover time, jobs
//! run, and how often two leaders (or more than two job holders) were active at once.
//!
//! ```text
//! cargo run -p lease-demo                                   # in-process memory backend
//! cargo run -p lease-demo --features consul -- --consul     # a Consul agent (also: etcd, amqp,
//!                                                           # postgres, redis)
//! cargo run -p lease-demo -- --help
//! ```

use std::fmt;
use std::io::IsTerminal;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use lease_conformance::Operator;
use lease_core::CancellationToken;
use lease_core::leader::{Campaign, LeaderEvent};
use lease_core::memory::Memory;
use lease_core::{Backend, BoxError, LeaseSpec, LeaseWatcher, Sequencer, Wait};
use tokio::sync::mpsc;
use tokio::time::Instant;

const LEADER_KEY: &str = "demo/scheduler/leader";
const JOBS_PREFIX: &str = "demo/jobs";
const JOB_SLOTS: u32 = 2;
const NODES: [&str; 3] = ["node-1", "node-2", "node-3"];
/// Long enough to show the old leader stopping before anyone else may lead; short for a demo.
const LOCK_DELAY: Duration = Duration::from_secs(1);
const KILL_AFTER: Duration = Duration::from_secs(3);
const RUN_AFTER_FAILOVER: Duration = Duration::from_millis(2500);
const ROUND: Duration = Duration::from_millis(500);

const HELP: &str = "\
lease-demo: leader failover and a shared job semaphore, measured.

USAGE:
    cargo run -p lease-demo [--features consul|etcd|amqp|postgres|redis] [-- OPTIONS]

OPTIONS:
    (none)          Run on the in-process memory backend: nothing to install.
                    Each server backend below needs the demo built with its feature.
    --consul [URL]  Run against a Consul agent (URL defaults to CONSUL_HTTP_ADDR, then
                    http://127.0.0.1:8500). The leader is killed with PUT /v1/session/destroy.
    --etcd [URL]    Run against etcd (URLs default to ETCD_ENDPOINTS, then
                    http://127.0.0.1:2379; comma-separated for a cluster). The leader is killed
                    by revoking its etcd lease, as `etcdctl lease revoke` does.
    --amqp URL      Run against RabbitMQ, e.g. amqp://guest:guest@127.0.0.1:5672/%2f. The leader
                    (a one-slot persistent semaphore) is killed by removing its slot.
    --postgres [URL]
                    Run against PostgreSQL (URL defaults to LEASE_POSTGRES_URL, then
                    DATABASE_URL), e.g. postgres://postgres@127.0.0.1:5432/postgres. The
                    leader is killed by deleting its row from the lease table.
    --redis [URL]   Run against Redis or Valkey (URL defaults to LEASE_REDIS_URL, then
                    REDIS_URL), e.g. redis://127.0.0.1:6379. The leader is killed by
                    deleting its key (DEL lease:{...}), which it learns within milliseconds.
    -h, --help      Print this help.

The demo ends by itself after about 8 seconds and prints a summary; its last line is
`SUMMARY key=value ...` for scripts. The exit status is 1 if two leaders ever overlapped.
RUST_LOG filters the output (default: lease_demo=info,lease_core=error,lease_consul=error,lease_etcd=error,lease_amqp=error,
lease_postgres=error,lease_redis=error).";

/// Which backend the command line asked for.
#[derive(Debug, PartialEq, Eq)]
enum Choice {
    Memory,
    Consul(Option<String>),
    Etcd(Option<String>),
    Amqp(String),
    Postgres(Option<String>),
    Redis(Option<String>),
    Help,
}

fn parse_args(args: impl IntoIterator<Item = String>) -> Result<Choice, String> {
    let mut args = args.into_iter().peekable();
    let mut choice = Choice::Memory;
    while let Some(arg) = args.next() {
        let next = match arg.as_str() {
            "-h" | "--help" => return Ok(Choice::Help),
            "--consul" => Choice::Consul(args.next_if(|a| !a.starts_with("--"))),
            "--etcd" => Choice::Etcd(args.next_if(|a| !a.starts_with("--"))),
            "--postgres" => Choice::Postgres(args.next_if(|a| !a.starts_with("--"))),
            "--redis" => Choice::Redis(args.next_if(|a| !a.starts_with("--"))),
            "--amqp" => match args.next() {
                Some(url) if !url.starts_with("--") => Choice::Amqp(url),
                _ => {
                    return Err(
                        "--amqp needs a URL, e.g. --amqp amqp://guest:guest@127.0.0.1:5672".into(),
                    );
                }
            },
            other => return Err(format!("unknown argument {other:?}; see --help")),
        };
        if choice != Choice::Memory {
            return Err(
                "choose one backend: --consul, --etcd, --amqp, --postgres or --redis, not several"
                    .into(),
            );
        }
        choice = next;
    }
    Ok(choice)
}

/// The backend the nodes share, chosen by flags, and its operator.
struct Setup {
    name: &'static str,
    backend: Arc<dyn Backend>,
    /// Takes the leader's lease away, as an administrator of that backend would.
    operator: Box<dyn Operator>,
}

fn connect(choice: Choice) -> Result<Setup, String> {
    match choice {
        Choice::Memory | Choice::Help => {
            let memory = Memory::new();
            Ok(Setup {
                name: "memory (in-process)",
                backend: Arc::new(memory.clone()),
                operator: Box::new(memory),
            })
        }
        #[cfg(feature = "consul")]
        Choice::Consul(url) => {
            let mut builder = lease_consul::ConsulBuilder::from_env();
            if let Some(url) = url {
                builder = builder.address(url);
            }
            let consul = builder.build().map_err(|e| e.to_string())?;
            Ok(Setup {
                name: "Consul",
                backend: Arc::new(consul.clone()),
                operator: Box::new(consul),
            })
        }
        #[cfg(feature = "etcd")]
        Choice::Etcd(urls) => {
            let mut builder = lease_etcd::EtcdBuilder::from_env();
            if let Some(urls) = urls {
                builder = builder.endpoints(urls.split(','));
            }
            let etcd = builder.build().map_err(|e| e.to_string())?;
            Ok(Setup {
                name: "etcd",
                backend: Arc::new(etcd.clone()),
                operator: Box::new(etcd),
            })
        }
        #[cfg(feature = "amqp")]
        Choice::Amqp(url) => {
            let amqp = lease_amqp::Amqp::new(url).map_err(|e| e.to_string())?;
            Ok(Setup {
                name: "RabbitMQ",
                backend: Arc::new(amqp.clone()),
                operator: Box::new(amqp),
            })
        }
        #[cfg(feature = "postgres")]
        Choice::Postgres(url) => {
            let postgres = match url {
                Some(url) => lease_postgres::Postgres::new(&url),
                None => lease_postgres::Postgres::from_env(),
            }
            .map_err(|e| e.to_string())?;
            Ok(Setup {
                name: "PostgreSQL",
                backend: Arc::new(postgres.clone()),
                operator: Box::new(postgres),
            })
        }
        #[cfg(feature = "redis")]
        Choice::Redis(url) => {
            let redis = match url {
                Some(url) => lease_redis::Redis::new(&url),
                None => lease_redis::Redis::from_env(),
            }
            .map_err(|e| e.to_string())?;
            Ok(Setup {
                name: "Redis",
                backend: Arc::new(redis.clone()),
                operator: Box::new(redis),
            })
        }
        #[cfg(not(all(
            feature = "consul",
            feature = "etcd",
            feature = "amqp",
            feature = "postgres",
            feature = "redis"
        )))]
        other => Err(not_built(&other)),
    }
}

/// Why a backend the flags asked for is not in this build, and the command that has it.
#[cfg(not(all(
    feature = "consul",
    feature = "etcd",
    feature = "amqp",
    feature = "postgres",
    feature = "redis"
)))]
fn not_built(choice: &Choice) -> String {
    let with_url = |flag: &str, url: Option<&String>| match url {
        Some(url) => format!("{flag} {url}"),
        None => flag.to_owned(),
    };
    let (feature, flags) = match choice {
        Choice::Consul(url) => ("consul", with_url("--consul", url.as_ref())),
        Choice::Etcd(urls) => ("etcd", with_url("--etcd", urls.as_ref())),
        Choice::Amqp(url) => ("amqp", with_url("--amqp", Some(url))),
        Choice::Postgres(url) => ("postgres", with_url("--postgres", url.as_ref())),
        Choice::Redis(url) => ("redis", with_url("--redis", url.as_ref())),
        Choice::Memory | Choice::Help => ("", String::new()),
    };
    format!(
        "this demo was built without the {feature} backend (so that the first build stays \
         small); run it with: cargo run -p lease-demo --features {feature} -- {flags}"
    )
}

/// What the demo measures. Every figure of the summary comes from here, recorded as it happened.
#[derive(Default)]
struct Ledger {
    inner: Mutex<LedgerState>,
}

#[derive(Default)]
struct LedgerState {
    tenures: Vec<Tenure>,
    leaders_now: u32,
    max_leaders: u32,
    jobs_now: u32,
    max_jobs: u32,
    jobs_run: u64,
    jobs_cancelled: u64,
    /// The highest LockIndex a downstream system has accepted a write from (fencing).
    fence: u64,
    stale_writes: u64,
    writes: u64,
}

struct Tenure {
    start: Instant,
    end: Option<Instant>,
}

impl Ledger {
    fn lock(&self) -> std::sync::MutexGuard<'_, LedgerState> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn leader_started(self: &Arc<Self>, node: &'static str) -> TenureGuard {
        let mut state = self.lock();
        state.leaders_now += 1;
        state.max_leaders = state.max_leaders.max(state.leaders_now);
        state.tenures.push(Tenure {
            start: Instant::now(),
            end: None,
        });
        TenureGuard {
            ledger: Arc::clone(self),
            slot: state.tenures.len() - 1,
            node,
            rounds: 0,
        }
    }

    /// A write to a downstream system that fences by sequencer: older LockIndexes are refused.
    fn fenced_write(&self, sequencer: &Sequencer) -> bool {
        let mut state = self.lock();
        state.writes += 1;
        if sequencer.index() < state.fence {
            state.stale_writes += 1;
            return false;
        }
        state.fence = sequencer.index();
        true
    }

    fn job_started(self: &Arc<Self>) -> JobGuard {
        let mut state = self.lock();
        state.jobs_now += 1;
        state.max_jobs = state.max_jobs.max(state.jobs_now);
        JobGuard {
            ledger: Arc::clone(self),
        }
    }

    /// Pairs of leader tenures whose running times intersect, measured from start/end instants.
    fn leader_overlaps(&self) -> usize {
        let state = self.lock();
        let now = Instant::now();
        let mut overlaps = 0;
        for (i, a) in state.tenures.iter().enumerate() {
            for b in &state.tenures[i + 1..] {
                if a.start < b.end.unwrap_or(now) && b.start < a.end.unwrap_or(now) {
                    overlaps += 1;
                }
            }
        }
        overlaps
    }
}

/// Lives inside the leader's worker future: dropped exactly when the work stops or is cancelled.
struct TenureGuard {
    ledger: Arc<Ledger>,
    slot: usize,
    node: &'static str,
    rounds: u64,
}

impl Drop for TenureGuard {
    fn drop(&mut self) {
        let mut state = self.ledger.lock();
        state.leaders_now -= 1;
        if let Some(tenure) = state.tenures.get_mut(self.slot) {
            tenure.end = Some(Instant::now());
        }
        drop(state);
        tracing::info!(
            node = self.node,
            rounds = self.rounds,
            "leader work stopped (its future was dropped)"
        );
    }
}

struct JobGuard {
    ledger: Arc<Ledger>,
}

impl Drop for JobGuard {
    fn drop(&mut self) {
        self.ledger.lock().jobs_now -= 1;
    }
}

/// The leader-only work: a scheduler that writes one fenced round every [`ROUND`].
async fn lead(
    node: &'static str,
    lease: LeaseWatcher,
    ledger: Arc<Ledger>,
) -> Result<(), BoxError> {
    let mut tenure = ledger.leader_started(node);
    loop {
        tenure.rounds += 1;
        if ledger.fenced_write(lease.sequencer()) {
            tracing::info!(
                node,
                round = tenure.rounds,
                lock_index = lease.sequencer().index(),
                "leader: scheduling round"
            );
        } else {
            tracing::error!(
                node,
                "leader: a downstream system refused a stale sequencer"
            );
        }
        tokio::time::sleep(ROUND).await;
    }
}

/// A node's job loop: take one of the semaphore's slots, run a job under it, give it back.
async fn run_jobs(
    node: &'static str,
    backend: Arc<dyn Backend>,
    ledger: Arc<Ledger>,
    shutdown: CancellationToken,
    pace: Duration,
) {
    let spec = LeaseSpec::semaphore(JOBS_PREFIX, JOB_SLOTS)
        .lock_delay(LOCK_DELAY)
        .value(node)
        .wait(Wait::Forever);
    loop {
        let acquired = tokio::select! {
            biased;
            () = shutdown.cancelled() => return,
            acquired = backend.acquire(&spec) => acquired,
        };
        let lease = match acquired {
            Ok(lease) => lease,
            Err(error) => {
                tracing::warn!(node, %error, "jobs: could not take a slot; retrying");
                tokio::time::sleep(ROUND).await;
                continue;
            }
        };
        let job = ledger.job_started();
        let outcome = lease.run(tokio::time::sleep(pace)).await;
        drop(job);
        match outcome {
            Ok(()) => {
                let mut state = ledger.lock();
                state.jobs_run += 1;
                tracing::debug!(node, slot = %lease.sequencer(), "jobs: job done");
            }
            Err(reason) => {
                ledger.lock().jobs_cancelled += 1;
                tracing::warn!(node, %reason, "jobs: slot lost; the job was cancelled");
            }
        }
        if let Err(error) = lease.release().await {
            tracing::warn!(node, %error, "jobs: release failed");
        }
    }
}

/// What the timeline learned from the campaigns' events.
#[derive(Default)]
struct Timeline {
    leader: Option<(&'static str, Sequencer)>,
    elections: Vec<(&'static str, u64)>,
}

fn describe(event: &LeaderEvent) -> Option<String> {
    Some(match event {
        LeaderEvent::Elected { sequencer } => {
            format!(
                "elected leader (LockIndex {}, session {})",
                sequencer.index(),
                sequencer.holder()
            )
        }
        LeaderEvent::Lost { reason, sequencer } => {
            format!(
                "lost leadership (LockIndex {}): {reason}; its work was cancelled",
                sequencer.index()
            )
        }
        LeaderEvent::Released { sequencer } => format!(
            "released leadership (LockIndex {}) on shutdown",
            sequencer.index()
        ),
        LeaderEvent::AcquireFailed { error, retry_in } => {
            format!("campaign error: {error}; retrying in {retry_in:?}")
        }
        LeaderEvent::WorkerFailed { error, .. } => format!("leader work failed: {error}"),
        LeaderEvent::WorkerPanicked { message, .. } => format!("leader work panicked: {message}"),
        _ => return None,
    })
}

struct Summary {
    failover: Option<Duration>,
    jobs_run: u64,
    jobs_cancelled: u64,
    max_jobs: u32,
    leader_overlaps: usize,
    max_leaders: u32,
    elections: Vec<(&'static str, u64)>,
    stale_writes: u64,
    writes: u64,
    sessions_left: Option<usize>,
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let elections: Vec<String> = self
            .elections
            .iter()
            .map(|(node, index)| format!("{node} (LockIndex {index})"))
            .collect();
        writeln!(f, "== summary ==")?;
        writeln!(f, "leaders, in order:        {}", elections.join(" -> "))?;
        match self.failover {
            Some(took) => writeln!(
                f,
                "failover took:            {} ms (lock-delay {LOCK_DELAY:?})",
                took.as_millis()
            )?,
            None => writeln!(f, "failover took:            NO FAILOVER OBSERVED")?,
        }
        writeln!(
            f,
            "jobs run:                 {} ({} cancelled), at most {} at once (limit {JOB_SLOTS})",
            self.jobs_run, self.jobs_cancelled, self.max_jobs
        )?;
        writeln!(
            f,
            "leader overlaps:          {} (at most {} leader at once)",
            self.leader_overlaps, self.max_leaders
        )?;
        writeln!(
            f,
            "fenced writes:            {} accepted, {} stale refused",
            self.writes - self.stale_writes,
            self.stale_writes
        )?;
        if let Some(left) = self.sessions_left {
            writeln!(f, "sessions left behind:     {left}")?;
        }
        write!(
            f,
            "SUMMARY failover_ms={} jobs_run={} max_jobs_in_flight={} leader_overlaps={} max_leaders={} elections={} stale_writes={} sessions_left={}",
            self.failover
                .map_or(-1, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
            self.jobs_run,
            self.max_jobs,
            self.leader_overlaps,
            self.max_leaders,
            self.elections.len(),
            self.stale_writes,
            self.sessions_left
                .map_or(-1, |n| i64::try_from(n).unwrap_or(i64::MAX)),
        )
    }
}

async fn run_demo(setup: Setup) -> Summary {
    tracing::info!(
        backend = setup.name,
        nodes = NODES.len(),
        job_slots = JOB_SLOTS,
        "demo: starting"
    );
    let ledger = Arc::new(Ledger::default());
    let shutdown = CancellationToken::new();
    // SIGTERM or Ctrl-C ends the demo early, the way a service stops: every node steps down.
    let stop = shutdown.clone();
    tokio::spawn(async move {
        lease_core::shutdown_signal().await;
        stop.cancel();
    });
    let (events_tx, mut events) = mpsc::unbounded_channel::<(&'static str, LeaderEvent)>();
    let mut tasks = Vec::new();

    for (i, node) in NODES.into_iter().enumerate() {
        let spec = LeaseSpec::leader(LEADER_KEY)
            .lock_delay(LOCK_DELAY)
            .value(format!("http://{node}.demo:8080"));
        let events_tx = events_tx.clone();
        let worker_ledger = Arc::clone(&ledger);
        let campaign = Campaign::new(Arc::clone(&setup.backend), spec).on_event(move |event| {
            let _ = events_tx.send((node, event));
        });
        tasks.push(tokio::spawn({
            let shutdown = shutdown.clone();
            async move {
                if let Err(error) = campaign
                    .run_until(shutdown, move |lease| {
                        lead(node, lease, Arc::clone(&worker_ledger))
                    })
                    .await
                {
                    tracing::error!(node, %error, "campaign stopped");
                }
            }
        }));
        let pace = Duration::from_millis(300 + 100 * i as u64);
        tasks.push(tokio::spawn(run_jobs(
            node,
            Arc::clone(&setup.backend),
            Arc::clone(&ledger),
            shutdown.clone(),
            pace,
        )));
    }
    drop(events_tx);

    // A gateway that never campaigns: it only follows the leader, to route requests to it.
    let gateway = match setup.backend.observe_leader(LEADER_KEY).await {
        Ok(mut observer) => {
            let shutdown = shutdown.clone();
            tracing::info!(
                node = "gateway",
                leader = observer
                    .leader()
                    .as_ref()
                    .and_then(|l| l.value_str().map(str::to_owned)),
                "gateway: following the leader key without campaigning"
            );
            Some(tokio::spawn(async move {
                loop {
                    tokio::select! {
                        () = shutdown.cancelled() => return,
                        changed = observer.changed() => match changed {
                            Ok(Some(leader)) => tracing::info!(
                                node = "gateway",
                                leader = leader.value_str().unwrap_or("?"),
                                lock_index = leader.sequencer.index(),
                                "gateway: routing leader-only requests to the new leader"
                            ),
                            Ok(None) => tracing::info!(node = "gateway", "gateway: no leader right now; holding leader-only requests"),
                            Err(_) => return,
                        },
                    }
                }
            }))
        }
        Err(error) => {
            tracing::info!(%error, "gateway: this backend cannot observe the leader; skipping it");
            None
        }
    };

    // The semaphore at work, once a second.
    tokio::spawn({
        let ledger = Arc::clone(&ledger);
        let shutdown = shutdown.clone();
        async move {
            let mut tick = tokio::time::interval_at(
                Instant::now() + Duration::from_secs(1),
                Duration::from_secs(1),
            );
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    _ = tick.tick() => {
                        let state = ledger.lock();
                        let (done, now) = (state.jobs_run, state.jobs_now);
                        drop(state);
                        tracing::info!(node = "jobs", done, in_flight = now, limit = JOB_SLOTS, "jobs: progress");
                    }
                }
            }
        }
    });

    let mut timeline = Timeline::default();
    let record = |timeline: &mut Timeline, node: &'static str, event: LeaderEvent| {
        if let Some(text) = describe(&event) {
            tracing::info!(node, "{text}");
        }
        match event {
            LeaderEvent::Elected { sequencer } => {
                timeline.elections.push((node, sequencer.index()));
                timeline.leader = Some((node, sequencer));
            }
            LeaderEvent::Lost { sequencer, .. } | LeaderEvent::Released { sequencer }
                if timeline
                    .leader
                    .as_ref()
                    .is_some_and(|(_, s)| *s == sequencer) =>
            {
                timeline.leader = None;
            }
            _ => {}
        }
    };

    // Phase 1: let the nodes elect a leader and run jobs.
    let kill_at = Instant::now() + KILL_AFTER;
    while let Ok(Some((node, event))) = tokio::time::timeout_at(kill_at, events.recv()).await {
        record(&mut timeline, node, event);
    }

    // Phase 2: the operator kills the leader; wait for another node to be elected.
    let mut failover = None;
    if let Some((victim, sequencer)) = timeline.leader.clone() {
        tracing::warn!(
            node = "operator",
            victim,
            lock_index = sequencer.index(),
            "operator: taking the lease away from the leader"
        );
        let killed_at = Instant::now();
        match setup.operator.revoke(&sequencer).await {
            Ok(()) => {
                let give_up = killed_at + LOCK_DELAY + Duration::from_secs(8);
                while let Ok(Some((node, event))) =
                    tokio::time::timeout_at(give_up, events.recv()).await
                {
                    let elected =
                        matches!(&event, LeaderEvent::Elected { sequencer: s } if *s != sequencer);
                    record(&mut timeline, node, event);
                    if elected {
                        failover = Some(killed_at.elapsed());
                        break;
                    }
                }
            }
            Err(error) => tracing::error!(%error, "operator: could not take the lease away"),
        }
    } else {
        tracing::error!("demo: no leader was elected in {KILL_AFTER:?}");
    }

    // Phase 3: run on under the new leader, then shut every node down; each releases at once.
    let stop_at = Instant::now() + RUN_AFTER_FAILOVER;
    loop {
        let event = tokio::select! {
            () = shutdown.cancelled() => break,
            event = tokio::time::timeout_at(stop_at, events.recv()) => event,
        };
        let Ok(Some((node, event))) = event else {
            break;
        };
        record(&mut timeline, node, event);
    }
    tracing::info!("demo: shutting every node down");
    shutdown.cancel();
    while let Ok(Some((node, event))) =
        tokio::time::timeout(Duration::from_secs(5), events.recv()).await
    {
        record(&mut timeline, node, event);
    }
    for task in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
    }
    if let Some(gateway) = gateway {
        let _ = gateway.await;
    }

    let (jobs_run, jobs_cancelled, max_jobs, max_leaders, stale_writes, writes) = {
        let state = ledger.lock();
        (
            state.jobs_run,
            state.jobs_cancelled,
            state.max_jobs,
            state.max_leaders,
            state.stale_writes,
            state.writes,
        )
    };
    Summary {
        failover,
        jobs_run,
        jobs_cancelled,
        max_jobs,
        leader_overlaps: ledger.leader_overlaps(),
        max_leaders,
        elections: timeline.elections,
        stale_writes,
        writes,
        sessions_left: setup.operator.sessions_left().await,
    }
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let choice = match parse_args(std::env::args().skip(1)) {
        Ok(Choice::Help) => {
            println!("{HELP}");
            return std::process::ExitCode::SUCCESS;
        }
        Ok(choice) => choice,
        Err(message) => {
            eprintln!("lease-demo: {message}");
            return std::process::ExitCode::from(2);
        }
    };
    let setup = match connect(choice) {
        Ok(setup) => setup,
        Err(message) => {
            eprintln!("lease-demo: {message}");
            return std::process::ExitCode::from(2);
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "lease_demo=info,lease_core=error,lease_consul=error,lease_etcd=error,lease_amqp=error,lease_postgres=error,lease_redis=error".into()),
        )
        .with_target(false)
        .with_timer(tracing_subscriber::fmt::time::uptime())
        // Colour for a person at a terminal, plain text for a pipe, a file or CI.
        .with_ansi(std::io::stdout().is_terminal())
        .init();

    let summary = run_demo(setup).await;
    println!("{summary}");
    if summary.leader_overlaps > 0 || summary.max_jobs > JOB_SLOTS || summary.failover.is_none() {
        std::process::ExitCode::FAILURE
    } else {
        std::process::ExitCode::SUCCESS
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Choice, String> {
        parse_args(args.iter().map(|a| (*a).to_owned()))
    }

    #[test]
    fn parses_the_backend_flags() {
        assert_eq!(parse(&[]), Ok(Choice::Memory));
        assert_eq!(parse(&["--consul"]), Ok(Choice::Consul(None)));
        assert_eq!(
            parse(&["--consul", "http://c:8500"]),
            Ok(Choice::Consul(Some("http://c:8500".into())))
        );
        assert_eq!(
            parse(&["--amqp", "amqp://x"]),
            Ok(Choice::Amqp("amqp://x".into()))
        );
        assert!(parse(&["--amqp"]).is_err());
        assert_eq!(
            parse(&["--etcd", "http://e:2379"]),
            Ok(Choice::Etcd(Some("http://e:2379".into())))
        );
        assert!(parse(&["--etcd", "--consul"]).is_err());
        assert_eq!(parse(&["--postgres"]), Ok(Choice::Postgres(None)));
        assert_eq!(
            parse(&["--postgres", "postgres://p/db"]),
            Ok(Choice::Postgres(Some("postgres://p/db".into())))
        );
        assert!(parse(&["--postgres", "--etcd"]).is_err());
        assert_eq!(parse(&["--redis"]), Ok(Choice::Redis(None)));
        assert!(parse(&["--redis", "--postgres"]).is_err());
        assert!(parse(&["--consul", "--amqp", "amqp://x"]).is_err());
        assert!(parse(&["--bogus"]).is_err());
        assert_eq!(parse(&["--help"]), Ok(Choice::Help));
    }

    /// A backend left out of the build says which feature brings it, with the exact command.
    #[cfg(not(feature = "consul"))]
    #[test]
    fn a_backend_not_built_names_the_feature_that_brings_it() {
        let Err(error) = connect(Choice::Consul(Some("http://c:8500".into()))) else {
            panic!("built without Consul, yet connected");
        };
        assert!(
            error.ends_with("cargo run -p lease-demo --features consul -- --consul http://c:8500"),
            "{error}"
        );
    }
}
