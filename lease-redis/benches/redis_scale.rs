//! Redis at scale: N leases held by one process, the connections and the traffic that costs, and
//! loss that stays where it happened.
//!
//! `cargo bench -p lease-redis --bench redis_scale` (`SCALE_NS=100,1000` to choose the sizes;
//! default 100, 1,000 and 10,000; `SCALE_HOLD_S=60` to hold them a minute before counting them,
//! instead of [`HOLD`]). The quick mode CI runs, N = 100 held 2 s with 11 losses:
//! `LEASE_BENCH_QUICK=1 cargo test -p lease-redis --bench redis_scale`. In every mode the run
//! fails if a lease is not acquired or is lost while held (a deleted key taking any lease but
//! its own), or if a deleted key's loss is not noticed within the lease's fence interval.
//!
//! For each N, on a fresh `redis-server`, one handle holds N/2 leader keys on distinct names
//! (`scale/leader/<i>`) and N/2 semaphore slots over 100 semaphores (`scale/sem/<i mod 100>`),
//! all requested at once, and this prints:
//! - the time to acquire them all;
//! - the peak of this process's connections to the server over the acquisitions and the hold:
//!   the ESTABLISHED sockets to its port that the kernel lists for this process, sampled every
//!   [`SAMPLE_EVERY`] (`lease_tests::sockets`), not counted by the client;
//! - how many are still held after holding them all, idle, for [`HOLD`] (no false loss: all N);
//! - requests the server got from clients per second while idle (`INFO commandstats`: script
//!   calls, pings, subscriptions; not the commands a script runs inside): the batched renewals;
//! - resident memory per lease (growth of this process's RSS over the N acquisitions);
//! - loss → cancel p50 and p99 of single leases (leaders and slots alike) whose own key an
//!   operator deletes among the N ([`LOSS_TRIALS`] of them), from just before the `DEL` until the
//!   guarded work is dropped.

#![allow(clippy::unwrap_used)] // A benchmark that cannot set up should stop loudly.

use std::sync::Arc;
use std::time::Duration;

use lease_core::{Backend, Lease, LeaseSpec, Wait};
use lease_redis::Redis;
use lease_tests::overlap::{DropStamp, now_ns};
use lease_tests::redis::Server;
use lease_tests::sockets::ConnectionSampler;
use lease_tests::stats::{percentile, rss_kb, scale_hold, scale_sizes, scaled};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(15);
/// How long the N leases are held, idle, before they are counted (`SCALE_HOLD_S`).
const HOLD: Duration = Duration::from_secs(60);
/// Keys deleted per N: over 100, so the p99 (nearest rank) is not simply the slowest.
const LOSS_TRIALS: usize = 101;
const SEMAPHORES: usize = 100;
/// Acquisitions in flight at once (the benchmark's own tasks).
const IN_FLIGHT: usize = 1024;
const SAMPLE_EVERY: Duration = Duration::from_millis(100);
/// A liveness bound on acquiring all N, far above any run's time, not a timing that is asserted.
const STALL: Duration = Duration::from_secs(300);

#[derive(Default)]
struct Figures {
    held: usize,
    acquire_s: f64,
    peak_conns: usize,
    idle_commands_per_s: f64,
    rss_kb_per_lease: f64,
    loss_p50_ms: f64,
    loss_p99_ms: f64,
}

fn specs(n: usize) -> Vec<LeaseSpec> {
    let leaders = n / 2;
    let slots = n - leaders;
    let limit = slots.div_ceil(SEMAPHORES).max(1);
    let leader = (0..leaders).map(|i| LeaseSpec::leader(format!("scale/leader/{i}")));
    let slot = (0..slots).map(|i| {
        LeaseSpec::semaphore(
            format!("scale/sem/{}", i % SEMAPHORES),
            u32::try_from(limit).unwrap(),
        )
    });
    leader
        .chain(slot)
        .map(|s| s.ttl(TTL).wait(Wait::Never))
        .collect()
}

async fn acquire_all(redis: &Redis, specs: Vec<LeaseSpec>) -> Vec<Lease> {
    let n = specs.len();
    let room = Arc::new(Semaphore::new(IN_FLIGHT));
    let mut acquiring = JoinSet::new();
    for (i, spec) in specs.into_iter().enumerate() {
        let (redis, room) = (redis.clone(), Arc::clone(&room));
        acquiring.spawn(async move {
            let _room = room.acquire_owned().await.unwrap();
            (i, redis.acquire(&spec).await)
        });
    }
    let mut leases: Vec<Option<Lease>> = (0..n).map(|_| None).collect();
    tokio::time::timeout(STALL, async {
        while let Some(joined) = acquiring.join_next().await {
            let (i, acquired) = joined.unwrap();
            leases[i] = Some(acquired.unwrap_or_else(|e| panic!("acquisition {i}: {e}")));
        }
    })
    .await
    .unwrap_or_else(|_| panic!("acquiring {n} leases stalled for {STALL:?}"));
    leases.into_iter().map(Option::unwrap).collect()
}

