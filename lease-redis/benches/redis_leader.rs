//! Redis leader lease and semaphore vs the common Rust Redis lock, on one real `redis-server`.
//!
//! `cargo bench -p lease-redis --bench redis_leader`; the quick mode CI runs (5 deletes of ours,
//! 2 of the reference, one round of 4 contenders each, 8 semaphore jobs; a few seconds):
//! `LEASE_BENCH_QUICK=1 cargo test -p lease-redis --bench redis_leader`. In every mode the run
//! fails if a delete is not noticed within the lease's fence interval
//! ([`LeaseSpec::fence_after`]), if two leader holders (ours or the reference's) or more than
//! the limit of our semaphore holders overlap, if one of our leases is lost while held, or if
//! an acquisition does not complete (within [`STALL`]).
//!
//! The reference is the lock rslock 0.10 implements (and redlock-rs before it), on one server:
//! `SET key value NX PX ttl`; a contender that finds it taken sleeps a random 0–200 ms
//! (rslock's default retry delay) and tries again, the fourth try in a row without a pause
//! (rslock's `acquire` loops over `lock`, which tries four times); released by a
//! compare-and-delete script. rslock itself has no renewal; the reference holder runs the
//! watchdog a user would add, rslock's `extend` (compare, then `PEXPIRE`) every TTL/3.
//!
//! - loss → cancel: an operator deletes the holder's key (`DEL`, from a connection of its own);
//!   we time until the guarded future is dropped (ours: client-side tracking pushes the
//!   invalidation) or until the reference's watchdog finds the key gone (its next `extend`: it
//!   has no notice at all; without a watchdog it would learn nothing until its own TTL ran out).
//!   The delete falls at a random point of the reference's renewal period.
//! - hand-off gap: 16 contenders each hold 20 ms and release; the gap between one holder's end
//!   and the next holder's start (ours: the release publishes, the next waiter in line is woken).
//! - semaphore: 32 jobs of 50 ms at limit 4; the ideal is 32 / 4 × 50 ms = 0.4 s.
//!
//! Timestamps are wall-clock nanoseconds (`SystemTime`), taken in this one process.

#![allow(clippy::unwrap_used)] // A benchmark that cannot set up should stop loudly.

use std::time::Duration;

use lease_core::backoff::random_below;
use lease_core::{Backend, LeaseSpec, Sequencer};
use lease_redis::Redis;
use lease_tests::overlap::{Timeline, leader_handoff, loss_to_cancel, now_ns, semaphore_jobs};
use lease_tests::redis::Server;
use lease_tests::stats::{percentile, scaled};
use redis::aio::MultiplexedConnection;

const LOSS_TRIALS: usize = 30;
const REFERENCE_TRIALS: usize = 8;
const CONTENDERS: usize = 16;
const HOLD: Duration = Duration::from_millis(20);
const ROUNDS: usize = 3;
const JOBS: usize = 32;
const LIMIT: u32 = 4;
const JOB: Duration = Duration::from_millis(50);
const TTL: Duration = Duration::from_secs(10);
/// How long a round of acquisitions may take before the run fails as stalled: a liveness bound
/// far above any round's time, not a timing that is asserted.
const STALL: Duration = Duration::from_secs(120);

const UNLOCK: &str = "if redis.call('get', KEYS[1]) == ARGV[1] then \
                      return redis.call('del', KEYS[1]) else return 0 end";
const EXTEND: &str = "if redis.call('get', KEYS[1]) == ARGV[1] then \
                      return redis.call('pexpire', KEYS[1], ARGV[2]) else return 0 end";

async fn ours_loss_to_cancel(server: &Server, redis: &Redis) -> Vec<f64> {
    let spec = |trial| LeaseSpec::leader(format!("bench/loss/ours-{trial}")).ttl(TTL);
    let delete = async |sequencer: &Sequencer| {
        assert_eq!(
            server.del(&format!("lease:{{{}}}", sequencer.key())).await,
            1
        );
    };
    loss_to_cancel(
        redis,
        scaled(LOSS_TRIALS, 5),
        spec,
        delete,
        "its key was deleted",
    )
    .await
}

/// The reference's `lock`: `SET NX PX`, retried as rslock's `acquire` does.
async fn reference_acquire(conn: &mut MultiplexedConnection, key: &str, value: &str) {
    let mut tries = 0;
    loop {
        let set: Option<String> = redis::cmd("SET")
            .arg(key)
            .arg(value)
            .arg("NX")
            .arg("PX")
            .arg(TTL.as_millis() as u64)
            .query_async(conn)
            .await
            .unwrap();
        if set.is_some() {
            return;
        }
        tries += 1;
        if tries < 4 {
            tokio::time::sleep(Duration::from_millis(random_below(200))).await;
        } else {
            tries = 0;
        }
    }
}

async fn script(conn: &mut MultiplexedConnection, source: &str, key: &str, args: &[&str]) -> i64 {
    redis::cmd("EVAL")
        .arg(source)
        .arg(1)
        .arg(key)
        .arg(args)
        .query_async(conn)
        .await
        .unwrap()
}

