//! The PostgreSQL lease backend (`lease_postgres::Postgres`) against a real server, beyond the
//! conformance suite: many leases on a small connection budget, a row deleted under its holder,
//! a holder's connections terminated by the server, a partitioned holder's self-fence, a
//! hand-over on release, and a dropped handle's connections closing.
//!
//! Each test has a database of its own (`lease_tests::postgres::TestDb`); PostgreSQL must run
//! on 127.0.0.1:5432 (or `LEASE_TEST_POSTGRES_URL`), see `lease_tests::postgres`.
//!
//! Run: `cargo test -p lease-tests --test postgres_lease`

use std::sync::Arc;
use std::time::Duration;

use lease_conformance::support::within;
use lease_core::backend::Reachability;
use lease_core::{Backend, Error, LeaseSpec, LostReason, Wait};
use lease_postgres::Postgres;
use lease_tests::postgres::TestDb;
use tokio_postgres::Client;

/// A backend on `db` whose connections are named `app`, so they can be counted and terminated.
fn backend(db: &TestDb, app: &str) -> Postgres {
    Postgres::builder()
        .url(db.url())
        .application_name(app)
        .build()
        .unwrap()
}

/// A test's database, a connection of its own to it, and a backend on it whose sessions are
/// named `lease-<test>` (returned, for [`sessions`]).
async fn set_up(test: &str) -> (TestDb, Client, Postgres, String) {
    lease_tests::init_tracing();
    let db = TestDb::create(test).await;
    let admin = db.connect().await;
    let app = format!("lease-{test}");
    let postgres = backend(&db, &app);
    (db, admin, postgres, app)
}

/// How many sessions named `app` are connected to `db`.
async fn sessions(admin: &Client, db: &TestDb, app: &str) -> i64 {
    admin
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND application_name = $2",
            &[&db.name(), &app],
        )
        .await
        .unwrap()
        .get(0)
}

