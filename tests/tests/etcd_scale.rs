//! etcd at scale: a thousand leases of one process held on at most two connections to etcd,
//! keep-alive traffic that does not grow with the leases, waiters that cost no connection each,
//! a deleted key that takes exactly its own lease, a cut link that fences every lease by its
//! deadline (and a client that acquires again once the link is back), and a 3-member cluster
//! whose raft leader dies under a hundred leases without losing one.
//!
//! Connections are counted from outside the client: the ESTABLISHED sockets of this process to
//! etcd's client port, as the kernel lists them (`lease_tests::sockets`), sampled while no
//! operator call is in flight; messages by etcd's own `/metrics` (served on a port of its own).
//!
//! Run: `cargo test -p lease-tests --all-features --test etcd_scale` (about 35 s on 2 shared
//! cores: the tests run side by side, the longest holds 1,000 leases for two TTLs). TTLs are
//! 10 s, the shortest a spec accepts.

use std::sync::Arc;
use std::time::Duration;

use lease_core::{Backend, Lease, LeaseSpec, LostReason, Wait};
use lease_etcd::Etcd;
use lease_tests::etcd::{Api, Cluster, READY_WITHIN, Server};
use lease_tests::proxy::Proxy;
use lease_tests::sockets::ConnectionSampler;
use lease_tests::{init_tracing, within};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;

/// The shortest TTL a spec accepts (`lease_core`'s `MIN_TTL`): holding past two of them is the
/// longest wait here.
const TTL: Duration = Duration::from_secs(10);
/// A bound on every wait for an event, far above its usual time on a loaded machine.
const EVENT: Duration = Duration::from_secs(30);
/// The most connections to one etcd endpoint a client may have open at once.
const PER_ENDPOINT: usize = 2;
const SAMPLE_EVERY: Duration = Duration::from_millis(100);

/// `leaders` leader keys `<base>/leader/<i>`, and `slots` slots over semaphores of `limit`
/// (`<base>/sem/<n>`, filled in turn).
fn specs(base: &str, leaders: usize, slots: usize, limit: u32) -> Vec<LeaseSpec> {
    let leader = (0..leaders).map(|i| LeaseSpec::leader(format!("{base}/leader/{i}")));
    let per = limit as usize;
    let slot = (0..slots).map(|i| LeaseSpec::semaphore(format!("{base}/sem/{}", i / per), limit));
    leader
        .chain(slot)
        .map(|s| s.ttl(TTL).wait(Wait::Never))
        .collect()
}

/// Acquires every spec at once; all must succeed (within [`EVENT`]). In the order given.
async fn acquire_all(etcd: &Etcd, specs: Vec<LeaseSpec>) -> Vec<Lease> {
    let n = specs.len();
    let mut acquiring = JoinSet::new();
    for (i, spec) in specs.into_iter().enumerate() {
        let etcd = etcd.clone();
        acquiring.spawn(async move { (i, etcd.acquire(&spec).await) });
    }
    let mut leases: Vec<Option<Lease>> = (0..n).map(|_| None).collect();
    within(EVENT, "every acquisition", async {
        while let Some(joined) = acquiring.join_next().await {
            let (i, acquired) = joined.unwrap();
            leases[i] = Some(acquired.unwrap_or_else(|e| panic!("acquisition {i}: {e}")));
        }
    })
    .await;
    leases.into_iter().map(Option::unwrap).collect()
}

/// The first loss among `leases`, with its lease's index.
async fn first_loss(leases: &[Lease]) -> (usize, LostReason) {
    let mut losses = JoinSet::new();
    for (i, lease) in leases.iter().enumerate() {
        let lost = lease.lost();
        losses.spawn(async move { (i, lost.await) });
    }
    losses.join_next().await.unwrap().unwrap()
}

/// Asserts that no lease among `leases` is lost for `hold`.
async fn assert_none_lost_for(leases: &[Lease], hold: Duration, during: &str) {
    let lost = tokio::time::timeout(hold, first_loss(leases)).await;
    assert!(lost.is_err(), "a lease was lost {during}: {lost:?}");
    assert!(leases.iter().all(Lease::is_held));
}

