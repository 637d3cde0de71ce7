//! AMQP leases (the RabbitMQ persistent semaphore, as amqp-locks defines it) against the real broker.
//!
//! Needs RabbitMQ at `LEASE_TEST_AMQP_URL` (default amqp://guest:guest@127.0.0.1:5672/%2f) and
//! `rabbitmqctl` (run as root). Every test uses its own semaphore name and destroys it at the end.
// A failed expectation in a test is a panic by design.
#![allow(clippy::unwrap_used)]

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lease_amqp::{Amqp, AmqpError};
use lease_core::backend::Reachability;
use lease_core::{Backend, Error, Lease, LeaseSpec, LostReason, Wait};
use lease_tests::amqp::{self as broker, backend, require_broker, unique};
use lease_tests::proxy::{Mode, Proxy};
use lease_tests::{init_tracing, within};

const T: Duration = Duration::from_secs(30);

async fn destroy(name: &str) {
    let (admin, _) = backend();
    admin.admin().destroy(name).await.unwrap();
}

/// Spawns `lease.run(pending)`: the guarded work, which only ends when the lease is lost.
fn guarded_work(lease: &Lease) -> tokio::task::JoinHandle<Result<(), LostReason>> {
    let watcher = lease.watcher();
    tokio::spawn(async move { watcher.run(std::future::pending::<()>()).await })
}

#[tokio::test]
async fn eight_contenders_on_three_slots_never_exceed_three_and_all_hold() {
    init_tracing();
    require_broker().await;
    let name = unique("eight-three");
    let holding = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (amqp, _) = backend();
        let (name, holding, most) = (name.clone(), Arc::clone(&holding), Arc::clone(&most));
        tasks.push(tokio::spawn(async move {
            let spec = LeaseSpec::semaphore(name, 3);
            for _ in 0..2 {
                let lease = amqp.acquire(&spec).await.unwrap();
                assert!((1..=3).contains(&lease.sequencer().index()));
                let now = holding.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                assert!(now <= 3, "{now} holders of a 3-slot semaphore");
                // Work that takes a moment, so the others must wait for a slot.
                let work = lease
                    .run(tokio::time::sleep(Duration::from_millis(30)))
                    .await;
                assert_eq!(work, Ok(()));
                holding.fetch_sub(1, Ordering::SeqCst);
                lease.release().await.unwrap();
            }
        }));
    }
    for task in tasks {
        within(
            Duration::from_secs(90),
            "every contender to hold twice",
            task,
        )
        .await
        .unwrap();
    }
    assert!(most.load(Ordering::SeqCst) >= 2, "slots were never shared");
    // Every scan probed the slot and holder queues with publishes; none of them stayed.
    let queues = tokio::task::spawn_blocking({
        let name = name.clone();
        move || broker::queues(&name)
    })
    .await
    .unwrap();
    assert!(
        queues.iter().any(|(q, _)| q.ends_with("-A")),
        "no slot queues listed: {queues:?}"
    );
    assert!(
        queues.iter().all(|(_, messages)| *messages == 0),
        "probes left messages: {queues:?}"
    );
    destroy(&name).await;
    let left = tokio::task::spawn_blocking(move || broker::queues(&name))
        .await
        .unwrap();
    assert!(left.is_empty(), "queues left after destroy: {left:?}");
}

#[tokio::test]
async fn closed_connection_cancels_the_work_and_frees_the_leader_slot() {
    init_tracing();
    require_broker().await;
    let name = unique("closed");
    let (holder, holder_conn) = backend();
    let (waiter, _) = backend();
    let lease = holder.acquire(&LeaseSpec::leader(&name)).await.unwrap();
    let seq = lease.sequencer().clone();
    assert_eq!((seq.key(), seq.index()), (name.as_str(), 1));
    assert!(seq.holder().starts_with(&format!("{name}-1-B#")), "{seq}");
    let work = guarded_work(&lease);
    let spec = LeaseSpec::leader(&name).wait(Wait::UpTo(T));
    let next = tokio::spawn(async move { waiter.acquire(&spec).await });

    tokio::task::spawn_blocking(move || broker::close_connection(&holder_conn))
        .await
        .unwrap();
    let reason = within(T, "the work to be cancelled", work).await.unwrap();
    assert_eq!(reason, Err(LostReason::ConnectionClosed));
    assert!(!lease.is_held());
    assert!(matches!(lease.check().await, Err(Error::Lost(_))));
    let next = within(T, "the waiter to take the slot", next)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(next.sequencer().index(), 1);
    assert_ne!(
        next.sequencer(),
        &seq,
        "the same slot taken again must give a new sequencer"
    );
    next.release().await.unwrap();
    destroy(&name).await;
}

