//! What every simulated process runs, as a service would: a campaign for the leader key whose
//! worker writes while it leads, a cron-style leader lease taken and given back in turn, and jobs
//! under a semaphore, churning. Every write is checked with `is_held()` immediately before it
//! (as the process tests' workers do) and goes to the history with its sequencer; every acquire
//! says how long it may wait and what it got.
//!
//! The leases held are also registered, so the simulation can compare each one with what the
//! server holds (the oracle of "a loss is noticed within the fence interval").

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::history::Kind;
use lease_core::backoff::random_below;
use lease_core::leader::{Campaign, CampaignHandle};
use lease_core::{
    Backend, BoxError, BoxFuture, CancellationToken, Lease, LeaseSpec, LeaseWatcher, Wait,
};
use tokio::time::Instant;

use crate::schedule::{CRON, LEADER, QUIET, SEMAPHORE, SEMAPHORE_LIMIT};
use crate::trace::Trace;
use crate::world::Process;

/// How often a holder writes.
pub const WRITE_EVERY: Duration = Duration::from_millis(100);

/// How often a holder writes while the pace is dense ([`Pace::dense_for`]).
pub const DENSE_EVERY: Duration = Duration::from_millis(1);

/// How often every holder writes: every [`WRITE_EVERY`], and every [`DENSE_EVERY`] for a while
/// after the simulation asks (an operator's action: the moments when an old holder and a new one
/// may overlap by milliseconds, which writes 100 ms apart would rarely show). Clones share it.
#[derive(Clone, Debug)]
pub struct Pace(Arc<tokio::sync::watch::Sender<Instant>>);

impl Pace {
    /// A pace that is not dense.
    pub fn new() -> Pace {
        Pace(Arc::new(tokio::sync::watch::Sender::new(Instant::now())))
    }

    /// Every holder writes every [`DENSE_EVERY`] from now for `lasting` (or longer, if it was
    /// dense longer already); a holder waiting for its next write writes at once.
    pub fn dense_for(&self, lasting: Duration) {
        let until = Instant::now() + lasting;
        self.0.send_if_modified(|dense| {
            let later = until > *dense;
            *dense = (*dense).max(until);
            later
        });
    }

    /// Waits until the next write is due, `longest` at most.
    async fn next_write(&self, longest: Duration) {
        let mut dense = self.0.subscribe();
        if Instant::now() < *dense.borrow_and_update() {
            return tokio::time::sleep(DENSE_EVERY.min(longest)).await;
        }
        // Biased: no draw from tokio's random numbers, which would move every later one.
        tokio::select! {
            biased;
            _ = dense.changed() => {}
            () = tokio::time::sleep(WRITE_EVERY.min(longest)) => {}
        }
    }
}

impl Default for Pace {
    fn default() -> Self {
        Pace::new()
    }
}

/// The leases held now, by process.
#[derive(Clone, Debug, Default)]
pub struct Registry(Arc<Mutex<Vec<Held>>>);

/// A lease a process holds, as the registry has it.
#[derive(Clone, Debug)]
pub struct Held {
    /// The process.
    pub pid: u32,
    /// Its lease.
    pub lease: LeaseWatcher,
}

impl Registry {
    fn add(&self, pid: u32, lease: LeaseWatcher) {
        self.lock().push(Held { pid, lease });
    }

    fn remove(&self, lease: &LeaseWatcher) {
        self.lock()
            .retain(|h| h.lease.sequencer() != lease.sequencer());
    }

    /// Forgets every lease of `pid` (killed: it holds nothing that runs).
    pub fn forget(&self, pid: u32) {
        self.lock().retain(|h| h.pid != pid);
    }

