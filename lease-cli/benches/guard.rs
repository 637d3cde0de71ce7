//! `lease lock` beside `consul lock` on one real dev agent: loss → signal, start → child
//! running, and 32 × 50 ms jobs at `-n 4`. Ends with a `RESULT` line.
//!
//! ```text
//! cargo bench -p lease-cli --bench guard
//! ```
#![allow(missing_docs, clippy::unwrap_used)]

use std::process::Stdio;
use std::time::Instant;

use lease_tests::consul::{Agent, SIGNAL_CHILD, consul_lock_loss_to_signal, loss_to_signal};
use lease_tests::stats::percentile;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

const TRIALS: usize = 15;
/// The loss figures' p99 is their largest sample or near it: enough trials that one slow
/// scheduling on a loaded machine is not the whole figure.
const LOSS_TRIALS: usize = 50;
const JOBS: usize = 32;

fn lease(agent: &Agent) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_lease"));
    cmd.env("CONSUL_HTTP_ADDR", agent.addr().to_string())
        .stdin(Stdio::null())
        .kill_on_drop(true);
    cmd
}

/// Destroy → the child's SIGTERM handler ran, for `lease lock` (ms).
async fn lease_loss_to_signal(agent: &Agent) -> Vec<f64> {
    loss_to_signal(agent, LOSS_TRIALS, "l", |prefix| {
        let mut command = lease(agent);
        command.args(["lock", prefix, "--", "sh", "-c", SIGNAL_CHILD]);
        command
    })
    .await
}

/// Spawn → the child printed `ready`, uncontended (ms).
async fn start_times(mut command: impl FnMut(usize) -> Command) -> Vec<f64> {
    let mut samples = Vec::new();
    for trial in 0..TRIALS {
        let started = Instant::now();
        let mut child = command(trial).stdout(Stdio::piped()).spawn().unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        if let Ok(Some(_)) = lines.next_line().await {
            samples.push(started.elapsed().as_secs_f64() * 1e3);
        }
        let _ = child.wait().await;
    }
    samples
}

/// 32 jobs of 50 ms contending for 4 slots: seconds until the last has finished.
async fn semaphore_total(mut command: impl FnMut() -> Command) -> f64 {
    let started = Instant::now();
    let children: Vec<_> = (0..JOBS).map(|_| command().spawn().unwrap()).collect();
    for mut child in children {
        assert!(child.wait().await.unwrap().success());
    }
    started.elapsed().as_secs_f64()
}

#[tokio::main]
async fn main() {
    let agent = Agent::start().await;

    let ours = lease_loss_to_signal(&agent).await;
    let theirs = consul_lock_loss_to_signal(&agent, LOSS_TRIALS).await;

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
