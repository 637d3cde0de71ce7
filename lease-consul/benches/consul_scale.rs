//! Consul at scale: N leases held by one process on a bounded connection budget.
//!
//! `cargo bench -p lease-consul --bench consul_scale` (`SCALE_NS=100,1000` to
//! choose the sizes; default 100, 1,000 and 10,000; `SCALE_HOLD_S=300` to hold them five minutes
//! before counting them, instead of [`HOLD`]). The quick mode CI runs, N = 100 held 2 s with 11
//! losses: `LEASE_BENCH_QUICK=1 cargo test -p lease-consul --bench consul_scale`.
//! In every mode the run fails if a lease is not acquired or is lost while held, or if a
//! destroyed session's loss is not noticed within the lease's fence interval.
//!
//! For each N, on a fresh dev agent, one client holds N/2 leader keys (`<base>/leader/<i>`) and
//! N/2 semaphore slots over up to 100 prefixes, and this prints:
//! - the time to acquire them all (all requested at once);
//! - the peak of connections open to the agent, counted by a proxy in between;
//! - how many are still held after holding them all for [`HOLD`] (no false loss: all N);
//! - requests per second while idle (over that time), counted by the proxy;
//! - resident memory per lease (growth of this process's RSS over the N leases);
//! - loss → cancel p50 and p99 of single leader sessions destroyed among the N by an operator
//!   (101 of them, after one uncounted while the watches catch up with the acquisitions),
//!   on a second client that talks to the agent directly (as `consul lock` does), holding the
//!   same N leases.
//!
//! Beside each loss figure: `consul lock`'s loss → signal on the same agent, measured while our
//! N leases are held. The same figures follow for per-session keep-alive
//! (`KeepAlive::SessionTtl`: every session renews its own TTL, as `consul lock` and this crate
//! before 0.2 did). The per-lease watch design of before 0.2 is
//! not run: it needed one connection per lease and lost every lease past about 100.

#![allow(clippy::unwrap_used)] // A benchmark that cannot set up should stop loudly.

use std::sync::Arc;
use std::time::Duration;

use lease_consul::{Consul, KeepAlive};
use lease_core::{Backend, Lease, LeaseSpec, Wait};
use lease_tests::consul::{Agent, consul_lock_loss_to_signal};
use lease_tests::proxy::Proxy;
use lease_tests::stats::{percentile, rss_kb, scale_hold, scale_sizes, scaled};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(15);
/// How long the N leases are held, idle, before they are counted (`SCALE_HOLD_S`).
const HOLD: Duration = Duration::from_secs(20);
/// Sessions destroyed per N: over 100, so the p99 (nearest rank) is not simply the slowest.
const LOSS_TRIALS: usize = 101;
/// Acquisitions in flight at once (the client queues the rest itself; this bounds the
/// benchmark's own tasks).
const IN_FLIGHT: usize = 1024;

struct Figures {
    held: usize,
    acquire_s: f64,
    peak_conns: usize,
    idle_rps: f64,
    rss_kb_per_lease: f64,
    loss_p50_ms: f64,
    loss_p99_ms: f64,
    /// `consul lock`'s loss → signal on the same agent, with our N leases held.
    consul_lock_p50_ms: f64,
    consul_lock_p99_ms: f64,
}

fn specs(base: &str, n: usize) -> Vec<LeaseSpec> {
    let leaders = n / 2;
    let slots = n - leaders;
    let prefixes = slots.clamp(1, 100);
    let limit = slots.div_ceil(prefixes);
    let leader = (0..leaders).map(|i| LeaseSpec::leader(format!("{base}/leader/{i}")));
    let slot = (0..slots).map(|i| {
        LeaseSpec::semaphore(
            format!("{base}/sem/{}", i % prefixes),
            u32::try_from(limit).unwrap(),
        )
    });
    leader
        .chain(slot)
        .map(|s| s.ttl(TTL).lock_delay(Duration::ZERO).wait(Wait::Never))
        .collect()
}

/// Acquires `specs(base, n)` on `consul`, all at once (bounded by [`IN_FLIGHT`]).
async fn acquire_all(consul: &Consul, base: &str, n: usize) -> Vec<Lease> {
    let room = Arc::new(Semaphore::new(IN_FLIGHT));
    let mut acquiring = JoinSet::new();
    for spec in specs(base, n) {
        let (consul, room) = (consul.clone(), Arc::clone(&room));
        acquiring.spawn(async move {
            let _room = room.acquire_owned().await.unwrap();
            consul.acquire(&spec).await
        });
    }
    let mut leases: Vec<Lease> = Vec::new();
    let mut failed = 0;
    while let Some(acquired) = acquiring.join_next().await {
        match acquired.unwrap() {
            Ok(lease) => leases.push(lease),
            Err(error) => {
                if failed == 0 {
                    eprintln!("  first failure: {error}");
                }
                failed += 1;
            }
        }
    }
    if failed > 0 {
        eprintln!("  {failed} of {n} acquisitions failed");
    }
    leases
}

fn client(address: String, keep_alive: KeepAlive) -> Consul {
    Consul::builder()
        .address(address)
        .keep_alive(keep_alive)
        .build()
        .unwrap()
}