/// RabbitMQ has no lock-delay; the holder's settle queue stands in for it. A slot freed by a
/// dropped connection is not taken before the holder's settle time, measured from the drop, by a
/// waiter or by a process that arrives afterwards; a clean release is taken at once, although the
/// settle time is longer than the test's bound.
#[tokio::test]
async fn a_slot_freed_by_a_dropped_connection_waits_out_the_settle_time_and_a_release_does_not() {
    init_tracing();
    require_broker().await;
    const SETTLE: Duration = Duration::from_secs(2);
    let name = unique("settle");
    let (holder, holder_conn) = backend();
    let (waiter, _) = backend();
    let (latecomer, _) = backend();
    let spec = LeaseSpec::leader(&name).settle(SETTLE).wait(Wait::UpTo(T));
    let lease = holder.acquire(&spec).await.unwrap();
    let work = guarded_work(&lease);
    let next = tokio::spawn({
        let spec = spec.clone();
        async move {
            let lease = waiter.acquire(&spec).await;
            (lease, tokio::time::Instant::now())
        }
    });
    tokio::task::spawn_blocking(move || broker::close_connection(&holder_conn))
        .await
        .unwrap();
    let reason = within(T, "the work to be cancelled", work).await.unwrap();
    assert_eq!(reason, Err(LostReason::ConnectionClosed));
    // The broker dropped the connection a few milliseconds before the holder noticed; the
    // margin below covers that, not the settle time.
    let dropped = tokio::time::Instant::now() - Duration::from_millis(200);
    // Arrives after the loss, never having seen the holder: it waits out the settle time too.
    let late = latecomer
        .acquire(&LeaseSpec::leader(&name).wait(Wait::UpTo(SETTLE / 4)))
        .await;
    assert!(
        matches!(late, Err(Error::Busy { .. })),
        "a newcomer took the slot {:?} after its holder's connection was dropped, within the \
         holder's settle time {SETTLE:?}: {late:?}",
        dropped.elapsed()
    );
    let (next, taken) = within(T, "the waiter to take the slot", next)
        .await
        .unwrap();
    let next = next.unwrap();
    assert!(
        taken - dropped >= SETTLE,
        "the waiter took the slot {:?} after the holder's connection was dropped, before the \
         holder's settle time {SETTLE:?}",
        taken - dropped
    );

    next.release().await.unwrap();

    // A clean release is taken at once, although the releasing holder's settle time is far
    // longer than the test's bound.
    let long = latecomer
        .acquire(&LeaseSpec::leader(&name).settle(Duration::from_secs(60)))
        .await
        .unwrap();
    let (last, _) = backend();
    let after = tokio::spawn({
        let spec = LeaseSpec::leader(&name).wait(Wait::UpTo(T));
        async move { last.acquire(&spec).await }
    });
    long.release().await.unwrap();
    let after = within(T, "the slot to be taken after a clean release", after)
        .await
        .unwrap()
        .unwrap();
    after.release().await.unwrap();
    destroy(&name).await;
    let left = tokio::task::spawn_blocking(move || broker::queues(&name))
        .await
        .unwrap();
    assert!(left.is_empty(), "queues left after destroy: {left:?}");
}

