//! etcd at scale: N leases held by one process, the connections and the traffic that costs, and
//! loss that stays where it happened.
//!
//! `cargo bench -p lease-etcd --bench etcd_scale` (`SCALE_NS=100,1000` to choose the sizes;
//! default 100, 1,000 and 10,000; `SCALE_HOLD_S=300` to hold them five minutes before counting
//! them, instead of [`HOLD`]). The quick mode CI runs, N = 100 held 2 s with 11 losses and 2
//! `etcdctl lock` trials: `LEASE_BENCH_QUICK=1 cargo test -p lease-etcd --bench etcd_scale`.
//! In every mode the run fails if a lease is not acquired or is lost while held (a deleted key
//! taking any lease but its own), or if a deleted key's loss is not noticed within the lease's
//! fence interval.
//!
//! For each N, on a fresh single-member etcd, one client holds N/2 leader keys on distinct names
//! (`scale/leader/<i>`) and N/2 semaphore slots over 100 semaphores (`scale/sem/<i mod 100>`),
//! all requested at once, and this prints:
//! - the time to acquire them all;
//! - the peak of this process's connections to etcd, over the acquisitions and the hold: the
//!   ESTABLISHED sockets to etcd's port that the kernel lists for this process, sampled every
//!   [`SAMPLE_EVERY`] (`lease_tests::sockets`), not counted by the client;
//! - how many are still held after holding them all, idle, for [`HOLD`] (no false loss: all N);
//! - gRPC messages (and calls) etcd received per second while idle, from etcd's own `/metrics`
//!   (`grpc_server_msg_received_total`, `grpc_server_started_total`). Calls through the JSON
//!   gateway count too (the gateway forwards each over gRPC), so the figures compare a JSON
//!   client with a gRPC one: a keep-alive request is one call and one message either way, a
//!   message on a shared keep-alive stream one message;
//! - resident memory per lease (growth of this process's RSS over the N acquisitions);
//! - loss → cancel p50 and p99 of single leases (leaders and slots alike) whose own key an
//!   operator deletes among the N ([`LOSS_TRIALS`] of them): from the delete's answer (etcd has
//!   committed it) to the guarded work's drop; a cancellation before the answer counts as 0. The
//!   p99 from just before the delete request was sent follows in brackets (it adds etcd's commit,
//!   a disk sync, to the figure);
//! - the time N waiters take to queue behind 100 holders (N/100 on each leader key), from the
//!   first waiter's start until etcd has all of their keys (`etcd_debugging_mvcc_keys_total` on
//!   its metrics port), and the peak connections meanwhile, sampled until [`WAITING`] after.
//!
//! Beside each loss figure: `etcdctl lock`'s loss → exit on the same etcd, measured while our N
//! leases are held (an operator revokes its lease; it learns of it from its next keep-alive).

#![allow(clippy::unwrap_used)] // A benchmark that cannot set up should stop loudly.

use std::sync::Arc;
use std::time::Duration;

use lease_core::{Backend, Lease, LeaseSpec, Wait};
use lease_etcd::Etcd;
use lease_tests::etcd::{Server, etcdctl_lock_loss_to_exit};
use lease_tests::overlap::{DropStamp, now_ns};
use lease_tests::sockets::ConnectionSampler;
use lease_tests::stats::{percentile, rss_kb, scale_hold, scale_sizes, scaled};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(15);
/// How long the N leases are held, idle, before they are counted (`SCALE_HOLD_S`).
const HOLD: Duration = Duration::from_secs(20);
/// Keys deleted per N: over 100, so the p99 (nearest rank) is not simply the slowest.
const LOSS_TRIALS: usize = 101;
const ETCDCTL_TRIALS: usize = 8;
/// Semaphores the slots are spread over, and holders the waiters queue behind.
const SEMAPHORES: usize = 100;
const HOLDERS: usize = 100;
/// Acquisitions in flight at once (the client queues the rest itself; this bounds the
/// benchmark's own tasks).
const IN_FLIGHT: usize = 1024;
const SAMPLE_EVERY: Duration = Duration::from_millis(100);
/// How long the connections of the queued waiters are sampled: a keep-alive round (TTL/3).
const WAITING: Duration = Duration::from_secs(5);
/// How long acquiring all N, or queueing all waiters, may take before the run reports it as
/// stalled: a liveness bound far above any run's time, not a timing that is asserted.
const STALL: Duration = Duration::from_secs(300);

