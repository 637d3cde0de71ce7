//! The etcd backend against a real etcd (one per test; see `lease_tests::etcd`): interoperation
//! with `etcdctl elect` both ways, FIFO hand-over, the losses (revoke, delete, partition with the
//! self-fence checked against etcd's own lease TTL), bad input, and nothing left behind.
//!
//! Run: `cargo test -p lease-tests --all-features --test etcd`. The raft-leader fault is in
//! tests/etcd_cluster.rs.

use std::process::Stdio;
use std::time::Duration;

use lease_core::{Backend, Error, LeaseSpec, LostReason, Sequencer, Wait};
use lease_etcd::Etcd;
use lease_tests::etcd::Server;
use lease_tests::proxy::Proxy;
use lease_tests::{assert_refined, within};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout};
use tokio::time::Instant;

/// A bound on every wait for an event.
const EVENT: Duration = Duration::from_secs(10);

fn leader(key: &str) -> LeaseSpec {
    LeaseSpec::leader(key).ttl(Duration::from_secs(10))
}

/// `etcdctl elect <name> <proposal>`, and its output lines.
async fn etcdctl_elect(
    server: &Server,
    name: &str,
    proposal: &str,
) -> (Child, Lines<BufReader<ChildStdout>>) {
    let mut child = server
        .etcdctl()
        .args(["elect", name, proposal])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("etcdctl runs");
    let lines = BufReader::new(child.stdout.take().unwrap()).lines();
    (child, lines)
}

/// Ends `etcdctl elect` the way an operator does (Ctrl-C): it resigns and revokes its lease.
async fn interrupt(mut child: Child) {
    let pid = child.id().expect("etcdctl is running").to_string();
    let status = tokio::process::Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .await;
    assert!(status.is_ok_and(|s| s.success()));
    within(EVENT, "etcdctl to exit after SIGINT", child.wait())
        .await
        .unwrap();
}

/// After the test, none of our leases and no key of the election `name` remain. `etcdctl elect`
/// resigns on SIGINT (deletes its key) but leaves its session's lease to expire with its 60 s
/// TTL: that one lease, named by its `elected` key, is etcdctl's, not ours.
async fn assert_only_etcdctls_lease_is_left(server: &Server, name: &str, elected: &str) {
    let theirs = elected.rsplit('/').next().unwrap_or_default();
    let left = server.leases().await;
    assert!(
        left.iter().all(|lease| lease == theirs),
        "a lease other than etcdctl's {theirs} was left behind: {left:?}"
    );
    assert!(
        server.keys(name).await.is_empty(),
        "a key of {name:?} was left behind"
    );
}

