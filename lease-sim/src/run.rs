//! One schedule, run: the server model and the processes started, the faults applied and healed
//! at their times, recovery awaited, the processes stopped, and every invariant judged.
//!
//! The run's own checks, beside those of [`crate::check`]:
//!
//! - **a loss is noticed within the fence interval**: every 100 ms the simulation compares each
//!   lease a process holds with the server; one the server no longer has must read as not held
//!   within its TTL (the fence runs out sooner) — a lease that runs on unnoticed is a blind spot;
//! - **recovery**: after the last fault heals, within [`recovery_bound`], a process leads (writes
//!   under the leader key), every live process's backend reads reachable, and no campaign has
//!   given up;
//! - **no panic**, anywhere (a hook records them);
//! - **nothing left behind**: once every process has stopped and the TTL has passed, the server
//!   keeps no session or lease and no key held by one.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use lease_core::Sequencer;
use lease_core::backend::Reachability;
use lease_core::leader::CampaignState;
use tokio::task::LocalSet;
use tokio::time::Instant;

use crate::check::{self, NOTICE, Seen};
use crate::net::{Net, NetConfig};
use crate::panics;
use crate::rng::Rng;
use crate::schedule::{LEADER, Schedule};
use crate::server::Server;
use crate::workload::{self, Running, Settings, Shared};
use crate::world::{self, Process};

mod faults;
mod operator;

/// The server's host.
const SERVER: &str = "server";

/// How long the run goes on after recovery, for what recovery might have broken.
const AFTER_RECOVERY: Duration = Duration::from_secs(3);

/// How much longer than its faults and recovery a run may go on (stopping, the server forgetting
/// what the processes left) before it counts as hung.
const RUN_BOUND: Duration = Duration::from_secs(300);

/// How long a process may take to stop (the campaign's drain and `Backend::shutdown`'s bound).
const STOP_BOUND: Duration = Duration::from_secs(15);

/// What a run found.
#[derive(Debug)]
pub struct Outcome {
    /// The backend's name.
    pub backend: &'static str,
    /// The schedule run.
    pub schedule: Schedule,
    /// Each broken invariant, told with the history around it.
    pub violations: Vec<String>,
    /// The hash of the whole history.
    pub hash: u64,
    /// From the last heal to recovery, if it came.
    pub recovered_after: Option<Duration>,
    /// Simulated time the run took.
    pub simulated: Duration,
    /// Lines in the history.
    pub lines: usize,
    /// Segments the network carried (about two per request and answer).
    pub segments: u64,
    /// The whole history, as text (one line per event).
    pub history: String,
}

impl Outcome {
    /// A run that could not be judged: `why`, after `simulated`.
    fn broken(schedule: &Schedule, why: String, simulated: Duration) -> Outcome {
        Outcome {
            backend: "?",
            schedule: schedule.clone(),
            violations: vec![why],
            hash: 0,
            recovered_after: None,
            simulated,
            lines: 0,
            segments: 0,
            history: String::new(),
        }
    }
}

/// The bound on recovery after the last heal: a session or lease the server may keep up to
/// `ttl × multiplier` after its holder last renewed it (Consul: up to twice the TTL), its
/// lock-delay, the settle, and the campaign's longest pause between attempts (10 s), with 2 s of
/// slack for the requests themselves.
pub fn recovery_bound(schedule: &Schedule) -> Duration {
    schedule.ttl * 2 + schedule.lock_delay + Duration::from_secs(12)
}

/// Runs `schedule` against the model `model` builds.
pub fn run(schedule: &Schedule, model: &dyn Fn(&Schedule) -> Rc<dyn Server>) -> Outcome {
    panics::install();
    panics::take();
    let runtime = match world::runtime(schedule.seed) {
        Ok(runtime) => runtime,
        Err(error) => {
            return Outcome::broken(schedule, format!("no runtime: {error}"), Duration::ZERO);
        }
    };
    let root = LocalSet::new();
    let bound = schedule.healed_at() + recovery_bound(schedule) + RUN_BOUND;
    let simulated = async { tokio::time::timeout(bound, simulate(schedule.clone(), model)).await };
    let mut outcome = root.block_on(&runtime, simulated).unwrap_or_else(|_| {
        let why = format!(
            "the run did not end within {bound:?} of simulated time (something waits for ever)"
        );
        Outcome::broken(schedule, why, bound)
    });
    {
        // What is left (killed processes' tasks) is dropped inside the runtime: a task's
        // destructor may start another.
        let _inside = runtime.enter();
        drop(root);
    }
    drop(runtime);
    for panic in panics::take() {
        outcome.violations.push(format!("panic: {panic}"));
    }
    outcome
}

/// A process slot: who runs there now.
struct Slot {
    process: Process,
    running: Option<Running>,
}

struct Sim {
    schedule: Schedule,
    net: Net,
    model: Rc<dyn Server>,
    shared: Shared,
    settings: Settings,
    slots: RefCell<Vec<Slot>>,
    /// Killed processes and their workloads: never polled again, dropped with the run.
    graveyard: RefCell<Vec<Slot>>,
    /// Every process ever started, by pid.
    started: RefCell<u32>,
    seen: RefCell<Seen>,
    violations: RefCell<Vec<String>>,
    start: Instant,
    seeds: RefCell<Rng>,
}