#[derive(Default)]
struct Figures {
    acquired: usize,
    held: usize,
    acquire_s: f64,
    peak_conns: usize,
    idle_msgs_per_s: f64,
    idle_calls_per_s: f64,
    rss_kb_per_lease: f64,
    loss_p50_ms: f64,
    loss_p99_ms: f64,
    loss_from_request_p99_ms: f64,
    /// Leases other than the victims that were lost during the loss trials.
    false_losses: usize,
    etcdctl_p50_ms: f64,
    etcdctl_p99_ms: f64,
    waiters_queued: u64,
    /// Seconds until etcd had every waiter's key.
    waiters_queue_s: f64,
    peak_conns_waiting: usize,
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

/// Acquires every spec at once (bounded by [`IN_FLIGHT`]), in the order given; a lease that could
/// not be acquired (or not within [`STALL`]) is `None`.
async fn acquire_all(etcd: &Etcd, specs: Vec<LeaseSpec>) -> Vec<Option<Lease>> {
    let n = specs.len();
    let room = Arc::new(Semaphore::new(IN_FLIGHT));
    let mut acquiring = JoinSet::new();
    for (i, spec) in specs.into_iter().enumerate() {
        let (etcd, room) = (etcd.clone(), Arc::clone(&room));
        acquiring.spawn(async move {
            let _room = room.acquire_owned().await.unwrap();
            (i, etcd.acquire(&spec).await)
        });
    }
    let mut leases: Vec<Option<Lease>> = (0..n).map(|_| None).collect();
    let mut failed = 0;
    let deadline = Instant::now() + STALL;
    loop {
        match tokio::time::timeout_at(deadline, acquiring.join_next()).await {
            Ok(Some(joined)) => match joined.unwrap() {
                (i, Ok(lease)) => leases[i] = Some(lease),
                (_, Err(error)) => {
                    if failed == 0 {
                        eprintln!("  first failure: {error}");
                    }
                    failed += 1;
                }
            },
            Ok(None) => break,
            Err(_) => {
                eprintln!(
                    "  {} of {n} acquisitions still pending after {STALL:?}: given up",
                    acquiring.len()
                );
                acquiring.shutdown().await;
                break;
            }
        }
    }
    if failed > 0 {
        eprintln!("  {failed} of {n} acquisitions failed");
    }
    leases
}

async fn release_all(leases: impl IntoIterator<Item = Lease>) {
    let mut releasing = JoinSet::new();
    for lease in leases {
        releasing.spawn(lease.release());
    }
    while releasing.join_next().await.is_some() {}
}

/// Deletes the own key of single leases among `leases`, one at a time, and times each loss →
/// cancel: (from the delete's answer, from the delete's request), in ms. The victims are taken out
/// of `leases`.
async fn loss_to_cancel(
    server: &Server,
    leases: &mut [Option<Lease>],
    trials: usize,
) -> (Vec<f64>, Vec<f64>) {
    let n = leases.len();
    let mut from_answer = Vec::new();
    let mut from_request = Vec::new();
    for t in 0..trials.min(n) {
        let Some(victim) = leases[t * n / trials.min(n)].take() else {
            continue;
        };
        let fence = LeaseSpec::leader("any").ttl(TTL).fence_after();
        // A lease lost before its trial (counted as held or not by the caller) is no trial.
        let own = match server.own_key(victim.sequencer()).await {
            Some(own) if victim.is_held() => own,
            _ => {
                eprintln!("  {} was lost before its trial", victim.sequencer());
                leases[t * n / trials.min(n)] = Some(victim);
                continue;
            }
        };
        let victim = Arc::new(victim);
        let (stamp, dropped) = DropStamp::new();
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let runner = tokio::spawn({
            let victim = Arc::clone(&victim);
            async move {
                let work = async move {
                    let _stamp = stamp;
                    let _ = ready_tx.send(());
                    std::future::pending::<()>().await
                };
                assert!(victim.run(work).await.is_err());
            }
        });
        ready_rx.await.unwrap();
        let sent = now_ns();
        assert_eq!(
            server.post_delete_one(&own).await,
            1,
            "{own} was not there to delete"
        );
        let answered = now_ns();
        tokio::time::timeout(fence, runner)
            .await
            .unwrap_or_else(|_| {
                panic!("the deletion of {own} was not noticed within the fence interval {fence:?}")
            })
            .unwrap();
        let cancelled = dropped.lock().unwrap().expect("work dropped");
        let after_request = cancelled.saturating_sub(sent) as f64 / 1e6;
        assert!(
            after_request < fence.as_secs_f64() * 1e3,
            "the work ran {after_request:.1} ms after {own} was deleted, past the fence interval \
             {fence:?}"
        );
        from_request.push(after_request);
        from_answer.push(cancelled.saturating_sub(answered) as f64 / 1e6);
        // Its clean-up done before the next trial (it answers that the lease was lost).
        let _ = Arc::into_inner(victim).unwrap().release().await;
    }
    (from_answer, from_request)
}

/// N waiters queued behind [`HOLDERS`] holders: the peak connections from the holders'
/// acquisition until [`WAITING`] after etcd has every waiter's key (or [`STALL`] passed); how
/// many waiters were queued; and the seconds from the first waiter's start until etcd had every
/// waiter's key (or until the count stalled).
async fn waiters(server: &Server, etcd: &Etcd, n: usize) -> (u64, usize, f64) {
    const KEYS: &str = "etcd_debugging_mvcc_keys_total";
    let port = server.addr().port();
    // Counted on etcd's metrics port: no operator call on the client port while sampling.
    let before = server.metric_total(KEYS).await as u64;
    let sampler = ConnectionSampler::start(&[port], SAMPLE_EVERY);
    let spec = |k: usize| LeaseSpec::leader(format!("wait/{k}")).ttl(TTL);
    let holders = acquire_all(
        etcd,
        (0..HOLDERS).map(|k| spec(k).wait(Wait::Never)).collect(),
    )
    .await;
    let mut waiting = JoinSet::new();
    let started = Instant::now();
    for i in 0..n {
        let (etcd, spec) = (etcd.clone(), spec(i % HOLDERS));
        waiting.spawn(async move { etcd.acquire(&spec).await });
    }
    // Every waiter is queued once etcd has its key (a contender queues by writing a key of its
    // own under the name).
    let expected = before + (HOLDERS + n) as u64;
    let deadline = Instant::now() + STALL;
    let mut keys = server.metric_total(KEYS).await as u64;
    // Waiters that acquired (a holder was lost) or failed while they should have been queued.
    let mut finished = 0;
    while keys < expected && Instant::now() < deadline {
        if let Ok(Some(Ok(early))) =
            tokio::time::timeout(Duration::from_millis(250), waiting.join_next()).await
        {
            if finished == 0 {
                eprintln!(
                    "  a waiter finished while queued: {:?}",
                    early.map(|l| l.sequencer().clone())
                );
            }
            finished += 1;
        }
        keys = server.metric_total(KEYS).await as u64;
    }
    let queue_s = started.elapsed().as_secs_f64();
    let queued = keys.saturating_sub(before + HOLDERS as u64);
    if keys < expected {
        eprintln!("  only {queued} of {n} waiters queued after {STALL:?}");
    }
    if finished > 0 {
        eprintln!("  {finished} waiters finished while they should have been queued");
    }
    // Queued: sampled a while longer, over a keep-alive round.
    tokio::time::sleep(scaled(WAITING, Duration::from_secs(1))).await;
    sampler.stop();
    let peak = sampler.peak(port);
    waiting.shutdown().await;
    release_all(holders.into_iter().flatten()).await;
    (queued, peak, queue_s)
}

async fn run(n: usize, hold: Duration) -> Figures {
    let server = Server::start().await;
    let etcd = server.backend();
    let port = server.addr().port();
    let mut f = Figures::default();

    let sampler = ConnectionSampler::start(&[port], SAMPLE_EVERY);
    let rss_before = rss_kb();
    let started = Instant::now();
    let mut leases = acquire_all(&etcd, specs(n)).await;
    f.acquire_s = started.elapsed().as_secs_f64();
    f.acquired = leases.iter().flatten().count();
    f.rss_kb_per_lease = (rss_kb() - rss_before) / n as f64;

    // (etcd serves /metrics on a port of its own: the scrapes are no connection to its client
    // port.) Counted once every hold is up (each begins with one read of its key).
    server.await_watchers(f.acquired, STALL).await;
    let msgs = server.metric_total("grpc_server_msg_received_total").await;
    let calls = server.metric_total("grpc_server_started_total").await;
    tokio::time::sleep(hold).await;
    sampler.stop();
    f.peak_conns = sampler.peak(port);
    let secs = hold.as_secs_f64();
    f.idle_msgs_per_s = (server.metric_total("grpc_server_msg_received_total").await - msgs) / secs;
    f.idle_calls_per_s = (server.metric_total("grpc_server_started_total").await - calls) / secs;
    f.held = leases.iter().flatten().filter(|l| l.is_held()).count();

    let lost_before = leases.iter().flatten().filter(|l| !l.is_held()).count();
    let trials = scaled(LOSS_TRIALS, 11);
    let (from_answer, from_request) = loss_to_cancel(&server, &mut leases, trials).await;
    f.loss_p50_ms = percentile(&from_answer, 50.0);
    f.loss_p99_ms = percentile(&from_answer, 99.0);
    f.loss_from_request_p99_ms = percentile(&from_request, 99.0);
    let etcdctl = etcdctl_lock_loss_to_exit(&server, scaled(ETCDCTL_TRIALS, 2)).await;
    f.etcdctl_p50_ms = percentile(&etcdctl, 50.0);
    f.etcdctl_p99_ms = percentile(&etcdctl, 99.0);
    f.false_losses = leases.iter().flatten().filter(|l| !l.is_held()).count() - lost_before;
    // Released here, so their clean-up does not overlap the waiters' figures.
    release_all(leases.into_iter().flatten()).await;

    (f.waiters_queued, f.peak_conns_waiting, f.waiters_queue_s) = waiters(&server, &etcd, n).await;
    etcd.shutdown().await;
    f
}

fn print(n: usize, f: &Figures) {
    println!(
        "N={n:>6}  held {:>6}  acquire-all {:>7.2} s  peak conns {:>5}  idle {:>8.1} msg/s \
         ({:>7.1} calls/s)  RSS {:>6.1} KB/lease  loss→cancel p50 {:>6.2} p99 {:>6.2} ms \
         (from the request: p99 {:>6.2})  (etcdctl lock: p50 {:>7.1} p99 {:>7.1} ms)  \
         {} waiters queued in {:.2} s: peak conns {}",
        f.held,
        f.acquire_s,
        f.peak_conns,
        f.idle_msgs_per_s,
        f.idle_calls_per_s,
        f.rss_kb_per_lease,
        f.loss_p50_ms,
        f.loss_p99_ms,
        f.loss_from_request_p99_ms,
        f.etcdctl_p50_ms,
        f.etcdctl_p99_ms,
        f.waiters_queued,
        f.waiters_queue_s,
        f.peak_conns_waiting,
    );
}

#[tokio::main]
async fn main() {
    let sizes = scale_sizes();
    let hold = scale_hold(HOLD);
    println!(
        "etcd_scale: one process, TTL {TTL:?}, half leader keys and half slots over \
         {SEMAPHORES} semaphores, each N held {hold:?} before it is counted"
    );
    let mut runs = Vec::new();
    for &n in &sizes {
        let figures = run(n, hold).await;
        print(n, &figures);
        runs.push((n, figures));
    }
    let mut result = String::from("RESULT");
    for (n, f) in &runs {
        result += &format!(
            " held_{n}={} acquire_s_{n}={:.2} max_conns_{n}={} idle_msgs_per_s_{n}={:.1} \
             rss_kb_per_lease_{n}={:.1} loss_p50_ms_at_{n}={:.2} loss_p99_ms_at_{n}={:.2} \
             etcdctl_loss_p99_ms_at_{n}={:.1} waiters_queued_{n}={} waiters_queue_s_{n}={:.2} \
             max_conns_waiting_{n}={}",
            f.held,
            f.acquire_s,
            f.peak_conns,
            f.idle_msgs_per_s,
            f.rss_kb_per_lease,
            f.loss_p50_ms,
            f.loss_p99_ms,
            f.etcdctl_p99_ms,
            f.waiters_queued,
            f.waiters_queue_s,
            f.peak_conns_waiting,
        );
    }
    if let Some((_, f)) = runs.last() {
        result += &format!(" etcdctl_loss_p99_ms={:.1}", f.etcdctl_p99_ms);
    }
    println!("{result}");
    for (n, f) in &runs {
        assert_eq!(f.acquired, *n, "N={n}: leases not acquired");
        assert_eq!(f.held, *n, "N={n}: leases lost while held");
        assert_eq!(
            f.false_losses, 0,
            "N={n}: deleting single keys lost other leases too"
        );
    }
}