/// Waits (10 s at most, counting every 20 ms) until the number of sessions named `app` on `db`
/// is `wanted`.
async fn sessions_until(
    admin: &Client,
    db: &TestDb,
    app: &str,
    what: &str,
    wanted: impl Fn(i64) -> bool,
) {
    within(Duration::from_secs(10), what, async {
        while !wanted(sessions(admin, db, app).await) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
}

/// Waits (bounded, polling the table every 20 ms) until every row of `holders` expires later
/// than `after` (the database's clock) plus `ttl`: each was renewed after `after`.
async fn renewed_after(admin: &Client, holders: &[String], after: f64, ttl: Duration) {
    within(Duration::from_secs(30), "every row to be renewed", async {
        loop {
            let row = admin
                .query_one(
                    "SELECT count(*) FROM lease.leases WHERE holder = ANY($1) \
                     AND extract(epoch FROM expires_at)::float8 > $2::float8",
                    &[&holders, &(after + ttl.as_secs_f64())],
                )
                .await
                .unwrap();
            if row.get::<_, i64>(0) == i64::try_from(holders.len()).unwrap() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
}

/// An operator's `DELETE` of `lease`'s row, and its loss (`KeyDeleted`, within 5 s) that
/// follows; the holder whose row it was.
async fn delete_row_and_lose(admin: &Client, lease: &lease_core::Lease) -> String {
    let holder = lease.sequencer().holder().to_owned();
    let deleted = admin
        .execute("DELETE FROM lease.leases WHERE holder = $1", &[&holder])
        .await
        .unwrap();
    assert_eq!(deleted, 1, "the row of {holder} was there");
    let reason = within(Duration::from_secs(5), "the loss", lease.lost()).await;
    assert_eq!(reason, LostReason::KeyDeleted);
    holder
}

/// Whether the bar a deletion put on `holder`'s key (or slot) is gone.
async fn bar_ended(admin: &Client, holder: &str) -> bool {
    admin
        .query_one(
            "SELECT NOT EXISTS (SELECT 1 FROM lease.bars WHERE holder = $1)",
            &[&holder],
        )
        .await
        .unwrap()
        .get(0)
}

/// The database's clock, in seconds since the epoch.
async fn db_now(admin: &Client) -> f64 {
    admin
        .query_one("SELECT extract(epoch FROM clock_timestamp())::float8", &[])
        .await
        .unwrap()
        .get(0)
}

/// One process holds 1,000 leader leases on 3 connections (2 for work, 1 listening), and keeps
/// them through a renewal of all of them; waiting costs no connection either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_leases_on_three_connections() {
    let (db, admin, postgres, app) = set_up("thousand").await;
    let ttl = Duration::from_secs(10);
    let started = std::time::Instant::now();
    let mut acquiring = tokio::task::JoinSet::new();
    for n in 0..1_000 {
        let postgres = postgres.clone();
        acquiring.spawn(async move {
            postgres
                .acquire(&LeaseSpec::leader(format!("many/{n}")).ttl(ttl))
                .await
        });
    }
    let mut leases = Vec::new();
    within(Duration::from_secs(40), "1,000 acquisitions", async {
        while let Some(acquired) = acquiring.join_next().await {
            leases.push(acquired.unwrap().unwrap());
        }
    })
    .await;
    eprintln!("1,000 leases acquired in {:?}", started.elapsed());
    // A hundred waiters on held keys: no connection of their own either.
    let mut waiting = tokio::task::JoinSet::new();
    for n in 0..100 {
        let postgres = postgres.clone();
        waiting.spawn(async move {
            postgres
                .acquire(&LeaseSpec::leader(format!("many/{n}")).ttl(ttl))
                .await
        });
    }
    let holders: Vec<String> = leases
        .iter()
        .map(|l| l.sequencer().holder().to_owned())
        .collect();
    let acquired_by = db_now(&admin).await;
    renewed_after(&admin, &holders, acquired_by, ttl).await;
    assert!(leases.iter().all(|l| l.is_held()));
    let connected = sessions(&admin, &db, &app).await;
    eprintln!("renewed, on {connected} connections");
    assert!(
        connected <= 3,
        "{connected} sessions for 1,000 leases and 100 waiters; the budget is 2 + 1 listening"
    );
    waiting.abort_all();
    postgres.shutdown().await;
    assert!(leases.iter().all(|l| !l.is_held()));
    let left: i64 = admin
        .query_one("SELECT count(*) FROM lease.leases", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(left, 0, "shutdown released every lease");
}

/// A holder whose row is deleted behind its back (an operator's DELETE) loses the lease at once,
/// told by the notification, not by its next renewal; and a waiter does not get it before the
/// holder's settle time (the key is barred).
#[tokio::test]
async fn a_holder_whose_row_is_deleted_loses_at_once() {
    let (_db, admin, postgres, _) = set_up("deleted").await;
    // A TTL of a minute: a loss noticed by the renewal would take 20 s.
    let spec = LeaseSpec::leader("jobs/deleted")
        .ttl(Duration::from_secs(60))
        .lock_delay(Duration::ZERO)
        .settle(Duration::from_secs(1));
    let lease = postgres.acquire(&spec).await.unwrap();
    let waiter = {
        let (postgres, spec) = (postgres.clone(), spec.clone());
        tokio::spawn(async move { postgres.acquire(&spec).await })
    };
    let holder = delete_row_and_lose(&admin, &lease).await;
    let barred: i64 = admin
        .query_one(
            "SELECT count(*) FROM lease.bars WHERE holder = $1 AND until > now()",
            &[&holder],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(barred, 1, "the key is barred for the holder's settle time");
    let next = within(Duration::from_secs(10), "the waiter", waiter)
        .await
        .unwrap()
        .unwrap();
    assert!(next.sequencer().index() > lease.sequencer().index());
    // The bar had ended when the waiter got in.
    assert!(bar_ended(&admin, &holder).await);
    next.release().await.unwrap();
}

/// The server terminates every connection of the holder's backend (`pg_terminate_backend`):
/// brief trouble, not loss. The backend connects again, keeps renewing the lease past the
/// deadline its old connections would have fenced it at, and listens again (a row deleted
/// afterwards is a loss at once).
#[tokio::test]
async fn terminated_connections_are_replaced_and_the_lease_lives_on() {
    let (db, admin, postgres, app) = set_up("terminated").await;
    let ttl = Duration::from_secs(10);
    let lease = postgres
        .acquire(&LeaseSpec::leader("jobs/terminated").ttl(ttl))
        .await
        .unwrap();
    // The listening connection is up once an observation sees the holder.
    let observer = postgres.observe_leader("jobs/terminated").await.unwrap();
    assert!(observer.leader().is_some());
    let terminated: i64 = admin
        .query_one(
            "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = $1 AND application_name = $2) t",
            &[&db.name(), &app],
        )
        .await
        .unwrap()
        .get(0);
    assert!(terminated >= 2, "{terminated} sessions terminated");
    let at = db_now(&admin).await;
    let holder = lease.sequencer().holder().to_owned();
    renewed_after(&admin, std::slice::from_ref(&holder), at, ttl).await;
    assert!(lease.is_held());
    lease.check().await.unwrap();
    // Renewed over a new connection; now a deletion must be heard on a new listening one.
    sessions_until(&admin, &db, &app, "listening again", |n| n >= 2).await;
    delete_row_and_lose(&admin, &lease).await;
    // And the client goes on: a new acquisition.
    let again = postgres
        .acquire(
            &LeaseSpec::leader("jobs/terminated-2")
                .ttl(ttl)
                .wait(Wait::Never),
        )
        .await
        .unwrap();
    again.release().await.unwrap();
}

/// Dropping every clone of a handle, its leases released and its observer dropped, closes its
/// connections (the work ones and the listening one) at once: its background tasks (attempts,
/// renewals, releases, listening) wait without keeping the handle, and its last clone going
/// wakes them to end. They used to keep it, and so its connections, for up to 30 s.
#[tokio::test]
async fn dropping_every_handle_closes_its_connections() {
    let (db, admin, postgres, app) = set_up("dropped").await;
    let clone = postgres.clone();
    let ttl = Duration::from_secs(10);
    // Every background task at work: an attempt, a renewal, a release, and the listening
    // connection (up once an observation sees the holder).
    let lease = clone
        .acquire(&LeaseSpec::leader("jobs/dropped").ttl(ttl))
        .await
        .unwrap();
    let observer = postgres.observe_leader("jobs/dropped").await.unwrap();
    assert!(observer.leader().is_some());
    let at = db_now(&admin).await;
    let holder = lease.sequencer().holder().to_owned();
    renewed_after(&admin, std::slice::from_ref(&holder), at, ttl).await;
    sessions_until(&admin, &db, &app, "the listening connection", |n| n >= 2).await;
    lease.release().await.unwrap();
    drop((observer, clone, postgres));
    let dropped = std::time::Instant::now();
    // Far below the 30 s the tasks used to keep the handle for.
    sessions_until(
        &admin,
        &db,
        &app,
        "every session of the handle to end",
        |n| n == 0,
    )
    .await;
    eprintln!(
        "sessions ended {:?} after the last handle",
        dropped.elapsed()
    );
}

/// A holder cut off from the database (a proxy that holds every byte) self-fences before its
/// row expires: by the time it is lost, the database still holds the row, so nobody else could
/// have had the lease yet.
#[tokio::test]
async fn a_partitioned_holder_self_fences_before_its_row_expires() {
    lease_tests::init_tracing();
    let db = TestDb::create("partitioned").await;
    let admin = db.connect().await;
    let config: tokio_postgres::Config = db.url().parse().unwrap();
    let host = match &config.get_hosts()[0] {
        tokio_postgres::config::Host::Tcp(host) => host.clone(),
        other => panic!("the tests' server must be reached over TCP, not {other:?}"),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let upstream = tokio::net::lookup_host((host.as_str(), port))
        .await
        .unwrap()
        .next()
        .unwrap();
    let proxy = lease_tests::proxy::Proxy::start(upstream).await.unwrap();
    let proxied = db
        .url()
        .replacen(&format!("{host}:{port}"), &proxy.addr().to_string(), 1);
    assert_ne!(proxied, db.url(), "the URL names {host}:{port}");
    let postgres = Postgres::builder()
        .url(proxied)
        .application_name("lease-partitioned")
        .build()
        .unwrap();
    let ttl = Duration::from_secs(10);
    let lease = postgres
        .acquire(&LeaseSpec::leader("jobs/partitioned").ttl(ttl))
        .await
        .unwrap();
    proxy.set_blackhole(true);
    let reason = within(ttl * 2, "the self-fence", lease.lost()).await;
    assert!(
        matches!(reason, LostReason::SelfFenced { .. }),
        "lost with {reason:?}"
    );
    let live: bool = admin
        .query_one(
            "SELECT expires_at > clock_timestamp() FROM lease.leases WHERE holder = $1",
            &[&lease.sequencer().holder()],
        )
        .await
        .unwrap()
        .get(0);
    assert!(live, "the row expired before the holder fenced itself");
    assert!(
        matches!(postgres.reachability(), Reachability::Unreachable { .. }),
        "{:?}",
        postgres.reachability()
    );
    proxy.set_blackhole(false);
    drop(lease);
    postgres.shutdown().await;
}

/// A release hands the key to a waiter at once (a notification), long before the holder's row
/// would have expired (a TTL of a minute here); `Wait::Never` and `Wait::UpTo` answer `Busy`
/// meanwhile.
#[tokio::test]
async fn a_release_hands_over_without_waiting_for_expiry() {
    lease_tests::init_tracing();
    let db = TestDb::create("handover").await;
    let a = backend(&db, "lease-handover-a");
    let b = backend(&db, "lease-handover-b");
    let spec = LeaseSpec::leader("jobs/handover").ttl(Duration::from_secs(60));
    let first = a.acquire(&spec).await.unwrap();
    let first_sequencer = first.sequencer().clone();
    let busy = b.acquire(&spec.clone().wait(Wait::Never)).await;
    assert!(matches!(busy, Err(Error::Busy { .. })), "{busy:?}");
    let waiter = {
        let (b, spec) = (b.clone(), spec.clone());
        tokio::spawn(async move { b.acquire(&spec).await })
    };
    let observer = Arc::new(b.observe_leader("jobs/handover").await.unwrap());
    assert_eq!(
        observer.leader().map(|l| l.sequencer),
        Some(first_sequencer.clone())
    );
    first.release().await.unwrap();
    let second = within(Duration::from_secs(5), "the hand-over", waiter)
        .await
        .unwrap()
        .unwrap();
    assert!(second.sequencer().index() > first_sequencer.index());
    assert!(matches!(
        b.check_sequencer(&first_sequencer).await,
        Err(Error::Lost(_))
    ));
    b.check_sequencer(second.sequencer()).await.unwrap();
    second.release().await.unwrap();
}

/// Acquisitions dropped right after their attempt was sent leave no row behind (the attempt may
/// have inserted it: it is given back in the background), in a schema of the application's
/// choosing, with a semaphore's holders untouched.
#[tokio::test]
async fn cancelled_acquisitions_leave_nothing_in_another_schema() {
    lease_tests::init_tracing();
    let db = TestDb::create("cancelled").await;
    let admin = db.connect().await;
    let postgres = Postgres::builder()
        .url(db.url())
        .schema("app_leases")
        .build()
        .unwrap();
    let spec = LeaseSpec::semaphore("jobs/reports", 5);
    let held = [
        postgres.acquire(&spec).await.unwrap(),
        postgres.acquire(&spec).await.unwrap(),
    ];
    for _ in 0..20 {
        let acquiring = postgres.acquire(&spec);
        // One poll: far enough to send the attempt, then dropped.
        tokio::select! {
            biased;
            _ = acquiring => {}
            () = std::future::ready(()) => {}
        }
    }
    let count = || async {
        let rows: i64 = admin
            .query_one("SELECT count(*) FROM app_leases.leases", &[])
            .await
            .unwrap()
            .get(0);
        rows
    };
    within(Duration::from_secs(10), "the cancelled rows to go", async {
        while count().await != 2 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    for lease in &held {
        assert!(lease.is_held());
        lease.check().await.unwrap();
    }
    let in_default: bool = admin
        .query_one("SELECT to_regclass('lease.leases') IS NULL", &[])
        .await
        .unwrap()
        .get(0);
    assert!(in_default, "nothing was installed in the default schema");
    postgres.shutdown().await;
    assert_eq!(count().await, 0);
}

/// An acquire dropped while its attempt waits on the key's lock (the statement has yet to insert
/// the row), then `shutdown` and the runtime gone, as a process does at SIGTERM: `shutdown`
/// returns only once the row the statement went on to insert is given back, so nothing is left.
/// (The chaos run's leak in CI: a waiter woken by the holder's release at SIGTERM sent its
/// attempt, was dropped, and its give-back, started only after `shutdown` had returned, died
/// with the process.)
#[tokio::test]
async fn shutdown_waits_for_the_row_of_an_acquire_dropped_while_its_attempt_was_blocked() {
    let (db, admin, postgres, app) = set_up("dropped_blocked").await;
    const KEY: &str = "jobs/blocked";
    // The key's advisory lock as `lease.try_acquire` takes it, held by an open transaction.
    let mut blocking = db.connect().await;
    let blocker = blocking.transaction().await.unwrap();
    blocker
        .execute(
            "SELECT pg_advisory_xact_lock(1818584421, hashtext($1))",
            &[&KEY],
        )
        .await
        .unwrap();
    let (drop_now, dropped) = tokio::sync::oneshot::channel::<()>();
    let (shutting_down, shutdown_began) = tokio::sync::oneshot::channel::<()>();
    let (gone, process_gone) = tokio::sync::oneshot::channel::<()>();
    // The process: a runtime of its own, which every task of the backend runs on, dropped once
    // `shutdown` returns.
    let process = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            // Both connections opened (their tasks on this runtime), so the attempt and a
            // release go on different ones.
            for _ in 0..2 {
                let warm_up = postgres.acquire(&LeaseSpec::leader("jobs/warm-up")).await;
                warm_up.unwrap().release().await.unwrap();
            }
            let spec = LeaseSpec::leader(KEY);
            tokio::select! {
                acquired = postgres.acquire(&spec) => {
                    panic!("acquired past the key's lock: {acquired:?}")
                }
                _ = dropped => {}
            }
            let _ = shutting_down.send(());
            postgres.shutdown().await;
        });
        drop(runtime);
        let _ = gone.send(());
    });
    within(
        Duration::from_secs(10),
        "the attempt to wait on the key's lock",
        async {
            loop {
                let waiting: i64 = admin
                    .query_one(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 \
                     AND application_name = $2 AND wait_event_type = 'Lock'",
                        &[&db.name(), &app],
                    )
                    .await
                    .unwrap()
                    .get(0);
                if waiting > 0 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        },
    )
    .await;
    drop_now.send(()).unwrap();
    shutdown_began.await.unwrap();
    // Had the give-back gone at once, it would have found nothing (the row is still to be
    // inserted) and `shutdown` would have returned, the process gone before the row is
    // inserted: the lock is let go once it is gone, or after a second (the give-back rightly
    // waiting for the answer, which comes after the lock).
    let _ = tokio::time::timeout(Duration::from_secs(1), process_gone).await;
    blocker.commit().await.unwrap();
    tokio::task::spawn_blocking(move || process.join())
        .await
        .unwrap()
        .unwrap();
    // Its connections closed, the statement it sent has ended.
    sessions_until(&admin, &db, &app, "the process's sessions to close", |n| {
        n == 0
    })
    .await;
    let rows = lease_tests::postgres::lease_rows(&admin, KEY)
        .await
        .unwrap();
    assert!(rows.is_empty(), "left behind: {rows:?}");
}

/// A semaphore holder whose row is deleted loses its slot at once; the slot stays barred for its
/// settle time, then goes to a waiter, while the other holder keeps its own throughout.
#[tokio::test]
async fn a_deleted_semaphore_holder_loses_its_slot_and_the_slot_is_barred_for_its_settle_time() {
    let (_db, admin, postgres, _) = set_up("semaphore").await;
    let spec = LeaseSpec::semaphore("jobs/reports", 2)
        .ttl(Duration::from_secs(60))
        .lock_delay(Duration::ZERO)
        .settle(Duration::from_secs(1));
    let a = postgres.acquire(&spec).await.unwrap();
    let b = postgres.acquire(&spec).await.unwrap();
    assert_eq!(
        a.sequencer().key(),
        format!("jobs/reports/{}", a.sequencer().holder())
    );
    let busy = postgres.acquire(&spec.clone().wait(Wait::Never)).await;
    assert!(matches!(busy, Err(Error::Busy { .. })), "{busy:?}");
    let waiter = {
        let (postgres, spec) = (postgres.clone(), spec.clone());
        tokio::spawn(async move { postgres.acquire(&spec).await })
    };
    let holder = delete_row_and_lose(&admin, &a).await;
    assert!(matches!(a.check().await, Err(Error::Lost(_))));
    let c = within(Duration::from_secs(10), "the waiter", waiter)
        .await
        .unwrap()
        .unwrap();
    // The bar goes only with an attempt made at or after its end.
    assert!(
        bar_ended(&admin, &holder).await,
        "the waiter got the slot inside its bar"
    );
    assert!(b.is_held());
    b.check().await.unwrap();
    c.check().await.unwrap();
    b.release().await.unwrap();
    c.release().await.unwrap();
}

/// A runtime that ends while it holds a lease (a `main` that returns without
/// `Backend::shutdown`) gives the lease back from a detached runtime: the next holder gets it at
/// once, not after its TTL of a minute. The same handle, used on a new runtime, starts its
/// background tasks and connections again.
#[test]
fn a_runtime_that_ends_holding_a_lease_gives_it_back() {
    lease_tests::init_tracing();
    let runtime = || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap()
    };
    let first = runtime();
    let db = first.block_on(TestDb::create("abandoned"));
    let postgres = backend(&db, "lease-abandoned");
    let spec = LeaseSpec::leader("jobs/abandoned").ttl(Duration::from_secs(60));
    let lease = first.block_on(postgres.acquire(&spec)).unwrap();
    // The holder task goes with the runtime, the lease handle outlives it.
    drop(first);
    let second = runtime();
    second.block_on(async {
        let next = within(
            Duration::from_secs(10),
            "the lease after the runtime ended",
            postgres.acquire(&spec.clone().wait(Wait::UpTo(Duration::from_secs(5)))),
        )
        .await
        .unwrap();
        assert!(next.sequencer().index() > lease.sequencer().index());
        // Waiting, renewing and releasing work on the new runtime.
        let waiter = {
            let (postgres, spec) = (postgres.clone(), spec.clone());
            tokio::spawn(async move { postgres.acquire(&spec).await })
        };
        next.release().await.unwrap();
        let last = within(Duration::from_secs(5), "the hand-over", waiter)
            .await
            .unwrap()
            .unwrap();
        last.check().await.unwrap();
        postgres.shutdown().await;
        assert!(!last.is_held());
    });
    drop(second);
    drop(db);
}

/// The database refuses connections (`ALTER DATABASE … ALLOW_CONNECTIONS false`: SQLSTATE 55000,
/// "not currently accepting connections") and its sessions are terminated, as a campaign starts.
/// The campaign keeps retrying, and the backend reports itself unreachable: the campaign used to
/// end (`Failed`, on a code it took for permanent) and the backend to report itself reachable
/// (the refusal was an answer), so a cluster stayed leaderless, and ready, for good. A handle
/// that only observes (as a waiting follower, it sends nothing but its listening connection)
/// reports it too, and reachable again once it listens again. Once the database takes
/// connections again, the campaign leads within its retry pause (no row is in the way; a
/// holder's row would add at most one TTL).
#[tokio::test]
async fn a_campaign_rides_out_a_database_that_refuses_connections() {
    use lease_core::leader::{Campaign, CampaignEnd, CampaignState};

    let (db, _admin, postgres, _app) = set_up("refusing").await;
    // The handle has its connections, and the tables are installed.
    postgres
        .acquire(&LeaseSpec::leader("jobs/refusing/first").wait(Wait::Never))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let follower = backend(&db, "lease-refusing-follower");
    let _observer = follower
        .observe_leader("jobs/refusing/first")
        .await
        .unwrap();
    assert_eq!(follower.reachability(), Reachability::Reachable);
    let terminated = db.refuse_connections().await;
    assert!(terminated >= 2, "{terminated} sessions terminated");
    within(
        Duration::from_secs(10),
        "the observing handle to report the database unreachable",
        async {
            while !matches!(follower.reachability(), Reachability::Unreachable { .. }) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        },
    )
    .await;

    let ttl = Duration::from_secs(10);
    let campaign = Campaign::try_new(
        postgres.clone(),
        LeaseSpec::leader("jobs/refusing").ttl(ttl),
    )
    .unwrap();
    let handle = campaign.handle();
    let shutdown = lease_core::CancellationToken::new();
    let running = tokio::spawn(campaign.hold_until(shutdown.clone()));
    let still_running = || {
        let state = handle.state();
        assert!(
            matches!(state, CampaignState::NotStarted | CampaignState::Running),
            "the campaign stopped while the database refused connections: {state:?}"
        );
    };
    within(
        Duration::from_secs(10),
        "the backend to report the database unreachable",
        async {
            while !matches!(postgres.reachability(), Reachability::Unreachable { .. }) {
                still_running();
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        },
    )
    .await;
    // The first failed acquisition the campaign hears of (after the backend's own retries).
    let error = within(
        Duration::from_secs(20),
        "the campaign's first failed acquisition",
        async {
            loop {
                still_running();
                if let Some(error) = handle.last_error() {
                    return error;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        },
    )
    .await;
    assert!(
        error.is_transient() && error.kind() == lease_core::ErrorKind::Unreachable,
        "{error:?}"
    );
    assert!(error.to_string().contains("55000"), "{error}");
    still_running();
    assert!(
        matches!(postgres.reachability(), Reachability::Unreachable { .. }),
        "{:?}",
        postgres.reachability()
    );

    db.accept_connections().await;
    let reopened = tokio::time::Instant::now();
    let bound = ttl + Campaign::DEFAULT_MAX_BACKOFF;
    within(
        bound,
        "a leader once the database took connections",
        async {
            while !handle.is_leader() {
                still_running();
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        },
    )
    .await;
    eprintln!(
        "elected {:?} after the database took connections again",
        reopened.elapsed()
    );
    assert_eq!(postgres.reachability(), Reachability::Reachable);
    within(
        Duration::from_secs(5),
        "the observing handle to listen again",
        async {
            while follower.reachability() != Reachability::Reachable {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        },
    )
    .await;
    shutdown.cancel();
    let ended = within(Duration::from_secs(10), "the step-down", running).await;
    assert!(matches!(ended, Ok(Ok(CampaignEnd::Shutdown))), "{ended:?}");
    postgres.shutdown().await;
    follower.shutdown().await;
}