/// The reference's holders run a watchdog (`extend` every TTL/3); an operator deletes the key at
/// a random point of its period; the time until the watchdog finds out. Trials run side by side.
async fn reference_loss(server: &Server, trials: usize) -> Vec<f64> {
    let period = TTL / 3;
    let tasks: Vec<_> = (0..trials)
        .map(|trial| {
            let url = server.url();
            tokio::spawn(async move {
                let client = redis::Client::open(url).unwrap();
                let mut conn = client.get_multiplexed_async_connection().await.unwrap();
                let mut operator = client.get_multiplexed_async_connection().await.unwrap();
                let key = format!("bench/loss/reference-{trial}");
                let value = format!("{:x}", random_below(u64::MAX));
                reference_acquire(&mut conn, &key, &value).await;
                let ttl_ms = (TTL.as_millis() as u64).to_string();
                let delete_in = Duration::from_millis(random_below(period.as_millis() as u64));
                let deleted_at = tokio::spawn(async move {
                    tokio::time::sleep(delete_in).await;
                    let at = now_ns();
                    let _: u64 = redis::cmd("DEL")
                        .arg(&key)
                        .query_async(&mut operator)
                        .await
                        .unwrap();
                    at
                });
                let key = format!("bench/loss/reference-{trial}");
                loop {
                    tokio::time::sleep(period).await;
                    if script(&mut conn, EXTEND, &key, &[&value, &ttl_ms]).await == 0 {
                        let noticed = now_ns();
                        let deleted = deleted_at.await.unwrap();
                        return noticed.saturating_sub(deleted) as f64 / 1e6;
                    }
                }
            })
        })
        .collect();
    let mut samples = Vec::new();
    for task in tasks {
        samples.push(task.await.unwrap());
    }
    samples
}

async fn ours_handoff(redis: &Redis) -> Vec<f64> {
    let spec = |round| LeaseSpec::leader(format!("bench/handoff/ours-{round}")).ttl(TTL);
    let (rounds, contenders) = (scaled(ROUNDS, 1), scaled(CONTENDERS, 4));
    leader_handoff(redis, rounds, spec, contenders, HOLD, STALL).await
}

/// The reference's hand-off: each contender takes the key with the retry loop, holds it, and
/// releases it with compare-and-delete.
async fn reference_handoff(server: &Server) -> Vec<f64> {
    let (rounds, contenders) = (scaled(ROUNDS, 1), scaled(CONTENDERS, 4));
    let mut gaps = Vec::new();
    for round in 0..rounds {
        let timeline = Timeline::new();
        let key = format!("bench/handoff/reference-{round}");
        let tasks: Vec<_> = (0..contenders)
            .map(|i| {
                let (url, key, timeline) = (server.url(), key.clone(), timeline.clone());
                tokio::spawn(async move {
                    let client = redis::Client::open(url).unwrap();
                    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
                    let value = format!("{i}-{:x}", random_below(u64::MAX));
                    reference_acquire(&mut conn, &key, &value).await;
                    let guard = timeline.hold(format!("reference-{i}"));
                    tokio::time::sleep(HOLD).await;
                    drop(guard);
                    assert_eq!(script(&mut conn, UNLOCK, &key, &[&value]).await, 1);
                })
            })
            .collect();
        let joined = async {
            for task in tasks {
                task.await.unwrap();
            }
        };
        tokio::time::timeout(STALL, joined).await.unwrap();
        gaps.extend(timeline.handoff_gaps_ms());
    }
    gaps
}

async fn semaphore_total(redis: &Redis, jobs: usize) -> f64 {
    let spec = LeaseSpec::semaphore("bench/semaphore", LIMIT).ttl(TTL);
    semaphore_jobs(redis, &spec, jobs, JOB, STALL)
        .await
        .as_secs_f64()
}

#[tokio::main]
async fn main() {
    let server = Server::start().await;
    let redis = Redis::new(&server.url()).unwrap();

    let reference_trials = scaled(REFERENCE_TRIALS, 2);
    let (ours_loss, reference_loss) = tokio::join!(
        ours_loss_to_cancel(&server, &redis),
        reference_loss(&server, reference_trials)
    );
    let gap = ours_handoff(&redis).await;
    let reference_gap = reference_handoff(&server).await;
    let jobs = scaled(JOBS, 8);
    let sem_total = semaphore_total(&redis, jobs).await;
    let ideal = jobs as f64 / f64::from(LIMIT) * JOB.as_secs_f64();

    let contenders = scaled(CONTENDERS, 4);
    let gap_label = format!("hand-off gap, {contenders} contenders");
    let reference_gap_label = "  reference (SET NX PX + retry)";
    println!("{:<34} {:>9} {:>9} {:>6}", "ms", "p50", "p99", "n");
    for (name, samples) in [
        ("loss -> cancel (ours)", &ours_loss),
        ("loss -> noticed (reference)", &reference_loss),
        (gap_label.as_str(), &gap),
        (reference_gap_label, &reference_gap),
    ] {
        println!(
            "{name:<34} {:>9.2} {:>9.2} {:>6}",
            percentile(samples, 50.0),
            percentile(samples, 99.0),
            samples.len()
        );
    }
    println!(
        "semaphore: {jobs} x {JOB:?} jobs at limit {LIMIT}: {sem_total:.3} s (ideal {ideal:.1} s)"
    );
    println!(
        "RESULT redis_loss_cancel_p99_ms={:.2} reference_loss_p99_ms={:.2} redis_handoff_p50_ms={:.2} reference_handoff_p50_ms={:.2} redis_sem_total_s={:.3} ideal_s={:.1}",
        percentile(&ours_loss, 99.0),
        percentile(&reference_loss, 99.0),
        percentile(&gap, 50.0),
        percentile(&reference_gap, 50.0),
        sem_total,
        ideal
    );
    redis.shutdown().await;
    let left: Vec<String> = server.cmd(redis::cmd("KEYS").arg("lease:{bench/*}")).await;
    assert!(
        !left.iter().any(|k| k.ends_with('}') || k.contains("}:s:")),
        "our leases were left behind: {left:?}"
    );
}
