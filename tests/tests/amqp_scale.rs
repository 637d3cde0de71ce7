//! AMQP at scale: how many leases one backend holds, and what happens at the broker's
//! `channel_max`, against the real broker.
//!
//! Every held lease keeps one channel (with its consumer on `A[L]`) open, and one connection
//! carries at most the negotiated `channel_max`. Needs RabbitMQ at `LEASE_TEST_AMQP_URL` (default
//! amqp://guest:guest@127.0.0.1:5672/%2f) and `rabbitmqctl` (run as root). Every test uses its
//! own semaphore names and destroys them at the end.
// A failed expectation in a test is a panic by design.
#![allow(clippy::unwrap_used)]

use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lease_amqp::{Amqp, AmqpError};
use lease_core::{Backend, Lease, LeaseSpec, LostReason, Wait};
use lease_tests::amqp::{self as broker, require_broker, unique};
use lease_tests::{init_tracing, release_lost, within};

const T: Duration = Duration::from_secs(30);

/// How many broker operations the tests keep in flight at once.
const CONCURRENCY: usize = 32;

/// Runs `operation` on every item, at most [`CONCURRENCY`] at once; the results in item order.
async fn bounded<T, R, F, Fut>(items: Vec<T>, operation: F) -> Vec<R>
where
    F: Fn(T) -> Fut,
    Fut: Future<Output = R> + Send + 'static,
    R: Send + 'static,
{
    let limit = Arc::new(tokio::sync::Semaphore::new(CONCURRENCY));
    let mut tasks = tokio::task::JoinSet::new();
    for (index, item) in items.into_iter().enumerate() {
        let permit = Arc::clone(&limit).acquire_owned().await.unwrap();
        let running = operation(item);
        tasks.spawn(async move {
            let result = running.await;
            drop(permit);
            (index, result)
        });
    }
    let mut results = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        results.push(joined.unwrap());
    }
    results.sort_by_key(|(index, _)| *index);
    results.into_iter().map(|(_, result)| result).collect()
}

/// Runs a `rabbitmqctl` listing off the runtime's threads.
async fn listing<R: Send + 'static>(list: impl FnOnce() -> R + Send + 'static) -> R {
    tokio::task::spawn_blocking(list).await.unwrap()
}

/// Releases every lease, checking each release succeeds.
async fn release_all(leases: Vec<Lease>) {
    for released in bounded(leases, |lease| lease.release()).await {
        released.unwrap();
    }
}

