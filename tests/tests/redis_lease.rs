//! The Redis lease backend (`lease_redis::Redis`) against a real `redis-server`, beyond the
//! conformance suite: loss within milliseconds of a `DEL` or an eviction, the settle after it,
//! FIFO waiters, hand-over on release, killed connections replaced, a restarted or paused server,
//! a partitioned holder's self-fence, tokens that rise after a purge, and the connection budget.
//!
//! Each test starts a `redis-server` of its own on a free port (`lease_tests::redis`): Debian's
//! `redis-server` must be installed (`apt-get install redis-server`; scripts/test.sh does it).
//!
//! Run: `cargo test -p lease-tests --test redis_lease`

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lease_conformance::support::within;
use lease_core::backend::Reachability;
use lease_core::{Backend, Error, LeaseSpec, LostReason, Wait};
use lease_redis::Redis;
use lease_tests::proxy::Proxy;
use lease_tests::redis::Server;
use tokio::time::Instant;

async fn set_up() -> (Server, Redis) {
    lease_tests::init_tracing();
    let server = Server::start().await;
    let redis = Redis::new(&server.url()).unwrap();
    (server, redis)
}

fn leader(key: &str) -> LeaseSpec {
    LeaseSpec::leader(key)
        .ttl(Duration::from_secs(10))
        .lock_delay(Duration::ZERO)
}

/// Waits (2 s at most) for `lease`'s loss, which must be its key's deletion, noticed less than
/// `bound` after `since`.
async fn deleted_within(lease: &lease_core::Lease, since: Instant, bound: Duration) {
    let reason = within(Duration::from_secs(2), "the loss", lease.lost()).await;
    let noticed = since.elapsed();
    assert_eq!(reason, LostReason::KeyDeleted);
    assert!(noticed < bound, "noticed {noticed:?} after the deletion");
}

