//! Many schedules: seeds `from..from + count` of one backend, on `jobs` threads, each failure
//! told with the one command that replays it.

use std::fmt::Write as _;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::run::{self, Outcome};
use crate::schedule::Schedule;
use crate::server::Server;

/// Builds a backend's model for a schedule.
pub type ModelFor = fn(&Schedule) -> Rc<dyn Server>;

/// What a sweep found.
#[derive(Debug, Default)]
pub struct Report {
    /// Schedules run.
    pub runs: u64,
    /// The failing ones, in seed order.
    pub failures: Vec<Outcome>,
    /// Seeds run twice whose histories differed (a determinism break).
    pub nondeterministic: Vec<u64>,
    /// Sweep threads that panicked outside a run (a bug of the simulator: the seeds they had are
    /// not counted).
    pub crashed: usize,
    /// Wall-clock time the sweep took.
    pub took: Duration,
    /// Simulated time, summed.
    pub simulated: Duration,
    /// Network segments carried, summed.
    pub segments: u64,
    /// The slowest recovery seen after a heal.
    pub slowest_recovery: Duration,
    /// The first seed.
    pub from: u64,
    /// Threads it ran on.
    pub jobs: usize,
}

impl Report {
    /// Schedules per wall-clock second.
    pub fn rate(&self) -> f64 {
        self.runs as f64 / self.took.as_secs_f64().max(1e-9)
    }

    /// Whether every schedule passed, every seed run twice gave one history and no thread crashed.
    pub fn passed(&self) -> bool {
        self.failures.is_empty() && self.nondeterministic.is_empty() && self.crashed == 0
    }

    /// What went wrong, a few lines per problem: each failing schedule with its violations and the
    /// command that replays it, each seed whose two runs differed, the threads that crashed.
    /// Empty when the sweep passed.
    pub fn problems(&self, backend: &str) -> String {
        let mut text = String::new();
        for failure in &self.failures {
            let _ = writeln!(text, "FAILED {}", failure.schedule);
            for violation in &failure.violations {
                let _ = writeln!(text, "  {violation}");
            }
            let seed = failure.schedule.seed;
            let _ = writeln!(text, "  replay: {}", replay_command(backend, seed));
        }
        for &seed in &self.nondeterministic {
            let _ = writeln!(
                text,
                "NONDETERMINISTIC seed {seed}: two runs gave two histories; replay: {}",
                replay_command(backend, seed)
            );
        }
        if self.crashed > 0 {
            let _ = writeln!(
                text,
                "CRASHED {} sweep threads panicked outside a run",
                self.crashed
            );
        }
        text
    }

    /// The sweep's figures as one `RESULT` line, named so runs compare.
    pub fn result_line(&self, backend: &str) -> String {
        format!(
            "RESULT sim_backend={backend} sim_schedules={} sim_failed={} sim_nondeterministic={} \
             sim_schedules_per_s={:.1} sim_wall_s={:.1} sim_simulated_h={:.2} \
             sim_slowest_recovery_s={:.2} sim_segments_per_schedule={} from={} jobs={}",
            self.runs,
            self.failures.len(),
            self.nondeterministic.len(),
            self.rate(),
            self.took.as_secs_f64(),
            self.simulated.as_secs_f64() / 3600.0,
            self.slowest_recovery.as_secs_f64(),
            self.segments / self.runs.max(1),
            self.from,
            self.jobs,
        )
    }
}

/// The command that replays `seed` of `backend`.
pub fn replay_command(backend: &str, seed: u64) -> String {
    format!("cargo run -p lease-sim --release -- run {backend} --seed {seed}")
}

/// Runs seeds `from..from + count` of the backend `model` builds on `jobs` threads. Every
/// `twice_every`-th seed (0: none) runs a second time, and its history must hash the same.
pub fn sweep(model: ModelFor, from: u64, count: u64, jobs: usize, twice_every: u64) -> Report {
    let started = std::time::Instant::now();
    let next = Arc::new(AtomicU64::new(from));
    let report = Arc::new(Mutex::new(Report::default()));
    let threads: Vec<_> = (0..jobs.max(1))
        .map(|_| {
            let (next, report) = (Arc::clone(&next), Arc::clone(&report));
            std::thread::spawn(move || {
                loop {
                    let seed = next.fetch_add(1, Ordering::Relaxed);
                    if seed >= from + count {
                        return;
                    }
                    let schedule = Schedule::draw(seed);
                    let outcome = run::run(&schedule, &model);
                    let again = (twice_every > 0 && seed % twice_every == 0)
                        .then(|| run::run(&schedule, &model).hash);
                    let mut report = report.lock().unwrap_or_else(PoisonError::into_inner);
                    report.runs += 1;
                    report.simulated += outcome.simulated;
                    report.segments += outcome.segments;
                    if let Some(recovered) = outcome.recovered_after {
                        report.slowest_recovery = report.slowest_recovery.max(recovered);
                    }
                    if again.is_some_and(|hash| hash != outcome.hash) {
                        report.nondeterministic.push(seed);
                    }
                    if !outcome.violations.is_empty() {
                        report.failures.push(outcome);
                    }
                }
            })
        })
        .collect();
    let crashed = threads.into_iter().filter_map(|t| t.join().err()).count();
    let mut report = std::mem::take(&mut *report.lock().unwrap_or_else(PoisonError::into_inner));
    report.crashed = crashed;
    report.from = from;
    report.jobs = jobs.max(1);
    report.failures.sort_by_key(|o| o.schedule.seed);
    report.nondeterministic.sort_unstable();
    report.took = started.elapsed();
    report
}