async fn release_all(leases: impl IntoIterator<Item = Lease>) {
    let mut releasing = JoinSet::new();
    for lease in leases {
        releasing.spawn(lease.release());
    }
    within(EVENT, "every release", async {
        while let Some(released) = releasing.join_next().await {
            released.unwrap().unwrap();
        }
    })
    .await;
}

fn assert_connections(sampler: &ConnectionSampler, ports: &[u16], during: &str) {
    for &port in ports {
        let peak = sampler.peak(port);
        eprintln!(
            "{peak} connections to 127.0.0.1:{port} at most {during} ({} samples)",
            sampler.samples()
        );
        assert!(
            peak <= PER_ENDPOINT,
            "{peak} connections to etcd at 127.0.0.1:{port} at once {during} (at most \
             {PER_ENDPOINT} per endpoint; {} samples)",
            sampler.samples()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_leases_outlive_two_ttls_on_two_connections() {
    init_tracing();
    let server = Server::start().await;
    let etcd = server.backend();
    let port = server.addr().port();
    let sampler = ConnectionSampler::start(&[port], SAMPLE_EVERY);

    // 500 leader keys, and 500 slots over 100 semaphores.
    let leases = acquire_all(&etcd, specs("many", 500, 500, 5)).await;
    // Counted once every hold is up (each begins with one read of its key).
    server.await_watchers(leases.len(), EVENT).await;
    let messages = server.metric_total("grpc_server_msg_received_total").await;
    assert_none_lost_for(&leases, 2 * TTL + Duration::from_secs(1), "while held").await;
    let idle = server.metric_total("grpc_server_msg_received_total").await - messages;
    sampler.stop();
    assert_connections(
        &sampler,
        &[port],
        "while acquiring and holding 1,000 leases",
    );
    // Keep-alives that do not grow with the leases: fewer messages in two TTLs than leases (one
    // keep-alive per lease per TTL/3 would be 1,000 × 21 s / 3.3 s ≈ 6,300).
    eprintln!("etcd received {idle} gRPC messages while 1,000 leases were held for two TTLs");
    assert!(
        idle < leases.len() as f64,
        "etcd received {idle} gRPC messages while 1,000 leases were held for two TTLs"
    );
    release_all(leases).await;
    etcd.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_queued_behind_holders_cost_no_connection_each() {
    init_tracing();
    let server = Server::start().await;
    let etcd = server.backend();
    let port = server.addr().port();
    let (holders, per_holder) = (20, 10);
    let sampler = ConnectionSampler::start(&[port], SAMPLE_EVERY);
    let spec = |k: usize| LeaseSpec::leader(format!("queue/{k}")).ttl(TTL);
    let leases = acquire_all(
        &etcd,
        (0..holders).map(|k| spec(k).wait(Wait::Never)).collect(),
    )
    .await;

    let (acquired_tx, mut acquired) = mpsc::unbounded_channel();
    let mut waiting = JoinSet::new();
    for i in 0..holders * per_holder {
        let (etcd, spec, acquired_tx) = (etcd.clone(), spec(i % holders), acquired_tx.clone());
        waiting.spawn(async move {
            let lease = etcd.acquire(&spec).await.unwrap();
            acquired_tx.send(spec.key().to_owned()).unwrap();
            // Held until the test ends.
            std::future::pending::<()>().await;
            drop(lease);
        });
    }
    // Every waiter is queued once etcd has its key, beside the holders' (etcd's election recipe:
    // a contender queues by writing a key of its own under the name). Counted on etcd's metrics
    // port, so no operator call is on the client port while the connections are sampled.
    let expected = (holders * (per_holder + 1)) as f64;
    within(EVENT, "every waiter to queue", async {
        while server.metric_total("etcd_debugging_mvcc_keys_total").await < expected {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(
        acquired.try_recv().is_err(),
        "a waiter acquired a held lease"
    );

    // Queued, then handed over: one waiter per released name takes it, through the same
    // connections.
    release_all(leases).await;
    let mut took = std::collections::HashSet::new();
    within(EVENT, "a waiter of each released name to acquire", async {
        while took.len() < holders {
            let name = acquired.recv().await.unwrap();
            assert!(took.insert(name.clone()), "two waiters took {name}");
        }
    })
    .await;
    sampler.stop();
    assert_connections(
        &sampler,
        &[port],
        &format!("with {} waiters queued", holders * per_holder),
    );
    waiting.shutdown().await;
    etcd.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_one_key_among_two_hundred_cancels_exactly_that_work() {
    init_tracing();
    let server = Server::start().await;
    let etcd = server.backend();
    // 100 leader keys, and 100 slots over 10 semaphores.
    let leases: Vec<Arc<Lease>> = acquire_all(&etcd, specs("one", 100, 100, 10))
        .await
        .into_iter()
        .map(Arc::new)
        .collect();
    // Every lease guards work that runs until it is cancelled; each reports its end.
    let (ended_tx, mut ended) = mpsc::unbounded_channel();
    let mut works = JoinSet::new();
    for (i, lease) in leases.iter().enumerate() {
        let (lease, ended_tx) = (Arc::clone(lease), ended_tx.clone());
        works.spawn(async move {
            let outcome = lease.run(std::future::pending::<()>()).await;
            ended_tx.send((i, outcome)).unwrap();
        });
    }
    let mut observer = etcd.observe_leader("one/marker").await.unwrap();
    let mut victims = Vec::new();

    // An operator deletes a leader's key, then a slot's.
    for victim in [37, 150] {
        let own = server
            .own_key(leases[victim].sequencer())
            .await
            .unwrap_or_else(|| panic!("no key in etcd for {}", leases[victim].sequencer()));
        assert_eq!(server.post_delete_one(&own).await, 1);
        let (cancelled, outcome) = within(EVENT, "the work to be cancelled", ended.recv())
            .await
            .unwrap();
        assert_eq!(cancelled, victim, "the wrong work was cancelled");
        assert_eq!(outcome, Err(LostReason::KeyDeleted));
        victims.push(victim);

        // Later events, each after the deletion: a marker written after it, seen through the
        // client's watches, and a check of every other lease in etcd. Still no other work ended.
        let marker = format!("after-{victim}");
        let spec = LeaseSpec::leader("one/marker")
            .ttl(TTL)
            .value(marker.clone());
        let marking = etcd.acquire(&spec).await.unwrap();
        within(
            EVENT,
            "the marker",
            observer.wait_for(|l| l.is_some_and(|l| l.value_str() == Some(marker.as_str()))),
        )
        .await
        .unwrap();
        marking.release().await.unwrap();
        for (i, lease) in leases.iter().enumerate() {
            if !victims.contains(&i) {
                etcd.check_sequencer(lease.sequencer())
                    .await
                    .unwrap_or_else(|e| panic!("lease {i} after deleting {own}: {e}"));
                assert!(lease.is_held(), "lease {i} lost after deleting {own}");
            }
        }
        assert!(
            ended.try_recv().is_err(),
            "other work was cancelled after deleting {own}"
        );
    }
    works.shutdown().await;
    let leases = leases
        .into_iter()
        .enumerate()
        .filter(|(i, _)| !victims.contains(i))
        .map(|(_, lease)| Arc::into_inner(lease).unwrap());
    release_all(leases).await;
    etcd.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_link_fences_every_lease_by_its_deadline_and_the_client_acquires_again() {
    init_tracing();
    let server = Server::start().await;
    let proxy = Proxy::start(server.addr()).await.unwrap();
    let etcd = Etcd::builder().endpoints([proxy.url()]).build().unwrap();
    let leases = acquire_all(&etcd, specs("cut", 50, 50, 10)).await;
    let mut losses = JoinSet::new();
    for lease in &leases {
        let lost = lease.lost();
        losses.spawn(lost);
    }

    // Every open connection is reset, and new ones pass no byte: a link that is down.
    proxy.set_blackhole(true);
    proxy.cut_all();
    // Each lease's fence deadline is within its fence interval of the cut (its last
    // confirmation was sent before it); the margin covers a loaded machine's scheduling.
    let by = TTL + Duration::from_secs(5);
    within(by, "every lease to be fenced by its deadline", async {
        while let Some(lost) = losses.join_next().await {
            let reason = lost.unwrap();
            assert!(
                matches!(reason, LostReason::SelfFenced { .. }),
                "lost for another reason while the link was down: {reason}"
            );
        }
    })
    .await;

    // The link is back: the same client acquires the same names again, once etcd has let the
    // old holders' keys go.
    proxy.set_blackhole(false);
    let again: Vec<LeaseSpec> = specs("cut", 50, 50, 10)
        .into_iter()
        .map(|s| s.wait(Wait::UpTo(EVENT)))
        .collect();
    let reacquired = acquire_all(&etcd, again).await;
    for (old, new) in leases.iter().zip(&reacquired) {
        assert!(new.sequencer().index() > old.sequencer().index());
    }
    for lease in leases {
        let _ = lease.release().await;
    }
    release_all(reacquired).await;
    etcd.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_leases_outlive_the_raft_leaders_death() {
    init_tracing();
    let mut cluster = Cluster::start().await;
    let endpoints: Vec<String> = cluster.endpoints().split(',').map(str::to_owned).collect();
    let ports: Vec<u16> = endpoints
        .iter()
        .map(|e| e.rsplit(':').next().unwrap().parse().unwrap())
        .collect();
    let etcd = Etcd::builder().endpoints(endpoints).build().unwrap();
    // Sampled while acquiring and while holding through the election; not while the test asks
    // the members who leads. Checked last, after the losses.
    let acquiring = ConnectionSampler::start(&ports, SAMPLE_EVERY);
    let leases = acquire_all(&etcd, specs("raft", 50, 50, 10)).await;
    acquiring.stop();

    let old = within(READY_WITHIN, "a raft leader", async {
        loop {
            if let Some(i) = cluster.leader().await {
                return i;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    let losses = tokio::spawn({
        let lost: Vec<_> = leases.iter().map(Lease::lost).collect();
        async move {
            let mut losses: JoinSet<_> = lost.into_iter().collect();
            losses.join_next().await.map(Result::unwrap)
        }
    });
    cluster.kill9(old).await;
    let killed = Instant::now();
    let new = within(READY_WITHIN, "a new raft leader", async {
        loop {
            match cluster.leader().await {
                Some(i) if i != old => return i,
                _ => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    })
    .await;
    eprintln!(
        "raft leader m{old} killed; m{new} elected {:?} later; logs {:?}",
        killed.elapsed(),
        cluster.logs()
    );

    // More than a TTL after the election: no lease was lost, and etcd still has every one, so
    // keep-alives reached the new raft leader.
    let holding = ConnectionSampler::start(&ports, SAMPLE_EVERY);
    // The losses task ends only with a loss.
    let lost = tokio::time::timeout(TTL + Duration::from_secs(1), losses).await;
    holding.stop();
    assert!(
        lost.is_err(),
        "a lease was lost to the raft election: {lost:?}"
    );
    assert!(leases.iter().all(Lease::is_held));
    for (i, lease) in leases.iter().enumerate() {
        lease
            .check()
            .await
            .unwrap_or_else(|e| panic!("lease {i} after the election: {e}"));
    }
    assert_connections(&acquiring, &ports, "while acquiring 100 leases");
    assert_connections(
        &holding,
        &ports,
        "while holding 100 leases through the election",
    );

    cluster.restart(old);
    release_all(leases).await;
    etcd.shutdown().await;
    let api = Api::new(
        cluster
            .url(new)
            .trim_start_matches("http://")
            .parse()
            .unwrap(),
        None,
    );
    assert!(api.leases().await.is_empty(), "a lease was left behind");
}
