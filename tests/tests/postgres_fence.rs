//! The fence of `lease-postgres` proved with real processes: a holder paused (SIGSTOP) past its
//! lease's TTL between its `is_held()` check and its commit, the next holder committing, and the
//! paused holder resumed. Real Consul (and etcd) for the lease, real PostgreSQL for the data, and
//! the verdict judged from the table the holders write (`fenced_writes`), beside their histories.
//!
//! Each holder is a `lease-fenced-writer` process writing one fenced transaction every 20 ms; the
//! first (A) stops itself with SIGSTOP at its third transaction, at a given point. Cases:
//!
//! - stopped before its fence call (Consul, etcd): B acquires once A's session has expired and
//!   commits; A, resumed, is refused by the fence (LF001) and its transaction rolled back.
//! - stopped after its fence call, with `idle_in_transaction_session_timeout` below the TTL (the
//!   setting the fence's docs recommend): PostgreSQL ends A's session, releasing the fence's row
//!   lock; B commits; A, resumed, finds its connection gone and its transaction rolled back.
//! - stopped after its fence call, without that timeout: B acquires but waits at the fence for
//!   A's transaction; A, resumed, commits, ordered before B, and B then commits. The fence orders
//!   the writes by index; it does not bound how long a frozen holder holds the next one back.
//!
//! In every case the rows, in the order they were written, never go back to a lower index. Every
//! wait is bounded and waits on an event (a history line, a process state, a lock wait in
//! `pg_stat_activity`); the tests take turns, as each starts a server and two processes.
//!
//! ```sh
//! cargo test -p lease-tests --test postgres_fence -- --nocapture   # prints each case's figures
//! ```
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use lease_core::Sequencer;
use lease_tests::consul::Agent;
use lease_tests::history::{Kind, Line};
use lease_tests::overlap::now_ns;
use lease_tests::postgres::TestDb;
use lease_tests::workers::{Run, signal, wait_for, wait_for_async};
use tokio_postgres::Client;

const WRITER: &str = env!("CARGO_BIN_EXE_lease-fenced-writer");

const KEY: &str = "fence/billing";
/// The lease TTL (Consul's minimum). Consul invalidates a session within twice its TTL.
const TTL_SECS: u64 = 10;
/// The transaction of A that stops.
const STOP_AT: i64 = 3;
/// The idle-in-transaction timeout of the case that sets one: well below the TTL.
const IDLE_TIMEOUT_MS: u64 = 2_000;
/// Generous bounds for a loaded two-core machine.
const START: Duration = Duration::from_secs(60);
const TAKEOVER: Duration = Duration::from_secs(3 * TTL_SECS + 30);
const STEP: Duration = Duration::from_secs(30);

/// Where A stops, and what the case expects of its stopped transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Case {
    /// Stopped between its check and its fence call: refused by the fence.
    BeforeFence,
    /// Stopped after its fence call; its session ended by PostgreSQL's idle timeout.
    AfterFenceIdleTimeout,
    /// Stopped after its fence call, without a timeout: B waits for it, it commits first.
    AfterFenceHeld,
}

/// One committed row of `fenced_writes`, in id (insertion) order.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Row {
    id: i64,
    index: i64,
    holder: String,
    pid: i64,
    attempt: i64,
}

async fn rows(client: &Client) -> Vec<Row> {
    client
        .query(
            "SELECT id, lease_index, holder, pid, attempt FROM fenced_writes ORDER BY id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| Row {
            id: r.get(0),
            index: r.get(1),
            holder: r.get(2),
            pid: r.get(3),
            attempt: r.get(4),
        })
        .collect()
}

/// Whether process `pid` is stopped (state `T` in `/proc/<pid>/stat`).
fn is_stopped(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // `pid (comm) state …`: comm may hold spaces and parentheses, the state follows the last ')'.
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.trim_start().chars().next())
        .is_some_and(|state| state == 'T')
}

/// Waits for the first line of worker `who` of `kind` (and, if given, whose detail starts with
/// `detail`).
async fn line_of(run: &Run, who: usize, kind: Kind, detail: &str, limit: Duration) -> Line {
    let pid = run.pid(who);
    wait_for(
        limit,
        || format!("a {kind} line of pid {pid} ({detail}); {}", run.files()),
        || {
            run.history(&[who])
                .of_pid(pid)
                .find(|l| l.kind == kind && l.detail.starts_with(detail))
                .cloned()
        },
    )
    .await
}