async fn run(n: usize, keep_alive: KeepAlive, hold: Duration) -> Figures {
    let agent = Agent::start().await;
    let proxy = Proxy::start(agent.addr()).await.unwrap();
    let consul = client(proxy.url(), keep_alive);
    let rss_before = rss_kb();
    let started = Instant::now();
    let leases = acquire_all(&consul, "scale", n).await;
    let acquire_s = started.elapsed().as_secs_f64();
    let rss_kb_per_lease = (rss_kb() - rss_before) / n as f64;

    let from = proxy.requests();
    tokio::time::sleep(hold).await;
    let idle_rps = (proxy.requests() - from) as f64 / hold.as_secs_f64();
    let held = leases.iter().filter(|l| l.is_held()).count();
    let peak_conns = proxy.peak_connections();
    // Released before the next phase, so its writes do not wake the next client's watches.
    let mut releasing = JoinSet::new();
    for lease in leases {
        releasing.spawn(lease.release());
    }
    while releasing.join_next().await.is_some() {}
    consul.shutdown().await;

    // The same N again, without the proxy in the way, for loss → cancel.
    let consul = client(agent.url(), keep_alive);
    let leases = acquire_all(&consul, "direct", n).await;

    // Loss → cancel of single leader sessions among the N.
    let leaders: Vec<usize> = (leases.iter().enumerate())
        .filter(|(_, l)| l.sequencer().key().starts_with("direct/leader/"))
        .map(|(i, _)| i)
        .collect();
    // One more than counted: the first, right after acquire-all, also waits for the watches to
    // catch up with the acquisitions, and is not counted.
    let loss_trials = scaled(LOSS_TRIALS, 11);
    let trials = (loss_trials + 1).min(leaders.len());
    let victims: Vec<usize> = (0..trials)
        .map(|t| leaders[t * leaders.len() / trials])
        .collect();
    let mut leases: Vec<Option<Lease>> = leases.into_iter().map(Some).collect();
    let mut samples = Vec::new();
    let mut warm_up = trials > loss_trials;
    for at in victims {
        let Some(victim) = leases[at].take() else {
            continue;
        };
        let session = victim.sequencer().holder().to_owned();
        let lost = victim.lost();
        let noticed = tokio::spawn(async move {
            lost.await;
            Instant::now()
        });
        let t0 = Instant::now();
        agent.destroy_session(&session).await;
        let at = noticed.await.unwrap();
        let noticed_after = at.duration_since(t0);
        let fence = LeaseSpec::leader("any").ttl(TTL).fence_after();
        assert!(
            noticed_after < fence,
            "N={n}: a loss was noticed {noticed_after:?} after the session was destroyed, past the \
             fence interval {fence:?}"
        );
        samples.push(noticed_after.as_secs_f64() * 1e3);
        if std::mem::take(&mut warm_up) {
            samples.clear();
        }
        // Its clean-up done before the next trial (it answers that the lease was lost).
        let _ = victim.release().await;
    }
    let consul_lock = consul_lock_loss_to_signal(&agent, loss_trials).await;
    // Released here, so their clean-up does not overlap the next run's measurements.
    let mut releasing = JoinSet::new();
    for lease in leases.into_iter().flatten() {
        releasing.spawn(lease.release());
    }
    while releasing.join_next().await.is_some() {}
    consul.shutdown().await;
    Figures {
        held,
        acquire_s,
        peak_conns,
        idle_rps,
        rss_kb_per_lease,
        loss_p50_ms: percentile(&samples, 50.0),
        loss_p99_ms: percentile(&samples, 99.0),
        consul_lock_p50_ms: percentile(&consul_lock, 50.0),
        consul_lock_p99_ms: percentile(&consul_lock, 99.0),
    }
}

fn print(label: &str, n: usize, f: &Figures) {
    println!(
        "{label:<18} N={n:>6}  held {:>6}  acquire-all {:>7.2} s  peak conns {:>4}  idle {:>8.2} req/s  \
         RSS {:>6.1} KB/lease  loss→cancel p50 {:>7.2} p99 {:>7.2} ms  \
         (consul lock on this agent: p50 {:>5.2} p99 {:>5.2} ms)",
        f.held,
        f.acquire_s,
        f.peak_conns,
        f.idle_rps,
        f.rss_kb_per_lease,
        f.loss_p50_ms,
        f.loss_p99_ms,
        f.consul_lock_p50_ms,
        f.consul_lock_p99_ms
    );
}

#[tokio::main]
async fn main() {
    let sizes = scale_sizes();
    let hold = scale_hold(HOLD);
    println!(
        "consul_scale: one process, default budget of 8 connections, TTL {TTL:?}, each N held \
         {hold:?} before it is counted"
    );
    let mut last = None;
    for &n in &sizes {
        let ours = run(n, KeepAlive::AgentCheck, hold).await;
        print("ours (heartbeat)", n, &ours);
        let renewing = run(n, KeepAlive::SessionTtl, hold).await;
        print("per-session TTL", n, &renewing);
        // Acquired and still held, all of them. (Peak connections are a figure, not a bound:
        // the proxy counts a watch read the client abandoned until the agent answers it.)
        for (mode, figures) in [("heartbeat", &ours), ("per-session TTL", &renewing)] {
            assert_eq!(
                figures.held, n,
                "N={n} ({mode}): leases not acquired, or lost while held"
            );
        }
        last = Some((n, ours));
    }
    if let Some((n, ours)) = last {
        println!(
            "RESULT held_{n}={} max_conns_{n}={} idle_rps_{n}={:.2} rss_kb_per_lease={:.1} \
             loss_p99_ms_at_{n}={:.2} consul_lock_loss_p99_ms={:.2}",
            ours.held,
            ours.peak_conns,
            ours.idle_rps,
            ours.rss_kb_per_lease,
            ours.loss_p99_ms,
            ours.consul_lock_p99_ms
        );
    }
}