async fn simulate(schedule: Schedule, model: &dyn Fn(&Schedule) -> Rc<dyn Server>) -> Outcome {
    let rng = Rng::new(schedule.seed);
    let net = Net::new(rng.fork("net"), NetConfig::default());
    let model = model(&schedule);
    let lines_show_waiters = model.line_shows_waiters();
    let sim = Rc::new(Sim {
        settings: Settings {
            ttl: schedule.ttl,
            lock_delay: schedule.lock_delay,
            quiet: schedule.quiet,
        },
        schedule,
        net,
        model,
        shared: Shared::default(),
        slots: RefCell::new(Vec::new()),
        graveyard: RefCell::new(Vec::new()),
        started: RefCell::new(0),
        seen: RefCell::new(Seen {
            lines_show_waiters,
            ..Seen::default()
        }),
        violations: RefCell::new(Vec::new()),
        start: Instant::now(),
        seeds: RefCell::new(rng.fork("processes")),
    });
    let server = Process::start(SERVER, &sim.net, sim.seeds.borrow_mut().next_u64());
    match sim.net.listen(SERVER, sim.model.port()) {
        Ok(listener) => sim.model.serve(&server, listener),
        Err(error) => sim.violate(format!("the server cannot listen: {error}")),
    }
    for slot in 0..sim.schedule.processes {
        let process = sim.start_process(slot);
        sim.slots.borrow_mut().push(process);
    }
    let oracle = tokio::task::spawn_local(Rc::clone(&sim).oracle());
    for planned in sim.schedule.faults.clone() {
        tokio::time::sleep_until(sim.start + planned.at).await;
        Rc::clone(&sim).apply(&server, planned.fault);
    }
    let healed = sim.start + sim.schedule.healed_at();
    tokio::time::sleep_until(healed).await;
    let recovered_after = sim.recovery(healed).await;
    tokio::time::sleep(AFTER_RECOVERY).await;
    oracle.abort();
    sim.stop_all().await;
    sim.shared.trace.note("stopped", "every process");
    tokio::time::sleep(sim.model.forgets_within(sim.schedule.ttl) + Duration::from_secs(2)).await;
    let left = sim.model.leftovers();
    if !left.is_empty() {
        sim.violate(format!(
            "left behind once every process stopped and the TTL passed: {left:?}"
        ));
    }
    let history = sim.shared.trace.history();
    let seen = sim.seen.borrow().clone();
    let mut violations = sim.violations.borrow().clone();
    violations.extend(check::safety(&history, &seen));
    violations.extend(check::sequencers_rise(&history, &seen));
    violations.extend(check::acquires_within_bounds(&history, &seen));
    Outcome {
        backend: sim.model.name(),
        schedule: sim.schedule.clone(),
        violations,
        hash: sim.shared.trace.hash(),
        recovered_after,
        simulated: sim.start.elapsed(),
        lines: history.lines().len(),
        segments: sim.net.stats().1.segments,
        history: history.lines().iter().map(|l| format!("{l}\n")).collect(),
    }
}

impl Sim {
    fn violate(&self, what: String) {
        self.violations.borrow_mut().push(what);
    }

    fn now_ns(&self) -> u128 {
        self.start.elapsed().as_nanos()
    }

    /// A new process in `slot`, its workload running.
    fn start_process(&self, slot: usize) -> Slot {
        let pid = {
            let mut started = self.started.borrow_mut();
            *started += 1;
            *started - 1
        };
        let name = format!("p{slot}.{pid}");
        let process = Process::start(&name, &self.net, self.seeds.borrow_mut().next_u64());
        let backend = self.model.client(&process, SERVER);
        let running = match workload::start(
            &process,
            pid,
            Arc::clone(&backend),
            &self.settings,
            &self.shared,
        ) {
            Ok(running) => Some(running),
            Err(error) => {
                self.violate(format!("process {name} could not start: {error}"));
                None
            }
        };
        self.shared
            .trace
            .note("started", format!("{name} pid {pid}"));
        Slot { process, running }
    }

    fn pid_of(&self, slot: usize) -> Option<u32> {
        let slots = self.slots.borrow();
        slots.get(slot)?.running.as_ref().map(|r| r.pid)
    }

    fn host_of(&self, slot: usize) -> String {
        let slots = self.slots.borrow();
        slots
            .get(slot)
            .map_or_else(String::new, |s| s.process.name().to_owned())
    }

