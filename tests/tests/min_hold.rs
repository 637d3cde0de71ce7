//! `min_hold` outlives the process that ran the job: a scheduled job fired on several nodes a
//! second apart runs once per `min_hold`, although each node's process exits right after its
//! firing (ShedLock's `lockAtLeastFor`). Real processes (`lease-job`: a `#[leader_only]` job,
//! `wait = "never"`, `min_hold = "5s"`, TTL 10 s), real PostgreSQL, etcd and Consul, judged from
//! the histories the processes write.
//!
//! Each backend runs two rounds: a process fires the job (it runs) and exits, by
//! `Backend::shutdown` in the first round and by returning from `main` in the second (the runtime
//! drops the holder task: the last-resort path); then a new process fires it every second until
//! one runs. Every firing before the end of the `min_hold` must skip, and the job must run again
//! soon after it: within the TTL on PostgreSQL and etcd (where the row's or key's expiry is the end
//! of `min_hold`, to the second on etcd), within two TTLs on Consul (a session nothing renews
//! lives one to two TTLs; Consul 1.8 waits two).
//!
//! On etcd, `etcdctl lock` also waits for the kept key until `min_hold` ends.
//!
//! About 15 s for PostgreSQL and etcd each, 7 s for etcdctl, 45 s for Consul (the tests take
//! turns; about 70 s in all): one of the long test binaries.
//!
//! ```sh
//! cargo test -p lease-tests --test min_hold -- --nocapture   # prints the measured figures
//! ```
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use lease_tests::history::Kind;
use lease_tests::workers::Run;
use tokio::time::Instant;

const JOB: &str = env!("CARGO_BIN_EXE_lease-job");

/// The job's `min_hold` and TTL (`lease-job`'s attribute).
const MIN_HOLD: Duration = Duration::from_secs(5);
const TTL: Duration = Duration::from_secs(10);
/// How far apart the firings are.
const EVERY: Duration = Duration::from_secs(1);
/// How long after acquiring the job's lease its `ran` line may come (process scheduling on a
/// loaded machine): a firing that ran less than `MIN_HOLD - SLACK` after the last run is a
/// violation.
const SLACK: Duration = Duration::from_millis(200);
/// How long one process may take to fire and exit.
const FIRING: Duration = Duration::from_secs(30);

/// The tests take turns, so their timings do not disturb each other on a small machine.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// What one firing did.
#[derive(Debug)]
struct Firing {
    ran: bool,
    /// When it logged its outcome (wall clock, ns).
    t: u128,
}

