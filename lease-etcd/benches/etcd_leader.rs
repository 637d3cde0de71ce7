//! etcd leader lease vs `etcdctl lock`, and the FIFO semaphore, on one real etcd.
//!
//! `cargo bench -p lease-etcd --bench etcd_leader`; the quick mode CI runs (5
//! revokes of ours, 2 of `etcdctl lock`, one round of 4 contenders, 8 semaphore jobs; a few
//! seconds): `LEASE_BENCH_QUICK=1 cargo test -p lease-etcd --bench etcd_leader`.
//! In every mode the run fails if a revoke is not noticed within the lease's fence interval
//! ([`LeaseSpec::fence_after`]), if two of our leader holders or more than the limit of our
//! semaphore holders overlap, if one of our leases is lost while held, or if an acquisition does
//! not complete (within [`STALL`]).
//!
//! - loss → cancel: an operator revokes the holder's etcd lease; we time until the guarded future
//!   is dropped (ours) or until `etcdctl lock --ttl 10` (no command: it holds until its session
//!   ends) exits with "session expired". etcdctl learns of the revoke from its next keep-alive
//!   (every TTL/3); we learn it from the watch on our key.
//! - hand-off gap: 16 contenders each hold 20 ms and release; the gap between one holder's end and
//!   the next holder's start.
//! - semaphore: 32 jobs of 50 ms at limit 4; the ideal is 32 / 4 × 50 ms = 0.4 s.
//!
//! Timestamps that cross processes are wall-clock nanoseconds (`SystemTime`), taken on one machine.

#![allow(clippy::unwrap_used)] // A benchmark that cannot set up should stop loudly.

use std::time::Duration;

use lease_core::{LeaseSpec, Sequencer};
use lease_etcd::Etcd;
use lease_tests::etcd::{Server, etcdctl_lock_loss_to_exit};
use lease_tests::overlap::{leader_handoff, loss_to_cancel, semaphore_jobs};
use lease_tests::stats::{percentile, scaled};

const LOSS_TRIALS: usize = 30;
const ETCDCTL_TRIALS: usize = 8;
const CONTENDERS: usize = 16;
const HOLD: Duration = Duration::from_millis(20);
const ROUNDS: usize = 3;
const JOBS: usize = 32;
const LIMIT: u32 = 4;
const JOB: Duration = Duration::from_millis(50);
/// How long a round of acquisitions may take before the run fails as stalled: a liveness bound
/// far above any round's time, not a timing that is asserted.
const STALL: Duration = Duration::from_secs(120);

/// An operator revokes the holder's etcd lease.
async fn ours_loss_to_cancel(server: &Server, etcd: &Etcd) -> Vec<f64> {
    let spec = |trial| LeaseSpec::leader(format!("bench/loss/ours-{trial}"));
    let revoke = async |sequencer: &Sequencer| assert!(server.revoke(sequencer.holder()).await);
    loss_to_cancel(
        etcd,
        scaled(LOSS_TRIALS, 5),
        spec,
        revoke,
        "its lease was revoked",
    )
    .await
}

async fn ours_handoff(etcd: &Etcd) -> Vec<f64> {
    let spec = |round| LeaseSpec::leader(format!("bench/handoff/ours-{round}"));
    let (rounds, contenders) = (scaled(ROUNDS, 1), scaled(CONTENDERS, 4));
    leader_handoff(etcd, rounds, spec, contenders, HOLD, STALL).await
}

async fn semaphore_total(etcd: &Etcd, jobs: usize) -> f64 {
    let spec = LeaseSpec::semaphore("bench/semaphore", LIMIT);
    semaphore_jobs(etcd, &spec, jobs, JOB, STALL)
        .await
        .as_secs_f64()
}

#[tokio::main]
async fn main() {
    let server = Server::start().await;
    let etcd = server.backend();

    let ours_loss = ours_loss_to_cancel(&server, &etcd).await;
    let etcdctl_trials = scaled(ETCDCTL_TRIALS, 2);
    let ctl_loss = etcdctl_lock_loss_to_exit(&server, etcdctl_trials).await;
    let gap = ours_handoff(&etcd).await;
    let jobs = scaled(JOBS, 8);
    let sem_total = semaphore_total(&etcd, jobs).await;
    let ideal = jobs as f64 / f64::from(LIMIT) * JOB.as_secs_f64();

    let gap_label = format!("hand-off gap, {} contenders", scaled(CONTENDERS, 4));
    println!("{:<30} {:>9} {:>9} {:>6}", "ms", "p50", "p99", "n");
    for (name, samples) in [
        ("loss -> cancel (ours)", &ours_loss),
        ("loss -> exit (etcdctl lock)", &ctl_loss),
        (gap_label.as_str(), &gap),
    ] {
        println!(
            "{name:<30} {:>9.2} {:>9.2} {:>6}",
            percentile(samples, 50.0),
            percentile(samples, 99.0),
            samples.len()
        );
    }
    println!(
        "semaphore: {jobs} x {JOB:?} jobs at limit {LIMIT}: {sem_total:.3} s (ideal {ideal:.1} s)"
    );
    println!(
        "RESULT etcd_loss_cancel_p99_ms={:.2} etcdctl_loss_p99_ms={:.2} etcd_handoff_p50_ms={:.2} etcd_sem_total_s={:.3} ideal_s={:.1}",
        percentile(&ours_loss, 99.0),
        percentile(&ctl_loss, 99.0),
        percentile(&gap, 50.0),
        sem_total,
        ideal
    );
    assert!(
        server.leases().await.len() <= etcdctl_trials,
        "our leases were left behind"
    );
}