#[tokio::test]
async fn connection_cut_by_a_proxy_cancels_the_work_and_frees_the_slot() {
    init_tracing();
    require_broker().await;
    let name = unique("cut");
    let proxy = Proxy::start(broker::broker_addr()).await.unwrap();
    let via_proxy = Amqp::new(format!("amqp://guest:guest@{}/%2f", proxy.addr())).unwrap();
    assert_eq!(via_proxy.reachability(), Reachability::Unknown);
    let (waiter, _) = backend();
    let lease = via_proxy.acquire(&LeaseSpec::leader(&name)).await.unwrap();
    assert_eq!(via_proxy.reachability(), Reachability::Reachable);
    let work = guarded_work(&lease);
    let spec = LeaseSpec::leader(&name).wait(Wait::UpTo(T));
    let next = tokio::spawn(async move { waiter.acquire(&spec).await });

    proxy.set_mode(Mode::Refuse);
    proxy.cut_all();
    let reason = within(T, "the work to be cancelled", work).await.unwrap();
    assert_eq!(reason, Err(LostReason::ConnectionClosed));
    let next = within(T, "the waiter to take the slot", next)
        .await
        .unwrap()
        .unwrap();
    next.release().await.unwrap();

    // The connection is gone and a new one is refused: unreachable, from the loss on; reachable
    // again once a connection is up (what `lease_tower::health` reports and readiness reads).
    assert!(
        matches!(via_proxy.reachability(), Reachability::Unreachable { .. }),
        "{:?}",
        via_proxy.reachability()
    );
    let refused = via_proxy
        .acquire(&LeaseSpec::leader(&name).wait(Wait::Never))
        .await;
    assert!(refused.is_err(), "{refused:?}");
    assert!(matches!(
        via_proxy.reachability(),
        Reachability::Unreachable { .. }
    ));
    // The broker is back: with nothing else sent, the handle's probe finds it.
    proxy.set_mode(Mode::Forward);
    within(T, "the handle to find the broker again", async {
        while via_proxy.reachability() != Reachability::Reachable {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    let again = via_proxy
        .acquire(&LeaseSpec::leader(&name).wait(Wait::UpTo(T)))
        .await
        .unwrap();
    assert_eq!(via_proxy.reachability(), Reachability::Reachable);
    again.release().await.unwrap();
    destroy(&name).await;
}

#[tokio::test]
async fn blackholed_holder_self_fences() {
    init_tracing();
    require_broker().await;
    let name = unique("blackhole");
    let proxy = Proxy::start(broker::broker_addr()).await.unwrap();
    let via_proxy = Amqp::builder(format!("amqp://guest:guest@{}/%2f", proxy.addr()))
        .heartbeat(Duration::from_secs(2))
        .build()
        .unwrap();
    let lease = via_proxy.acquire(&LeaseSpec::leader(&name)).await.unwrap();
    let work = guarded_work(&lease);
    proxy.set_blackhole(true);
    let reason = within(T, "the holder to self-fence", work).await.unwrap();
    assert!(
        matches!(reason, Err(LostReason::SelfFenced { .. })),
        "{reason:?}"
    );
    proxy.set_blackhole(false);
    drop(proxy);
    destroy(&name).await;
}

#[tokio::test]
async fn removed_slot_is_lost_and_an_added_slot_lets_an_acquirer_in() {
    init_tracing();
    require_broker().await;
    let name = unique("remove-add");
    let (admin_backend, _) = backend();
    let admin = admin_backend.admin();
    admin.create(&name, 2).await.unwrap();
    assert_eq!(admin.slots(&name).await.unwrap(), 2);

    let (a, _) = backend();
    let (b, _) = backend();
    let spec = LeaseSpec::semaphore(&name, 2).wait(Wait::Never);
    let first = a.acquire(&spec).await.unwrap();
    let second = b.acquire(&spec).await.unwrap();
    let (first, second) = if first.sequencer().index() == 2 {
        (second, first)
    } else {
        (first, second)
    };
    assert_eq!(second.sequencer().index(), 2);
    let work = guarded_work(&second);
    let (c, _) = backend();

    assert_eq!(admin.remove(&name, 1).await.unwrap(), 1);
    let reason = within(T, "the holder of slot 2 to lose it", work)
        .await
        .unwrap();
    assert_eq!(reason, Err(LostReason::SlotRemoved));
    assert_eq!(
        second.check().await.err().map(|e| e.to_string()),
        Some(Error::Lost(LostReason::SlotRemoved).to_string())
    );
    first.check().await.unwrap();
    admin
        .wait_for_holder(&name, 2, T)
        .await
        .expect("the holder of a removed slot deletes its holder queue");
    assert!(!admin.has_holder(&name, 2).await.unwrap());
    // The semaphore has one slot now: contenders must say so, and that slot is taken.
    let stale = c.acquire(&spec).await;
    assert!(
        matches!(
            stale,
            Err(Error::LimitMismatch {
                stored: 1,
                requested: 2,
                ..
            })
        ),
        "{stale:?}"
    );
    let one = LeaseSpec::semaphore(&name, 1).wait(Wait::Never);
    assert!(c.acquire(&one).await.unwrap_err().is_busy());

    assert_eq!(admin.add(&name, 1).await.unwrap(), 2);
    let waiting = LeaseSpec::semaphore(&name, 2).wait(Wait::UpTo(T));
    let third = within(T, "an acquirer to take the added slot", c.acquire(&waiting))
        .await
        .unwrap();
    assert_eq!(third.sequencer().index(), 2);
    third.release().await.unwrap();
    first.release().await.unwrap();
    assert_eq!(admin.destroy(&name).await.unwrap(), 2);
    assert_eq!(admin.slots(&name).await.unwrap(), 0);
}

/// The semaphore's slot count is every contender's limit, as on Consul: neither more nor fewer
/// slots are silently used.
#[tokio::test]
async fn asking_for_another_limit_than_the_semaphores_slot_count_is_an_error() {
    init_tracing();
    require_broker().await;
    let name = unique("limit-mismatch");
    let (amqp, _) = backend();
    let held = amqp
        .acquire(&LeaseSpec::semaphore(&name, 2).wait(Wait::Never))
        .await
        .unwrap();
    for requested in [3, 1] {
        let refused = amqp
            .acquire(&LeaseSpec::semaphore(&name, requested).wait(Wait::Never))
            .await;
        match refused {
            Err(Error::LimitMismatch {
                key,
                stored: 2,
                requested: r,
            }) if key == name && r == u64::from(requested) => {}
            other => panic!("asking for {requested} of 2 slots gave {other:?}"),
        }
    }
    // A leader lock is a one-slot semaphore, so on two slots it finds another kind of lock.
    let leader = amqp
        .acquire(&LeaseSpec::leader(&name).wait(Wait::Never))
        .await;
    assert!(
        matches!(&leader, Err(Error::FlagsConflict { key, found: Error::SEMAPHORE_FLAGS, expected: Error::LEADER_FLAGS }) if *key == name),
        "{leader:?}"
    );
    let message = amqp
        .acquire(&LeaseSpec::semaphore(&name, 3))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        message.contains("has limit 2") && message.contains("same limit"),
        "{message}"
    );
    let second = amqp
        .acquire(&LeaseSpec::semaphore(&name, 2).wait(Wait::Never))
        .await
        .unwrap();
    assert_eq!(amqp.admin().slots(&name).await.unwrap(), 2);
    second.release().await.unwrap();
    held.release().await.unwrap();
    destroy(&name).await;
}

#[tokio::test]
async fn simultaneous_acquirers_on_free_slots_all_succeed() {
    init_tracing();
    require_broker().await;
    let name = unique("race");
    const N: u32 = 10;
    // Two acquirers per connection too: a connection's own exclusive queues must not let two of
    // its leases share a slot.
    let backends: Vec<Amqp> = (0..N / 2).map(|_| backend().0).collect();
    let start = Arc::new(tokio::sync::Barrier::new(N as usize));
    let mut tasks = Vec::new();
    for i in 0..N {
        let amqp = backends[(i / 2) as usize].clone();
        let (name, start) = (name.clone(), Arc::clone(&start));
        tasks.push(tokio::spawn(async move {
            start.wait().await;
            amqp.acquire(&LeaseSpec::semaphore(name, N).wait(Wait::Never))
                .await
        }));
    }
    let mut leases = Vec::new();
    for task in tasks {
        let lease = within(T, "every acquirer", task).await.unwrap();
        leases.push(lease.expect("no acquirer fails while slots remain"));
    }
    let slots: HashSet<u64> = leases.iter().map(|l| l.sequencer().index()).collect();
    assert_eq!(slots.len(), N as usize, "two leases share a slot");
    let (extra, _) = backend();
    let busy = extra
        .acquire(&LeaseSpec::semaphore(&name, N).wait(Wait::Never))
        .await;
    assert!(matches!(busy, Err(Error::Busy { .. })), "{busy:?}");
    for lease in leases {
        lease.release().await.unwrap();
    }
    destroy(&name).await;
}

#[tokio::test]
async fn bad_input_gives_typed_errors() {
    init_tracing();
    require_broker().await;
    let spec = LeaseSpec::leader(unique("bad"));

    let nowhere = Amqp::builder("amqp://guest:guest@127.0.0.1:1/%2f")
        .connect_timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let err = nowhere.acquire(&spec).await.unwrap_err();
    assert!(matches!(err, Error::Unreachable { .. }), "{err:?}");
    assert!(
        err.to_string().contains("rabbitmq-server -detached"),
        "{err}"
    );
    // The URL came from the builder: the hint names it, not an environment variable.
    assert!(err.to_string().contains("Amqp::builder"), "{err}");
    assert!(!err.to_string().contains("AMQP_URL"), "{err}");

    let addr = broker::broker_addr();
    let wrong = Amqp::new(format!("amqp://guest:not-the-password@{addr}/%2f")).unwrap();
    let err = wrong.acquire(&spec).await.unwrap_err();
    assert!(matches!(err, Error::PermissionDenied { .. }), "{err:?}");
    assert!(!err.to_string().contains("not-the-password"), "{err}");
    assert!(!format!("{wrong:?}").contains("not-the-password"));

    let (amqp, _) = backend();
    let err = amqp.acquire(&LeaseSpec::leader("")).await.unwrap_err();
    assert!(matches!(err, Error::InvalidKey { .. }), "{err:?}");
    let long = "n".repeat(250);
    let err = amqp.acquire(&LeaseSpec::leader(&long)).await.unwrap_err();
    assert!(matches!(err, Error::InvalidKey { .. }), "{err:?}");
    let err = amqp
        .acquire(&LeaseSpec::semaphore(unique("zero"), 0))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidLimit { .. }), "{err:?}");
    let err = amqp.admin().create(&unique("zero"), 0).await.unwrap_err();
    assert!(matches!(err, Error::InvalidLimit { .. }), "{err:?}");
}