/// The line of worker `who` that ends its transaction `attempt`: `write attempt=N`, or
/// `refused`/`failed` with the detail `attempt=N: <error>`.
async fn outcome_of(run: &Run, who: usize, attempt: i64, limit: Duration) -> Line {
    let pid = run.pid(who);
    let (done, ended) = (format!("attempt={attempt}"), format!("attempt={attempt}:"));
    wait_for(
        limit,
        || {
            format!(
                "the end of transaction {attempt} of pid {pid}; {}",
                run.files()
            )
        },
        || {
            run.history(&[who])
                .of_pid(pid)
                .find(|l| match &l.kind {
                    Kind::Write => l.detail == done,
                    Kind::Other(word) if word == "refused" || word == "failed" => {
                        l.detail.starts_with(&ended)
                    }
                    _ => false,
                })
                .cloned()
        },
    )
    .await
}

/// Runs one case on the lease backend `backend_args` (`--consul URL` or `--etcd URL`).
async fn paused_holder(test: &str, backend_args: &[String], case: Case) {
    let db = TestDb::create(test).await;
    let client = db.connect_for_fenced_writes().await;

    let mut run = Run::new("postgres-fence", test, WRITER.as_ref());
    let mut common: Vec<String> = backend_args.to_vec();
    for arg in [
        "--key",
        KEY,
        "--postgres",
        db.url(),
        "--ttl",
        &TTL_SECS.to_string(),
        "--lock-delay",
        "0",
    ] {
        common.push(arg.to_owned());
    }
    let mut a_args = common.clone();
    a_args.extend([
        "--stop-at".to_owned(),
        STOP_AT.to_string(),
        "--stop-where".to_owned(),
    ]);
    a_args.push(match case {
        Case::BeforeFence => "before-fence".to_owned(),
        Case::AfterFenceIdleTimeout | Case::AfterFenceHeld => "after-fence".to_owned(),
    });
    if case == Case::AfterFenceIdleTimeout {
        a_args.extend([
            "--idle-in-transaction-timeout-ms".to_owned(),
            IDLE_TIMEOUT_MS.to_string(),
        ]);
    }

    // A holds the lease first; B starts once A has it, and waits.
    let a = run.spawn("a", &a_args);
    let a_acquired = line_of(&run, a, Kind::Acquired, "", START).await;
    let b = run.spawn("b", &common);
    let a_seq: Sequencer = a_acquired.seq.parse().unwrap();

    // A stops itself at its third transaction.
    line_of(&run, a, Kind::Other("stopping".into()), "", START).await;
    let a_pid = run.pid(a);
    wait_for(
        STEP,
        || format!("pid {a_pid} to be stopped"),
        || is_stopped(a_pid).then_some(()),
    )
    .await;
    let stopped = now_ns();
    run.assert_alive();

    // A's session expires; B acquires the lease.
    let b_acquired = line_of(&run, b, Kind::Acquired, "", TAKEOVER).await;
    let b_seq: Sequencer = b_acquired.seq.parse().unwrap();
    assert!(
        b_seq.index() > a_seq.index(),
        "B's index {} is not above A's {}",
        b_seq.index(),
        a_seq.index()
    );
    match case {
        // B commits while A is still stopped.
        Case::BeforeFence | Case::AfterFenceIdleTimeout => {
            line_of(&run, b, Kind::Write, "", STEP).await;
        }
        // B waits at the fence for A's open transaction.
        Case::AfterFenceHeld => {
            wait_for_async(
                STEP,
                || format!("B to wait for A's row lock; {}", run.files()),
                || async {
                    let waiting: i64 = client
                        .query_one(
                            "SELECT count(*) FROM pg_stat_activity \
                             WHERE datname = current_database() AND wait_event_type = 'Lock'",
                            &[],
                        )
                        .await
                        .unwrap()
                        .get(0);
                    (waiting > 0).then_some(())
                },
            )
            .await;
            let b_pid = run.pid(b);
            assert!(
                run.history(&[b])
                    .of_pid(b_pid)
                    .all(|l| l.kind != Kind::Write),
                "B wrote while A held the fence's row lock; {}",
                run.files()
            );
        }
    }
    assert!(is_stopped(a_pid), "A was resumed by something else");
    let resumed = now_ns();
    signal("CONT", &[a_pid]);

    // A's stopped transaction ends: refused, failed, or committed.
    let outcome = outcome_of(&run, a, STOP_AT, STEP).await;
    if case == Case::AfterFenceHeld {
        // B's wait ends with A's commit, and B commits after it.
        line_of(&run, b, Kind::Write, "", STEP).await;
    }
    run.terminate_all().await.unwrap();

    // The verdict, from the table.
    let rows = rows(&client).await;
    let backwards: Vec<(&Row, &Row)> = rows
        .windows(2)
        .filter(|w| w[1].index < w[0].index)
        .map(|w| (&w[0], &w[1]))
        .collect();
    let a_index = i64::try_from(a_seq.index()).unwrap();
    let b_index = i64::try_from(b_seq.index()).unwrap();
    let stopped_row = rows
        .iter()
        .find(|r| r.pid == i64::from(a_pid) && r.attempt == STOP_AT);
    let a_rows = rows.iter().filter(|r| r.index == a_index).count();
    let b_rows: Vec<&Row> = rows.iter().filter(|r| r.index == b_index).collect();
    let report = format!(
        "{test}: A (index {a_index}) stopped {:.1} s; B (index {b_index}) {} rows; A's stopped \
         transaction: {} {}; A's rows {a_rows}; rows going back to a lower index: {}",
        (resumed - stopped) as f64 / 1e9,
        b_rows.len(),
        outcome.kind,
        outcome.detail,
        backwards.len()
    );
    println!("{report}");
    let mut problems = Vec::new();
    if !backwards.is_empty() {
        problems.push(format!("rows went back to a lower index: {backwards:?}"));
    }
    if b_rows.is_empty() {
        problems.push("B committed nothing".to_owned());
    }
    if rows
        .iter()
        .any(|r| r.holder != a_seq.holder() && r.holder != b_seq.holder())
    {
        problems.push("a row of an unknown holder".to_owned());
    }
    // A's transactions before the stopped one committed.
    if a_rows < usize::try_from(STOP_AT - 1).unwrap() {
        problems.push(format!("A committed {a_rows} rows before it stopped"));
    }
    match case {
        Case::BeforeFence => {
            if outcome.kind != Kind::Other("refused".into())
                || !outcome.detail.contains("LF001") && !outcome.detail.contains("stale")
            {
                problems.push(format!(
                    "A's transaction was not refused as stale: {outcome}"
                ));
            }
            if let Some(row) = stopped_row {
                problems.push(format!("the stopped transaction committed: {row:?}"));
            }
        }
        Case::AfterFenceIdleTimeout => {
            if outcome.kind != Kind::Other("failed".into()) {
                problems.push(format!("A's transaction did not fail: {outcome}"));
            }
            if let Some(row) = stopped_row {
                problems.push(format!("the stopped transaction committed: {row:?}"));
            }
        }
        Case::AfterFenceHeld => match stopped_row {
            // Committed, and ordered before every row of B's.
            Some(row) if b_rows.iter().all(|b| b.id > row.id) => {}
            other => problems.push(format!(
                "the stopped transaction was not committed before B's rows: {other:?}"
            )),
        },
    }
    if !problems.is_empty() {
        run.keep = true;
        panic!(
            "{report}\n{}\nrows: {rows:?}\nhistories:\n{}\n({})",
            problems.join("\n"),
            run.all().around(stopped, 40),
            run.files()
        );
    }
    drop(db);
}

async fn consul_case(test: &str, case: Case) {
    let agent = Agent::start().await;
    paused_holder(test, &["--consul".to_owned(), agent.url()], case).await;
}

#[tokio::test]
async fn consul_a_holder_paused_before_its_fence_is_refused_after_the_next_commits() {
    consul_case("consul_before_fence", Case::BeforeFence).await;
}

#[tokio::test]
async fn consul_a_holder_paused_after_its_fence_loses_its_session_to_the_idle_timeout() {
    consul_case("consul_after_fence_timeout", Case::AfterFenceIdleTimeout).await;
}

#[tokio::test]
async fn consul_a_holder_paused_after_its_fence_is_ordered_before_the_next() {
    consul_case("consul_after_fence_held", Case::AfterFenceHeld).await;
}

#[tokio::test]
async fn etcd_a_holder_paused_before_its_fence_is_refused_after_the_next_commits() {
    let server = lease_tests::etcd::Server::start().await;
    paused_holder(
        "etcd_before_fence",
        &["--etcd".to_owned(), server.url()],
        Case::BeforeFence,
    )
    .await;
}