    /// Compares every lease held with the server, every 100 ms, until aborted.
    async fn oracle(self: Rc<Self>) {
        let mut unnoticed: Vec<(String, Instant)> = Vec::new();
        let mut reported: std::collections::BTreeSet<String> = std::collections::BTreeSet::new();
        let allowed = self.schedule.ttl + Duration::from_secs(1);
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let now = Instant::now();
            let held = self.shared.registry.held();
            let mut still = Vec::new();
            for h in held.iter().filter(|h| h.lease.is_held()) {
                let seq = h.lease.sequencer();
                if self.model.holds(seq) {
                    continue;
                }
                let text = seq.to_string();
                if reported.contains(&text) {
                    continue;
                }
                if !unnoticed.iter().any(|(s, _)| *s == text) {
                    self.taken_in_flight(seq, &text);
                }
                let since = (unnoticed.iter().find(|(s, _)| *s == text)).map_or(now, |(_, t)| *t);
                if now - since > allowed {
                    self.violate(format!(
                        "unnoticed loss: pid {} still holds {text} {:.3} s after the server let it go (at {:.3} s)\n{}",
                        h.pid,
                        (now - since).as_secs_f64(),
                        self.now_ns() as f64 / 1e9,
                        self.shared.trace.history().around(self.now_ns(), 12)
                    ));
                    reported.insert(text);
                    continue;
                }
                still.push((text, since));
            }
            unnoticed = still;
        }
    }

    /// A lease the server no longer has when the oracle first sees it held: if its key existed
    /// before an operator's action within [`NOTICE`] (the grant was applied before the action,
    /// its answer reached the holder after), that action took it, as if the holder had already
    /// known it held it.
    fn taken_in_flight(&self, seq: &Sequencer, text: &str) {
        let created = match seq.generation() {
            0 => seq.index(),
            generation => generation,
        };
        let now = self.now_ns();
        let mut seen = self.seen.borrow_mut();
        let action = (seen.actions.iter_mut().rev())
            .take_while(|a| a.at + NOTICE.as_nanos() >= now)
            .find(|a| created <= a.index);
        if let Some(action) = action {
            if !action.took.iter().any(|t| t == text) {
                action.took.push(text.to_owned());
            }
        }
    }

    /// Waits for recovery after the heal at `healed`; a violation if it does not come within the
    /// bound.
    async fn recovery(&self, healed: Instant) -> Option<Duration> {
        let bound = recovery_bound(&self.schedule);
        let healed_ns = healed.duration_since(self.start).as_nanos();
        loop {
            let leads = self
                .shared
                .trace
                .last_write(LEADER)
                .is_some_and(|t| t >= healed_ns);
            // Read inside each process: a backend that finds its server unreachable starts its
            // probe from `reachability()`, and that task is the process's own.
            let reads: Vec<_> = {
                let slots = self.slots.borrow();
                (slots.iter())
                    .filter_map(|s| {
                        let running = s.running.as_ref()?;
                        // A killed process (its replacement may start at this very instant) or
                        // a frozen one would not answer: not recovered yet.
                        if s.process.is_killed() || s.process.is_frozen() {
                            return Some(None);
                        }
                        let backend = Arc::clone(&running.backend);
                        let campaign = running.campaign.clone();
                        Some(Some(s.process.spawn(async move {
                            (backend.reachability(), campaign.state())
                        })))
                    })
                    .collect()
            };
            let (mut reachable, mut campaigning) = (true, true);
            for read in reads {
                let answer = match read {
                    Some(read) => read.await.ok(),
                    None => None,
                };
                let (reachability, state) =
                    answer.unwrap_or((Reachability::Unknown, CampaignState::Abandoned));
                reachable &= reachability == Reachability::Reachable;
                campaigning &= state == CampaignState::Running;
            }
            if leads && reachable && campaigning {
                let after = healed.elapsed();
                self.shared
                    .trace
                    .note("recovered", format!("after {after:?}"));
                return Some(after);
            }
            if healed.elapsed() > bound {
                self.violate(format!(
                    "recovery: {:?} after the last heal: a leader writing {leads}, every backend reachable {reachable}, every campaign running {campaigning}\n{}",
                    bound,
                    self.shared.trace.history().around(self.now_ns(), 20)
                ));
                return None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Stops every live process's workload, each within [`STOP_BOUND`].
    async fn stop_all(&self) {
        let running: Vec<(String, Running)> = {
            let mut slots = self.slots.borrow_mut();
            slots
                .iter_mut()
                .filter_map(|s| Some((s.process.name().to_owned(), s.running.take()?)))
                .collect()
        };
        let stops = running.into_iter().map(|(name, running)| async move {
            if tokio::time::timeout(STOP_BOUND, running.stop())
                .await
                .is_err()
            {
                Some(format!("{name} did not stop within {STOP_BOUND:?}"))
            } else {
                None
            }
        });
        for late in futures_join_all(stops).await.into_iter().flatten() {
            self.violate(late);
        }
    }
}

/// Awaits every future, concurrently, in order.
async fn futures_join_all<F>(futures: impl IntoIterator<Item = F>) -> Vec<F::Output>
where
    F: std::future::Future + 'static,
    F::Output: 'static,
{
    let handles: Vec<_> = futures.into_iter().map(tokio::task::spawn_local).collect();
    let mut out = Vec::new();
    for handle in handles {
        if let Ok(value) = handle.await {
            out.push(value);
        }
    }
    out
}

impl std::fmt::Debug for Sim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sim")
            .field("schedule", &self.schedule)
            .finish_non_exhaustive()
    }
}