/// A permission error says what to do in RabbitMQ's terms (never a Consul token), and the
/// common URL mistakes are named: a bare `/` path (the empty vhost) hints `%2f`.
#[tokio::test]
async fn permission_errors_say_what_to_do_in_rabbitmq_terms() {
    init_tracing();
    require_broker().await;
    let addr = broker::broker_addr();
    let spec = LeaseSpec::leader(unique("denied"));
    let no_consul = |err: &Error| {
        let text = err.to_string();
        assert!(
            !text.contains("CONSUL") && !text.contains("ETCD"),
            "names another backend's setting: {text}"
        );
        text
    };

    // Access refused on the semaphore's queues: a user without permissions in the vhost.
    let user = tokio::task::spawn_blocking(broker::UnprivilegedUser::create)
        .await
        .unwrap();
    let refused = Amqp::new(user.url()).unwrap();
    let err = refused.acquire(&spec).await.unwrap_err();
    assert!(matches!(err, Error::PermissionDenied { .. }), "{err:?}");
    let text = no_consul(&err);
    assert!(text.contains("rabbitmqctl set_permissions"), "{text}");
    assert!(text.contains("amq.default"), "{text}");
    assert!(!text.contains(&user.password), "{text}");
    tokio::task::spawn_blocking(move || drop(user))
        .await
        .unwrap();

    // A wrong password.
    let wrong = Amqp::new(format!("amqp://guest:not-the-password@{addr}/%2f")).unwrap();
    let err = wrong.acquire(&spec).await.unwrap_err();
    assert!(matches!(err, Error::PermissionDenied { .. }), "{err:?}");
    let text = no_consul(&err);
    assert!(text.contains("user and password"), "{text}");

    // `…:5672/` names the empty vhost, not `/`.
    let empty_vhost = Amqp::new(format!("amqp://guest:guest@{addr}/")).unwrap();
    let err = empty_vhost.acquire(&spec).await.unwrap_err();
    assert!(matches!(err, Error::PermissionDenied { .. }), "{err:?}");
    let text = no_consul(&err);
    assert!(text.contains("%2f"), "{text}");
}