/// Destroys the semaphores `names` (from a backend of its own) and checks that no queue whose
/// name starts with `prefix` is left.
async fn destroy_all(names: Vec<String>, prefix: String) {
    let (admin, _) = broker::backend();
    let admin = admin.admin();
    let destroyed = bounded(names, |name| {
        let admin = admin.clone();
        async move { admin.destroy(&name).await }
    })
    .await;
    for result in destroyed {
        result.unwrap();
    }
    let left = listing(move || broker::queues(&prefix)).await;
    assert!(left.is_empty(), "queues left after destroy: {left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_leader_leases_on_one_backend_are_held_and_leave_nothing_behind() {
    const LEASES: usize = 2_000;
    init_tracing();
    require_broker().await;
    let prefix = unique("scale");
    let connection_name = unique("scale-conn");
    let amqp = broker::builder(&connection_name).build().unwrap();
    let keys: Vec<String> = (0..LEASES).map(|i| format!("{prefix}/{i}")).collect();

    let started = Instant::now();
    let acquired = within(
        Duration::from_secs(120),
        "2,000 leader leases to be acquired",
        bounded(keys.clone(), |key| {
            let amqp = amqp.clone();
            async move {
                amqp.acquire(&LeaseSpec::leader(key).wait(Wait::Never))
                    .await
            }
        }),
    )
    .await;
    let leases: Vec<Lease> = acquired.into_iter().map(Result::unwrap).collect();
    eprintln!("acquired {LEASES} leader leases in {:?}", started.elapsed());
    assert!(leases.iter().all(Lease::is_held));
    let taken: HashSet<&str> = leases.iter().map(|l| l.sequencer().key()).collect();
    assert_eq!(taken.len(), LEASES, "a key was taken twice or not at all");

    // What each lease costs the broker: one channel, two consumers (on A[L] and on its settle
    // queue C[L]), the exclusive holder queue B[L] and C[L]. 2,000 channels fit on one connection
    // (channel_max 2047 less headroom).
    // `rabbitmqctl` lists what answered it in time; on a busy broker a listing can come up short,
    // so it is taken again (a few times) until it is whole.
    let mut attempts = 0;
    let (channels, consumers, queues) = loop {
        let listed = listing({
            let (name, prefix) = (connection_name.clone(), prefix.clone());
            move || {
                (
                    broker::connection_channels(&name),
                    broker::consumers(&prefix),
                    broker::queues(&prefix),
                )
            }
        })
        .await;
        attempts += 1;
        if (listed.1 == 2 * LEASES && listed.2.len() >= 3 * LEASES) || attempts == 5 {
            break listed;
        }
    };
    assert_eq!(channels, vec![LEASES as u64], "channels per connection");
    assert_eq!(consumers, 2 * LEASES);
    let holder_queues = queues.iter().filter(|(q, _)| q.ends_with("-B")).count();
    assert_eq!(holder_queues, LEASES);
    let settle_queues = queues.iter().filter(|(q, _)| q.ends_with("-C")).count();
    assert_eq!(settle_queues, LEASES);

    // Every lease is held as the broker sees it too (a confirmed probe of A[L] and B[L] each).
    let checked = bounded(leases.iter().map(Lease::watcher).collect(), |watcher| {
        let amqp = amqp.clone();
        async move { amqp.check_sequencer(watcher.sequencer()).await }
    })
    .await;
    for check in checked {
        check.unwrap();
    }
    assert!(leases.iter().all(Lease::is_held), "a lease was lost");

    let started = Instant::now();
    release_all(leases).await;
    eprintln!("released {LEASES} leases in {:?}", started.elapsed());
    let (channels, consumers) = listing({
        let (name, prefix) = (connection_name.clone(), prefix.clone());
        move || {
            (
                broker::connection_channels(&name),
                broker::consumers(&prefix),
            )
        }
    })
    .await;
    assert!(
        channels.iter().all(|&c| c == 0),
        "channels left: {channels:?}"
    );
    assert_eq!(consumers, 0);
    destroy_all(keys, format!("{prefix}/")).await;
}

#[tokio::test]
async fn leases_beyond_a_full_connection_go_on_another_and_a_full_pool_refuses_the_next_cleanly() {
    init_tracing();
    require_broker().await;
    // channel_max 20 less the 8 channels kept for acquiring and releasing.
    const PER_CONNECTION: usize = 12;
    let connection_name = unique("limit-conn");
    let amqp = Amqp::builder(broker::url_with_channel_max(20))
        .connection_name(&connection_name)
        .max_connections(2)
        .build()
        .unwrap();
    let name = unique("limit");
    let spec = LeaseSpec::semaphore(&name, 30).wait(Wait::Never);
    let channels = || {
        let name = connection_name.clone();
        listing(move || {
            let mut channels = broker::connection_channels(&name);
            channels.sort_unstable();
            channels
        })
    };

    let mut leases = Vec::new();
    for _ in 0..PER_CONNECTION {
        leases.push(amqp.acquire(&spec).await.unwrap());
    }
    assert_eq!(channels().await, vec![PER_CONNECTION as u64]);
    // The first connection is full: the next lease goes on a second one.
    leases.push(amqp.acquire(&spec).await.unwrap());
    assert_eq!(channels().await, vec![1, PER_CONNECTION as u64]);
    while leases.len() < 2 * PER_CONNECTION {
        leases.push(amqp.acquire(&spec).await.unwrap());
    }
    assert_eq!(
        channels().await,
        vec![PER_CONNECTION as u64, PER_CONNECTION as u64]
    );

    // Both connections allowed are full: the next acquire is refused, saying what to change.
    let refused = amqp.acquire(&spec).await.unwrap_err();
    assert!(
        matches!(
            refused
                .backend_error()
                .and_then(|e| e.downcast_ref::<AmqpError>()),
            Some(AmqpError::ChannelsExhausted {
                connections: 2,
                leases_per_connection: 12,
                channel_max: 20
            })
        ),
        "{refused:?}"
    );
    let message = refused.to_string();
    for needed in [
        "channel_max",
        "rabbitmq.conf",
        "AmqpBuilder::max_connections",
    ] {
        assert!(
            message.contains(needed),
            "{needed:?} missing from: {message}"
        );
    }
    assert!(refused.is_transient());

    // Nothing held was touched: every lease is held, here and on the broker (a check needs a
    // channel too, from the part of the headroom kept for such brief ones).
    assert!(leases.iter().all(Lease::is_held), "a refusal cost a lease");
    for lease in &leases {
        lease.check().await.unwrap();
    }
    let slots: HashSet<u64> = leases.iter().map(|l| l.sequencer().index()).collect();
    assert_eq!(slots.len(), 2 * PER_CONNECTION, "two leases share a slot");

    // A release makes room at once.
    leases.pop().unwrap().release().await.unwrap();
    leases.push(amqp.acquire(&spec).await.unwrap());
    assert!(leases.iter().all(Lease::is_held));

    release_all(leases).await;
    assert_eq!(channels().await, vec![0, 0]);
    destroy_all(vec![name.clone()], format!("{name}-")).await;
}

#[tokio::test]
async fn a_closed_pooled_connection_loses_only_the_leases_on_it() {
    init_tracing();
    require_broker().await;
    const PER_CONNECTION: usize = 12;
    let connection_name = unique("pool-close-conn");
    let amqp = Amqp::builder(broker::url_with_channel_max(20))
        .connection_name(&connection_name)
        .max_connections(2)
        .build()
        .unwrap();
    let name = unique("pool-close");
    let spec = LeaseSpec::semaphore(&name, 30).wait(Wait::Never);
    let mut leases = Vec::new();
    for _ in 0..2 * PER_CONNECTION {
        leases.push(amqp.acquire(&spec).await.unwrap());
    }
    let pids = listing({
        let name = connection_name.clone();
        move || broker::connection_pids(&name)
    })
    .await;
    assert_eq!(pids.len(), 2, "{pids:?}");

    let mut losses = tokio::task::JoinSet::new();
    for (index, lease) in leases.iter().enumerate() {
        let lost = lease.lost();
        losses.spawn(async move { (index, lost.await) });
    }
    let closed = pids[0].clone();
    listing(move || broker::close_connection_pid(&closed)).await;
    let mut lost = HashSet::new();
    while lost.len() < PER_CONNECTION {
        let (index, reason) = within(
            T,
            "the leases on the closed connection to be lost",
            losses.join_next(),
        )
        .await
        .unwrap()
        .unwrap();
        assert_eq!(reason, LostReason::ConnectionClosed);
        lost.insert(index);
    }
    losses.abort_all();

    // The leases on the other connection are untouched, here and on the broker.
    for (index, lease) in leases.iter().enumerate() {
        if !lost.contains(&index) {
            assert!(
                lease.is_held(),
                "lease {index} was lost with another connection"
            );
            lease.check().await.unwrap();
        }
    }
    // The closed connection is replaced for new leases. The slots lost with it settle first
    // (`LeaseSpec::settle`), so these wait for them.
    let again = spec.clone().wait(Wait::UpTo(T));
    for _ in 0..PER_CONNECTION {
        leases.push(amqp.acquire(&again).await.unwrap());
    }
    let mut channels = listing({
        let name = connection_name.clone();
        move || broker::connection_channels(&name)
    })
    .await;
    channels.sort_unstable();
    assert_eq!(channels, vec![PER_CONNECTION as u64, PER_CONNECTION as u64]);

    for (index, lease) in leases.into_iter().enumerate() {
        if lost.contains(&index) {
            release_lost(lease).await;
        } else {
            lease.release().await.unwrap();
        }
    }
    destroy_all(vec![name.clone()], format!("{name}-")).await;
}