/// An operator's `DEL` of the leader key reaches its holder as a tracking invalidation: the
/// work is cancelled within milliseconds, not at the next renewal; the name stays barred for the
/// holder's settle time, then a waiter takes it.
#[tokio::test]
async fn a_holder_whose_key_is_deleted_loses_within_milliseconds_and_waiters_settle() {
    let (server, redis) = set_up().await;
    let spec = leader("jobs/deleted").settle(Duration::from_millis(400));
    let lease = redis.acquire(&spec).await.unwrap();
    let waiter = {
        let redis = redis.clone();
        let spec = spec.clone();
        tokio::spawn(async move {
            let lease = redis.acquire(&spec).await.unwrap();
            (Instant::now(), lease)
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let deleted = Instant::now();
    assert_eq!(server.del("lease:{jobs/deleted}").await, 1);
    deleted_within(&lease, deleted, Duration::from_millis(200)).await;
    let (taken, next) = within(Duration::from_secs(5), "the waiter", waiter)
        .await
        .unwrap();
    let after = taken - deleted;
    assert!(
        after >= Duration::from_millis(400),
        "the waiter took the name {after:?} after the DEL, inside the holder's settle time"
    );
    assert!(next.sequencer().index() > lease.sequencer().index());
    next.release().await.unwrap();
}

/// Another client's overwrite of the leader key is a loss to the holder (`KeyTaken` when it
/// names another holder).
#[tokio::test]
async fn an_overwritten_key_is_taken() {
    let (server, redis) = set_up().await;
    let lease = redis.acquire(&leader("jobs/overwritten")).await.unwrap();
    let _: () = server
        .cmd(
            redis::cmd("HSET")
                .arg("lease:{jobs/overwritten}")
                .arg("holder")
                .arg("intruder")
                .arg("token")
                .arg("7"),
        )
        .await;
    let reason = within(Duration::from_secs(2), "the loss", lease.lost()).await;
    assert!(
        matches!(&reason, LostReason::KeyTaken { session, .. } if session == "intruder"),
        "{reason:?}"
    );
}

/// An eviction reaches the holder as a `DEL` does: a server over its `maxmemory` that evicts
/// the keys with a TTL first (`volatile-ttl`) drops the leader key, and the holder loses it
/// within milliseconds, not at its next renewal.
#[tokio::test]
async fn an_evicted_key_is_lost_at_once() {
    lease_tests::init_tracing();
    let server =
        Server::with_args(&["--maxmemory", "4mb", "--maxmemory-policy", "volatile-ttl"]).await;
    let redis = Redis::new(&server.url()).unwrap();
    let lease = redis.acquire(&leader("jobs/evicted")).await.unwrap();
    let mut conn = server.connection().await.unwrap();
    let value = vec![b'x'; 64 * 1024];
    // Keys without a TTL, until the server has had to evict the ones that have one (and refuses
    // a write once none is left).
    let mut filled = 0;
    let evicted = loop {
        let _: redis::RedisResult<()> = redis::cmd("SET")
            .arg(format!("filler:{filled}"))
            .arg(&value)
            .query_async(&mut conn)
            .await;
        filled += 1;
        let exists: u64 = server
            .cmd(redis::cmd("EXISTS").arg("lease:{jobs/evicted}"))
            .await;
        if exists == 0 {
            break Instant::now();
        }
        assert!(
            filled < 1_000,
            "64 MiB of fillers and the leader key is still there"
        );
    };
    deleted_within(&lease, evicted, Duration::from_millis(200)).await;
    let evictions: String = server.cmd(redis::cmd("INFO").arg("stats")).await;
    assert!(
        evictions
            .lines()
            .any(|l| l.starts_with("evicted_keys:") && l != "evicted_keys:0"),
        "the key went without an eviction:\n{evictions}"
    );
}

/// Waiters are served in the order they came, for a leader key and for a semaphore.
#[tokio::test]
async fn waiters_are_served_first_come_first_served() {
    let (_server, redis) = set_up().await;
    for (name, limit) in [("fifo/leader", 1), ("fifo/semaphore", 2)] {
        let spec = if limit == 1 {
            leader(name)
        } else {
            LeaseSpec::semaphore(name, limit)
                .ttl(Duration::from_secs(10))
                .lock_delay(Duration::ZERO)
        };
        let mut held = Vec::new();
        for _ in 0..limit {
            held.push(redis.acquire(&spec).await.unwrap());
        }
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut waiters = Vec::new();
        for i in 0..6 {
            let (redis, spec, order) = (redis.clone(), spec.clone(), Arc::clone(&order));
            waiters.push(tokio::spawn(async move {
                let lease = redis.acquire(&spec).await.unwrap();
                order.lock().unwrap().push(i);
                tokio::time::sleep(Duration::from_millis(30)).await;
                lease.release().await.unwrap();
            }));
            // Each in line before the next comes.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        for lease in held {
            lease.release().await.unwrap();
        }
        for waiter in waiters {
            within(Duration::from_secs(10), "every waiter", waiter)
                .await
                .unwrap();
        }
        let order = order.lock().unwrap().clone();
        assert_eq!(order, [0, 1, 2, 3, 4, 5], "{name}");
    }
}

/// A release hands the name to the waiter at once (the waiter is woken by pub/sub).
#[tokio::test]
async fn a_release_hands_over_at_once() {
    let (_server, redis) = set_up().await;
    let spec = leader("jobs/handover");
    let a = redis.acquire(&spec).await.unwrap();
    let waiter = {
        let redis = redis.clone();
        let spec = spec.clone();
        tokio::spawn(async move {
            let lease = redis.acquire(&spec).await.unwrap();
            (Instant::now(), lease)
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let released = Instant::now();
    a.release().await.unwrap();
    let (taken, b) = within(Duration::from_secs(2), "the waiter", waiter)
        .await
        .unwrap();
    let gap = taken - released;
    assert!(gap < Duration::from_millis(100), "hand-over took {gap:?}");
    b.release().await.unwrap();
}

/// `CLIENT KILL` of every connection is brief trouble, not loss: the connections are replaced,
/// the lease lives on, and tracking follows its key again (a later `DEL` is still noticed at
/// once).
#[tokio::test]
async fn killed_connections_are_replaced_and_the_lease_lives_on() {
    let (server, redis) = set_up().await;
    let lease = redis.acquire(&leader("jobs/killed")).await.unwrap();
    for _ in 0..3 {
        assert!(server.kill_clients().await >= 1);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(lease.is_held());
        lease.check().await.unwrap();
    }
    within(Duration::from_secs(5), "the connections back", async {
        while server.clients().await < 1 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let deleted = Instant::now();
    server.del("lease:{jobs/killed}").await;
    deleted_within(&lease, deleted, Duration::from_millis(500)).await;
}

/// A server restarted without persistence has lost every lease: the holder learns it as soon
/// as its connection is back, and the next acquisition's token is higher (it follows the
/// server's clock).
#[tokio::test]
async fn a_restarted_server_loses_its_leases_and_tokens_still_rise() {
    let (mut server, redis) = set_up().await;
    let lease = redis.acquire(&leader("jobs/restart")).await.unwrap();
    server.restart().await;
    let reason = within(Duration::from_secs(5), "the loss", lease.lost()).await;
    assert_eq!(reason, LostReason::KeyDeleted);
    let next = within(
        Duration::from_secs(5),
        "an acquisition after the restart",
        redis.acquire(&leader("jobs/restart")),
    )
    .await
    .unwrap();
    assert!(next.sequencer().index() > lease.sequencer().index());
    next.release().await.unwrap();
}

/// A holder cut off from the server (every byte held by a proxy) self-fences before its key
/// expires on the server, and the server is reported unreachable meanwhile; when the link
/// heals, a waiter elsewhere has the name.
#[tokio::test]
async fn a_partitioned_holder_self_fences_before_its_key_expires() {
    let (server, direct) = set_up().await;
    let proxy = Proxy::start(server.addr()).await.unwrap();
    let redis = Redis::new(&format!("redis://{}", proxy.addr())).unwrap();
    let spec = leader("jobs/partitioned");
    let lease = redis.acquire(&spec).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    proxy.set_blackhole(true);
    let cut = Instant::now();
    let reason = within(Duration::from_secs(15), "the self-fence", lease.lost()).await;
    assert!(reason.is_self_fenced(), "{reason:?}");
    assert!(cut.elapsed() < spec.session_ttl(), "{:?}", cut.elapsed());
    let pttl: i64 = server
        .cmd(redis::cmd("PTTL").arg("lease:{jobs/partitioned}"))
        .await;
    assert!(pttl > 0, "the key expired before the holder fenced itself");
    assert!(matches!(
        redis.reachability(),
        Reachability::Unreachable { .. }
    ));
    let other = within(
        Duration::from_secs(15),
        "the name elsewhere",
        direct.acquire(&spec),
    )
    .await
    .unwrap();
    proxy.set_blackhole(false);
    within(Duration::from_secs(5), "reachable again", async {
        while redis.reachability() != Reachability::Reachable {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    other.release().await.unwrap();
}

/// A server paused (`SIGSTOP`) past the TTL: the holder self-fences; after the resume the key
/// has expired on the server, and another holder takes it.
#[tokio::test]
async fn a_server_paused_past_the_ttl_fences_the_holder() {
    let (server, redis) = set_up().await;
    let spec = leader("jobs/paused");
    let lease = redis.acquire(&spec).await.unwrap();
    server.pause();
    let reason = within(Duration::from_secs(15), "the self-fence", lease.lost()).await;
    assert!(reason.is_self_fenced(), "{reason:?}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    server.resume();
    let next = within(
        Duration::from_secs(10),
        "the name after the resume",
        redis.acquire(&spec),
    )
    .await
    .unwrap();
    assert!(next.sequencer().index() > lease.sequencer().index());
    next.release().await.unwrap();
}

/// Tokens rise with every acquisition, even after every key of the name was removed.
#[tokio::test]
async fn tokens_rise_after_a_purge() {
    let (_server, redis) = set_up().await;
    let first = redis.acquire(&leader("jobs/purged")).await.unwrap();
    let token = first.sequencer().index();
    first.release().await.unwrap();
    assert!(redis.purge("jobs/purged").await.unwrap() > 0);
    let second = redis.acquire(&leader("jobs/purged")).await.unwrap();
    assert!(second.sequencer().index() > token);
    second.release().await.unwrap();
}

/// A name with `}` would split its keys' hash tag: refused. A busy name answers at once with
/// `Wait::Never`, and after its wait with `Wait::UpTo`.
#[tokio::test]
async fn bad_names_are_refused_and_busy_answers_in_time() {
    let (_server, redis) = set_up().await;
    let refused = redis.acquire(&leader("jobs/a}b")).await;
    assert!(
        matches!(refused, Err(Error::InvalidKey { .. })),
        "{refused:?}"
    );
    let held = redis.acquire(&leader("jobs/busy")).await.unwrap();
    let started = Instant::now();
    let busy = redis.acquire(&leader("jobs/busy").wait(Wait::Never)).await;
    assert!(busy.unwrap_err().is_busy());
    assert!(started.elapsed() < Duration::from_millis(200));
    let started = Instant::now();
    let busy = redis
        .acquire(&leader("jobs/busy").wait(Wait::UpTo(Duration::from_millis(500))))
        .await;
    assert!(busy.unwrap_err().is_busy());
    assert!(started.elapsed() >= Duration::from_millis(500));
    held.release().await.unwrap();
}

/// A server that is not there: an acquisition gives up with `Unreachable`, naming the address.
#[tokio::test]
async fn an_absent_server_is_unreachable() {
    lease_tests::init_tracing();
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let redis = Redis::new(&format!("redis://127.0.0.1:{port}")).unwrap();
    let answer = within(
        Duration::from_secs(15),
        "the acquisition to give up",
        redis.acquire(&leader("jobs/nowhere").wait(Wait::Never)),
    )
    .await;
    match answer {
        Err(Error::Unreachable { address, .. }) => assert!(address.contains(&port.to_string())),
        other => panic!("{other:?}"),
    }
}

/// Many leases and waiters of one handle share its two connections, and everything is given
/// back on shutdown.
#[tokio::test]
async fn a_thousand_leases_and_waiters_on_two_connections() {
    let (server, redis) = set_up().await;
    let started = Instant::now();
    let leases = futures_join((0..1_000).map(|i| {
        let redis = redis.clone();
        async move { redis.acquire(&leader(&format!("many/{i}"))).await.unwrap() }
    }))
    .await;
    let acquired_in = started.elapsed();
    let mut waiters = Vec::new();
    for i in 0..50 {
        let redis = redis.clone();
        waiters.push(tokio::spawn(async move {
            redis.acquire(&leader(&format!("many/{i}"))).await
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(redis.held(), 1_000);
    assert!(
        redis.open_connections() <= 2,
        "{}",
        redis.open_connections()
    );
    assert!(server.clients().await <= 2);
    eprintln!("1,000 acquisitions in {acquired_in:?}");
    drop(leases);
    for waiter in waiters {
        let lease = within(Duration::from_secs(10), "every waiter", waiter)
            .await
            .unwrap()
            .unwrap();
        drop(lease);
    }
    within(Duration::from_secs(10), "shutdown", redis.shutdown()).await;
    let keys: u64 = server.cmd(&redis::cmd("DBSIZE")).await;
    let left: Vec<String> = server.cmd(redis::cmd("KEYS").arg("lease:{many/*}")).await;
    let holders = left.iter().filter(|k| k.ends_with('}')).count();
    assert_eq!(holders, 0, "{keys} keys left: {left:?}");
}

/// Runs every future at once and collects their outputs in order.
async fn futures_join<F: std::future::Future + Send + 'static>(
    futures: impl Iterator<Item = F>,
) -> Vec<F::Output>
where
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futures.map(tokio::spawn).collect();
    let mut out = Vec::with_capacity(handles.len());
    for handle in handles {
        out.push(handle.await.unwrap());
    }
    out
}

/// A semaphore holder whose own key an operator deletes loses its slot within milliseconds (its
/// key is followed by tracking as a leader key is), and only that holder.
#[tokio::test]
async fn a_semaphore_holder_whose_key_is_deleted_loses_within_milliseconds() {
    let (server, redis) = set_up().await;
    let spec = LeaseSpec::semaphore("jobs/slots", 3).ttl(Duration::from_secs(10));
    let a = redis.acquire(&spec).await.unwrap();
    let b = redis.acquire(&spec).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let key = format!("lease:{{jobs/slots}}:s:{}", a.sequencer().holder());
    let deleted = Instant::now();
    assert_eq!(server.del(&key).await, 1);
    deleted_within(&a, deleted, Duration::from_millis(200)).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(b.is_held());
    b.check().await.unwrap();
    b.release().await.unwrap();
}

/// `rediss://` speaks TLS with rustls, as the other backends configure it: a server whose
/// certificate a CA of `RedisBuilder::ca_cert` signed is trusted, its name checked; without the
/// CA the handshake is refused with a configuration error that names TLS, not retried as an
/// outage.
#[tokio::test]
async fn rediss_urls_speak_tls_and_verify_the_certificate() {
    lease_tests::init_tracing();
    let server = Server::tls().await;
    let url = format!("rediss://localhost:{}", server.port());
    let redis = Redis::builder()
        .url(&url)
        .ca_cert(server.ca().unwrap())
        .build()
        .unwrap();
    let lease = redis.acquire(&leader("jobs/tls")).await.unwrap();
    lease.check().await.unwrap();
    lease.release().await.unwrap();
    redis.shutdown().await;

    let untrusted = Redis::new(&url).unwrap();
    let refused = within(
        Duration::from_secs(10),
        "the refusal",
        untrusted.acquire(&leader("jobs/tls").wait(Wait::Never)),
    )
    .await;
    match refused {
        Err(Error::Config { message, .. }) => assert!(message.contains("TLS"), "{message}"),
        other => panic!("{other:?}"),
    }
}