    /// The leases held now.
    pub fn held(&self) -> Vec<Held> {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Held>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Removes a lease from the registry when the work holding it ends, however it ends.
struct Registered(Registry, LeaseWatcher);

impl Drop for Registered {
    fn drop(&mut self) {
        self.0.remove(&self.1);
    }
}

/// The settings every lease of a run shares.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Every lease's TTL.
    pub ttl: Duration,
    /// Every lease's lock-delay.
    pub lock_delay: Duration,
    /// How many of the [`QUIET`] keys every process campaigns for.
    pub quiet: usize,
}

impl Settings {
    fn spec(&self, spec: LeaseSpec) -> LeaseSpec {
        spec.ttl(self.ttl).lock_delay(self.lock_delay)
    }
}

/// A process's workload, running.
#[derive(Debug)]
pub struct Running {
    /// The process's number in the history.
    pub pid: u32,
    /// Its backend.
    pub backend: Arc<dyn Backend>,
    /// Its campaign for [`LEADER`].
    pub campaign: CampaignHandle,
    stop: CancellationToken,
    done: tokio::task::JoinHandle<()>,
}

impl Running {
    /// Stops the workload as a service stops on SIGTERM: the campaign steps down, the jobs end,
    /// and `Backend::shutdown` gives back what is left.
    pub async fn stop(self) {
        self.stop.cancel();
        let _ = self.done.await;
    }
}

/// What every process's workload writes to and goes by: the history, the leases held, the pace
/// of writes. Clones share them.
#[derive(Clone, Debug, Default)]
pub struct Shared {
    /// The history.
    pub trace: Trace,
    /// The leases held.
    pub registry: Registry,
    /// How often holders write.
    pub pace: Pace,
}

/// Starts the workload of process `pid` on `process`.
pub fn start(
    process: &Process,
    pid: u32,
    backend: Arc<dyn Backend>,
    settings: &Settings,
    shared: &Shared,
) -> Result<Running, lease_core::Error> {
    let stop = CancellationToken::new();
    let campaign = Campaign::try_new(
        Arc::clone(&backend),
        settings.spec(LeaseSpec::leader(LEADER)),
    )?;
    let handle = campaign.handle();
    let campaigning = campaign.run_until(stop.clone(), leader_worker(pid, LEADER, shared));
    let mut quiet = Vec::new();
    for key in &QUIET[..settings.quiet] {
        let spec = settings.spec(LeaseSpec::leader(*key));
        let campaign = Campaign::try_new(Arc::clone(&backend), spec)?;
        let worker = leader_worker(pid, key, shared);
        quiet.push(process.spawn(campaign.run_until(stop.clone(), worker)));
    }
    let cron = churn(
        pid,
        Arc::clone(&backend),
        settings.spec(LeaseSpec::leader(CRON)),
        shared.clone(),
        stop.clone(),
    );
    let jobs = churn(
        pid,
        Arc::clone(&backend),
        settings.spec(LeaseSpec::semaphore(SEMAPHORE, SEMAPHORE_LIMIT)),
        shared.clone(),
        stop.clone(),
    );
    let shut_down = Arc::clone(&backend);
    let done = process.spawn(async move {
        let (campaigned, (), ()) = tokio::join!(campaigning, cron, jobs);
        drop(campaigned);
        for campaign in quiet {
            drop(campaign.await);
        }
        shut_down.shutdown().await;
    });
    Ok(Running {
        pid,
        backend,
        campaign: handle,
        stop,
        done,
    })
}

/// The worker of a campaign for leader key `key`: it writes while it leads.
fn leader_worker(
    pid: u32,
    key: &'static str,
    shared: &Shared,
) -> impl FnMut(LeaseWatcher) -> BoxFuture<'static, Result<(), BoxError>> + Send + use<> {
    let shared = shared.clone();
    move |lease: LeaseWatcher| {
        let Shared {
            trace,
            registry,
            pace,
        } = shared.clone();
        Box::pin(async move {
            trace.log(pid, Kind::Acquired, &lease.sequencer().to_string(), key);
            registry.add(pid, lease.clone());
            let _registered = Registered(registry, lease.clone());
            loop {
                if lease.is_held() {
                    trace.log(pid, Kind::Write, &lease.sequencer().to_string(), key);
                }
                pace.next_write(WRITE_EVERY).await;
            }
        })
    }
}

/// A duration in `low..=high` milliseconds, from the process's seeded draws.
fn millis(low: u64, high: u64) -> Duration {
    Duration::from_millis(low + random_below(high - low + 1))
}

/// Takes the lease `spec` names, works under it a while, gives it back, rests; until `stop`.
async fn churn(
    pid: u32,
    backend: Arc<dyn Backend>,
    spec: LeaseSpec,
    shared: Shared,
    stop: CancellationToken,
) {
    let trace = &shared.trace;
    let key = spec.key().to_owned();
    while !stop.is_cancelled() {
        let bound = millis(0, 4_000);
        let spec = spec.clone().wait(if bound.is_zero() {
            Wait::Never
        } else {
            Wait::UpTo(bound)
        });
        trace.log(
            pid,
            Kind::Waiting,
            "-",
            format!("{key} bound_ms={}", bound.as_millis()),
        );
        let acquired = tokio::select! {
            biased;
            () = stop.cancelled() => return,
            acquired = backend.acquire(&spec) => acquired,
        };
        match acquired {
            Ok(lease) => work(pid, lease, &key, &shared, &stop).await,
            Err(error) if error.is_busy() => {
                trace.log(pid, Kind::Other("busy".into()), "-", key.clone())
            }
            Err(error) => trace.log(
                pid,
                Kind::Other("error".into()),
                "-",
                format!("{key} {error}"),
            ),
        }
        tokio::select! {
            biased;
            () = stop.cancelled() => return,
            () = tokio::time::sleep(millis(100, 2_000)) => {}
        }
    }
}

/// A job under `lease`: a few writes, then the lease given back.
async fn work(
    pid: u32,
    lease: Lease,
    key: &str,
    Shared {
        trace,
        registry,
        pace,
    }: &Shared,
    stop: &CancellationToken,
) {
    let seq = lease.sequencer().to_string();
    trace.log(pid, Kind::Acquired, &seq, key);
    registry.add(pid, lease.watcher());
    let _registered = Registered(registry.clone(), lease.watcher());
    let until = Instant::now() + millis(50, 3_000);
    let job = async {
        while Instant::now() < until && !stop.is_cancelled() {
            if lease.is_held() {
                trace.log(pid, Kind::Write, &seq, key);
            }
            pace.next_write(until.saturating_duration_since(Instant::now()))
                .await;
        }
    };
    match lease.run(job).await {
        Ok(()) => match lease.release().await {
            Ok(()) => trace.log(pid, Kind::Released, &seq, format!("{key} ok")),
            Err(error) => trace.log(pid, Kind::Released, &seq, format!("{key} err {error}")),
        },
        Err(reason) => trace.log(pid, Kind::Lost, &seq, format!("{key} {reason}")),
    }
}
