//! Lease promises proved with real child processes (`lease-worker`), real Consul, RabbitMQ,
//! etcd and PostgreSQL, and judged from the histories the processes write (`lease_tests::history`).
//!
//! Faults are real: SIGSTOP/SIGCONT/SIGTERM sent with `kill`, keys deleted on the agent, a
//! database closed to connections (`LEASE_PG_OUTAGE_SECS=20` for the full outage). Every wait
//! is bounded; the only sleep holds a pause for its length. The tests take turns (one lock), so
//! their timings do not disturb each other on a small machine; the file takes a few minutes.
//! Histories are kept under `target/process-edges/` when a test fails (the path is printed).
//!
//! ```sh
//! cargo test -p lease-tests --test process_edges -- --nocapture   # prints the measured figures
//! ```
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use lease_core::Sequencer;
use lease_tests::consul::Agent;
use lease_tests::history::{History, Kind, Line, gap_percentiles};
use lease_tests::overlap::now_ns;
use lease_tests::stats::percentile;
use lease_tests::workers::{Run, signal, wait_for, wait_for_async};
use tokio::time::Instant;

const WORKER: &str = env!("CARGO_BIN_EXE_lease-worker");

/// The tests take turns: each starts dozens of processes on a machine that may have two cores.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// How many independent keys (each with its own pair of workers) one fault is repeated on.
const PAIRS: usize = 20;
/// How long the holders stay stopped: more than the Consul TTL below (10 s), and more than three
/// AMQP heartbeats (3 s), so RabbitMQ has dropped the frozen connection and handed the slot on.
const PAUSE: Duration = Duration::from_secs(13);
const CONSUL_TTL_SECS: u64 = 10;
const AMQP_HEARTBEAT_SECS: u64 = 3;
/// Generous bounds for a loaded two-core machine.
const START: Duration = Duration::from_secs(90);
const STEP: Duration = Duration::from_secs(30);

/// Waits for worker `who`'s first write and returns the session of the lease it wrote under.
async fn first_write_session(run: &Run, who: usize, what: &str) -> String {
    let seq = wait_for(
        START,
        || format!("{what}'s first write; {}", run.files()),
        || {
            run.history(&[who])
                .first(run.pid(who), &Kind::Write)
                .map(|l| l.seq.clone())
        },
    )
    .await;
    seq.parse::<Sequencer>().unwrap().holder().to_owned()
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| (*s).to_owned()).collect()
}

fn ms(ns: i128) -> f64 {
    ns as f64 / 1e6
}

/// `text` with every number replaced by `#`, to count loss reasons that carry durations.
fn without_numbers(text: &str) -> String {
    let mut out = String::new();
    let mut in_number = false;
    for c in text.chars() {
        if c.is_ascii_digit() || (in_number && c == '.') {
            if !in_number {
                out.push('#');
            }
            in_number = true;
        } else {
            in_number = false;
            out.push(c);
        }
    }
    out
}

fn summary(samples: &[f64]) -> String {
    if samples.is_empty() {
        return "no samples".to_owned();
    }
    format!(
        "p50 {:.1} / p99 {:.1} / max {:.1} ms over {}",
        percentile(samples, 50.0),
        percentile(samples, 99.0),
        samples.iter().copied().fold(f64::MIN, f64::max),
        samples.len()
    )
}

// ---------------------------------------------------------------------------------------------
// a, b: a frozen holder

/// What one pair's histories showed after its holder was frozen.
#[derive(Debug, Default)]
struct PauseFindings {
    violations: Vec<String>,
    /// (key, instant) to print the interleaving around.
    around: Vec<(usize, u128)>,
    stale: usize,
    late: usize,
    /// Frozen holders' first writes after SIGCONT that were past the deadline (exempt).
    resumed: usize,
    released_ok: usize,
    lost_reasons: BTreeMap<String, usize>,
    takeover_after_cont_ms: Vec<f64>,
}

