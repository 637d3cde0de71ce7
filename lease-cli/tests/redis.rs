//! `lease lock --redis` against a real `redis-server` (one per test) and real processes: two
//! `lease lock`s on one KEY take turns (judged from the timestamps the commands write), `status`
//! and `check` on the lease, LEASE_REDIS_URL choosing the backend, `lease check` inside the
//! command, and an unreachable server.

// A test that unwraps is a test that fails loudly.
#![allow(clippy::unwrap_used)]

mod support;

use lease_tests::redis::Server;
use lease_tests::within;

use support::*;

/// While one `lease lock --redis` runs its command, a second on the same KEY (chosen by
/// LEASE_REDIS_URL) waits and runs its command only after the first finished. The command gets
/// a `redis:` LEASE_SEQUENCER that `lease status` shows and `lease check` finds current while
/// held and stale after.
#[tokio::test]
async fn two_lease_locks_on_one_key_take_turns() {
    let server = Server::start().await;
    let url = server.url();
    let scratch = Scratch::new("redis-turns");
    let (lease_a, first, env) =
        lock_gated(&scratch, "first", "--redis", &url, "first", "jobs/a").await;
    let sequencer = env.sequencer.as_str();
    // redis:<token>:<holder>:<key>
    let parts: Vec<&str> = sequencer.splitn(4, ':').collect();
    assert_eq!(parts.len(), 4, "{sequencer}");
    assert_eq!((parts[0], parts[3]), ("redis", "jobs/a"), "{sequencer}");
    assert_eq!(parts[2], env.holder, "LEASE_HOLDER");

    let out = run(&["status", "--redis", &url, "--json", "jobs/a"]).await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["value"], "first");
    assert_eq!(json["sequencer"], sequencer);
    assert_eq!(json["holder"], parts[2], "{json}");
    assert_eq!(json["token"].to_string(), parts[1], "{json}");
    let out = run(&["check", "--redis", &url, sequencer]).await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");

    let second = Gated::ungated(&scratch, "second", "$LEASE_SEQUENCER");
    let mut lease_b = lease_cmd()
        .env("LEASE_REDIS_URL", &url)
        .args(["lock", "jobs/a", "--", "sh", "-c", &second.script])
        .spawn()
        .unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert!(
        !second.env.exists(),
        "the second command ran while the first held"
    );
    first.open();
    let out = within(
        T,
        "the first lease lock to exit",
        lease_a.wait_with_output(),
    )
    .await
    .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let status = within(T, "the second lease lock to run and exit", lease_b.wait())
        .await
        .unwrap();
    assert_eq!(status.code(), Some(0), "the second lease lock: {status}");
    assert_in_turn(("first", &first), ("second", &second));
    let next = std::fs::read_to_string(&second.env).unwrap();
    assert!(next.trim().starts_with("redis:"), "{next}");
    assert_ne!(next.trim(), sequencer, "a new acquisition, a new sequencer");
    let out = run(&["check", "--redis", &url, sequencer]).await;
    assert_eq!(out.status.code(), Some(1), "stale once released: {out:?}");
}

/// A closed port: `lease lock` exits 125 naming the address, and does not start the command.
#[tokio::test]
async fn an_unreachable_redis_is_a_clear_error() {
    let scratch = Scratch::new("redis-unreachable");
    let marker = scratch.path("started");
    let mut cmd = lease_cmd();
    cmd.args([
        "lock",
        "--redis",
        "redis://127.0.0.1:1",
        "jobs/a",
        "--",
        "touch",
    ])
    .arg(&marker);
    let out = output(cmd, "lease lock --redis at a closed port").await;
    let (code, stderr) = code_and_stderr(&out);
    assert_eq!(code, Some(125), "{stderr}");
    for needle in ["127.0.0.1:1", "the command was not started"] {
        assert!(
            stderr.contains(needle),
            "{needle:?} missing from:\n{stderr}"
        );
    }
    assert!(!marker.exists(), "the command ran");
}

/// `lease check "$LEASE_SEQUENCER"` inside the command reaches the server `--redis` named (the
/// command gets it as LEASE_REDIS_URL).
#[tokio::test]
async fn lease_check_inside_the_command_reaches_the_server_of_the_flag() {
    let server = Server::start().await;
    let out = check_inside(&["--redis", &server.url(), "jobs/inside"]).await;
    assert_checked_current(&out);
}
