//! Consul semaphore vs `consul lock -n`, side by side on one dev agent.
//!
//! `cargo bench -p lease-consul --bench consul_semaphore`; the quick mode CI runs
//! (one round of 8 jobs each way, a few seconds): `LEASE_BENCH_QUICK=1 cargo test -p lease-consul
//! --bench consul_semaphore`. In every mode the run fails if more than the limit
//! of our holders overlap, if one of our leases is lost while held, if an acquisition does not
//! complete (within [`STALL`]), or if a `consul lock -n` process fails.
//!
//! 32 jobs of 50 ms at limit 4: ideally 8 waves, 0.4 s. Ours runs the 32 jobs as tasks of one
//! process (one `Consul` client); `consul lock -n 4` runs them as 32 processes. Reported: total
//! time against the ideal, and for ours CAS conflicts and Consul requests (and writes) per
//! acquisition.
#![allow(clippy::unwrap_used)] // A benchmark that cannot set up should stop loudly.

use std::process::Stdio;
use std::time::{Duration, Instant};

use lease_consul::Consul;
use lease_core::LeaseSpec;
use lease_tests::consul::Agent;
use lease_tests::overlap::semaphore_jobs;
use lease_tests::stats::{percentile, scaled};

const JOBS: u32 = 32;
const LIMIT: u32 = 4;
const JOB: Duration = Duration::from_millis(50);
const ROUNDS: usize = 3;
/// How long a round may take before the run fails as stalled: a liveness bound far above any
/// round's time, not a timing that is asserted.
const STALL: Duration = Duration::from_secs(120);

fn ideal(jobs: u32) -> Duration {
    JOB * jobs.div_ceil(LIMIT)
}

async fn ours(consul: &Consul, round: usize, jobs: u32) -> Duration {
    let spec =
        LeaseSpec::semaphore(format!("bench/sem/ours-{round}"), LIMIT).lock_delay(Duration::ZERO);
    semaphore_jobs(consul, &spec, jobs as usize, JOB, STALL).await
}

async fn consul_lock(agent: &Agent, round: usize, jobs: u32) -> Duration {
    let prefix = format!("bench/sem/cl-{round}");
    let child = format!("sleep {}", JOB.as_secs_f64());
    let started = Instant::now();
    let mut procs = Vec::new();
    for _ in 0..jobs {
        procs.push(
            agent
                .command()
                .args(["lock", "-n", &LIMIT.to_string(), &prefix, &child])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        );
    }
    for mut p in procs {
        let status = p.wait().await.unwrap();
        assert!(status.success(), "consul lock -n failed: {status}");
    }
    started.elapsed()
}

#[tokio::main]
async fn main() {
    let agent = Agent::start().await;
    let consul = Consul::builder().address(agent.url()).build().unwrap();

    let (jobs, rounds) = (scaled(JOBS, 8), scaled(ROUNDS, 1));
    let mut ours_s = Vec::new();
    let mut cl_s = Vec::new();
    let (requests0, writes0, conflicts0) = (
        consul.requests_sent(),
        consul.writes_sent(),
        consul.cas_conflicts(),
    );
    for round in 0..rounds {
        let took = ours(&consul, round, jobs).await;
        ours_s.push(took.as_secs_f64());
    }
    let acquisitions = f64::from(jobs) * rounds as f64;
    let per = |n: u64| n as f64 / acquisitions;
    let requests = per(consul.requests_sent() - requests0);
    let writes = per(consul.writes_sent() - writes0);
    let conflicts = per(consul.cas_conflicts() - conflicts0);
    for round in 0..rounds {
        let took = tokio::time::timeout(STALL, consul_lock(&agent, round, jobs))
            .await
            .unwrap_or_else(|_| panic!("round {round}: consul lock -n stalled for {STALL:?}"));
        cl_s.push(took.as_secs_f64());
    }
    let (ours_total, cl_total, ideal) = (
        percentile(&ours_s, 50.0),
        percentile(&cl_s, 50.0),
        ideal(jobs).as_secs_f64(),
    );

    println!("{jobs} jobs of {JOB:?} at limit {LIMIT}, {rounds} rounds (median shown)");
    println!("{:<34} {:>10} {:>12}", "", "total s", "vs ideal");
    println!("{:<34} {:>10.3} {:>11.0}%", "ideal", ideal, 100.0);
    println!(
        "{:<34} {:>10.3} {:>11.0}%",
        "ours (tasks, one client)",
        ours_total,
        100.0 * ours_total / ideal
    );
    println!(
        "{:<34} {:>10.3} {:>11.0}%",
        "consul lock -n (processes)",
        cl_total,
        100.0 * cl_total / ideal
    );
    println!(
        "ours per acquisition: {conflicts:.2} CAS conflicts, {requests:.1} Consul requests ({writes:.1} writes)"
    );
    println!("rounds: ours {ours_s:.3?} s, consul lock -n {cl_s:.3?} s");
    println!(
        "ratio consul lock -n / ours = {:.2}x",
        cl_total / ours_total
    );
    println!(
        "RESULT sem_total_s={ours_total:.3} consul_lock_sem_total_s={cl_total:.3} ideal_s={ideal:.1} cas_conflicts_per_acquire={conflicts:.2}"
    );
}