#[tokio::test]
async fn etcdctl_elect_waits_while_we_lead_and_takes_over_on_release() {
    lease_tests::init_tracing();
    let server = Server::start().await;
    let etcd = server.backend();
    let lease = etcd
        .acquire(&leader("interop/ours-first").value("ours"))
        .await
        .unwrap();
    let (child, mut lines) = etcdctl_elect(&server, "interop/ours-first", "theirs").await;
    // etcdctl has joined the queue behind us (its key exists), and is not elected.
    within(EVENT, "etcdctl's key", async {
        while server.keys("interop/ours-first/").await.len() < 2 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(
        tokio::time::timeout(Duration::from_millis(300), lines.next_line())
            .await
            .is_err(),
        "etcdctl elect was elected while we led"
    );
    lease.check().await.unwrap();
    lease.release().await.unwrap();
    let elected = within(EVENT, "etcdctl elect to be elected", lines.next_line())
        .await
        .unwrap()
        .unwrap();
    assert!(elected.starts_with("interop/ours-first/"), "{elected}");
    let busy = etcd
        .acquire(&leader("interop/ours-first").wait(Wait::UpTo(Duration::from_millis(300))))
        .await;
    assert!(busy.unwrap_err().is_busy());
    interrupt(child).await;
    assert_only_etcdctls_lease_is_left(&server, "interop/ours-first", &elected).await;
}

#[tokio::test]
async fn we_wait_while_etcdctl_elect_leads_and_take_over_when_it_resigns() {
    lease_tests::init_tracing();
    let server = Server::start().await;
    let etcd = server.backend();
    let (child, mut lines) = etcdctl_elect(&server, "interop/theirs-first", "theirs").await;
    let elected = within(EVENT, "etcdctl elect to be elected", lines.next_line())
        .await
        .unwrap()
        .unwrap();
    let busy = etcd
        .acquire(&leader("interop/theirs-first").wait(Wait::Never))
        .await;
    assert!(
        busy.unwrap_err().is_busy(),
        "we were admitted while etcdctl led"
    );
    // Observers see etcdctl's leader, its proposal as the value.
    let observer = etcd.observe_leader("interop/theirs-first").await.unwrap();
    let seen = observer.leader().expect("etcdctl leads");
    assert_eq!(seen.value_str(), Some("theirs"));
    assert_eq!(
        format!("interop/theirs-first/{}", seen.sequencer.holder()),
        elected
    );

    let waiting = tokio::spawn({
        let etcd = etcd.clone();
        async move {
            etcd.acquire(&leader("interop/theirs-first").value("ours"))
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "we were elected while etcdctl led");
    interrupt(child).await;
    let lease = within(EVENT, "our election after etcdctl resigned", waiting)
        .await
        .unwrap()
        .unwrap();
    assert!(lease.sequencer().index() > seen.sequencer.index());
    lease.release().await.unwrap();
    assert_only_etcdctls_lease_is_left(&server, "interop/theirs-first", &elected).await;
}

/// `etcdctl elect` leads, its proposal JSON but not our semaphore's format: a semaphore of ours
/// on the name is refused at once (a leader contender is no semaphore's, however its value
/// looks), while a leader of ours only waits for its turn, as ever.
#[tokio::test]
async fn a_semaphore_is_refused_at_once_where_etcdctl_elect_leads() {
    lease_tests::init_tracing();
    let server = Server::start().await;
    let etcd = server.backend();
    let name = "interop/kinds";
    let (child, mut lines) = etcdctl_elect(&server, name, r#"{"limit":2}"#).await;
    let elected = within(EVENT, "etcdctl elect to be elected", lines.next_line())
        .await
        .unwrap()
        .unwrap();
    let started = Instant::now();
    let patient = Wait::UpTo(Duration::from_secs(30));
    let err = etcd
        .acquire(&LeaseSpec::semaphore(name, 2).wait(patient))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::FlagsConflict { key, found: Error::LEADER_FLAGS, expected: Error::SEMAPHORE_FLAGS } if key == name),
        "{err:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(5), "waited");
    let busy = etcd.acquire(&leader(name).wait(Wait::Never)).await;
    assert!(busy.unwrap_err().is_busy());
    interrupt(child).await;
    assert_only_etcdctls_lease_is_left(&server, name, &elected).await;
}

#[tokio::test]
async fn twenty_waiters_acquire_in_the_order_they_arrived() {
    lease_tests::init_tracing();
    let server = Server::start().await;
    let etcd = server.backend();
    let first = etcd.acquire(&leader("fifo")).await.unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    for i in 0..20usize {
        let (etcd, tx) = (etcd.clone(), tx.clone());
        tokio::spawn(async move {
            let lease = etcd.acquire(&leader("fifo")).await.unwrap();
            let _ = tx.send((i, lease));
        });
        // Arrival is the write of the waiter's key: wait for it before the next one starts.
        within(EVENT, "the waiter's key", async {
            while server.keys("fifo/").await.len() < i + 2 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
    }
    // Contenders of one process on one name share its pooled etcd lease: the first under its
    // plain hex, the others under `<hex>_<n>`.
    let leases = server.leases().await;
    assert_eq!(leases.len(), 1, "one etcd lease for 21 contenders");
    let keys: Vec<String> = server
        .keys("fifo/")
        .await
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    assert_eq!(keys[0], format!("fifo/{}", leases[0]));
    for key in &keys[1..] {
        let suffix = key.strip_prefix(&format!("fifo/{}_", leases[0]));
        assert!(suffix.is_some_and(|n| n.parse::<u64>().is_ok()), "{key}");
    }
    let observer = etcd.observe_leader("fifo").await.unwrap();
    let mut last = first.sequencer().clone();
    first.release().await.unwrap();
    for expected in 0..20 {
        let (i, lease) = within(EVENT, "the next waiter", rx.recv()).await.unwrap();
        assert_eq!(i, expected, "waiters acquired out of arrival order");
        assert!(lease.sequencer().index() > last.index());
        // A holder under a `_<n>` key is checked, observed and named like any other.
        etcd.check_sequencer(lease.sequencer()).await.unwrap();
        etcd.check_sequencer(&last).await.unwrap_err();
        let mut seen = observer.clone();
        within(EVENT, "the observer to see the new leader", async {
            while seen.leader().map(|l| l.sequencer) != Some(lease.sequencer().clone()) {
                seen.changed().await.unwrap();
            }
        })
        .await;
        assert_eq!(
            server.own_key(lease.sequencer()).await,
            Some(format!("fifo/{}", lease.sequencer().holder()))
        );
        last = lease.sequencer().clone();
        lease.release().await.unwrap();
    }
    assert!(server.leases().await.is_empty());
    assert!(server.keys("fifo").await.is_empty());
}

#[tokio::test]
async fn semaphore_admits_waiters_in_arrival_order() {
    lease_tests::init_tracing();
    let server = Server::start().await;
    let etcd = server.backend();
    let spec = LeaseSpec::semaphore("fifo-sem", 2).ttl(Duration::from_secs(10));
    let a = etcd.acquire(&spec).await.unwrap();
    let b = etcd.acquire(&spec).await.unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    for i in 0..6usize {
        let (etcd, tx, spec) = (etcd.clone(), tx.clone(), spec.clone());
        tokio::spawn(async move {
            let lease = etcd.acquire(&spec).await.unwrap();
            let _ = tx.send((i, lease));
        });
        within(EVENT, "the waiter's key", async {
            while server.keys("fifo-sem/").await.len() < i + 3 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
    }
    // The newer holder leaves first: its slot goes to the oldest waiter, and so on.
    b.release().await.unwrap();
    let mut held = vec![a];
    for expected in 0..6 {
        let (i, lease) = within(EVENT, "the next waiter", rx.recv()).await.unwrap();
        assert_eq!(i, expected, "waiters admitted out of arrival order");
        etcd.check_sequencer(lease.sequencer()).await.unwrap();
        held.push(lease);
        held.remove(0).release().await.unwrap();
    }
    for lease in held {
        lease.release().await.unwrap();
    }
    assert!(server.leases().await.is_empty());
}

/// A waiter settles after a holding key went without a release (an operator's delete, or the
/// lease revoked), so the old holder has stopped before the waiter starts; a release, which
/// announces itself, hands over at once.
#[tokio::test]
async fn waiters_settle_after_an_unannounced_removal_and_not_after_a_release() {
    lease_tests::init_tracing();
    let server = Server::start().await;
    let etcd = server.backend();
    let settle = Duration::from_secs(2);
    let specs = [
        leader("settle/leader"),
        LeaseSpec::semaphore("settle/sem", 1).ttl(Duration::from_secs(10)),
    ];
    for spec in specs {
        let name = spec.key().to_owned();
        for fault in ["delete", "revoke"] {
            let spec = spec.clone().settle(settle);
            let holder = etcd.acquire(&spec).await.unwrap();
            let waiter = queued_waiter(&server, &etcd, spec).await;
            let own = format!("{name}/{}", holder.sequencer().holder());
            let removed_at = Instant::now();
            match fault {
                "delete" => assert_eq!(server.post_delete_one(&own).await, 1),
                _ => assert!(server.revoke(holder.sequencer().holder()).await),
            }
            let next = within(EVENT, "the waiter after the removal", waiter)
                .await
                .unwrap()
                .unwrap();
            let waited = removed_at.elapsed();
            assert!(
                waited >= settle,
                "{name}: a waiter took over {waited:?} after an operator's {fault}, within the {settle:?} settle time"
            );
            assert!(
                !holder.is_held(),
                "{name}: the old holder had not noticed its loss when the waiter took over"
            );
            lease_tests::release_lost(holder).await;
            next.release().await.unwrap();
        }
        // A release, with a settle time far longer than EVENT: the waiter must not settle.
        let spec = spec.settle(Duration::from_secs(60));
        let holder = etcd.acquire(&spec).await.unwrap();
        let waiter = queued_waiter(&server, &etcd, spec).await;
        holder.release().await.unwrap();
        let next = within(
            EVENT,
            "the waiter after a release (it must not settle)",
            waiter,
        )
        .await
        .unwrap()
        .unwrap();
        next.release().await.unwrap();
    }
    assert!(server.leases().await.is_empty());
}

/// An acquire of `spec` in a task, returned once its key is queued behind the holder's.
async fn queued_waiter(
    server: &Server,
    etcd: &Etcd,
    spec: LeaseSpec,
) -> tokio::task::JoinHandle<Result<lease_core::Lease, Error>> {
    let queue = format!("{}/", spec.key());
    let etcd = etcd.clone();
    let waiter = tokio::spawn(async move { etcd.acquire(&spec).await });
    within(EVENT, "the waiter's key", async {
        while server.keys(&queue).await.len() < 2 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    waiter
}

#[tokio::test]
async fn revoking_the_lease_cancels_work_with_session_invalidated() {
    lease_tests::init_tracing();
    let server = Server::start().await;
    let etcd = server.backend();
    let lease = etcd.acquire(&leader("loss/revoke")).await.unwrap();
    let holder = lease.sequencer().holder().to_owned();
    let (work, revoked) = within(EVENT, "work cancelled after revoke", async {
        tokio::join!(
            lease.run(std::future::pending::<()>()),
            server.revoke(&holder)
        )
    })
    .await;
    assert!(revoked);
    assert_refined(&lease, &work.unwrap_err(), LostReason::SessionInvalidated).await;
    assert!(matches!(lease.check().await, Err(Error::Lost(_))));
    lease_tests::release_lost(lease).await;
    assert!(server.leases().await.is_empty());
}

#[tokio::test]
async fn deleting_the_own_key_loses_the_lease_and_the_lease_is_revoked() {
    lease_tests::init_tracing();
    let server = Server::start().await;
    let etcd = server.backend();
    let lease = etcd.acquire(&leader("loss/delete")).await.unwrap();
    let own = format!("loss/delete/{}", lease.sequencer().holder());
    assert_eq!(server.keys(&own).await.len(), 1);
    // Only the holder's own key, as `etcdctl del <key>` would: the etcd lease itself lives on.
    let deleted = server.post_delete_one(&own).await;
    assert_eq!(deleted, 1);
    let reason = within(EVENT, "loss after the key was deleted", lease.lost()).await;
    assert_eq!(reason, LostReason::KeyDeleted);
    assert!(matches!(
        etcd.check_sequencer(lease.sequencer()).await,
        Err(Error::Lost(LostReason::KeyDeleted))
    ));
    // The clean-up after the loss revokes the etcd lease: nothing left behind.
    within(EVENT, "the lost lease's etcd lease to be revoked", async {
        while !server.leases().await.is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    lease_tests::release_lost(lease).await;
}

#[tokio::test]
async fn partition_self_fences_while_etcd_still_keeps_the_lease() {
    lease_tests::init_tracing();
    let server = Server::start().await;
    let proxy = Proxy::start(server.addr()).await.unwrap();
    let partitioned = Etcd::builder().endpoints([proxy.url()]).build().unwrap();
    let direct = server.backend();
    let spec = leader("loss/partition");
    let lease = partitioned.acquire(&spec).await.unwrap();
    let holder = lease.sequencer().holder().to_owned();
    let waiting = tokio::spawn({
        let direct = direct.clone();
        let spec = spec.clone();
        async move {
            let lease = direct.acquire(&spec).await;
            (Instant::now(), lease)
        }
    });
    proxy.set_blackhole(true);
    let cut = Instant::now();
    // Each round reads `is_held()` (no I/O: the fence on the monotonic clock) *before* asking
    // etcd for the lease's TTL, so a round where etcd says "expired" while we still held would
    // be a real overlap, whatever the scheduling.
    let mut at_fence = None;
    within(
        Duration::from_secs(15),
        "etcd to expire the partitioned lease",
        async {
            loop {
                let held = lease.is_held();
                let left = server.time_to_live(&holder).await;
                if !held && at_fence.is_none() {
                    at_fence = Some((Instant::now(), left));
                }
                if left < 0 {
                    assert!(
                        !held,
                        "etcd expired the lease while the holder still held it"
                    );
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        },
    )
    .await;
    let (fenced, left) = at_fence.expect("the holder self-fenced");
    assert!(
        matches!(lease.lost_reason(), Some(LostReason::SelfFenced { .. })),
        "lost with {:?}",
        lease.lost_reason()
    );
    assert!(
        left >= 0,
        "etcd had already expired the lease when we self-fenced"
    );
    let (taken_at, next) = within(Duration::from_secs(15), "the next holder", waiting)
        .await
        .unwrap();
    let next = next.unwrap();
    assert!(
        taken_at > fenced,
        "the next holder was admitted before we self-fenced"
    );
    assert!(next.sequencer().index() > lease.sequencer().index());
    eprintln!(
        "self-fenced {:?} after the cut, etcd still giving the lease {left} whole second(s); next holder {:?} later",
        fenced - cut,
        taken_at - fenced
    );
    next.release().await.unwrap();
    proxy.set_blackhole(false);
    drop(lease);
    partitioned.shutdown().await;
}

#[tokio::test]
async fn bad_input_gives_typed_errors() {
    lease_tests::init_tracing();
    // Nothing listens on a port we just freed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let nobody = Etcd::builder()
        .endpoints([format!("127.0.0.1:{port}")])
        .build()
        .unwrap();
    match nobody.acquire(&leader("bad/unreachable")).await {
        Err(error @ Error::Unreachable { .. }) => {
            assert!(error.is_transient());
            assert!(error.to_string().contains("ETCD_ENDPOINTS"), "{error}");
        }
        other => panic!("expected Unreachable, got {other:?}"),
    }
    // A key with NUL is refused before any request.
    let key_error = nobody.acquire(&leader("bad/\0key")).await.unwrap_err();
    assert!(matches!(key_error, Error::InvalidKey { .. }), "{key_error}");
    assert!(matches!(
        Etcd::builder().endpoints(["ftp://x:1"]).build(),
        Err(Error::Config { .. })
    ));

    let mut server = Server::start().await;
    server.enable_auth("root-secret").await;
    let wrong = Etcd::builder()
        .endpoints([server.url()])
        .user("root", "wrong")
        .build()
        .unwrap();
    match wrong.acquire(&leader("bad/credentials")).await {
        Err(Error::PermissionDenied { message, .. }) => {
            assert!(message.contains("authentication failed"), "{message}");
        }
        other => panic!("expected PermissionDenied, got {other:?}"),
    }
    let anonymous = server.backend();
    let refused = anonymous
        .acquire(&leader("bad/anonymous"))
        .await
        .unwrap_err();
    assert!(!refused.is_transient(), "{refused}");
    // The right credentials work, and a check of a made-up sequencer is a typed answer.
    let right = Etcd::builder()
        .endpoints([server.url()])
        .user("root", "root-secret")
        .build()
        .unwrap();
    let lease = right.acquire(&leader("bad/credentials")).await.unwrap();
    let made_up: Sequencer = "etcd:1:zz:bad/credentials".parse().unwrap();
    assert!(matches!(
        right.check_sequencer(&made_up).await,
        Err(Error::Lost(_))
    ));
    lease.release().await.unwrap();
    assert!(server.leases().await.is_empty());
}

#[tokio::test]
async fn nothing_is_left_behind() {
    lease_tests::init_tracing();
    let server = Server::start().await;
    let etcd = server.backend();
    let held = etcd.acquire(&leader("left/leader")).await.unwrap();
    let semaphore = LeaseSpec::semaphore("left/semaphore", 2).ttl(Duration::from_secs(10));
    let s1 = etcd.acquire(&semaphore).await.unwrap();
    let s2 = etcd.acquire(&semaphore).await.unwrap();
    // A waiter whose acquire is cancelled, one that gives up, and one that finds it busy.
    let cancelled = tokio::spawn({
        let etcd = etcd.clone();
        async move { etcd.acquire(&leader("left/leader")).await }
    });
    within(EVENT, "the waiter's key", async {
        while server.keys("left/leader/").await.len() < 2 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    cancelled.abort();
    let gave_up = etcd
        .acquire(
            &semaphore
                .clone()
                .wait(Wait::UpTo(Duration::from_millis(200))),
        )
        .await;
    assert!(gave_up.unwrap_err().is_busy());
    let busy = etcd.acquire(&leader("left/leader").wait(Wait::Never)).await;
    assert!(busy.unwrap_err().is_busy());
    held.release().await.unwrap();
    drop(s1);
    let s2_watcher = s2.watcher();
    etcd.shutdown().await;
    assert!(!s2_watcher.is_held());
    drop(s2);
    within(EVENT, "every lease and key to be gone", async {
        loop {
            let (leases, keys) = (server.leases().await, server.keys("").await);
            if leases.is_empty() && keys.is_empty() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
}

/// TLS on the gRPC channel: an `https://` endpoint, the CA that signed etcd's certificate and a
/// client certificate (etcd verifies clients); refused without the client certificate, and
/// without the CA.
#[tokio::test]
async fn tls_with_a_ca_and_a_client_certificate() {
    lease_tests::init_tracing();
    let tls = lease_tests::consul::AgentTls::create().await;
    let server = Server::start_tls(&tls).await;
    let etcd = Etcd::builder()
        .endpoints([server.https_url()])
        .ca_cert(&tls.ca)
        .client_cert(&tls.client_cert, &tls.client_key)
        .build()
        .unwrap();
    let lease = etcd.acquire(&leader("tls/leader")).await.unwrap();
    lease.check().await.unwrap();
    lease.release().await.unwrap();
    let spec = leader("tls/refused").wait(Wait::Never);
    let without_certificate = Etcd::builder()
        .endpoints([server.https_url()])
        .ca_cert(&tls.ca)
        .build()
        .unwrap();
    let refused = without_certificate.acquire(&spec).await.unwrap_err();
    assert!(matches!(refused, Error::Unreachable { .. }), "{refused}");
    let without_ca = Etcd::builder()
        .endpoints([server.https_url()])
        .client_cert(&tls.client_cert, &tls.client_key)
        .build()
        .unwrap();
    let untrusted = without_ca.acquire(&spec).await.unwrap_err();
    assert!(untrusted.to_string().contains("ETCD_CACERT"), "{untrusted}");
    assert!(server.leases().await.is_empty());
}