/// Starts a pair of loop workers on each key, freezes every key's holder for [`PAUSE`], and
/// judges: no stale writes, no write by a frozen holder past its fencing deadline (at the latest
/// `stopped + fence_bound`), and `release()` of the lease lost while frozen reports the loss.
///
/// A holder frozen between its `is_held()` check and its write makes that one write after
/// SIGCONT; no library can prevent it, so each frozen holder's first write after SIGCONT is
/// exempt and counted apart (`History::without_resumed_writes`, as the chaos checker does). A
/// second write is judged: a holder that did not self-fence is caught by it.
async fn frozen_holders(
    test: &str,
    backend_args: &[String],
    keys: &[String],
    fence_bound: Duration,
) {
    let mut run = Run::new("process-edges", test, WORKER.as_ref());
    let mut pairs = Vec::new();
    for (k, key) in keys.iter().enumerate() {
        let mut args = backend_args.to_vec();
        args.extend(strings(&["--key", key, "--lock-delay", "0"]));
        let a = run.spawn(&format!("k{k:02}-a"), &args);
        let b = run.spawn(&format!("k{k:02}-b"), &args);
        pairs.push((a, b));
    }

    // Each key's holder is the worker that writes; the other waits in acquire.
    let holders: Vec<(usize, usize, String)> = wait_for(
        START,
        || format!("every key's holder to write; {}", run.files()),
        || {
            let mut found = Vec::new();
            for &(a, b) in &pairs {
                let h = run.history(&[a, b]);
                let writers: HashSet<u32> = h
                    .lines()
                    .iter()
                    .filter(|l| l.kind == Kind::Write)
                    .map(|l| l.pid)
                    .collect();
                let waiting = h.lines().iter().filter(|l| l.kind == Kind::Waiting).count();
                if writers.len() != 1 || waiting < 2 {
                    return None;
                }
                let (holder, other) = if writers.contains(&run.pid(a)) {
                    (a, b)
                } else {
                    (b, a)
                };
                let seq = h
                    .lines()
                    .iter()
                    .find(|l| l.kind == Kind::Write)
                    .map(|l| l.seq.clone())?;
                found.push((holder, other, seq));
            }
            Some(found)
        },
    )
    .await;
    run.assert_alive();

    let frozen: Vec<u32> = holders.iter().map(|(h, _, _)| run.pid(*h)).collect();
    let stopped = now_ns();
    signal("STOP", &frozen);
    // Holding the pause, not judging by it.
    tokio::time::sleep(PAUSE).await;
    let resumed = now_ns();
    signal("CONT", &frozen);

    // Until each pair's other worker has written and the frozen one has logged its loss or has
    // stopped writing for a second. Not finishing is itself a finding, reported below.
    let settle_deadline = Instant::now() + Duration::from_secs(60);
    let mut unsettled = Vec::new();
    loop {
        unsettled.clear();
        let now = now_ns();
        for (k, (holder, other, seq)) in holders.iter().enumerate() {
            let h = run.history(&[*holder, *other]);
            // The next holder may be either process (the frozen one can win the key back).
            let other_wrote = h
                .lines()
                .iter()
                .any(|l| l.kind == Kind::Write && l.seq != *seq);
            let lost = h.of_seq(seq).any(|l| l.kind == Kind::Lost);
            let last_write = h
                .of_seq(seq)
                .filter(|l| l.kind == Kind::Write)
                .map(|l| l.t)
                .max()
                .unwrap_or(0);
            let quiet = now.saturating_sub(last_write) > 1_000_000_000;
            if !(other_wrote && (lost || quiet)) {
                unsettled.push((k, other_wrote, lost, quiet));
            }
        }
        if unsettled.is_empty() || Instant::now() >= settle_deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    run.assert_alive();
    let shutdown = run.terminate_all().await;

    let mut f = PauseFindings::default();
    for (k, other_wrote, lost, quiet) in &unsettled {
        f.violations.push(format!(
            "key {k}: 60 s after SIGCONT {} and the frozen holder has {}",
            if *other_wrote {
                "a new holder has written"
            } else {
                "no new holder has written"
            },
            match (lost, quiet) {
                (false, false) =>
                    "neither reported a loss nor stopped writing (it did not self-fence)",
                (false, true) => "stopped writing without reporting a loss",
                _ => "reported its loss",
            }
        ));
    }
    let fence = stopped + fence_bound.as_nanos();
    let mut released_ok_keys = Vec::new();
    for (k, (holder, other, seq)) in holders.iter().enumerate() {
        let all = run.history(&[*holder, *other]);
        let (h, exempt) = all.without_resumed_writes(&[(run.pid(*holder), resumed)]);
        f.resumed += exempt.iter().filter(|w| w.t > fence).count();
        for w in h.stale_writes() {
            f.stale += 1;
            if f.stale <= 5 {
                f.violations.push(format!("key {k}: stale write: {w}"));
                f.around.push((k, w.t));
            }
        }
        let over = h.max_concurrent_writers(1);
        if over.exceeds_limit() {
            f.violations.push(format!("key {k}: {over}"));
        }
        let late = h.writes_after(seq, fence);
        if let Some(first) = late.first() {
            f.late += late.len();
            f.violations.push(format!(
                "key {k}: the frozen holder (pid {}) wrote {} times under {seq} past its fencing \
                 deadline (stopped + {fence_bound:?}), the first {:.1} ms after SIGCONT",
                run.pid(*holder),
                late.len(),
                ms(first.t as i128 - resumed as i128)
            ));
            f.around.push((k, first.t));
        }
        if let Some(lost) = h.of_seq(seq).find(|l| l.kind == Kind::Lost) {
            *f.lost_reasons
                .entry(without_numbers(&lost.detail))
                .or_default() += 1;
        }
        if h.of_seq(seq)
            .any(|l| l.kind == Kind::Released && l.detail.starts_with("ok"))
        {
            f.released_ok += 1;
            released_ok_keys.push(k.to_string());
        }
        if let Some(first) = h
            .lines()
            .iter()
            .find(|l| l.kind == Kind::Write && l.t > stopped && l.seq != *seq)
        {
            f.takeover_after_cont_ms
                .push(ms(first.t as i128 - resumed as i128));
        }
    }
    if !released_ok_keys.is_empty() {
        f.violations.push(format!(
            "keys {}: release() answered `Ok` for the lease lost while its holder was frozen \
             (the history says `released <seq> ok` after `lost`); it must report the loss",
            released_ok_keys.join(", ")
        ));
    }
    if let Err(e) = shutdown {
        f.violations.push(e);
    }

    println!(
        "process_edges::{test}: {} keys, holders frozen {PAUSE:?}; stale writes {}, writes past \
         the fencing deadline {} (and {} first writes after SIGCONT, exempt), `released ok` for the lost lease {}; loss reasons {:?}; the \
         next holder's first write, from SIGCONT: {}",
        keys.len(),
        f.stale,
        f.late,
        f.resumed,
        f.released_ok,
        f.lost_reasons,
        summary(&f.takeover_after_cont_ms)
    );
    if !f.violations.is_empty() {
        run.keep = true;
        let mut report = f.violations.join("\n");
        let mut shown = HashSet::new();
        for (k, t) in f.around.iter().filter(|(k, _)| shown.insert(*k)).take(3) {
            let (holder, other, _) = &holders[*k];
            report.push_str(&format!(
                "\n--- key {k} around {t}:\n{}",
                run.history(&[*holder, *other]).around(*t, 8)
            ));
        }
        panic!(
            "{} violation(s) with frozen holders ({}):\n{report}",
            f.violations.len(),
            run.files()
        );
    }
}

#[tokio::test]
async fn a_paused_holder_writes_nothing_after_its_fence_deadline() {
    let _serial = SERIAL.lock().await;
    let agent = Agent::start().await;
    let backend = strings(&[
        "--consul",
        &agent.url(),
        "--ttl",
        &CONSUL_TTL_SECS.to_string(),
    ]);
    let keys: Vec<String> = (0..PAIRS).map(|k| format!("edges/pause/{k}")).collect();
    // The holder self-fences at its last confirmation + TTL − margin; its last confirmation was
    // before SIGSTOP, so any write later than SIGSTOP + TTL is past the deadline.
    frozen_holders(
        "consul_pause",
        &backend,
        &keys,
        Duration::from_secs(CONSUL_TTL_SECS),
    )
    .await;
}

#[tokio::test]
async fn amqp_a_paused_holder_writes_nothing_after_its_fence_deadline() {
    let _serial = SERIAL.lock().await;
    lease_tests::amqp::require_broker().await;
    let base = lease_tests::amqp::url();
    let sep = if base.contains('?') { '&' } else { '?' };
    // lease-core's Amqp takes the heartbeat from the URL; it self-fences at 3/4 of it.
    let url = format!("{base}{sep}heartbeat={AMQP_HEARTBEAT_SECS}");
    let backend = strings(&["--amqp", &url]);
    let keys: Vec<String> = (0..PAIRS)
        .map(|_| lease_tests::amqp::unique("edges-pause"))
        .collect();
    let result = tokio::spawn({
        let keys = keys.clone();
        async move {
            frozen_holders(
                "amqp_pause",
                &backend,
                &keys,
                Duration::from_secs(AMQP_HEARTBEAT_SECS),
            )
            .await;
        }
    })
    .await;
    let (admin, _) = lease_tests::amqp::backend();
    for key in &keys {
        if let Err(e) = admin.admin().destroy(key).await {
            eprintln!("could not destroy the semaphore {key}: {e}");
        }
    }
    if let Err(e) = result {
        std::panic::resume_unwind(e.into_panic());
    }
}

/// The TTL of the PostgreSQL and etcd leases of the frozen-process tests (the shortest the spec
/// allows); [`PAUSE`] is longer.
const PAUSED_TTL_SECS: u64 = 10;

/// Issue 33, break 7: a holder process frozen past its TTL (SIGSTOP, then SIGCONT) while the
/// backend is fine must name the pause as the reason of its loss, not an unreachable backend.
///
/// Two loop workers on one key; the holder is frozen for [`PAUSE`]. The other one acquiring the
/// key meanwhile shows that the backend answered throughout. Judged from the frozen worker's
/// history: its `lost` line for the frozen lease.
async fn a_frozen_process_names_the_pause(test: &str, backend_args: &[String]) {
    let mut run = Run::new("process-edges", test, WORKER.as_ref());
    let mut args = backend_args.to_vec();
    args.extend(strings(&[
        "--key",
        &format!("edges/{test}"),
        "--ttl",
        &PAUSED_TTL_SECS.to_string(),
        "--lock-delay",
        "0",
    ]));
    let a = run.spawn("a", &args);
    let b = run.spawn("b", &args);
    let (holder, other, seq) = wait_for(
        START,
        || format!("a holder's first write; {}", run.files()),
        || {
            let h = run.history(&[a, b]);
            let write = h.lines().iter().find(|l| l.kind == Kind::Write)?;
            let holder = if write.pid == run.pid(a) { a } else { b };
            let other = if holder == a { b } else { a };
            Some((holder, other, write.seq.clone()))
        },
    )
    .await;
    run.assert_alive();

    let stopped = now_ns();
    signal("STOP", &[run.pid(holder)]);
    let taken_over = wait_for(
        PAUSE + STEP,
        || {
            format!(
                "the other worker to write while the holder is frozen; {}",
                run.files()
            )
        },
        || {
            run.history(&[other])
                .lines()
                .iter()
                .find(|l| l.kind == Kind::Write && l.t > stopped)
                .map(|l| l.t)
        },
    )
    .await;
    // Holding the pause, not judging by it.
    let frozen_for = Duration::from_nanos((now_ns() - stopped) as u64);
    tokio::time::sleep(PAUSE.saturating_sub(frozen_for)).await;
    let resumed = now_ns();
    signal("CONT", &[run.pid(holder)]);

    let lost = wait_for(
        STEP,
        || {
            format!(
                "the resumed holder to log the loss of {seq}; {}",
                run.files()
            )
        },
        || {
            run.history(&[holder])
                .of_seq(&seq)
                .find(|l| l.kind == Kind::Lost)
                .cloned()
        },
    )
    .await;
    run.assert_alive();
    let shutdown = run.terminate_all().await;
    println!(
        "RESULT process_edges::{test}: holder frozen {:.1} s (the other worker wrote {:.1} s \
         after SIGSTOP); loss logged {:.1} ms after SIGCONT: {}",
        ms((resumed - stopped) as i128) / 1e3,
        ms((taken_over - stopped) as i128) / 1e3,
        ms(lost.t as i128 - resumed as i128),
        lost.detail
    );
    let names_it = lost.detail.starts_with(PAUSE_NAMED);
    judge_pause_named(&mut run, "holder's loss", &lost.detail, names_it, shutdown);
}

/// How a loss found because this process was paused begins (`LostReason::ProcessPaused`).
const PAUSE_NAMED: &str = "this process was paused for at least ";

/// The verdict of a frozen-process test: what the resumed process logged (`detail`, the `what`)
/// names the pause (`names_it`) and not the backend, and the workers stopped cleanly; else the
/// test fails with the run's files kept.
fn judge_pause_named(
    run: &mut Run,
    what: &str,
    detail: &str,
    names_it: bool,
    shutdown: Result<(), String>,
) {
    if !names_it || detail.contains("unreachable") {
        run.keep = true;
        panic!(
            "the frozen {what} does not name the pause: {detail:?}\n{}",
            run.files()
        );
    }
    if let Err(e) = shutdown {
        run.keep = true;
        panic!("{e}");
    }
}

#[tokio::test]
async fn postgres_a_frozen_process_names_the_pause_not_the_backend() {
    let _serial = SERIAL.lock().await;
    let db = lease_tests::postgres::TestDb::create("process_edges_pause").await;
    let backend = strings(&["--postgres", db.url()]);
    a_frozen_process_names_the_pause("postgres_frozen_process", &backend).await;
}

#[tokio::test]
async fn etcd_a_frozen_process_names_the_pause_not_the_backend() {
    let _serial = SERIAL.lock().await;
    let server = lease_tests::etcd::Server::start().await;
    let backend = strings(&["--etcd", &server.url()]);
    a_frozen_process_names_the_pause("etcd_frozen_process", &backend).await;
}

/// The same for a waiter: frozen past its TTL while it waits in `acquire`, it finds the fence of
/// its waiting session (Consul) or pooled lease (etcd) passed when it resumes, and the acquire's
/// error names the pause.
async fn a_frozen_waiter_names_the_pause(test: &str, backend_args: &[String]) {
    let mut run = Run::new("process-edges", test, WORKER.as_ref());
    let mut args = backend_args.to_vec();
    args.extend(strings(&[
        "--key",
        &format!("edges/{test}"),
        "--ttl",
        &PAUSED_TTL_SECS.to_string(),
    ]));
    let a = run.spawn("a", &args);
    let b = run.spawn("b", &args);
    let waiter = wait_for(
        START,
        || format!("a holder's first write and a waiter; {}", run.files()),
        || {
            let h = run.history(&[a, b]);
            let write = h.lines().iter().find(|l| l.kind == Kind::Write)?;
            let waiter = if write.pid == run.pid(a) { b } else { a };
            run.history(&[waiter])
                .first(run.pid(waiter), &Kind::Waiting)
                .map(|_| waiter)
        },
    )
    .await;
    run.assert_alive();
    signal("STOP", &[run.pid(waiter)]);
    // Holding the pause, not judging by it.
    tokio::time::sleep(PAUSE).await;
    let resumed = now_ns();
    signal("CONT", &[run.pid(waiter)]);
    let error = wait_for(
        STEP,
        || {
            format!(
                "the resumed waiter to report its acquire's end; {}",
                run.files()
            )
        },
        || {
            run.history(&[waiter])
                .lines()
                .iter()
                .find(|l| l.kind == Kind::Other("error".to_owned()) && l.t > resumed)
                .cloned()
        },
    )
    .await;
    run.assert_alive();
    let shutdown = run.terminate_all().await;
    println!(
        "RESULT process_edges::{test}: waiter frozen {PAUSE:?}; {:.1} ms after SIGCONT: {}",
        ms(error.t as i128 - resumed as i128),
        error.detail
    );
    // The acquire's error wraps the loss's text.
    let names_it = error.detail.contains(PAUSE_NAMED);
    judge_pause_named(
        &mut run,
        "waiter's error",
        &error.detail,
        names_it,
        shutdown,
    );
}

#[tokio::test]
async fn etcd_a_frozen_waiter_names_the_pause_not_the_backend() {
    let _serial = SERIAL.lock().await;
    let server = lease_tests::etcd::Server::start().await;
    let backend = strings(&["--etcd", &server.url()]);
    a_frozen_waiter_names_the_pause("etcd_frozen_waiter", &backend).await;
}

#[tokio::test]
async fn consul_a_frozen_waiter_names_the_pause_not_the_backend() {
    let _serial = SERIAL.lock().await;
    let agent = Agent::start().await;
    let backend = strings(&["--consul", &agent.url()]);
    a_frozen_waiter_names_the_pause("consul_frozen_waiter", &backend).await;
}

// ---------------------------------------------------------------------------------------------
// c: an operator deletes keys

/// The sequencer currently writing: the latest to begin, with at least `writes` writes, not in
/// `done`.
fn current_writer(h: &History, writes: usize, done: &HashSet<String>) -> Option<(String, u128)> {
    h.spans()
        .into_iter()
        .rev()
        .find(|s| s.writes >= writes && !done.contains(&s.seq))
        .map(|s| (s.seq, s.first))
}

#[tokio::test]
async fn deleting_the_leader_key_never_lets_two_leaders_write() {
    let _serial = SERIAL.lock().await;
    let agent = Agent::start().await;
    let key = "edges/delete/leader";
    let mut run = Run::new("process-edges", "delete_leader", WORKER.as_ref());
    let args = strings(&[
        "--consul",
        &agent.url(),
        "--key",
        key,
        "--ttl",
        "10",
        "--lock-delay",
        "0",
    ]);
    run.spawn("w0", &args);
    run.spawn("w1", &args);

    let mut deleted: HashSet<String> = HashSet::new();
    let mut reelection_ms = Vec::new();
    let mut last_delete = None;
    let mut actions = Vec::new();
    for round in 0..20 {
        let (seq, first) = wait_for(
            STEP,
            || format!("a holder's writes before delete {round}; {}", run.files()),
            || current_writer(&run.all(), 3, &deleted),
        )
        .await;
        if let Some(at) = last_delete {
            reelection_ms.push(ms(first as i128 - at as i128));
        }
        run.assert_alive();
        last_delete = Some(now_ns());
        agent.delete_key(key).await;
        actions.push((
            last_delete.unwrap(),
            format!("delete {key} (held by {seq})"),
        ));
        deleted.insert(seq);
    }
    // The 20th deletion's successor.
    let (_, first) = wait_for(
        STEP,
        || format!("a holder after the last delete; {}", run.files()),
        || current_writer(&run.all(), 1, &deleted),
    )
    .await;
    reelection_ms.push(ms(first as i128 - last_delete.unwrap() as i128));
    run.assert_alive();
    let shutdown = run.terminate_all().await;

    let h = run.all();
    let over = h.max_concurrent_writers(1);
    let stale = h.stale_writes();
    let gaps = h.handoff_gaps();
    let (p50, p99) = gap_percentiles(&gaps);
    println!(
        "process_edges::delete_leader: 20 deletions; max concurrent writers {}, stale writes {}; \
         delete → next holder's first write: {}; hand-off gap p50 {p50:.2} / p99 {p99:.2} ms",
        over.count,
        stale.len(),
        summary(&reelection_ms)
    );
    judge(
        &mut run,
        &h,
        &over,
        &stale,
        &actions,
        shutdown,
        "deleting the leader key",
    );
}

#[tokio::test]
async fn deleting_semaphore_keys_never_lets_more_than_the_limit_write() {
    let _serial = SERIAL.lock().await;
    let agent = Agent::start().await;
    let prefix = "edges/delete/sem";
    let limit = 3;
    let mut run = Run::new("process-edges", "delete_semaphore", WORKER.as_ref());
    // Holders give their slot back every 400 ms, so there is always a next holder to wait for.
    let args = strings(&[
        "--consul",
        &agent.url(),
        "--key",
        prefix,
        "--limit",
        "3",
        "--ttl",
        "10",
        "--lock-delay",
        "0",
        "--hold-ms",
        "400",
    ]);
    for w in 0..5 {
        run.spawn(&format!("w{w}"), &args);
    }
    wait_for(
        START,
        || format!("{limit} holders to write; {}", run.files()),
        || (run.all().spans().len() >= limit).then_some(()),
    )
    .await;

    let mut lock_deletes = 0;
    let mut contender_deletes = 0;
    let mut victims: HashSet<String> = HashSet::new();
    let mut next_holder_ms = Vec::new();
    let mut actions = Vec::new();
    for round in 0..40 {
        run.assert_alive();
        // Each delete meets a full semaphore: `limit` holders writing now (within 50 ms, no loss
        // or release logged).
        let active = wait_for(
            STEP,
            || {
                format!(
                    "{limit} holders writing before delete {round}; {}",
                    run.files()
                )
            },
            || {
                let h = run.all();
                let now = now_ns();
                let active: Vec<_> = h
                    .spans()
                    .into_iter()
                    .filter(|s| {
                        now.saturating_sub(s.last) < 50_000_000
                            && !h
                                .of_seq(&s.seq)
                                .any(|l| matches!(l.kind, Kind::Lost | Kind::Released))
                    })
                    .collect();
                (active.len() >= limit).then_some(active)
            },
        )
        .await;
        let deleted_at = now_ns();
        if round % 2 == 0 {
            agent.delete_key(&format!("{prefix}/.lock")).await;
            actions.push((deleted_at, format!("delete {prefix}/.lock")));
            lock_deletes += 1;
        } else {
            let victim = active
                .into_iter()
                .find(|s| !victims.contains(&s.seq))
                .unwrap_or_else(|| {
                    panic!(
                        "every writing holder had its contender key deleted before and writes \
                         on; {}",
                        run.files()
                    )
                });
            let contender = victim
                .seq
                .parse::<Sequencer>()
                .unwrap_or_else(|e| panic!("{e}"))
                .key()
                .to_owned();
            assert!(
                contender.starts_with(&format!("{prefix}/")),
                "a semaphore sequencer names the contender key <prefix>/<session>: {}",
                victim.seq
            );
            agent.delete_key(&contender).await;
            actions.push((
                deleted_at,
                format!(
                    "delete the contender key of pid {} ({})",
                    victim.pid, victim.seq
                ),
            ));
            victims.insert(victim.seq);
            contender_deletes += 1;
        }
        // The next holder: a sequencer whose first write follows the delete.
        let first = wait_for(
            STEP,
            || format!("a holder after delete {round}; {}", run.files()),
            || {
                run.all()
                    .spans()
                    .into_iter()
                    .find(|s| s.first > deleted_at)
                    .map(|s| s.first)
            },
        )
        .await;
        next_holder_ms.push(ms(first as i128 - deleted_at as i128));
    }
    run.assert_alive();
    let shutdown = run.terminate_all().await;

    let h = run.all();
    let over = h.max_concurrent_writers(limit);
    let stale = h.stale_writes_shared(limit);
    let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
    for l in h.lines().iter().filter(|l| l.kind == Kind::Lost) {
        *reasons.entry(without_numbers(&l.detail)).or_default() += 1;
    }
    println!(
        "process_edges::delete_semaphore: limit {limit}, 5 workers, {lock_deletes} `.lock` and \
         {contender_deletes} contender-key deletions, {} holders in all; max concurrent writers {}, \
         stale writes {}; delete → a new holder's first write: {}; losses {reasons:?}",
        h.spans().len(),
        over.count,
        stale.len(),
        summary(&next_holder_ms)
    );
    judge(
        &mut run,
        &h,
        &over,
        &stale,
        &actions,
        shutdown,
        "deleting the semaphore's keys",
    );
}

/// Fails with the details and the interleaving around the first violation, if any.
fn judge(
    run: &mut Run,
    h: &History,
    over: &lease_tests::history::Overlap,
    stale: &[lease_tests::history::StaleWrite],
    actions: &[(u128, String)],
    shutdown: Result<(), String>,
    what: &str,
) {
    let mut problems = Vec::new();
    let mut at = None;
    if over.exceeds_limit() {
        problems.push(over.to_string());
        at = Some(over.at);
    }
    if !stale.is_empty() {
        problems.push(format!("{} stale write(s); the first:", stale.len()));
        for w in stale.iter().take(5) {
            problems.push(format!("  {w}"));
        }
        at = Some(stale[0].t);
    }
    if let Err(e) = shutdown {
        problems.push(e);
    }
    if problems.is_empty() {
        return;
    }
    run.keep = true;
    let around = at.map_or_else(String::new, |t| {
        let cause = actions.iter().rev().find(|(at, _)| *at <= t).map_or_else(
            String::new,
            |(at, action)| {
                format!(
                    "\nthe last operator action before it, {:.1} ms earlier: {action}",
                    ms(t as i128 - *at as i128)
                )
            },
        );
        format!(
            "{cause}\n--- the merged histories around {t}:\n{}",
            h.around(t, 10)
        )
    });
    panic!("{what}: {}{around}\n({})", problems.join("\n"), run.files());
}

// ---------------------------------------------------------------------------------------------
// d: ways out of a process

/// How many times each way out is tried: the leak is a race between the process's last moments
/// and the lease's background release, so one try can miss it.
const EXIT_TRIES: usize = 5;

/// The sessions on the agent that are not in `known`, once there is at least one.
async fn new_sessions(agent: &Agent, known: &[String], what: &str, run: &Run) -> Vec<String> {
    wait_for_async(
        START,
        || format!("{what}; {}", run.files()),
        || async {
            let fresh: Vec<String> = agent
                .sessions()
                .await
                .into_iter()
                .filter(|s| !known.contains(s))
                .collect();
            (!fresh.is_empty()).then_some(fresh)
        },
    )
    .await
}

/// The holder runs in `mode` with Consul's defaults (TTL 15 s, lock-delay 15 s), a follower
/// waits; SIGTERM the holder; the follower must be elected within a second of the holder's exit.
/// A session left behind would show as a wait of 15 s or more. Tried [`EXIT_TRIES`] times, each
/// on its own key; the first failure fails the test.
async fn exit_handoff(mode: &str) {
    let agent = Agent::start().await;
    let mut run = Run::new("process-edges", &format!("exit_{mode}"), WORKER.as_ref());
    let mut handoffs = Vec::new();
    for attempt in 0..EXIT_TRIES {
        let key = format!("edges/exit/{mode}/{attempt}");
        let base = strings(&["--consul", &agent.url(), "--key", &key]);
        let mut holder_args = base.clone();
        holder_args.extend(strings(&["--mode", mode]));
        let holder = run.spawn(&format!("holder{attempt}"), &holder_args);
        let holder_session = first_write_session(&run, holder, &format!("the {mode} holder")).await;
        let before = agent.sessions().await;
        let follower = run.spawn(&format!("follower{attempt}"), &base);
        // The follower waits in acquire once it has a session of its own.
        new_sessions(&agent, &before, "the follower's session", &run).await;
        run.assert_alive();

        let shutdown = run.terminate(&[holder]).await;
        let exit = run
            .history(&[holder])
            .first(run.pid(holder), &Kind::Exit)
            .cloned();
        let Some(exit) = exit else {
            run.keep = true;
            panic!(
                "the {mode} holder exited without logging `exit` ({shutdown:?}); {}",
                run.files()
            );
        };
        // Bounded well below the 15 s a leaked session costs, and well above the 1 s promised.
        let limit = Duration::from_secs(5);
        let deadline = Instant::now() + limit;
        let acquired: Option<Line> = loop {
            if let Some(l) = run
                .history(&[follower])
                .first(run.pid(follower), &Kind::Acquired)
            {
                break Some(l.clone());
            }
            if Instant::now() >= deadline {
                break None;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        let sessions_left = agent.sessions().await;
        let _ = run.terminate(&[follower]).await;
        let Some(acquired) = acquired else {
            run.keep = true;
            println!(
                "process_edges::exit {mode}: try {attempt}: hand-off > {limit:?} (earlier tries: \
                 {handoffs:.1?} ms)"
            );
            let leaked = if sessions_left.contains(&holder_session) {
                format!(
                    "the exited holder's session {holder_session} is still listed, so the key \
                     stays taken until its TTL (15 s, which Consul lets run to 30 s) and \
                     lock-delay (15 s) pass"
                )
            } else {
                format!(
                    "the exited holder's session {holder_session} is gone (sessions: \
                     {sessions_left:?})"
                )
            };
            panic!(
                "exit by {mode} (try {attempt}): the follower was not elected within {limit:?} \
                 of the holder's exit; {leaked}. {}",
                run.files()
            );
        };
        let handoff = ms(acquired.t as i128 - exit.t as i128);
        handoffs.push(handoff);
        assert!(
            shutdown.is_ok(),
            "exit by {mode}: {}",
            shutdown.unwrap_err()
        );
        if handoff >= 1000.0 {
            run.keep = true;
            panic!(
                "exit by {mode} (try {attempt}): the follower was elected {handoff:.1} ms after \
                 the holder's exit (promised: under 1 s); {}",
                run.files()
            );
        }
    }
    println!(
        "process_edges::exit {mode}: holder's exit → follower acquired: {}",
        summary(&handoffs)
    );
}

#[tokio::test]
async fn exit_from_a_campaign_in_select_hands_over_within_a_second() {
    let _serial = SERIAL.lock().await;
    exit_handoff("campaign-select").await;
}

/// A process that stops the README's way (`lease_core::shutdown_signal()`, then the campaign's
/// token, then awaits it) hands over within a second of a SIGTERM, as systemd, Kubernetes and
/// `docker stop` send it.
#[tokio::test]
async fn sigterm_to_a_service_built_the_readme_s_way_hands_over_within_a_second() {
    let _serial = SERIAL.lock().await;
    exit_handoff("campaign-signal").await;
}

#[tokio::test]
async fn a_lease_dropped_at_the_end_of_main_hands_over_within_a_second() {
    let _serial = SERIAL.lock().await;
    exit_handoff("drop-at-exit").await;
}

#[tokio::test]
async fn sigterm_in_the_loop_hands_over_within_a_second() {
    let _serial = SERIAL.lock().await;
    exit_handoff("loop").await;
}

#[tokio::test]
async fn a_waiter_that_exits_leaves_no_session_behind() {
    let _serial = SERIAL.lock().await;
    let agent = Agent::start().await;
    let key = "edges/exit/waiter";
    let mut run = Run::new("process-edges", "exit_waiter", WORKER.as_ref());
    let base = strings(&["--consul", &agent.url(), "--key", key]);
    let a = run.spawn("holder", &base);
    let a_session = first_write_session(&run, a, "the holder").await;
    let mut waiter_args = base.clone();
    waiter_args.extend(strings(&["--mode", "wait-then-exit"]));
    let mut gone_ms = Vec::new();
    for attempt in 0..EXIT_TRIES {
        let b = run.spawn(&format!("waiter{attempt}"), &waiter_args);
        let b_sessions = new_sessions(
            &agent,
            std::slice::from_ref(&a_session),
            "the waiter's session",
            &run,
        )
        .await;
        run.assert_alive();
        let shutdown = run.terminate(&[b]).await;
        assert!(shutdown.is_ok(), "the waiter: {}", shutdown.unwrap_err());
        let exited = Instant::now();

        // Within 2 s of the waiter's exit, only the holder's session may be listed.
        let limit = Duration::from_secs(2);
        let left = loop {
            let sessions = agent.sessions().await;
            if sessions == [a_session.clone()] || Instant::now() >= exited + limit {
                break sessions;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        if left != [a_session.clone()] {
            run.keep = true;
            println!(
                "process_edges::exit wait-then-exit: try {attempt}: the waiter's session \
                 {b_sessions:?} still listed {:?} after its exit (earlier tries: gone after \
                 {gone_ms:.1?} ms)",
                exited.elapsed()
            );
            let _ = run.terminate_all().await;
            panic!(
                "{limit:?} after the waiting process exited (try {attempt}), Consul lists \
                 sessions {left:?}; only the holder's {a_session} may remain: the dropped acquire \
                 leaked its session {b_sessions:?} (it lives until its TTL runs out). {}",
                run.files()
            );
        }
        gone_ms.push(exited.elapsed().as_secs_f64() * 1e3);
    }
    let _ = run.terminate_all().await;
    println!(
        "process_edges::exit wait-then-exit: the waiter's session gone after its exit: {}",
        summary(&gone_ms)
    );
}

/// How many leases the process below holds when it exits: as many as a clean-up budget of one
/// second gives back on a loaded two-core machine, with room to spare (about 300 a second
/// were given back here).
const MANY: usize = 100;

/// A process that returns from `main` holding many leases exits promptly and gives them all
/// back: its runtime hands each holder's clean-up to the detached runtime, which must not build
/// a client per lease (it did: a quarter of a second of CPU each, so 2,000 leases took nine
/// minutes to exit, and 100 about 25 s).
#[tokio::test]
async fn a_process_that_exits_holding_many_leases_exits_promptly_and_gives_them_all_back() {
    use tokio::io::{AsyncBufReadExt, BufReader};

    let _serial = SERIAL.lock().await;
    let agent = Agent::start().await;
    // Started without the run, for its stdout; the run's directory takes its panic records, and
    // dropping the run fails the test on one.
    let run = Run::new("process-edges", "exit_many", WORKER.as_ref());
    let mut child = tokio::process::Command::new(WORKER)
        .env(lease_tests::panics::DIR_ENV, &run.dir)
        .args(["--consul", &agent.url(), "--key", "edges/exit/many"])
        .args([
            "--mode",
            "hold-many-drop-at-exit",
            "--count",
            &MANY.to_string(),
        ])
        .args(["--history", "/dev/null"])
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let held = lease_tests::within(START, "the worker to hold its leases", lines.next_line()).await;
    assert_eq!(held.unwrap(), Some(format!("held {MANY}")));
    let sessions = agent.sessions().await.len();
    assert!(
        sessions >= MANY,
        "{sessions} sessions listed for {MANY} leases"
    );

    signal("TERM", &[child.id().unwrap()]);
    // The clean-ups of a shutdown may hold the exit up for 1 s in all; before the fix, building
    // a client per clean-up took 6 to 25 s here.
    let limit = Duration::from_secs(4);
    let status = tokio::time::timeout(limit, child.wait()).await;
    let Ok(status) = status else {
        panic!(
            "the worker did not exit within {limit:?} of SIGTERM with {MANY} leases held; \
             {} sessions still listed",
            agent.sessions().await.len()
        );
    };
    assert!(status.unwrap().success());
    let exited = Instant::now();

    // Given back, not left to expire: the TTL is 15 s, so a leaked session would still be listed.
    let limit = Duration::from_secs(3);
    let left = loop {
        let left = agent.sessions().await.len();
        if left == 0 || exited.elapsed() >= limit {
            break left;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(
        left, 0,
        "{left} of {MANY} sessions still listed {limit:?} after the process exited: their leases \
         were not given back, and stay taken until their TTL (15 s) and lock-delay (15 s) pass"
    );
}

// ---------------------------------------------------------------------------------------------
// A database that refuses connections for a while

/// The environment variable that sets how long the database refuses connections in
/// [`a_database_that_refused_connections_has_a_leader_again_within_a_ttl_and_a_retry_pause`]
/// (whole seconds; 20 for the figure of the closing note).
const PG_OUTAGE_ENV: &str = "LEASE_PG_OUTAGE_SECS";
/// The outage without [`PG_OUTAGE_ENV`]: longer than the holder's fence (its TTL, 10 s, less a
/// tenth), so every process campaigns while the database refuses them. A holder rides out a
/// shorter outage (its renewals go through again in time), and nobody's campaign meets the
/// refusal, so a few seconds would prove nothing.
const PG_OUTAGE_DEFAULT_SECS: u64 = 12;
const PG_TTL_SECS: u64 = 10;

/// Three `lease-worker` processes campaign (the README's way) on a PostgreSQL leader key; the
/// database refuses connections (`ALTER DATABASE … ALLOW_CONNECTIONS false`, and every session
/// terminated) for [`PG_OUTAGE_DEFAULT_SECS`] (or [`PG_OUTAGE_ENV`]), then takes them again.
/// Judged from the histories: a holder runs again within one TTL plus the campaign's longest
/// retry pause (and a margin for a loaded machine) of the end of the outage, and never two at
/// once. Every campaign used to end on the refusal (SQLSTATE 55000 was taken for permanent), and
/// no process ever led again.
#[tokio::test]
async fn a_database_that_refused_connections_has_a_leader_again_within_a_ttl_and_a_retry_pause() {
    use lease_tests::postgres::TestDb;

    let _serial = SERIAL.lock().await;
    let outage_secs = match std::env::var(PG_OUTAGE_ENV) {
        Ok(secs) => secs
            .parse()
            .unwrap_or_else(|_| panic!("{PG_OUTAGE_ENV}={secs:?} is not a whole number")),
        Err(_) => PG_OUTAGE_DEFAULT_SECS,
    };
    let outage = Duration::from_secs(outage_secs);
    let db = TestDb::create("process_pg_outage").await;
    let mut run = Run::new("process-edges", "pg_outage", WORKER.as_ref());
    let args = strings(&[
        "--postgres",
        db.url(),
        "--key",
        "edges/pg-outage",
        "--ttl",
        &PG_TTL_SECS.to_string(),
        "--mode",
        "campaign-signal",
    ]);
    let workers: Vec<usize> = (0..3).map(|i| run.spawn(&format!("w{i}"), &args)).collect();
    let first = wait_for(
        START,
        || format!("a first write; {}", run.files()),
        || {
            let h = run.all();
            h.lines().iter().find(|l| l.kind == Kind::Write).cloned()
        },
    )
    .await;
    run.assert_alive();

    let terminated = db.refuse_connections().await;
    assert!(terminated >= 3, "{terminated} sessions terminated");
    // The outage itself: held for its length.
    tokio::time::sleep(outage).await;
    run.assert_alive();
    db.accept_connections().await;
    let opened = now_ns();

    let bound =
        Duration::from_secs(PG_TTL_SECS) + lease_core::leader::Campaign::DEFAULT_MAX_BACKOFF;
    let margin = Duration::from_secs(5);
    let deadline = Instant::now() + bound + margin;
    let back = loop {
        let h = run.all();
        if let Some(l) = h
            .lines()
            .iter()
            .find(|l| l.kind == Kind::Write && l.t > opened)
        {
            break Some(l.clone());
        }
        if Instant::now() >= deadline {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let Some(back) = back else {
        run.keep = true;
        panic!(
            "no process ran the leader's work within {:?} of the database taking connections \
             again (outage {outage:?}; promised: one TTL, {PG_TTL_SECS} s, plus the campaign's \
             longest retry pause, {:?}); {}",
            bound + margin,
            lease_core::leader::Campaign::DEFAULT_MAX_BACKOFF,
            run.files()
        );
    };
    let recovery_ms = ms(back.t as i128 - opened as i128);
    let elected_again = back.seq != first.seq;
    run.assert_alive();
    let shutdown = run.terminate(&workers).await;
    let overlap = run.all().max_concurrent_writers(1);
    if overlap.exceeds_limit() || shutdown.is_err() {
        run.keep = true;
    }
    assert!(!overlap.exceeds_limit(), "{overlap}; {}", run.files());
    shutdown.unwrap();
    println!(
        "RESULT pg_outage_s={outage_secs} pg_leader_back_after_outage_ms={recovery_ms:.0} \
         pg_new_term_after_outage={elected_again}"
    );
    assert!(
        recovery_ms <= (bound + margin).as_secs_f64() * 1000.0,
        "a holder ran {recovery_ms:.0} ms after the outage; {}",
        run.files()
    );
}

// ---------------------------------------------------------------------------------------------
// Failover on every backend, from real processes

/// The TTL of the failover measurement: the least a lease may have, so `kill -9` costs least.
const FAILOVER_TTL_SECS: u64 = 10;

/// The first line of `kind` by worker `who` at or after `after` (ns), waited for up to `limit`.
async fn first_after(run: &Run, who: usize, kind: Kind, after: u128, limit: Duration) -> Line {
    let pid = run.pid(who);
    wait_for(
        limit,
        || format!("worker {pid}'s first `{kind}` line; {}", run.files()),
        || {
            run.history(&[who])
                .of_pid(pid)
                .find(|l| l.kind == kind && l.t >= after)
                .cloned()
        },
    )
    .await
}

/// Failover on one backend (`backend`: its `lease-worker` flag and URL), from the histories of
/// `lease-worker` processes campaigning the README's way with a TTL of [`FAILOVER_TTL_SECS`]
/// (and, on Consul, the default lock-delay of 15 s): a holder and a follower that sees it lead;
/// SIGTERM the holder; then, with a new follower, `kill -9` the new holder. Returns the time
/// from each signal to the follower's first write, in ms. Judged against what is promised: a
/// second after a SIGTERM's exit (5 s here, from the signal, on a loaded machine), and after a
/// `kill -9` the backend's own expiry (the TTL; on Consul up to twice the TTL, plus the
/// lock-delay), with a margin.
async fn failover(name: &str, backend: &[String], kill9_bound: Duration) -> (f64, f64) {
    let mut run = Run::new(
        "process-edges",
        &format!("failover_{name}"),
        WORKER.as_ref(),
    );
    let mut args = backend.to_vec();
    args.extend(strings(&[
        "--key",
        &format!("edges/failover/{name}"),
        "--ttl",
        &FAILOVER_TTL_SECS.to_string(),
        "--mode",
        "campaign-signal",
    ]));
    let holder = run.spawn(&format!("{name}-a"), &args);
    first_after(&run, holder, Kind::Write, 0, START).await;
    let follower = run.spawn(&format!("{name}-b"), &args);
    first_after(&run, follower, Kind::Other("leader".into()), 0, START).await;
    run.assert_alive();

    let term = now_ns();
    let exited = run.terminate(&[holder]).await;
    let took_over = first_after(&run, follower, Kind::Write, term, Duration::from_secs(5)).await;
    let sigterm_ms = ms(took_over.t as i128 - term as i128);
    assert!(exited.is_ok(), "{name}: {}", exited.unwrap_err());

    let next = run.spawn(&format!("{name}-c"), &args);
    first_after(&run, next, Kind::Other("leader".into()), 0, START).await;
    run.assert_alive();
    let kill = now_ns();
    run.kill9(follower).await;
    let took_over = first_after(&run, next, Kind::Write, kill, kill9_bound).await;
    let kill9_ms = ms(took_over.t as i128 - kill as i128);

    let stopped = run.terminate(&[next]).await;
    let overlap = run.all().max_concurrent_writers(1);
    if overlap.exceeds_limit() {
        run.keep = true;
    }
    assert!(
        !overlap.exceeds_limit(),
        "{name}: {overlap}; {}",
        run.files()
    );
    stopped.unwrap();
    println!(
        "RESULT {name}_failover_sigterm_ms={sigterm_ms:.0} {name}_failover_kill9_ms={kill9_ms:.0} {name}_failover_ttl_s={FAILOVER_TTL_SECS}"
    );
    (sigterm_ms, kill9_ms)
}

/// The failover figures of every backend: from a leader process's SIGTERM, and from its
/// `kill -9`, until the next process's worker runs (`RESULT <backend>_failover_…` lines). The
/// three backends run at once (each its own processes and server), so the test takes about as
/// long as Consul's `kill -9` failover (TTL, which Consul may let run to twice the TTL, then
/// the lock-delay).
#[tokio::test]
async fn failover_after_sigterm_and_after_kill_9_on_consul_etcd_and_postgres() {
    let _serial = SERIAL.lock().await;
    let agent = Agent::start().await;
    let etcd = lease_tests::etcd::Server::start().await;
    let db = lease_tests::postgres::TestDb::create("process_failover").await;
    let ttl = Duration::from_secs(FAILOVER_TTL_SECS);
    let margin = Duration::from_secs(5);
    let consul_lock_delay = Duration::from_secs(15);
    let (consul, etcd, postgres) = (
        strings(&["--consul", &agent.url()]),
        strings(&["--etcd", &etcd.url()]),
        strings(&["--postgres", db.url()]),
    );
    tokio::join!(
        failover("consul", &consul, 2 * ttl + consul_lock_delay + margin),
        failover("etcd", &etcd, ttl + margin),
        failover("postgres", &postgres, ttl + margin),
    );
}
