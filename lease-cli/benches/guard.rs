//! `lease lock` beside `consul lock` on one real dev agent: loss → signal, start → child
//! running, and 32 × 50 ms jobs at `-n 4`. Ends with a `RESULT` line.
//!
//! ```text
//! cargo bench -p lease-cli --bench guard
//! LEASE_BENCH_QUICK=1 cargo test -p lease-cli --bench guard   # a few trials, as CI runs it
//! ```
//!
//! Every wait is bounded ([`GUARD_BOUND`]): a guard that never starts its child, never signals it
//! after its loss, or a job that never finishes fails the run with the trial it was in.
#![allow(missing_docs, clippy::unwrap_used)]

use std::process::Stdio;
use std::time::{Duration, Instant};

use lease_tests::consul::{
    Agent, GUARD_BOUND, SIGNAL_CHILD, consul_lock_loss_to_signal, guard_loss_to_signal,
};
use lease_tests::stats::{percentile, scaled};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

/// Uncontended starts timed (a few in the quick mode).
fn trials() -> usize {
    scaled(15, 3)
}
/// The loss figures' p99 is their largest sample or near it: enough trials that one slow
/// scheduling on a loaded machine is not the whole figure.
fn loss_trials() -> usize {
    scaled(50, 5)
}
const JOBS: usize = 32;
/// The semaphore run's jobs finish within this (32 × 50 ms at 4 at once is 0.4 s ideal).
const JOBS_BOUND: Duration = Duration::from_secs(120);

fn lease(agent: &Agent) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_lease"));
    cmd.env("CONSUL_HTTP_ADDR", agent.addr().to_string())
        .stdin(Stdio::null())
        .kill_on_drop(true);
    cmd
}

/// Destroy → the child's SIGTERM handler ran, for `lease lock` (ms).
async fn lease_loss_to_signal(agent: &Agent) -> Vec<f64> {
    guard_loss_to_signal(agent, loss_trials(), "l", |prefix| {
        let mut command = lease(agent);
        command.args(["lock", prefix, "--", "sh", "-c", SIGNAL_CHILD]);
        command
    })
    .await
}

/// Spawn → the child printed `ready`, uncontended (ms).
async fn start_times(mut command: impl FnMut(usize) -> Command) -> Vec<f64> {
    let mut samples = Vec::new();
    for trial in 0..trials() {
        let started = Instant::now();
        let mut child = command(trial).stdout(Stdio::piped()).spawn().unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let line = tokio::time::timeout(GUARD_BOUND, lines.next_line()).await;
        assert!(
            matches!(line, Ok(Ok(Some(_)))),
            "start trial {trial}: the child did not print within {GUARD_BOUND:?}"
        );
        samples.push(started.elapsed().as_secs_f64() * 1e3);
        let status = tokio::time::timeout(GUARD_BOUND, child.wait()).await;
        assert!(
            matches!(status, Ok(Ok(s)) if s.success()),
            "start trial {trial}: the guard did not exit cleanly within {GUARD_BOUND:?}: {status:?}"
        );
    }
    samples
}

/// 32 jobs of 50 ms contending for 4 slots: seconds until the last has finished.
async fn semaphore_total(mut command: impl FnMut() -> Command) -> f64 {
    let started = Instant::now();
    let children: Vec<_> = (0..JOBS)
        .map(|_| command().kill_on_drop(true).spawn().unwrap())
        .collect();
    let deadline = tokio::time::Instant::now() + JOBS_BOUND;
    for (job, mut child) in children.into_iter().enumerate() {
        let status = tokio::time::timeout_at(deadline, child.wait()).await;
        assert!(
            matches!(status, Ok(Ok(s)) if s.success()),
            "job {job} of {JOBS} did not finish cleanly within {JOBS_BOUND:?}: {status:?}"
        );
    }
    started.elapsed().as_secs_f64()
}

#[tokio::main]
async fn main() {
    let agent = Agent::start().await;

    let ours = lease_loss_to_signal(&agent).await;
    let theirs = consul_lock_loss_to_signal(&agent, loss_trials()).await;

    let ours_start = start_times(|i| {
        let mut c = lease(&agent);
        c.args(["lock", &format!("bench/start/l-{i}"), "--", "echo", "ready"]);
        c
    })
    .await;
    let theirs_start = start_times(|i| {
        let mut c = agent.command();
        c.args(["lock", &format!("bench/start/c-{i}"), "echo ready"]);
        c
    })
    .await;

    let ours_sem = semaphore_total(|| {
        let mut c = lease(&agent);
        c.args(["lock", "-n", "4", "bench/sem/l", "--", "sleep", "0.05"])
            .stderr(Stdio::null());
        c
    })
    .await;
    let theirs_sem = semaphore_total(|| {
        let mut c = agent.command();
        c.args(["lock", "-n", "4", "bench/sem/c", "sleep 0.05"])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        c
    })
    .await;

    let row = |what: &str, unit: &str, a: f64, b: f64| {
        println!("{what:<34} {a:>10.1} {b:>12.1}  {unit}");
    };
    println!("{:<34} {:>10} {:>12}", "", "lease lock", "consul lock");
    row(
        "loss → child signalled, p50",
        "ms",
        percentile(&ours, 50.0),
        percentile(&theirs, 50.0),
    );
    row(
        "loss → child signalled, p99",
        "ms",
        percentile(&ours, 99.0),
        percentile(&theirs, 99.0),
    );
    row(
        "start → child running, p50",
        "ms",
        percentile(&ours_start, 50.0),
        percentile(&theirs_start, 50.0),
    );
    row(
        &format!("{JOBS} × 50 ms jobs at -n 4"),
        "s",
        ours_sem,
        theirs_sem,
    );
    println!(
        "RESULT lock_loss_signal_p99_ms={:.1} consul_lock_loss_signal_p99_ms={:.1} \
         lock_start_ms={:.1} consul_lock_start_ms={:.1} sem_total_s={:.2} consul_lock_sem_total_s={:.2}",
        percentile(&ours, 99.0),
        percentile(&theirs, 99.0),
        percentile(&ours_start, 50.0),
        percentile(&theirs_start, 50.0),
        ours_sem,
        theirs_sem
    );
}
