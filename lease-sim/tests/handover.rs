//! A hand-over between two tasks of one process, under every interleaving the seeds draw: the
//! follower takes the key within 100 ms of the leader's clean release, however short the
//! leader's tenure and however the follower's reads straddle it (a follower that never saw the
//! holder does not settle for a holding its own client gave back). CI's real-agent
//! `shutdown_hands_over_within_100ms_on_consul` met this interleaving once in many runs; here
//! every seed is one.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::LocalSet;
use tokio::time::Instant;

use lease_core::{Backend, Lease, LeaseSpec, Wait};
use lease_sim::consul::{Config, Model};
use lease_sim::net::{Net, NetConfig};
use lease_sim::rng::Rng;
use lease_sim::server::Server;
use lease_sim::world::{self, Process};

/// The bound `tests/tests/leader_loop.rs` holds a real agent to.
const HAND_OVER: Duration = Duration::from_millis(100);
const SEEDS: u64 = 300;

/// One seed: two tasks of one client race for a key (15 s TTL and lock-delay, so only a clean
/// release lets the follower in early); the winner holds it for 0–8 ms and releases it. How long
/// after the release the follower took it.
fn hand_over(seed: u64) -> Duration {
    let runtime = world::runtime(seed).expect("a runtime");
    let root = LocalSet::new();
    root.block_on(&runtime, async move {
        let mut rng = Rng::new(seed);
        let net = Net::new(rng.fork("net"), NetConfig::default());
        let model = Model::new(Config::new(seed));
        let server = Process::start("server", &net, rng.next_u64());
        model.serve(&server, net.listen("server", model.port()).expect("listen"));
        let process = Process::start("p", &net, rng.next_u64());
        let backend = model.client(&process, "server");
        let spec = LeaseSpec::leader("svc/handover")
            .ttl(Duration::from_secs(15))
            .lock_delay(Duration::from_secs(15))
            .wait(Wait::UpTo(Duration::from_secs(60)));
        // The first task to take the key leads; the other follows, told when the release was.
        let led = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (released_tx, released_rx) = tokio::sync::watch::channel(None::<Instant>);
        let tenure = Duration::from_micros(rng.below(8_000));
        let contend = |backend: Arc<dyn Backend>, spec: LeaseSpec| {
            let (led, released_tx) = (Arc::clone(&led), released_tx.clone());
            let mut released_rx = released_rx.clone();
            process.spawn(async move {
                let lease: Lease = backend.acquire(&spec).await.expect("acquired");
                if !led.swap(true, std::sync::atomic::Ordering::SeqCst) {
                    tokio::time::sleep(tenure).await;
                    lease.release().await.expect("released");
                    released_tx.send_replace(Some(Instant::now()));
                    return None;
                }
                let took = Instant::now();
                let released_at = *released_rx
                    .wait_for(Option::is_some)
                    .await
                    .expect("the leader released");
                lease.release().await.expect("released");
                released_at.map(|at| took.saturating_duration_since(at))
            })
        };
        let first = contend(Arc::clone(&backend), spec.clone());
        let second = contend(Arc::clone(&backend), spec);
        let (first, second) = tokio::join!(first, second);
        backend.shutdown().await;
        first
            .expect("first task")
            .or(second.expect("second task"))
            .expect("a follower")
    })
}

#[test]
fn a_hand_over_between_two_tasks_of_one_process_never_settles() {
    let mut slowest = (Duration::ZERO, 0);
    for seed in 0..SEEDS {
        let took = hand_over(seed);
        assert!(
            took <= HAND_OVER,
            "seed {seed}: the follower took the key {took:?} after the leader's release"
        );
        slowest = slowest.max((took, seed));
    }
    println!("slowest hand-over: {:?} (seed {})", slowest.0, slowest.1);
}
