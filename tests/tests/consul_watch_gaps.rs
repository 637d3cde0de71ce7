//! A lease acquired while the client's prefix watches are reshaped is watched at once.
//!
//! A Consul client multiplexes every watch onto a few prefix watches, widening one (and
//! absorbing others) when it runs out. These tests acquire leases one after another on distinct
//! keys, which reshapes the watches again and again, and have an operator destroy each lease's
//! session right after it was acquired: every loss must be noticed within [`NOTICED_WITHIN`]
//! (it once took up to 30 s, one trial in ten). The same with 1,000 leases already held, and with
//! a second process waiting on each key with lock-delay 0, judged from the histories the two
//! processes write.

use std::time::Duration;

use lease_core::{Backend, Lease, LeaseSpec, Sequencer, Wait};
use lease_tests::consul::Agent;
use lease_tests::history::{History, Kind};
use lease_tests::init_tracing;
use lease_tests::overlap::now_ns;
use lease_tests::workers::{Run, wait_for};
use tokio::io::AsyncWriteExt;
use tokio::time::Instant;

/// How soon a loss must be noticed: far below the 30 s a key could go unwatched, far above what
/// a loaded machine adds to the milliseconds it takes.
const NOTICED_WITHIN: Duration = Duration::from_secs(2);
const KEYS: usize = 50;

fn leader(key: String) -> LeaseSpec {
    LeaseSpec::leader(key).lock_delay(Duration::ZERO)
}

fn semaphore(prefix: String) -> LeaseSpec {
    LeaseSpec::semaphore(prefix, 2).lock_delay(Duration::ZERO)
}

/// Acquires `KEYS` leases one after another (`spec(i)`), destroying each one's session right
/// after; returns the slowest loss-to-notice, and fails if any took longer than
/// [`NOTICED_WITHIN`].
async fn every_loss_noticed(
    agent: &Agent,
    backend: &dyn Backend,
    spec: impl Fn(usize) -> LeaseSpec,
) {
    let mut slowest = Duration::ZERO;
    for i in 0..KEYS {
        let spec = spec(i);
        let lease = backend.acquire(&spec).await.unwrap();
        let destroyed = Instant::now();
        agent.destroy_session(lease.sequencer().holder()).await;
        let reason = tokio::time::timeout(NOTICED_WITHIN, lease.lost())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "the loss of {} (lease {i} of {KEYS}) was not noticed within {NOTICED_WITHIN:?}",
                    lease.sequencer()
                )
            });
        assert!(!lease.is_held(), "{reason}");
        slowest = slowest.max(destroyed.elapsed());
    }
    eprintln!("slowest loss to notice of {KEYS}: {slowest:?}");
}

#[tokio::test]
async fn leader_keys_acquired_one_after_another_are_watched_at_once() {
    init_tracing();
    let agent = Agent::start().await;
    let backend = agent.backend();
    // Keys with little in common, so groups are widened all the way to the whole store.
    every_loss_noticed(&agent, &backend, |i| {
        leader(format!(
            "{}{i}/gaps/leader",
            char::from(b'a' + (i % 26) as u8)
        ))
    })
    .await;
}

#[tokio::test]
async fn semaphores_acquired_one_after_another_are_watched_at_once() {
    init_tracing();
    let agent = Agent::start().await;
    let backend = agent.backend();
    every_loss_noticed(&agent, &backend, |i| {
        semaphore(format!("{}{i}/gaps/sem", char::from(b'a' + (i % 26) as u8)))
    })
    .await;
}

#[tokio::test]
async fn leases_acquired_beside_a_thousand_held_ones_are_watched_at_once() {
    init_tracing();
    let agent = Agent::start().await;
    let backend = agent.backend();
    let mut acquiring = tokio::task::JoinSet::new();
    for i in 0..1_000 {
        let backend = backend.clone();
        let spec = leader(format!("held/{i}")).wait(Wait::Never);
        acquiring.spawn(async move { backend.acquire(&spec).await });
    }
    let mut held: Vec<Lease> = Vec::new();
    while let Some(acquired) = acquiring.join_next().await {
        held.push(acquired.unwrap().unwrap());
    }
    every_loss_noticed(&agent, &backend, |i| leader(format!("gaps/{i}/leader"))).await;
    every_loss_noticed(&agent, &backend, |i| semaphore(format!("gaps/{i}/sem"))).await;
    let lost = held.iter().filter(|l| !l.is_held()).count();
    assert_eq!(lost, 0, "leases held all along were lost");
}

