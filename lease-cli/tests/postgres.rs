//! `lease lock --postgres` against a real PostgreSQL (a database of its own per test) and real
//! processes: two `lease lock`s on one KEY take turns (judged from the timestamps the commands
//! write), `status`/`check` on the lease, LEASE_POSTGRES_URL choosing the backend, and an
//! unreachable server.

// A test that unwraps is a test that fails loudly.
#![allow(clippy::unwrap_used)]

mod support;

use std::process::Stdio;

use lease_tests::postgres::TestDb;
use lease_tests::within;
use tokio::io::{AsyncBufReadExt, BufReader};

use support::*;

/// While one `lease lock --postgres` runs its command, a second on the same KEY (chosen by
/// LEASE_POSTGRES_URL) waits, saying whom for, and runs its command only after the first
/// finished. The command gets a `postgres:` LEASE_SEQUENCER that `lease status` shows and `lease
/// check` finds current while held and stale after.
#[tokio::test]
async fn two_lease_locks_on_one_key_take_turns() {
    let db = TestDb::create("cli_take_turns").await;
    let url = db.url();
    let scratch = Scratch::new("postgres-turns");

    let (lease_a, first, env) =
        lock_gated(&scratch, "first", "--postgres", url, "first", "jobs/a").await;
    let sequencer = env.sequencer.as_str();
    // postgres:<index>:<holder>:<key>
    let parts: Vec<&str> = sequencer.splitn(4, ':').collect();
    assert_eq!(parts.len(), 4, "{sequencer}");
    assert_eq!(parts[0], "postgres", "{sequencer}");
    assert_eq!(parts[3], "jobs/a", "{sequencer}");
    assert_eq!(env.key, "jobs/a", "LEASE_KEY");
    assert_eq!(parts[2], env.holder, "LEASE_HOLDER");

    let out = run(&["status", "--postgres", url, "--json", "jobs/a"]).await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["value"], "first");
    assert_eq!(json["sequencer"], sequencer);
    // In PostgreSQL's terms: a holder ID and an index, not a session and a lock index.
    assert_eq!(json["holder"], parts[2], "{json}");
    assert_eq!(json["index"].to_string(), parts[1], "{json}");
    assert!(
        json.get("session").is_none() && json.get("lock_index").is_none(),
        "{json}"
    );
    let out = run(&["status", "--postgres", url, "jobs/a"]).await;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(&format!("holder: {}", parts[2])), "{text}");
    let out = run(&["check", "--postgres", url, sequencer]).await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");

    // The second, by the environment: it waits, naming the first.
    let second = Gated::ungated(&scratch, "second", "$LEASE_SEQUENCER");
    let mut lease_b = lease_cmd()
        .env("LEASE_POSTGRES_URL", url)
        .args(["lock", "jobs/a", "--", "sh", "-c", &second.script])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(lease_b.stderr.take().unwrap()).lines();
    let waiting = within(T, "the second lease lock to say whom it waits for", async {
        while let Some(line) = stderr.next_line().await.unwrap() {
            if line.starts_with("lease: waiting for jobs/a: held by first") {
                return line;
            }
        }
        panic!("the second lease lock ended its stderr without waiting");
    })
    .await;
    assert!(
        waiting.contains(&format!("(holder {}, index {})", parts[2], parts[1])),
        "{waiting}"
    );
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
    assert!(next.trim().starts_with("postgres:"), "{next}");
    assert_ne!(next.trim(), sequencer, "a new acquisition, a new sequencer");

    let out = run(&["check", "--postgres", url, sequencer]).await;
    assert_eq!(out.status.code(), Some(1), "stale once released: {out:?}");
}

/// A server that refuses connections: `lease lock` exits 125 with a message naming the address,
/// and does not start the command.
#[tokio::test]
async fn an_unreachable_postgres_is_a_clear_error() {
    let scratch = Scratch::new("postgres-unreachable");
    let marker = scratch.path("started");
    let url = "postgres://postgres@127.0.0.1:1/postgres";
    let mut cmd = lease_cmd();
    cmd.args(["lock", "--postgres", url, "jobs/a", "--", "touch"])
        .arg(&marker);
    let out = output(cmd, "lease lock --postgres at a closed port").await;
    let (code, stderr) = code_and_stderr(&out);
    assert_eq!(code, Some(125), "{stderr}");
    for needle in [
        "127.0.0.1:1",
        "the command was not started",
        "(--postgres, or LEASE_POSTGRES_URL)",
    ] {
        assert!(
            stderr.contains(needle),
            "{needle:?} missing from:\n{stderr}"
        );
    }
    // `lease` never reads DATABASE_URL: its message must not send the user there.
    assert!(!stderr.contains("DATABASE_URL"), "{stderr}");
    assert!(!marker.exists(), "the command ran");
}

/// A database that does not exist is the backend's refusal (125, as a role without rights or a
/// closed port), not bad usage (64: what `lease` refuses before asking anything).
#[tokio::test]
async fn a_missing_database_is_a_backend_error() {
    let scratch = Scratch::new("postgres-no-db");
    let marker = scratch.path("started");
    let url = "postgres://postgres@127.0.0.1:5432/lease_cli_no_such_database";
    let mut cmd = lease_cmd();
    cmd.args(["lock", "--postgres", url, "jobs/a", "--", "touch"])
        .arg(&marker);
    let out = output(cmd, "lease lock --postgres of a missing database").await;
    let (code, stderr) = code_and_stderr(&out);
    assert_eq!(code, Some(125), "{stderr}");
    assert!(stderr.contains("does not exist"), "{stderr}");
    assert!(!marker.exists(), "the command ran");
}

/// LEASE_POSTGRES_URL and LEASE_ETCD_ENDPOINTS both set, with no backend flag: refused as bad
/// usage (64) rather than one of them silently chosen; a flag settles it.
#[tokio::test]
async fn two_backend_variables_without_a_flag_are_refused() {
    let mut cmd = lease_cmd();
    cmd.env(
        "LEASE_POSTGRES_URL",
        "postgres://postgres@127.0.0.1:1/postgres",
    )
    .env("LEASE_ETCD_ENDPOINTS", "http://127.0.0.1:1")
    .args(["lock", "jobs/a", "--", "true"]);
    let out = output(cmd, "lease lock with both variables").await;
    let (code, stderr) = code_and_stderr(&out);
    assert_eq!(code, Some(64), "{stderr}");
    assert!(
        stderr.contains("both LEASE_POSTGRES_URL and LEASE_ETCD_ENDPOINTS are set"),
        "{stderr}"
    );
    let mut cmd = lease_cmd();
    cmd.args(["lock", "--postgres", "", "jobs/a", "--", "true"]);
    let out = output(cmd, "lease lock --postgres ''").await;
    let (code, stderr) = code_and_stderr(&out);
    assert_eq!(code, Some(64), "{stderr}");
    assert!(
        stderr.contains("--postgres: give PostgreSQL's URL"),
        "{stderr}"
    );
}

/// `lease check "$LEASE_SEQUENCER"` inside the command reaches the database `--postgres` named
/// (the command gets it as LEASE_POSTGRES_URL).
#[tokio::test]
async fn lease_check_inside_the_command_reaches_the_database_of_the_flag() {
    let db = TestDb::create("cli_check_inside").await;
    let out = check_inside(&["--postgres", db.url(), "jobs/inside"]).await;
    assert_checked_current(&out);
}
