//! The Consul semaphore against a real agent, shared with `consul lock -n`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lease_consul::Consul;
use lease_core::{Backend, Error, LeaseSpec, LostReason, Wait};
use lease_tests::consul::Agent;
use lease_tests::overlap::{Rng, Timeline};
use lease_tests::{assert_refined, init_tracing, release_lost, within};
use tokio::time::Instant;

const T: Duration = Duration::from_secs(60);
const FLAGS: u64 = 0xe0f6_9a2b_aa41_4de0;

fn spec(prefix: &str, limit: u32) -> LeaseSpec {
    LeaseSpec::semaphore(prefix, limit)
        .ttl(Duration::from_secs(10))
        .lock_delay(Duration::ZERO)
}

async fn nothing_left(agent: &Agent, prefix: &str) {
    // A holder lost to an operator keeps its entry in `Holders` for the settle time before the
    // coordinator prunes it; everything else goes at once.
    within(T, "sessions, contender keys and holders to go", async {
        loop {
            let keys = agent.keys(prefix).await;
            let only_lock = keys.iter().all(|k| k.ends_with("/.lock"));
            let lock = agent.key(&format!("{prefix}/.lock")).await;
            let no_holders = lock.is_null() || decode(&lock)["Holders"] == serde_json::json!({});
            if agent.sessions().await.is_empty() && only_lock && no_holders {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

fn decode(entry: &serde_json::Value) -> serde_json::Value {
    let b64 = entry["Value"].as_str().unwrap_or_default();
    let out = std::process::Command::new("base64")
        .arg("-d")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().unwrap().write_all(b64.as_bytes())?;
            c.wait_with_output()
        })
        .unwrap();
    serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null)
}

#[tokio::test]
async fn ours_and_consul_lock_n_never_exceed_the_limit_together() {
    init_tracing();
    let agent = Agent::start().await;
    let consul = agent.backend();
    let timeline = Timeline::new();
    let dir = std::env::temp_dir().join(format!("lease-sem-mixed-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let spans = dir.join("consul-lock-spans");
    let _ = std::fs::remove_file(&spans);

    let child = format!(
        "s=$(date +%s%N); sleep 0.15; echo \"$s $(date +%s%N)\" >> {}",
        spans.display()
    );
    let mut procs = Vec::new();
    for _ in 0..5 {
        procs.push(
            agent
                .command()
                .args(["lock", "-n", "3", "mixed", &child])
                .spawn()
                .unwrap(),
        );
    }
    let mut tasks = Vec::new();
    for i in 0..6 {
        let (consul, timeline) = (consul.clone(), timeline.clone());
        tasks.push(tokio::spawn(async move {
            let lease = consul.acquire(&spec("mixed", 3)).await.unwrap();
            let guard = timeline.hold(format!("ours-{i}"));
            lease
                .run(tokio::time::sleep(Duration::from_millis(150)))
                .await
                .unwrap();
            drop(guard);
            lease.release().await.unwrap();
        }));
    }
    for t in tasks {
        within(T, "our holders", t).await.unwrap();
    }
    for mut p in procs {
        let status = within(T, "consul lock -n holders", p.wait()).await.unwrap();
        assert!(status.success(), "consul lock -n failed: {status}");
    }
    timeline.record_file("consul-lock", &spans);
    assert_eq!(timeline.len(), 11, "every holder ran once");
    timeline.assert_at_most(3);
    let _ = std::fs::remove_dir_all(&dir);
    nothing_left(&agent, "mixed").await;
}

#[tokio::test]
async fn sixteen_tasks_with_operator_destroys_stay_within_limit_and_all_run() {
    init_tracing();
    let agent = Arc::new(Agent::start().await);
    let consul = agent.backend();
    let timeline = Timeline::new();
    let mut rng = Rng::from_time();
    // A destroyed holder runs on until it notices (a millisecond or so); the lock-delay keeps its
    // slot from being handed on meanwhile. With lock-delay 0 that overlap would be allowed.
    let spec = spec("sixteen", 3).lock_delay(Duration::from_secs(1));
    let ran = Arc::new(AtomicUsize::new(0));
    let destroyed = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..16u64 {
        let (consul, timeline, agent) = (consul.clone(), timeline.clone(), Arc::clone(&agent));
        let (ran, destroyed, spec) = (Arc::clone(&ran), Arc::clone(&destroyed), spec.clone());
        let hold = Duration::from_millis(20 + rng.below(80));
        let destroy = rng.below(4) == 0;
        tasks.push(tokio::spawn(async move {
            // A destroyed holder's work is cancelled; it tries again until its work completes.
            loop {
                let lease = consul.acquire(&spec).await.unwrap();
                let session = lease.sequencer().holder().to_owned();
                let guard = timeline.hold(format!("task-{i}"));
                let work = async {
                    let _guard = guard;
                    tokio::time::sleep(hold).await;
                };
                let operator = async {
                    if destroy && destroyed.load(Ordering::SeqCst) < 4 {
                        agent.destroy_session(&session).await;
                        destroyed.fetch_add(1, Ordering::SeqCst);
                        std::future::pending::<()>().await;
                    }
                    std::future::pending::<()>().await
                };
                let result = tokio::select! {
                    r = lease.run(work) => r,
                    () = operator => unreachable!(),
                };
                match result {
                    Ok(()) => {
                        lease.release().await.unwrap();
                        ran.fetch_add(1, Ordering::SeqCst);
                        return;
                    }
                    Err(reason) => {
                        assert_refined(&lease, &reason, LostReason::SessionInvalidated).await;
                        release_lost(lease).await;
                    }
                }
            }
        }));
    }
    for t in tasks {
        within(T, "every task to run", t).await.unwrap();
    }
    assert_eq!(ran.load(Ordering::SeqCst), 16);
    timeline.assert_at_most(3);
    nothing_left(&agent, "sixteen").await;
}

#[tokio::test]
async fn more_waiters_than_the_coordinator_takes_at_once_all_get_their_turn() {
    init_tracing();
    let agent = Agent::start().await;
    let consul = agent.backend();
    // 160 callers of one process on one prefix, more than the coordinator's channel holds
    // (each waits with a session of its own, and the agent serves 200 connections a client);
    // some give up while they wait. Those who stay all run, within the limit, and the slots are
    // handed on through the crowd: give-backs are never stuck behind waiting takes.
    let timeline = Timeline::new();
    let spec = spec("crowd", 4);
    let (mut stay, mut leave) = (Vec::new(), Vec::new());
    for i in 0..160 {
        let (consul, timeline, spec) = (consul.clone(), timeline.clone(), spec.clone());
        if i % 8 < 5 {
            stay.push(tokio::spawn(async move {
                let lease = consul.acquire(&spec).await.unwrap();
                let guard = timeline.hold(format!("job-{i}"));
                let work = tokio::time::sleep(Duration::from_millis(2));
                lease.run(work).await.unwrap();
                drop(guard);
                lease.release().await.unwrap();
            }));
        } else {
            let impatient = spec.wait(Wait::UpTo(Duration::from_millis(50)));
            leave.push(tokio::spawn(async move {
                match consul.acquire(&impatient).await {
                    Ok(lease) => lease.release().await.unwrap(),
                    Err(error) => assert!(error.is_busy(), "{error}"),
                }
            }));
        }
    }
    for task in leave.into_iter().chain(stay) {
        within(T, "every caller to be answered", task)
            .await
            .unwrap();
    }
    assert!(timeline.len() >= 100, "{} ran", timeline.len());
    timeline.assert_at_most(4);
    nothing_left(&agent, "crowd").await;
}

#[tokio::test]
async fn a_dead_holder_is_pruned_and_its_slot_reused() {
    init_tracing();
    let agent = Agent::start().await;
    let consul = agent.backend();
    let first = consul.acquire(&spec("prune", 1)).await.unwrap();
    // The holder's session dies (an operator, or its TTL); its entry in Holders stays until pruned.
    agent.destroy_session(first.sequencer().holder()).await;
    let reported = within(T, "loss", first.lost()).await;
    assert_refined(&first, &reported, LostReason::SessionInvalidated).await;
    let second = within(
        T,
        "the slot to be reused",
        consul.acquire(&spec("prune", 1)),
    )
    .await
    .unwrap();
    let lock = decode(&agent.key("prune/.lock").await);
    assert_eq!(
        lock["Holders"],
        serde_json::json!({ second.sequencer().holder(): true })
    );
    assert_eq!(lock["Limit"], 1);
    assert_eq!(
        second.sequencer().key(),
        format!("prune/{}", second.sequencer().holder())
    );
    second.check().await.unwrap();
    consul.check_sequencer(second.sequencer()).await.unwrap();
    assert!(consul.check_sequencer(first.sequencer()).await.is_err());
    second.release().await.unwrap();
    release_lost(first).await;
    nothing_left(&agent, "prune").await;
}

#[tokio::test]
async fn busy_waits_and_releases() {
    init_tracing();
    let agent = Agent::start().await;
    let consul = agent.backend();
    let a = consul.acquire(&spec("busy", 2)).await.unwrap();
    let b = consul.acquire(&spec("busy", 2)).await.unwrap();
    assert_ne!(a.sequencer(), b.sequencer());
    let err = consul
        .acquire(&spec("busy", 2).wait(Wait::Never))
        .await
        .unwrap_err();
    assert!(err.is_busy(), "{err}");
    let started = Instant::now();
    let err = consul
        .acquire(&spec("busy", 2).wait(Wait::UpTo(Duration::from_millis(300))))
        .await
        .unwrap_err();
    assert!(
        err.is_busy() && started.elapsed() >= Duration::from_millis(300),
        "{err}"
    );
    let waiter = {
        let consul = consul.clone();
        tokio::spawn(async move { consul.acquire(&spec("busy", 2)).await })
    };
    a.release().await.unwrap();
    let c = within(T, "the waiter to get the freed slot", waiter)
        .await
        .unwrap()
        .unwrap();
    assert!(c.is_held() && b.is_held());
    let err = consul.destroy_semaphore("busy").await.unwrap_err();
    assert!(
        matches!(err, Error::SemaphoreInUse { holders: 2, .. }),
        "{err}"
    );
    c.release().await.unwrap();
    b.release().await.unwrap();
    nothing_left(&agent, "busy").await;
    consul.destroy_semaphore("busy").await.unwrap();
    assert!(agent.key("busy/.lock").await.is_null());
}

#[tokio::test]
async fn holder_removed_from_holders_or_contender_deleted_is_loss() {
    init_tracing();
    let agent = Agent::start().await;
    let consul = agent.backend();
    let lease = consul.acquire(&spec("ops", 2)).await.unwrap();
    agent.delete_key(lease.sequencer().key()).await;
    let reason = within(T, "loss", lease.run(std::future::pending::<()>()))
        .await
        .unwrap_err();
    assert_eq!(reason, LostReason::KeyDeleted);
    release_lost(lease).await;

    let lease = consul.acquire(&spec("ops", 2)).await.unwrap();
    // An operator rewrites Holders without us.
    agent
        .put_key("ops/.lock", br#"{"Limit":2,"Holders":{}}"#, FLAGS)
        .await;
    assert_eq!(
        within(T, "loss", lease.lost()).await,
        LostReason::HolderPruned
    );
    release_lost(lease).await;
    nothing_left(&agent, "ops").await;
}

#[tokio::test]
async fn bad_input_is_refused_and_the_key_left_untouched() {
    init_tracing();
    let agent = Agent::start().await;
    let consul = agent.backend();
    let err = consul.acquire(&spec("zero", 0)).await.unwrap_err();
    assert!(matches!(err, Error::InvalidLimit { limit: 0, .. }), "{err}");

    let held = consul.acquire(&spec("mismatch", 2)).await.unwrap();
    let err = consul.acquire(&spec("mismatch", 3)).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::LimitMismatch {
                stored: 2,
                requested: 3,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains('2') && err.to_string().contains('3'));
    held.release().await.unwrap();

    let bad_values: [&[u8]; 5] = [
        b"\xff\xfe garbage",
        br#"{"Holders":{}}"#,
        br#"{"Limit":-3,"Holders":{}}"#,
        br#"{"Limit":3,"Holders":"abc"}"#,
        br#"[1,2,3]"#,
    ];
    for (i, value) in bad_values.iter().enumerate() {
        let prefix = format!("bad{i}");
        agent
            .put_key(&format!("{prefix}/.lock"), value, FLAGS)
            .await;
        let before = agent.key(&format!("{prefix}/.lock")).await;
        let err = consul
            .acquire(&spec(&prefix, 3).wait(Wait::Never))
            .await
            .unwrap_err();
        assert!(
            matches!(err, Error::CorruptLockValue { .. }),
            "{}: {err}",
            String::from_utf8_lossy(value)
        );
        let after = agent.key(&format!("{prefix}/.lock")).await;
        assert_eq!(before, after, "the unreadable key was modified");
    }

    // A leader lock's key where the semaphore's lock key should be.
    agent
        .put_key("leaderish/.lock", b"", 0x2ddc_cbc0_58a5_0c18)
        .await;
    let err = consul.acquire(&spec("leaderish", 3)).await.unwrap_err();
    assert!(matches!(err, Error::FlagsConflict { .. }), "{err}");
    nothing_left(&agent, "mismatch").await;
}

#[tokio::test]
async fn a_pooled_backend_reuses_sessions_and_still_changes_the_sequencer() {
    init_tracing();
    let agent = Agent::start().await;
    let consul = Consul::builder()
        .address(agent.url())
        .semaphore_pool(Duration::from_secs(30))
        .build()
        .unwrap();
    let first = consul.acquire(&spec("pool", 2)).await.unwrap();
    let old = first.sequencer().clone();
    first.release().await.unwrap();
    let writes = consul.writes_sent();
    let second = consul.acquire(&spec("pool", 2)).await.unwrap();
    second.release().await.unwrap();
    assert_eq!(
        consul.writes_sent() - writes,
        2,
        "a pooled take + give-back is two writes"
    );
    let third = consul.acquire(&spec("pool", 2)).await.unwrap();
    assert_eq!(
        third.sequencer().holder(),
        old.holder(),
        "the session was reused"
    );
    assert!(
        third.sequencer().index() > old.index(),
        "the sequencer did not change"
    );
    assert!(consul.check_sequencer(&old).await.is_err());
    third.check().await.unwrap();
    third.release().await.unwrap();
}

/// A name is used by one kind of lock at a time, and the keys say which, held or not: a released
/// leader key refuses a semaphore, a semaphore's `.lock` refuses a leader lock, both at once. Other
/// data at the name, or `lease lock`'s leader on `<name>/.lock`, refuses neither. Asked for at the
/// same moment on a fresh name, the two kinds are never both granted.
#[tokio::test]
async fn a_name_is_used_by_one_kind_of_lock_and_its_keys_say_which() {
    init_tracing();
    let agent = Agent::start().await;
    let consul = agent.backend();
    let leader = |key: &str| {
        LeaseSpec::leader(key)
            .ttl(Duration::from_secs(10))
            .lock_delay(Duration::ZERO)
    };
    let patient = Wait::UpTo(Duration::from_secs(30));
    let conflict = |error: &Error, at: &str, found: u64, expected: u64| {
        matches!(error, Error::FlagsConflict { key, found: f, expected: e }
            if key == at && *f == found && *e == expected)
    };
    let (leader_flags, semaphore_flags) = (Error::LEADER_FLAGS, Error::SEMAPHORE_FLAGS);

    let held = consul.acquire(&leader("name")).await.unwrap();
    held.release().await.unwrap();
    let started = Instant::now();
    let err = consul
        .acquire(&spec("name", 2).wait(patient))
        .await
        .unwrap_err();
    assert!(
        conflict(&err, "name", leader_flags, semaphore_flags),
        "{err}"
    );
    assert!(started.elapsed() < Duration::from_secs(5), "waited");
    assert!(
        agent.keys("name/").await.is_empty(),
        "a refused semaphore wrote"
    );
    assert!(consul.remove_unheld_key("name").await.unwrap());

    let slot = consul.acquire(&spec("name", 2)).await.unwrap();
    let started = Instant::now();
    let err = consul
        .acquire(&leader("name").wait(patient))
        .await
        .unwrap_err();
    assert!(
        conflict(&err, "name/.lock", semaphore_flags, leader_flags),
        "{err}"
    );
    assert!(started.elapsed() < Duration::from_secs(5), "waited");
    slot.release().await.unwrap();
    let err = consul
        .acquire(&leader("name").wait(Wait::Never))
        .await
        .unwrap_err();
    assert!(
        conflict(&err, "name/.lock", semaphore_flags, leader_flags),
        "{err}"
    );
    assert!(agent.key("name").await.is_null(), "a refused leader wrote");
    nothing_left(&agent, "name").await;

    // Plain data where a leader key would be is no leader lock.
    agent.put_key("data", b"x", 0).await;
    let slot = consul.acquire(&spec("data", 1)).await.unwrap();
    slot.release().await.unwrap();
    assert_eq!(agent.key("data").await["Value"], "eA==");
    // `lease lock cli` holds `cli/.lock` as a leader: no semaphore of `cli`, so a leader on `cli`
    // is not refused, and a semaphore on `cli` still is (the two share `cli/.lock`).
    let cli = consul.acquire(&leader("cli/.lock")).await.unwrap();
    let other = consul
        .acquire(&leader("cli").wait(Wait::Never))
        .await
        .unwrap();
    let err = consul
        .acquire(&spec("cli", 2).wait(Wait::Never))
        .await
        .unwrap_err();
    assert!(
        conflict(&err, "cli/.lock", leader_flags, semaphore_flags),
        "{err}"
    );
    other.release().await.unwrap();
    cli.release().await.unwrap();

    // Two clients, both kinds at the same moment on fresh names: exactly one is granted.
    let (a, b) = (agent.backend(), agent.backend());
    for i in 0..20 {
        let name = format!("race/{i}");
        let (leader_spec, semaphore_spec) = (
            leader(&name).wait(Wait::Never),
            spec(&name, 2).wait(Wait::Never),
        );
        let (as_leader, as_semaphore) =
            tokio::join!(a.acquire(&leader_spec), b.acquire(&semaphore_spec));
        match (as_leader, as_semaphore) {
            (Ok(lease), Err(err)) => {
                assert!(
                    conflict(&err, &name, leader_flags, semaphore_flags),
                    "{err}"
                );
                lease.release().await.unwrap();
            }
            (Err(err), Ok(lease)) => {
                let lock = format!("{name}/.lock");
                assert!(
                    conflict(&err, &lock, semaphore_flags, leader_flags),
                    "{err}"
                );
                lease.release().await.unwrap();
            }
            (leader, semaphore) => panic!("{name}: {leader:?} and {semaphore:?}"),
        }
    }
    assert!(agent.sessions().await.is_empty(), "sessions left behind");
}
