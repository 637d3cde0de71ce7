//! `lease lock --etcd` against a real etcd and real processes: interoperation with
//! `etcdctl lock` both ways (judged from the timestamps the commands write), `status`/`check` on
//! the etcd lease, and an unreachable etcd.

// A test that unwraps is a test that fails loudly.
#![allow(clippy::unwrap_used)]

mod support;

use std::process::Stdio;
use std::time::{Duration, Instant};

use lease_core::{BackendKind, Sequencer};
use lease_tests::etcd::Server;
use lease_tests::proxy::{Mode, Proxy};
use lease_tests::within;
use lease_tests::workers::wait_for_async;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};

use support::*;

/// The keys under `prefix/` once there are `n`, oldest first, with their values.
async fn queue_of(server: &Server, prefix: &str, n: usize, what: &str) -> Vec<(String, String)> {
    let under = format!("{prefix}/");
    wait_for_async(
        T,
        || format!("{what} ({n} keys under {under})"),
        || async {
            let keys = server.keys(&under).await;
            (keys.len() == n).then_some(keys)
        },
    )
    .await
}

/// While `lease lock --etcd` runs its command, `etcdctl lock KEY -- CMD` queues behind it and
/// runs only after it finished; and the other way round (`lease lock` chosen by
/// LEASE_ETCD_ENDPOINTS). Both use `KEY/<lease ID in hex>`, the oldest create revision holding.
#[tokio::test]
async fn excludes_etcdctl_lock_both_ways() {
    let server = Server::start().await;
    let scratch = Scratch::new("etcd-interop");
    let url = server.url();

    // Ours holds; etcdctl lock waits.
    let (lease_a, ours, env) =
        lock_gated(&scratch, "ours-a", "--etcd", &url, "ours-a", "interop/a").await;
    let sequencer: Sequencer = env.sequencer.parse().unwrap();
    let holder = env.holder;
    assert_eq!(sequencer.backend(), BackendKind::Etcd);
    assert_eq!(sequencer.key(), "interop/a");
    assert_eq!(env.key, "interop/a", "LEASE_KEY");
    assert_eq!(sequencer.holder(), holder, "LEASE_HOLDER");

    let theirs = Gated::ungated(&scratch, "theirs-a", "$ETCD_LOCK_KEY");
    let mut etcdctl_a = server
        .etcdctl()
        .args(["lock", "interop/a", "--", "sh", "-c", &theirs.script])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    // The queue: our key first (our lease, our value), then etcdctl's (empty value).
    let queue = queue_of(&server, "interop/a", 2, "etcdctl lock to queue behind us").await;
    assert_eq!(
        queue[0],
        (format!("interop/a/{holder}"), "ours-a".to_owned()),
        "{queue:?}"
    );
    assert!(queue[1].1.is_empty(), "{queue:?}");
    assert_eq!(
        sequencer.index(),
        server_revision_of(&server, &queue[0].0).await
    );

    // `status` and `check` see our lease while we hold.
    let out = run(&["status", "--etcd", &url, "--json", "interop/a"]).await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["session"], holder.as_str());
    assert_eq!(json["value"], "ours-a");
    assert_eq!(json["sequencer"], sequencer.to_string());
    let out = run(&["check", "--etcd", &url, &sequencer.to_string()]).await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");

    ours.open();
    let out = within(T, "lease lock to exit", lease_a.wait_with_output())
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let status = within(T, "etcdctl lock to run and exit", etcdctl_a.wait())
        .await
        .unwrap();
    assert!(status.success(), "etcdctl lock: {status}");
    assert_in_turn(("lease lock", &ours), ("etcdctl lock", &theirs));
    assert_eq!(
        std::fs::read_to_string(&theirs.env).unwrap().trim(),
        queue[1].0,
        "etcdctl's ETCD_LOCK_KEY is the key it queued"
    );
    let out = run(&["check", "--etcd", &url, &sequencer.to_string()]).await;
    assert_eq!(out.status.code(), Some(1), "stale once released: {out:?}");

    // etcdctl lock holds; ours waits, naming it.
    let theirs = Gated::new(&scratch, "theirs-b", "$ETCD_LOCK_KEY");
    let mut etcdctl_b = server
        .etcdctl()
        .args(["lock", "interop/b", "--", "sh", "-c", &theirs.script])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let their_key = file_appears(&theirs.env).await.trim().to_owned();
    let their_lease = their_key.strip_prefix("interop/b/").unwrap().to_owned();
    let ours = Gated::ungated(&scratch, "ours-b", "$LEASE_HOLDER");
    let mut lease_b = lease_cmd()
        .env("LEASE_ETCD_ENDPOINTS", &url)
        .args(["lock", "interop/b", "--", "sh", "-c", &ours.script])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(lease_b.stderr.take().unwrap());
    let mut waiting = String::new();
    within(T, "lease lock to say whom it waits for", async {
        while !waiting.contains("lease: waiting for interop/b:") {
            stderr.read_line(&mut waiting).await.unwrap();
        }
    })
    .await;
    assert!(
        waiting.contains(&format!("held by an unnamed holder (session {their_lease}")),
        "{waiting}"
    );
    let queue = queue_of(
        &server,
        "interop/b",
        2,
        "lease lock to queue behind etcdctl",
    )
    .await;
    assert_eq!(queue[0].0, their_key, "{queue:?}");

    theirs.open();
    let status = within(T, "etcdctl lock to exit", etcdctl_b.wait())
        .await
        .unwrap();
    assert!(status.success(), "etcdctl lock: {status}");
    let code = within(T, "lease lock to run and exit", lease_b.wait())
        .await
        .unwrap();
    let mut rest = String::new();
    stderr.read_to_string(&mut rest).await.unwrap();
    assert_eq!(code.code(), Some(0), "{waiting}{rest}");
    assert_in_turn(("etcdctl lock", &theirs), ("lease lock", &ours));
    let ours_b = std::fs::read_to_string(&ours.env)
        .unwrap()
        .trim()
        .to_owned();
    assert_eq!(queue[1].0, format!("interop/b/{ours_b}"), "{queue:?}");

    // Nothing left: no key, and neither of our etcd leases (etcdctl's exec form deletes its key
    // but leaves its own lease to expire).
    assert_eq!(server.keys("interop/").await, Vec::new());
    let leases = server.leases().await;
    assert!(
        !leases.contains(&holder) && !leases.contains(&ours_b),
        "our leases {holder}, {ours_b} are still in {leases:?}"
    );
}