/// The server's key of `lease`: the leader key, or the semaphore holder's own.
fn holder_key(lease: &Lease) -> String {
    let sequencer = lease.sequencer();
    let key = sequencer.key();
    match key
        .strip_suffix(sequencer.holder())
        .and_then(|p| p.strip_suffix('/'))
    {
        Some(name) => format!("lease:{{{name}}}:s:{}", sequencer.holder()),
        None => format!("lease:{{{key}}}"),
    }
}

async fn run(n: usize, hold: Duration) -> Figures {
    let server = Server::start().await;
    let redis = Redis::new(&server.url()).unwrap();
    let sampler = ConnectionSampler::start(&[server.port()], SAMPLE_EVERY);
    let rss_before = rss_kb();
    let started = Instant::now();
    let mut leases = acquire_all(&redis, specs(n)).await;
    let acquire_s = started.elapsed().as_secs_f64();
    let rss_kb_per_lease = (rss_kb() - rss_before) / n as f64;

    let before = server.client_requests().await;
    let idle_from = Instant::now();
    tokio::time::sleep(hold).await;
    let after = server.client_requests().await;
    let idle_commands_per_s =
        after.saturating_sub(before) as f64 / idle_from.elapsed().as_secs_f64();
    let held = leases.iter().filter(|l| l.is_held()).count();
    assert_eq!(held, n, "leases were lost while held, idle");

    // Single losses among the N: each victim's own key deleted; no other lease may go.
    let trials = scaled(LOSS_TRIALS, 11).min(n);
    let victims: Vec<Lease> = (0..trials)
        .map(|t| leases.swap_remove(t * leases.len() / trials.max(1) % leases.len()))
        .collect();
    let mut samples = Vec::new();
    for victim in victims {
        let key = holder_key(&victim);
        let fence = TTL;
        let (stamp, dropped) = DropStamp::new();
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let runner = tokio::spawn(async move {
            let work = async move {
                let _stamp = stamp;
                let _ = ready_tx.send(());
                std::future::pending::<()>().await
            };
            assert!(victim.run(work).await.is_err(), "the work ended on its own");
        });
        ready_rx.await.unwrap();
        let t0 = now_ns();
        assert_eq!(server.del(&key).await, 1, "{key}");
        tokio::time::timeout(fence, runner)
            .await
            .unwrap_or_else(|_| panic!("{key}: the work ran on a TTL after its key was deleted"))
            .unwrap();
        let t1 = dropped.lock().unwrap().expect("work dropped");
        samples.push(t1.saturating_sub(t0) as f64 / 1e6);
    }
    let still = leases.iter().filter(|l| l.is_held()).count();
    assert_eq!(
        still,
        leases.len(),
        "a deleted key took leases other than its own"
    );
    let peak_conns = sampler.peak(server.port());
    sampler.stop();
    drop(leases);
    redis.shutdown().await;
    Figures {
        held,
        acquire_s,
        peak_conns,
        idle_commands_per_s,
        rss_kb_per_lease,
        loss_p50_ms: percentile(&samples, 50.0),
        loss_p99_ms: percentile(&samples, 99.0),
    }
}

#[tokio::main]
async fn main() {
    let hold = scale_hold(scaled(HOLD, Duration::from_secs(2)));
    let mut runs = Vec::new();
    for n in scale_sizes() {
        let figures = run(n, hold).await;
        println!(
            "N={n}: acquired in {:.2} s, {} connection(s) at most, {} held after {hold:?} idle, \
             {:.1} commands/s idle, {:.1} KB/lease, loss -> cancel p50 {:.2} ms p99 {:.2} ms",
            figures.acquire_s,
            figures.peak_conns,
            figures.held,
            figures.idle_commands_per_s,
            figures.rss_kb_per_lease,
            figures.loss_p50_ms,
            figures.loss_p99_ms,
        );
        assert!(
            figures.peak_conns <= 3,
            "{} connections for {n} leases",
            figures.peak_conns
        );
        runs.push((n, figures));
    }
    let mut result = String::from("RESULT");
    for (n, f) in &runs {
        result += &format!(
            " held_{n}={} acquire_s_{n}={:.2} max_conns_{n}={} idle_commands_per_s_{n}={:.2} \
             rss_kb_per_lease_{n}={:.1} loss_p50_ms_at_{n}={:.2} loss_p99_ms_at_{n}={:.2}",
            f.held,
            f.acquire_s,
            f.peak_conns,
            f.idle_commands_per_s,
            f.rss_kb_per_lease,
            f.loss_p50_ms,
            f.loss_p99_ms,
        );
    }
    println!("{result}");
}