/// Starts `lease-job` with `backend` flags on `key`, exiting as `exit` says, and waits until it
/// has exited; returns what it did.
async fn fire(run: &mut Run, backend: &[String], key: &str, exit: &str) -> Firing {
    let name = format!("job-{}", run.workers.len());
    let mut args = backend.to_vec();
    args.extend(["--key", key, "--exit", exit].map(str::to_owned));
    let i = run.spawn(&name, &args);
    let deadline = Instant::now() + FIRING;
    while run.running(i) {
        assert!(
            Instant::now() < deadline,
            "{name} did not exit within {FIRING:?}; {}",
            run.files()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let history = run.history(&[i]);
    let outcome = history
        .lines()
        .iter()
        .find(|l| matches!(&l.kind, Kind::Other(word) if word == "ran" || word == "skipped"));
    let Some(outcome) = outcome else {
        run.keep = true;
        let log = std::fs::read_to_string(&run.workers[i].log).unwrap_or_default();
        panic!(
            "{name} neither ran nor skipped the job; its history:\n{history:?}\nits log:\n{log}"
        );
    };
    assert!(
        history.lines().iter().any(|l| l.kind == Kind::Exit),
        "{name} did not exit cleanly; {}",
        run.files()
    );
    Firing {
        ran: outcome.kind == Kind::Other("ran".into()),
        t: outcome.t,
    }
}

/// Two rounds on `backend`: the job runs in a process that exits (by `shutdown`, then by
/// returning from `main`), then fires every second in new processes until it runs again. Every
/// firing before the end of `min_hold` must skip; the job must run again within `freed_within` of
/// its last run. Returns how long after each run the job ran again, in seconds.
async fn rounds(area: &str, backend: &[String], key: &str, freed_within: Duration) -> Vec<f64> {
    let _turn = SERIAL.lock().await;
    let mut run = Run::new("min-hold", area, std::path::Path::new(JOB));
    let exits = ["shutdown", "return"];
    let first = fire(&mut run, backend, key, exits[0]).await;
    assert!(first.ran, "the first firing must run; {}", run.files());
    let mut last_run = first.t;
    let mut freed_after = Vec::new();
    for round in 0..exits.len() {
        let next_exit = exits.get(round + 1).copied().unwrap_or("shutdown");
        let mut skipped = 0;
        loop {
            tokio::time::sleep(EVERY).await;
            let firing = fire(&mut run, backend, key, next_exit).await;
            let since = Duration::from_nanos(u64::try_from(firing.t - last_run).unwrap());
            if !firing.ran {
                skipped += 1;
                assert!(
                    since < freed_within + EVERY + FIRING,
                    "{area}: the job's lease was still held {since:?} after the job ran \
                     (min_hold {MIN_HOLD:?}, TTL {TTL:?}); {}",
                    run.files()
                );
                continue;
            }
            if since < MIN_HOLD - SLACK {
                run.keep = true;
                panic!(
                    "{area}: the job ran again {since:?} after it ran in a process that exited \
                     by {}, before its min_hold of {MIN_HOLD:?} ended; {}",
                    exits[round],
                    run.files()
                );
            }
            assert!(
                since <= freed_within + EVERY + SLACK,
                "{area}: the job ran again only {since:?} after it last ran, later than \
                 {freed_within:?} after it: the lease outlived its min_hold too long; {}",
                run.files()
            );
            // A firing is a process start and a connection: on a loaded machine a second or two
            // apart besides EVERY, so within a 5 s min_hold as few as one (seen: 2) may find it.
            assert!(
                skipped >= 1,
                "{area}: no firing was skipped within the min_hold; {}",
                run.files()
            );
            println!(
                "RESULT min_hold {area}: exit by {}: {skipped} firings skipped, ran again {:.2} s \
                 after (min_hold {:?})",
                exits[round],
                since.as_secs_f64(),
                MIN_HOLD
            );
            freed_after.push(since.as_secs_f64());
            last_run = firing.t;
            break;
        }
    }
    freed_after
}

fn flags(flag: &str, url: &str) -> Vec<String> {
    vec![flag.to_owned(), url.to_owned()]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_hold_outlives_the_process_on_postgres() {
    let db = lease_tests::postgres::TestDb::create("min_hold").await;
    rounds(
        "postgres",
        &flags("--postgres", db.url()),
        "jobs/nightly",
        MIN_HOLD + TTL,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_hold_outlives_the_process_on_etcd() {
    let etcd = lease_tests::etcd::Server::start().await;
    rounds(
        "etcd",
        &flags("--etcd", &etcd.url()),
        "jobs/nightly",
        MIN_HOLD + TTL,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_hold_outlives_the_process_on_consul() {
    let agent = lease_tests::consul::Agent::start().await;
    rounds(
        "consul",
        &flags("--consul", &agent.url()),
        "jobs/nightly",
        TTL * 2 + EVERY,
    )
    .await;
}

/// `etcdctl lock` waits for the kept key as for any holder's: it gets the lock when `min_hold`
/// ends, not when the process that ran the job exits. (The key keeps its create revision when it
/// moves onto its own etcd lease, and etcdctl waits for the deletion of the keys created before
/// its own.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_lock_waits_for_the_kept_key() {
    use tokio::io::{AsyncBufReadExt, BufReader};

    let etcd = lease_tests::etcd::Server::start().await;
    let _turn = SERIAL.lock().await;
    let mut run = Run::new("min-hold", "etcdctl", std::path::Path::new(JOB));
    let key = "jobs/interop";
    let ran = fire(&mut run, &flags("--etcd", &etcd.url()), key, "return").await;
    assert!(ran.ran, "the job must run; {}", run.files());
    let mut etcdctl = etcd
        .etcdctl()
        .args(["lock", "--ttl", "10", key])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(etcdctl.stdout.take().unwrap()).lines();
    // It prints its key `<name>/<lease hex>` once it holds the lock.
    let held = tokio::time::timeout(MIN_HOLD + TTL + FIRING, lines.next_line())
        .await
        .expect("etcdctl lock never got the lock")
        .unwrap()
        .expect("etcdctl lock holds");
    let since =
        Duration::from_nanos(u64::try_from(lease_tests::overlap::now_ns() - ran.t).unwrap());
    assert!(held.starts_with(key), "{held}");
    assert!(
        since >= MIN_HOLD - SLACK,
        "etcdctl lock got the lock {since:?} after the job ran, before its min_hold ended"
    );
    assert!(
        since <= MIN_HOLD + TTL,
        "etcdctl lock got the lock only {since:?} after the job ran"
    );
    println!(
        "RESULT min_hold etcdctl lock: got the kept key {:.2} s after the job ran (min_hold {:?})",
        since.as_secs_f64(),
        MIN_HOLD
    );
    let _ = etcdctl.kill().await;
}