/// A holder process acquires 50 keys one after another (beside 200 it holds all along), and an
/// operator destroys each holder session right after; a second process waits on each key with
/// lock-delay 0 and takes it over. From their histories: every loss was noticed within
/// [`NOTICED_WITHIN`], and no key ever had two writers at once.
#[tokio::test]
async fn a_waiting_process_never_overlaps_a_holder_whose_watches_reshape() {
    init_tracing();
    let agent = Agent::start().await;
    let mut run = Run::new(
        "consul-watch-gaps",
        "overlap",
        env!("CARGO_BIN_EXE_lease-worker").as_ref(),
    );
    let common = |mode: &str| -> Vec<String> {
        [
            "--consul",
            &agent.url(),
            "--key",
            "gaps/proc",
            "--lock-delay",
            "0",
            "--mode",
            mode,
        ]
        .map(str::to_owned)
        .to_vec()
    };
    let (waiter, mut waiter_stdin) = run.spawn_with_stdin("waiter", &common("loop-stdin"));
    let mut holder_args = common("one-after-another");
    holder_args.extend(["--count", &KEYS.to_string(), "--preheld", "200"].map(str::to_owned));
    let holder = run.spawn("holder", &holder_args);
    let waiter_log = run.workers[waiter].log.clone();
    let mut destroyed_at = Vec::new();
    for i in 0..KEYS {
        let key = format!("gaps/proc/{i}");
        // The holder acquires the key...
        let seq: Sequencer = wait_for(
            Duration::from_secs(30),
            || format!("the holder to acquire {key:?}; {}", run.files()),
            || {
                let history = run.history(&[holder]);
                let line = history
                    .lines()
                    .iter()
                    .find(|l| l.kind == Kind::Acquired && l.seq.ends_with(&format!(":{key}")))?;
                line.seq.parse().ok()
            },
        )
        .await;
        // ...the waiter waits for it, having seen the holder...
        waiter_stdin
            .write_all(format!("{i}\n").as_bytes())
            .await
            .unwrap();
        let seen = format!("key={key} holder={}", seq.holder());
        wait_for(
            Duration::from_secs(30),
            || format!("the waiter to see {key:?} held; {}", run.files()),
            || {
                let log = std::fs::read_to_string(&waiter_log).unwrap_or_default();
                log.contains(&seen).then_some(())
            },
        )
        .await;
        run.assert_alive();
        // ...and an operator destroys the holder's session.
        destroyed_at.push((seq.clone(), now_ns()));
        agent.destroy_session(seq.holder()).await;
    }
    let history = wait_for(
        Duration::from_secs(30),
        || format!("the waiter to hold every key; {}", run.files()),
        || {
            let history = run.all();
            let taken = history
                .lines()
                .iter()
                .filter(|l| l.pid == run.pid(waiter) && l.kind == Kind::Write)
                .map(|l| l.seq.rsplit(':').next().unwrap_or_default().to_owned())
                .collect::<std::collections::BTreeSet<_>>();
            (taken.len() == KEYS).then_some(history)
        },
    )
    .await;
    // End of input: the waiter's reader of stdin ends, so its runtime can.
    drop(waiter_stdin);
    run.terminate_all().await.unwrap();

    let mut slowest = 0.0_f64;
    for (seq, at) in &destroyed_at {
        let text = seq.to_string();
        let lost = history
            .of_seq(&text)
            .find(|l| l.kind == Kind::Lost)
            .unwrap_or_else(|| {
                panic!(
                    "the holder never noticed the loss of {seq}; {}",
                    run.files()
                )
            });
        let after = (lost.t.saturating_sub(*at)) as f64 / 1e6;
        slowest = slowest.max(after);
        assert!(
            after <= NOTICED_WITHIN.as_secs_f64() * 1e3,
            "the holder noticed the loss of {seq} {after:.1} ms after its session was destroyed; {}",
            run.files()
        );
    }
    for i in 0..KEYS {
        let suffix = format!(":gaps/proc/{i}");
        let of_key = History::from_lines(
            (history.lines().iter())
                .filter(|l| l.seq.ends_with(&suffix))
                .cloned()
                .collect(),
        );
        let overlap = of_key.max_concurrent_writers(1);
        assert!(
            !overlap.exceeds_limit(),
            "two writers at once on gaps/proc/{i}: {overlap:?}; {}",
            run.files()
        );
    }
    eprintln!("slowest loss to notice of {KEYS} in the holder process: {slowest:.1} ms");
}
