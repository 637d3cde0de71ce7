//! Consul leader lease vs `consul lock`, side by side on one dev agent.
//!
//! `cargo bench -p lease-consul --bench consul_leader`; the quick mode CI runs
//! (5 losses, one round of 4 contenders): `LEASE_BENCH_QUICK=1 cargo test -p lease-consul
//! --bench consul_leader`. In every mode the run fails if a loss is noticed later
//! than the lease's fence interval, if two of our holders overlap, if one of our leases is lost
//! while held, or if a round of ours does not complete (within [`STALL`]).
//!
//! - loss → cancel: an operator destroys the holder's session; we time until the guarded future is
//!   dropped (ours) or until `consul lock`'s child receives its signal. Each trial is on a key of
//!   its own, acquired right before, so the client's prefix watches are started and widened along
//!   the way (a key acquired while they were reshaped once went unwatched for 30 s).
//! - hand-off gap: 16 contenders each hold 20 ms and release; the gap between one holder's end and
//!   the next holder's start.
//!
//! Timestamps that cross processes are wall-clock nanoseconds (`SystemTime`), taken on one machine.

#![allow(clippy::unwrap_used)] // A benchmark that cannot set up should stop loudly.

use std::process::Stdio;
use std::time::Duration;

use lease_consul::Consul;
use lease_core::{LeaseSpec, Sequencer};
use lease_tests::consul::{Agent, consul_lock_loss_to_signal};
use lease_tests::overlap::{leader_handoff, loss_to_cancel};
use lease_tests::stats::{percentile, scaled};

const LOSS_TRIALS: usize = 50;
const CONTENDERS: usize = 16;
const HOLD: Duration = Duration::from_millis(20);
const ROUNDS: usize = 3;
/// How long a round of acquisitions may take before the run fails as stalled: a liveness bound
/// far above any round's time, not a timing that is asserted.
const STALL: Duration = Duration::from_secs(120);

/// An operator destroys the holder's session. Each trial is on a key of its own (module docs).
async fn ours_loss_to_cancel(agent: &Agent, consul: &Consul) -> Vec<f64> {
    let spec =
        |trial| LeaseSpec::leader(format!("bench/loss/ours-{trial}")).lock_delay(Duration::ZERO);
    let destroy = async |sequencer: &Sequencer| agent.destroy_session(sequencer.holder()).await;
    loss_to_cancel(
        consul,
        scaled(LOSS_TRIALS, 5),
        spec,
        destroy,
        "its session was destroyed",
    )
    .await
}

/// Gaps between consecutive holders, from (start, end) stamps in ns.
fn gaps(mut spans: Vec<(u128, u128)>) -> Vec<f64> {
    spans.sort_unstable();
    spans
        .windows(2)
        .map(|w| w[1].0.saturating_sub(w[0].1) as f64 / 1e6)
        .collect()
}

async fn ours_handoff(consul: &Consul) -> Vec<f64> {
    let spec =
        |round| LeaseSpec::leader(format!("bench/handoff/ours-{round}")).lock_delay(Duration::ZERO);
    let (rounds, contenders) = (scaled(ROUNDS, 1), scaled(CONTENDERS, 4));
    leader_handoff(consul, rounds, spec, contenders, HOLD, STALL).await
}

async fn consul_lock_handoff(agent: &Agent) -> Vec<f64> {
    let mut all = Vec::new();
    let dir = std::env::temp_dir().join(format!("lease-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for round in 0..scaled(ROUNDS, 1) {
        let prefix = format!("bench/handoff/cl-{round}");
        let file = dir.join(format!("spans-{round}"));
        let _ = std::fs::remove_file(&file);
        // `date` rather than an interpreter, so child start-up does not count against consul lock.
        let child = format!(
            "s=$(date +%s%N); sleep {}; echo \"$s $(date +%s%N)\" >> {}",
            HOLD.as_secs_f64(),
            file.display()
        );
        let mut procs = Vec::new();
        for _ in 0..scaled(CONTENDERS, 4) {
            procs.push(
                agent
                    .command()
                    .args(["lock", &prefix, &child])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .unwrap(),
            );
        }
        for mut p in procs {
            let _ = tokio::time::timeout(STALL, p.wait()).await;
        }
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        let spans = text
            .lines()
            .filter_map(|l| {
                let (s, e) = l.split_once(' ')?;
                Some((s.parse().ok()?, e.trim().parse().ok()?))
            })
            .collect();
        all.extend(gaps(spans));
    }
    let _ = std::fs::remove_dir_all(&dir);
    all
}

fn row(name: &str, ours: &[f64], theirs: &[f64]) {
    println!(
        "{name:<28} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>6} {:>6}",
        percentile(ours, 50.0),
        percentile(ours, 99.0),
        percentile(theirs, 50.0),
        percentile(theirs, 99.0),
        ours.len(),
        theirs.len()
    );
}

#[tokio::main]
async fn main() {
    let agent = Agent::start().await;
    let consul = Consul::builder().address(agent.url()).build().unwrap();

    let ours_loss = ours_loss_to_cancel(&agent, &consul).await;
    let cl_loss = consul_lock_loss_to_signal(&agent, scaled(LOSS_TRIALS, 5)).await;
    let ours_gap = ours_handoff(&consul).await;
    let cl_gap = consul_lock_handoff(&agent).await;

    println!(
        "{:<28} {:>9} {:>9} {:>9} {:>9} {:>6} {:>6}",
        "ms", "ours p50", "ours p99", "cl p50", "cl p99", "n", "cl n"
    );
    row("loss -> cancel", &ours_loss, &cl_loss);
    row("hand-off gap", &ours_gap, &cl_gap);
    println!(
        "ratios: loss->cancel p99 consul lock/ours = {:.1}x; hand-off p50 consul lock/ours = {:.1}x",
        percentile(&cl_loss, 99.0) / percentile(&ours_loss, 99.0),
        percentile(&cl_gap, 50.0) / percentile(&ours_gap, 50.0)
    );
    println!(
        "RESULT loss_cancel_p99_ms={:.2} consul_lock_loss_p99_ms={:.2} handoff_p50_ms={:.2} consul_lock_handoff_p50_ms={:.2}",
        percentile(&ours_loss, 99.0),
        percentile(&cl_loss, 99.0),
        percentile(&ours_gap, 50.0),
        percentile(&cl_gap, 50.0)
    );
}