/// The create revision of `key`, which a leader's sequencer carries as its index.
async fn server_revision_of(server: &Server, key: &str) -> u64 {
    let out = server
        .etcdctl()
        .args(["get", key, "-w", "json"])
        .output()
        .await
        .unwrap();
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    json["kvs"][0]["create_revision"].as_u64().unwrap()
}

/// An etcd that refuses connections, and one behind a partition (every byte held): `lease lock`
/// exits 125 with a message naming the URL and what to do, starts nothing, and does not hang.
#[tokio::test]
async fn an_unreachable_etcd_is_a_clear_error_within_a_bounded_time() {
    let server = Server::start().await;
    let proxy = Proxy::start(server.addr()).await.unwrap();
    proxy.set_mode(Mode::Blackhole);
    let partitioned = format!("http://{}", proxy.addr());
    let scratch = Scratch::new("etcd-unreachable");
    let cases = [
        (
            "http://127.0.0.1:1",
            "is it running? Start etcd, or point --etcd at it",
            Duration::from_secs(2),
        ),
        // One request's timeout (5 s), with room for a loaded machine.
        (
            partitioned.as_str(),
            "no answer in time",
            Duration::from_secs(10),
        ),
    ];
    for (i, (url, hint, bound)) in cases.into_iter().enumerate() {
        let marker = scratch.path(&format!("started-{i}"));
        let mut cmd = lease_cmd();
        cmd.args(["lock", "--etcd", url, "jobs/a", "--", "touch"])
            .arg(&marker);
        let started = Instant::now();
        let out = output(cmd, &format!("lease lock --etcd {url}")).await;
        let took = started.elapsed();
        let (code, stderr) = code_and_stderr(&out);
        eprintln!("--etcd {url}: exit {code:?} after {took:.1?}");
        assert_eq!(code, Some(125), "{stderr}");
        for needle in [
            &format!("lease: cannot reach etcd at {url}"),
            hint,
            "the command was not started",
        ] {
            assert!(
                stderr.contains(needle),
                "{needle:?} missing from:\n{stderr}"
            );
        }
        assert!(took < bound, "--etcd {url} took {took:?} (bound {bound:?})");
        assert!(!marker.exists(), "the command ran");
    }
}

/// `lease check "$LEASE_SEQUENCER"` inside the command reaches the etcd `--etcd` named (the
/// command gets it as LEASE_ETCD_ENDPOINTS), not 127.0.0.1:2379.
#[tokio::test]
async fn lease_check_inside_the_command_reaches_the_etcd_of_the_flag() {
    let server = Server::start().await;
    let out = check_inside(&["--etcd", &server.url(), "jobs/inside"]).await;
    assert_checked_current(&out);
}