#[tokio::test]
async fn a_queue_declared_with_other_arguments_is_a_typed_error() {
    init_tracing();
    require_broker().await;
    let name = unique("mismatch");
    // Another tool left slot 2 of this semaphore, declared without our arguments.
    let other = lapin::Connection::connect(&broker::url(), lapin::ConnectionProperties::default())
        .await
        .unwrap();
    let channel = other.create_channel().await.unwrap();
    let stray = format!("{name}-2-A");
    let durable = lapin::options::QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    channel
        .queue_declare(stray.as_str().into(), durable, Default::default())
        .await
        .unwrap();

    let (amqp, _) = backend();
    let err = amqp.admin().create(&name, 2).await.unwrap_err();
    match err
        .backend_error()
        .and_then(|e| e.downcast_ref::<AmqpError>())
    {
        Some(AmqpError::QueueMismatch { queue, message }) => {
            assert_eq!(queue, &stray);
            assert!(message.contains("x-max-length"), "{message}");
        }
        _ => panic!("expected QueueMismatch, got {err:?}"),
    }
    assert_eq!(err.kind(), lease_core::ErrorKind::Conflict);
    for queue in [stray, format!("{name}-1-A")] {
        channel
            .queue_delete(queue.as_str().into(), Default::default())
            .await
            .unwrap();
    }
}
