//! Redis at scale: ten thousand leases of one process held on at most three connections through
//! several renewal rounds, a deleted key that takes exactly its own lease, a blackholed link that
//! fences every lease by its deadline (and a handle that acquires again once the link is back),
//! and everything given back on shutdown.
//!
//! Connections are counted from outside the client: the ESTABLISHED sockets of this process to
//! the server's port, as the kernel lists them (`lease_tests::sockets`).
//!
//! Run: `cargo test -p lease-tests --test redis_scale` (about 40 s on 2 shared cores; in the
//! second lane of scripts/test.sh). TTLs are 10 s, the shortest a spec accepts.

use std::sync::Arc;
use std::time::Duration;

use lease_core::{Backend, Lease, LeaseSpec, LostReason, Wait};
use lease_redis::Redis;
use lease_tests::proxy::Proxy;
use lease_tests::redis::Server;
use lease_tests::sockets::ConnectionSampler;
use lease_tests::{init_tracing, within};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(10);
const EVENT: Duration = Duration::from_secs(60);

/// `n` specs: half leader keys, half slots over 100 semaphores.
fn specs(base: &str, n: usize) -> Vec<LeaseSpec> {
    let leaders = n / 2;
    let slots = n - leaders;
    let limit = u32::try_from(slots.div_ceil(100).max(1)).unwrap();
    let leader = (0..leaders).map(|i| LeaseSpec::leader(format!("{base}/leader/{i}")));
    let slot = (0..slots).map(|i| LeaseSpec::semaphore(format!("{base}/sem/{}", i % 100), limit));
    leader
        .chain(slot)
        .map(|s| s.ttl(TTL).wait(Wait::Never))
        .collect()
}

async fn acquire_all(redis: &Redis, specs: Vec<LeaseSpec>) -> Vec<Lease> {
    let room = Arc::new(Semaphore::new(1024));
    let mut acquiring = JoinSet::new();
    for (i, spec) in specs.into_iter().enumerate() {
        let (redis, room) = (redis.clone(), Arc::clone(&room));
        acquiring.spawn(async move {
            let _room = room.acquire_owned().await.unwrap();
            (i, redis.acquire(&spec).await)
        });
    }
    let mut leases = Vec::new();
    within(EVENT, "every acquisition", async {
        while let Some(joined) = acquiring.join_next().await {
            let (i, acquired) = joined.unwrap();
            leases.push((
                i,
                acquired.unwrap_or_else(|e| panic!("acquisition {i}: {e}")),
            ));
        }
    })
    .await;
    leases.sort_by_key(|(i, _)| *i);
    leases.into_iter().map(|(_, lease)| lease).collect()
}

fn holder_key(lease: &Lease) -> String {
    let sequencer = lease.sequencer();
    match sequencer
        .key()
        .strip_suffix(sequencer.holder())
        .and_then(|p| p.strip_suffix('/'))
    {
        Some(name) => format!("lease:{{{name}}}:s:{}", sequencer.holder()),
        None => format!("lease:{{{}}}", sequencer.key()),
    }
}

/// Ten thousand leases of one handle: acquired, held through three renewal rounds with none
/// lost and never more than three connections (two, in fact: commands and the subscriber); a
/// `DEL` of one lease's key takes that lease within a second and no other; shutdown gives every
/// lease back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_leases_on_at_most_three_connections() {
    init_tracing();
    let server = Server::start().await;
    let redis = Redis::new(&server.url()).unwrap();
    let sampler = ConnectionSampler::start(&[server.port()], Duration::from_millis(100));
    let started = Instant::now();
    let leases = acquire_all(&redis, specs("scale", 10_000)).await;
    eprintln!("10,000 acquisitions in {:?}", started.elapsed());
    let before = server.client_requests().await;
    let held_from = Instant::now();
    tokio::time::sleep(TTL + TTL / 5).await;
    let requests = server.client_requests().await.saturating_sub(before);
    eprintln!(
        "{requests} requests while holding for {:?}",
        held_from.elapsed()
    );
    let lost: Vec<_> = leases.iter().filter(|l| !l.is_held()).collect();
    assert!(lost.is_empty(), "{} leases lost while held", lost.len());
    assert_eq!(redis.held(), 10_000);

    let victim = &leases[7_777];
    let deleted = Instant::now();
    assert_eq!(server.del(&holder_key(victim)).await, 1);
    let reason = within(Duration::from_secs(5), "the victim's loss", victim.lost()).await;
    assert_eq!(reason, LostReason::KeyDeleted);
    assert!(
        deleted.elapsed() < Duration::from_secs(1),
        "{:?}",
        deleted.elapsed()
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let others_lost = leases.iter().filter(|l| !l.is_held()).count() - 1;
    assert_eq!(others_lost, 0, "a deleted key took other leases");

    let peak = sampler.peak(server.port());
    assert!(peak <= 3, "{peak} connections for 10,000 leases");
    assert!(sampler.samples() > 10);
    sampler.stop();
    drop(leases);
    within(EVENT, "shutdown", redis.shutdown()).await;
    let left: Vec<String> = server
        .cmd(redis::cmd("KEYS").arg("lease:{scale/leader/*}"))
        .await;
    assert!(
        !left.iter().any(|k| k.ends_with('}')),
        "leader keys left after shutdown: {}",
        left.len()
    );
}

/// A link that stops carrying bytes (a partition): every one of a thousand leases is lost by its
/// fence deadline, before its key expires on the server; once the link is back, the handle
/// acquires again (recovery within a TTL).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blackholed_link_fences_every_lease_and_the_handle_recovers() {
    init_tracing();
    let server = Server::start().await;
    let proxy = Proxy::start(server.addr()).await.unwrap();
    let redis = Redis::new(&format!("redis://{}", proxy.addr())).unwrap();
    let leases = acquire_all(&redis, specs("cut", 1_000)).await;
    let fence = specs("cut", 1)[0].fence_after();
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.set_blackhole(true);
    let cut = Instant::now();
    within(
        fence + Duration::from_secs(2),
        "every lease fenced",
        async {
            for lease in &leases {
                let reason = lease.lost().await;
                assert!(reason.is_self_fenced(), "{reason:?}");
            }
        },
    )
    .await;
    assert!(
        cut.elapsed() < TTL,
        "fenced {:?} after the cut",
        cut.elapsed()
    );
    proxy.set_blackhole(false);
    let again = within(
        TTL + Duration::from_secs(10),
        "an acquisition after the link is back",
        redis.acquire(
            &LeaseSpec::leader("cut/after")
                .ttl(TTL)
                .wait(Wait::UpTo(TTL * 2)),
        ),
    )
    .await
    .unwrap();
    again.release().await.unwrap();
}
