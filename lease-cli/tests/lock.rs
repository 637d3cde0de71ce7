//! `lease lock` against a real Consul agent and real processes: interoperation with
//! `consul lock`, loss (a destroyed session, a partition), the exit paths, and `status`/`check`.

// A test that unwraps is a test that fails loudly.
#![allow(clippy::unwrap_used)]

mod support;

use std::process::Stdio;
use std::time::Duration;

use lease_tests::consul::Agent;
use lease_tests::overlap::{Timeline, now_ns};
use lease_tests::proxy::{Mode, Proxy};
use lease_tests::within;
use nix::sys::signal::Signal;
use tokio::io::{AsyncBufReadExt, BufReader};

use support::*;

/// Six contenders on one prefix, three `lease lock` and three `consul lock` (then eight at
/// `-n 3`): the children's own timestamps never show more holders than the limit.
#[tokio::test]
async fn excludes_consul_lock_both_ways_and_shares_its_semaphore() {
    let agent = Agent::start().await;
    let scratch = Scratch::new("interop");

    // Each direction, deterministically: the other tool holds, this one gives up.
    let mut held = agent
        .command()
        .args(["lock", "interop/a", "echo held; exec sleep 30"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(held.stdout.take().unwrap()).lines();
    within(T, "consul lock to run its child", lines.next_line())
        .await
        .unwrap();
    let busy = output(
        {
            let mut c = lease_on(&agent);
            c.args(["lock", "-try", "1s", "interop/a", "--", "touch"])
                .arg(scratch.path("ran"));
            c
        },
        "lease lock -try while consul lock holds",
    )
    .await;
    assert_eq!(busy.status.code(), Some(75), "{busy:?}");
    // Interrupted, consul lock releases and destroys its session (a SIGKILL would leave it).
    send(held.id().unwrap(), Signal::SIGINT);
    within(T, "consul lock to exit", held.wait()).await.unwrap();

    let mut ours = lease_on(&agent)
        .args([
            "lock",
            "interop/b",
            "--",
            "sh",
            "-c",
            "echo held; exec sleep 30",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(ours.stdout.take().unwrap()).lines();
    within(T, "lease lock to run its child", lines.next_line())
        .await
        .unwrap();
    let theirs = output(
        {
            let mut c = agent.command();
            c.args(["lock", "-timeout", "1s", "interop/b", "touch"])
                .arg(scratch.path("ran"));
            c
        },
        "consul lock -timeout while lease lock holds",
    )
    .await;
    assert!(
        !scratch.path("ran").exists(),
        "a child ran while the other tool held the lock: {theirs:?}"
    );
    // (A `consul lock` that gives up leaves its session to expire; `assert_nothing_left` only
    // looks at the sessions of the prefix it is given.)
    send(ours.id().unwrap(), Signal::SIGTERM);
    within(T, "lease lock to exit", ours.wait()).await.unwrap();

    // Mixed contenders, leader and -n 3.
    for (limit, each) in [(1, 3), (3, 4)] {
        let prefix = format!("interop/mixed-{limit}");
        let stamps = scratch.path(&format!("stamps-{limit}"));
        let child = stamping_child(&stamps, "0.2");
        let n = limit.to_string();
        let mut all = Vec::new();
        for _ in 0..each {
            all.push(
                lease_on(&agent)
                    .args(["lock", "-n", &n, &prefix, "--", "sh", "-c", &child])
                    .spawn()
                    .unwrap(),
            );
            all.push(
                agent
                    .command()
                    .args(["lock", "-n", &n, &prefix, &child])
                    .spawn()
                    .unwrap(),
            );
        }
        for mut p in all {
            let status = within(T, "every contender to finish", p.wait())
                .await
                .unwrap();
            assert!(status.success(), "a contender failed: {status}");
        }
        let timeline = Timeline::new();
        timeline.record_file("child", &stamps);
        assert_eq!(timeline.len(), 2 * each, "every child ran once");
        timeline.assert_at_most(limit);
        assert_nothing_left(&agent, &prefix).await;
    }
}

/// An operator destroys the session: the child's group gets SIGTERM at once; a child that
/// ignores it is killed after the grace. `lease` exits 124 both times.
#[tokio::test]
async fn destroyed_session_stops_the_child_and_kills_one_that_ignores_sigterm() {
    let agent = Agent::start().await;
    let scratch = Scratch::new("destroy");
    for (i, ignores) in [false, true].into_iter().enumerate() {
        let prefix = format!("destroy/{i}");
        let pid_file = scratch.path(&format!("pid-{i}"));
        let signalled = scratch.path(&format!("signalled-{i}"));
        let trap = if ignores {
            "trap '' TERM".to_owned()
        } else {
            format!("trap 'date +%s%N > {}; exit 0' TERM", signalled.display())
        };
        let script = format!(
            "{trap}; echo $$ > {}; while :; do sleep 0.05; done",
            pid_file.display()
        );
        let guard = lease_on(&agent)
            .args(["lock", "--grace", "1s", &prefix, "--", "sh", "-c", &script])
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let pid: i32 = file_appears(&pid_file).await.trim().parse().unwrap();
        let session = holder_session(&agent, &format!("{prefix}/.lock")).await;
        let destroyed = now_ns();
        agent.destroy_session(&session).await;
        let out = within(T, "lease lock to stop its child", guard.wait_with_output())
            .await
            .unwrap();
        let exited = now_ns();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(124), "{stderr}");
        assert!(stderr.contains("lease: lost destroy/"), "{stderr}");
        assert!(!alive(pid), "the child {pid} outlived lease lock");
        let after_ms = |t: u128| t.saturating_sub(destroyed) as f64 / 1e6;
        if ignores {
            let took = after_ms(exited);
            eprintln!("destroy → child killed after the 1 s grace: {took:.0} ms");
            assert!((1000.0..4000.0).contains(&took), "killed after {took} ms");
        } else {
            let at: u128 = file_appears(&signalled).await.trim().parse().unwrap();
            let took = after_ms(at);
            eprintln!("destroy → SIGTERM in the child: {took:.1} ms");
            assert!(took < 1000.0, "SIGTERM came {took} ms after the destroy");
        }
    }
}

/// `kill -9` of `lease lock` takes its command's whole process group with it (a supervisor
/// between them gets the kernel's parent-death signal), long before the lease could pass to
/// anyone else: a second `lease lock` on the key, started at once, never writes while anything of
/// the first still does. Judged from the history both commands append to.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn a_killed_lease_lock_takes_its_whole_command_group_with_it() {
    let agent = Agent::start().await;
    let scratch = Scratch::new("kill9");
    let history = scratch.path("history");
    let pids = scratch.path("pids");
    // The command writes from itself and from a background child of its own, every 10 ms.
    let writer = |name: &str| {
        format!(
            "w() {{ while :; do echo \"$(date +%s%N) {name}\" >> {h}; sleep 0.01; done; }}; \
             w & echo $! >> {p}; echo $$ >> {p}; w",
            h = history.display(),
            p = pids.display()
        )
    };
    let args = |name: &str| {
        [
            "lock",
            "--ttl",
            "10s",
            "--grace",
            "2s",
            "--lock-delay",
            "0s",
            "kill9",
            "--",
            "sh",
            "-c",
            &writer(name),
        ]
        .map(str::to_owned)
    };
    let mut first = lease_on(&agent).args(args("first")).spawn().unwrap();
    wait_for_lines(&history, "first", 5).await;
    let first_pids: Vec<i32> = std::fs::read_to_string(&pids)
        .unwrap()
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    assert_eq!(first_pids.len(), 2, "the command and its background child");

    let killed = now_ns();
    send(first.id().unwrap(), Signal::SIGKILL);
    first.wait().await.unwrap();
    lease_tests::workers::wait_for(
        Duration::from_secs(1),
        || format!("the command group {first_pids:?} to die with lease lock"),
        || first_pids.iter().all(|&p| !alive(p)).then_some(()),
    )
    .await;
    let gone = now_ns();

    // The first session expires with the heartbeat check (TTL 10 s); then the second runs.
    let mut second = lease_on(&agent).args(args("second")).spawn().unwrap();
    wait_for_lines(&history, "second", 5).await;
    send(second.id().unwrap(), Signal::SIGTERM);
    within(T, "the second lease lock to exit", second.wait())
        .await
        .unwrap();

    let (last_first, first_second) = hand_over(&history);
    eprintln!(
        "kill -9 → command group gone within {:.1} ms; its last write {:.1} ms after the kill; \
         the next holder's first write {:.0} ms after it",
        (gone - killed) as f64 / 1e6,
        last_first.saturating_sub(killed) as f64 / 1e6,
        first_second.saturating_sub(killed) as f64 / 1e6
    );
    assert!(
        last_first < first_second,
        "the killed holder's command wrote at {last_first}, after the next holder's first write at \
         {first_second}"
    );
}

/// Waits (bounded) until `path` has `n` lines ending in ` who`.
/// The hand-over in a history of `<ns> first` and `<ns> second` lines: the first command's last
/// write and the second's first.
fn hand_over(path: &std::path::Path) -> (u128, u128) {
    let lines = std::fs::read_to_string(path).unwrap();
    let stamps = |who: &str| -> Vec<u128> {
        lines
            .lines()
            .filter(|l| l.ends_with(who))
            .filter_map(|l| l.split_whitespace().next()?.parse().ok())
            .collect()
    };
    (
        stamps(" first").into_iter().max().unwrap(),
        stamps(" second").into_iter().min().unwrap(),
    )
}

async fn wait_for_lines(path: &std::path::Path, who: &str, n: usize) {
    let suffix = format!(" {who}");
    lease_tests::workers::wait_for(
        Duration::from_secs(60),
        || format!("{n} lines of {who} in {}", path.display()),
        || {
            let text = std::fs::read_to_string(path).ok()?;
            (text.lines().filter(|l| l.ends_with(&suffix)).count() >= n).then_some(())
        },
    )
    .await;
}

/// The child's code passes through, SIGINT is forwarded, `-try` on a held key exits 75, and no
/// session or key is left after any of them. The child sees its sequencer.
#[tokio::test]
async fn exit_paths_pass_codes_forward_signals_and_leave_nothing() {
    let agent = Agent::start().await;
    let scratch = Scratch::new("exits");

    let out = output(
        {
            let mut c = lease_on(&agent);
            c.args([
                "lock",
                "exits/code",
                "--",
                "sh",
                "-c",
                "echo \"$LEASE_SEQUENCER|$LEASE_KEY|$LEASE_HOLDER\"; exit 7",
            ]);
            c
        },
        "a child that exits 7",
    )
    .await;
    assert_eq!(out.status.code(), Some(7), "{out:?}");
    let env = String::from_utf8_lossy(&out.stdout);
    let mut parts = env.trim().split('|');
    let sequencer: lease_core::Sequencer = parts.next().unwrap().parse().unwrap();
    assert_eq!(sequencer.key(), "exits/code/.lock");
    assert_eq!(parts.next(), Some("exits/code/.lock"));
    assert_eq!(parts.next(), Some(sequencer.holder()));
    assert_nothing_left(&agent, "exits/code").await;

    // SIGINT to lease reaches the child, whose exit code comes back.
    let got = scratch.path("got-int");
    let script = format!(
        "trap 'echo int > {}; exit 42' INT; echo ready; while :; do sleep 0.05; done",
        got.display()
    );
    let mut guard = lease_on(&agent)
        .args(["lock", "exits/int", "--", "sh", "-c", &script])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(guard.stdout.take().unwrap()).lines();
    within(T, "the child to start", lines.next_line())
        .await
        .unwrap();
    send(guard.id().unwrap(), Signal::SIGINT);
    let status = within(T, "lease lock to exit after SIGINT", guard.wait())
        .await
        .unwrap();
    assert_eq!(status.code(), Some(42));
    assert_eq!(std::fs::read_to_string(&got).unwrap().trim(), "int");
    assert_nothing_left(&agent, "exits/int").await;

    // -try on a held key: busy, the holder named, no child started.
    let mut holder = lease_on(&agent)
        .args([
            "lock",
            "--value",
            "the-holder",
            "exits/busy",
            "--",
            "sh",
            "-c",
            "echo ready; exec sleep 30",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(holder.stdout.take().unwrap()).lines();
    within(T, "the holder to start", lines.next_line())
        .await
        .unwrap();
    let ran = scratch.path("ran");
    let busy = output(
        {
            let mut c = lease_on(&agent);
            c.args(["lock", "-try", "1s", "exits/busy", "--", "touch"])
                .arg(&ran);
            c
        },
        "lease lock -try 1s on a held key",
    )
    .await;
    let (code, stderr) = code_and_stderr(&busy);
    assert_eq!(code, Some(75), "{stderr}");
    assert!(
        stderr.contains("exits/busy/.lock: held by the-holder (session "),
        "the key and its holder are named: {stderr}"
    );
    assert!(!ran.exists(), "no child may run while busy");
    send(holder.id().unwrap(), Signal::SIGTERM);
    let status = within(T, "the holder to exit", holder.wait())
        .await
        .unwrap();
    assert_eq!(
        status.code(),
        Some(128 + 15),
        "sleep was killed by the forwarded SIGTERM"
    );
    assert_nothing_left(&agent, "exits").await;
}

/// Runs of `lease lock` on one key, one after another, get rising LockIndexes: the released
/// leader key stays (Consul restarts the LockIndex of a re-created key at 1), so a database fence
/// that saw one run's sequencer accepts the next run's.
#[tokio::test]
async fn consecutive_runs_get_rising_lock_indexes() {
    let agent = Agent::start().await;
    let mut indexes = Vec::new();
    for run in 0..3 {
        let out = output(
            {
                let mut c = lease_on(&agent);
                c.args([
                    "lock",
                    "rising",
                    "--",
                    "sh",
                    "-c",
                    "echo \"$LEASE_SEQUENCER\"",
                ]);
                c
            },
            "a run of lease lock",
        )
        .await;
        assert!(out.status.success(), "run {run}: {out:?}");
        let sequencer: lease_core::Sequencer =
            String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
        indexes.push(sequencer.index());
    }
    assert!(
        indexes.windows(2).all(|w| w[0] < w[1]),
        "each run's LockIndex above the last: {indexes:?}"
    );
    assert_nothing_left(&agent, "rising").await;
}

/// `lease status` and `lease check` while a command holds the lock and after it has gone,
/// leader and semaphore.
#[tokio::test]
async fn status_and_check_follow_the_holder() {
    let agent = Agent::start().await;
    let scratch = Scratch::new("status");
    let seq_file = scratch.path("seq");
    let script = format!(
        "echo $LEASE_SEQUENCER > {}; exec sleep 30",
        seq_file.display()
    );
    let mut holder = lease_on(&agent)
        .args([
            "lock",
            "--value",
            "billing-7",
            "st/a",
            "--",
            "sh",
            "-c",
            &script,
        ])
        .spawn()
        .unwrap();
    let sequencer = file_appears(&seq_file).await.trim().to_owned();

    let run = |args: &[&str]| {
        let mut c = lease_on(&agent);
        c.args(args);
        c
    };
    let out = output(run(&["status", "st/a"]), "status").await;
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(
        text.contains("billing-7") && text.contains(&sequencer),
        "{text}"
    );
    let out = output(run(&["status", "--json", "st/a"]), "status --json").await;
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["sequencer"], sequencer.as_str());
    assert_eq!(json["value"], "billing-7");
    let out = output(run(&["check", &sequencer]), "check a current sequencer").await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");

    send(holder.id().unwrap(), Signal::SIGTERM);
    within(T, "the holder to exit", holder.wait())
        .await
        .unwrap();
    let out = output(run(&["check", &sequencer]), "check a stale sequencer").await;
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("stale: "));
    let out = output(run(&["status", "st/a"]), "status of a free key").await;
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let out = output(run(&["check", "not-a-sequencer"]), "check garbage").await;
    assert_eq!(out.status.code(), Some(2), "{out:?}");

    // A semaphore: the limit and both holders.
    let mut holders = Vec::new();
    for name in ["one", "two"] {
        let ready = scratch.path(name);
        holders.push(
            lease_on(&agent)
                .args([
                    "lock", "-n", "3", "--value", name, "st/sem", "--", "sh", "-c",
                ])
                .arg(format!("touch {}; exec sleep 30", ready.display()))
                .spawn()
                .unwrap(),
        );
        file_appears_empty_ok(&ready).await;
    }
    let out = output(run(&["status", "-n", "3", "--json", "st/sem"]), "status -n").await;
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(json["limit"], 3);
    let mut values: Vec<&str> = json["holders"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|h| h["value"].as_str())
        .collect();
    values.sort_unstable();
    assert_eq!(values, ["one", "two"]);
    for h in &holders {
        send(h.id().unwrap(), Signal::SIGTERM);
    }
    for mut h in holders {
        within(T, "the holders to exit", h.wait()).await.unwrap();
    }
    assert_nothing_left(&agent, "st").await;

    // Inside the command, `lease check` reaches the agent `--consul` named (the command gets it
    // as CONSUL_HTTP_ADDR), not the one `lease`'s own environment names (a closed port here).
    let out = check_inside(&["--consul", &agent.addr().to_string(), "st/inside"]).await;
    assert_checked_current(&out);
}

async fn file_appears_empty_ok(path: &std::path::Path) {
    lease_tests::workers::wait_for(
        T,
        || format!("{} to appear", path.display()),
        || path.exists().then_some(()),
    )
    .await;
}

/// A partition between `lease` and its agent: the child is gone while the agent still lists the
/// session, before its TTL could expire. The same under `consul lock`: its child outlives its
/// session (hashicorp/consul 9788, 1843).
#[tokio::test]
async fn partition_stops_the_child_before_the_session_expires_unlike_consul_lock() {
    let agent = Agent::start().await;
    let scratch = Scratch::new("partition");
    let ours_proxy = Proxy::start(agent.addr()).await.unwrap();
    let theirs_proxy = Proxy::start(agent.addr()).await.unwrap();

    let our_pid = scratch.path("our-pid");
    let ours = lease(&ours_proxy.addr().to_string())
        .args([
            "lock",
            "--ttl",
            "10s",
            "--grace",
            "2s",
            "part/ours",
            "--",
            "sh",
            "-c",
        ])
        .arg(format!("echo $$ > {}; exec sleep 60", our_pid.display()))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let their_pid = scratch.path("their-pid");
    let mut theirs = agent
        .command()
        .env("CONSUL_HTTP_ADDR", theirs_proxy.addr().to_string())
        .args(["lock", "part/theirs"])
        .arg(format!("echo $$ > {}; exec sleep 120", their_pid.display()))
        .spawn()
        .unwrap();
    let our_child: i32 = file_appears(&our_pid).await.trim().parse().unwrap();
    let their_child: i32 = file_appears(&their_pid).await.trim().parse().unwrap();
    let our_session = holder_session(&agent, "part/ours/.lock").await;
    let their_session = holder_session(&agent, "part/theirs/.lock").await;

    let cut = now_ns();
    ours_proxy.set_mode(Mode::Blackhole);
    theirs_proxy.set_mode(Mode::Blackhole);

    // Ours: the child is gone, and at that moment the agent still lists the session.
    lease_tests::workers::wait_for(
        T,
        || "lease lock's child to be stopped".into(),
        || (!alive(our_child)).then_some(()),
    )
    .await;
    let gone_after = (now_ns() - cut) as f64 / 1e9;
    let sessions = agent.sessions().await;
    assert!(
        sessions.contains(&our_session),
        "the session expired before the child was gone ({gone_after:.1} s after the cut)"
    );
    eprintln!("lease lock: child gone {gone_after:.1} s after the cut, its session still listed");
    assert!(
        gone_after < 10.0,
        "the child outlived the TTL: {gone_after:.1} s"
    );
    let out = within(T, "lease lock to exit", ours.wait_with_output())
        .await
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(124),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // consul lock: its session expires (up to 2 × its 15 s TTL) while its child runs on.
    lease_tests::workers::wait_for_async(
        Duration::from_secs(45),
        || "consul lock's session to expire".into(),
        || async { (!agent.sessions().await.contains(&their_session)).then_some(()) },
    )
    .await;
    let expired_after = (now_ns() - cut) as f64 / 1e9;
    assert!(
        alive(their_child),
        "consul lock stopped its child this time; the README says it does not"
    );
    eprintln!(
        "consul lock: session gone {expired_after:.1} s after the cut, its child still running"
    );
    theirs.kill().await.unwrap();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(their_child), Signal::SIGKILL).unwrap();
}

/// Nothing of a command's process group runs beside the next holder: a command that ignores the
/// forwarded SIGTERM is killed (SIGKILL) a grace later, and a background child left by a command
/// that exited is stopped before the release. Judged from the history the commands (and their
/// background children) append to: the first's last write comes before the second's first.
#[tokio::test]
async fn nothing_of_the_command_group_runs_beside_the_next_holder() {
    let agent = Agent::start().await;
    let scratch = Scratch::new("group");
    for case in ["ignores-sigterm", "leaves-a-child"] {
        let history = scratch.path(&format!("history-{case}"));
        let pids = scratch.path(&format!("pids-{case}"));
        let go = scratch.path(&format!("go-{case}"));
        let prefix = format!("group/{case}");
        // Writes from the command and from a background child of its own, every 10 ms (not to
        // lease's stderr: a group left running would hold the test's pipe open).
        let writer = |name: &str, foreground: &str| {
            format!(
                "exec >/dev/null 2>&1; \
                 w() {{ while :; do echo \"$(date +%s%N) {name}\" >> {h}; sleep 0.01; done; }}; \
                 w & echo $! >> {p}; echo $$ >> {p}; {foreground}",
                h = history.display(),
                p = pids.display()
            )
        };
        let first_command = match case {
            // `trap ''` is inherited: the background writer and every sleep ignore SIGTERM too.
            "ignores-sigterm" => format!("trap '' TERM; {}", writer("first", "w")),
            // Exits once told to, leaving its background writer.
            _ => writer(
                "first",
                &format!("until [ -e {} ]; do sleep 0.01; done; exit 0", go.display()),
            ),
        };
        let first = lease_on(&agent)
            .args(["lock", "--grace", "1s", &prefix, "--", "sh", "-c"])
            .arg(&first_command)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        wait_for_lines(&history, "first", 5).await;
        let first_pids: Vec<i32> = std::fs::read_to_string(&pids)
            .unwrap()
            .split_whitespace()
            .map(|p| p.parse().unwrap())
            .collect();
        let mut second = lease_on(&agent)
            .args(["lock", &prefix, "--", "sh", "-c", &writer("second", "w")])
            .spawn()
            .unwrap();
        let asked = now_ns();
        if case == "ignores-sigterm" {
            send(first.id().unwrap(), Signal::SIGTERM);
        } else {
            std::fs::write(&go, "").unwrap();
        }
        // Whatever the verdict, no writer of this test outlives it.
        let cleanup = first_pids.clone();
        let _reaper = scopeguard(move || {
            for pid in cleanup {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL);
            }
        });
        let out = within(T, "the first lease lock to exit", first.wait_with_output())
            .await
            .unwrap();
        let exited = now_ns();
        let stderr = String::from_utf8_lossy(&out.stderr);
        let still: Vec<i32> = first_pids.iter().copied().filter(|&p| alive(p)).collect();
        assert!(
            still.is_empty(),
            "{case}: {still:?} of the first command's group still run after lease lock exited: \
             {stderr}"
        );
        match case {
            "ignores-sigterm" => {
                assert_eq!(out.status.code(), Some(128 + 9), "{stderr}");
                assert!(stderr.contains("killing it (SIGKILL)"), "{stderr}");
                eprintln!(
                    "{case}: SIGTERM → group killed and lease lock gone in {:.0} ms (grace 1 s)",
                    (exited - asked) as f64 / 1e6
                );
            }
            _ => {
                assert_eq!(out.status.code(), Some(0), "{stderr}");
                assert!(
                    stderr.contains("left processes running in its group"),
                    "{stderr}"
                );
            }
        }
        wait_for_lines(&history, "second", 5).await;
        send(second.id().unwrap(), Signal::SIGTERM);
        within(T, "the second lease lock to exit", second.wait())
            .await
            .unwrap();
        let (last_first, first_second) = hand_over(&history);
        assert!(
            last_first < first_second,
            "{case}: the first command's group wrote at {last_first}, after the next holder's \
             first write at {first_second}"
        );
        assert_nothing_left(&agent, &prefix).await;
    }
}

/// Runs `f` when dropped.
fn scopeguard(f: impl FnOnce()) -> impl Drop {
    struct Guard<F: FnOnce()>(Option<F>);
    impl<F: FnOnce()> Drop for Guard<F> {
        fn drop(&mut self) {
            if let Some(f) = self.0.take() {
                f();
            }
        }
    }
    Guard(Some(f))
}

/// `lease gc` removes the released leader keys under a prefix and nothing else: not a held
/// key, not a plain KV key, not a key taken during its `--older-than` watch; `--dry-run` removes
/// nothing. A removed key can be taken again (its LockIndex restarts at 1).
#[tokio::test]
async fn gc_removes_released_leader_keys_and_nothing_else() {
    let agent = Agent::start().await;
    let scratch = Scratch::new("gc");
    let run = |args: &[&str]| {
        let mut c = lease_on(&agent);
        c.args(args);
        c
    };
    let release = |key: &str| {
        let key = key.to_owned();
        let c = run(&["lock", &key, "--", "true"]);
        async move {
            let out = output(c, "lease lock KEY -- true").await;
            assert!(out.status.success(), "{key}: {out:?}");
        }
    };
    for key in ["gc/a", "gc/b", "gc/c", "gc/d"] {
        release(key).await;
    }
    let ready = scratch.path("ready");
    let mut held = run(&["lock", "gc/held", "--", "sh", "-c"])
        .arg(format!("touch {}; exec sleep 30", ready.display()))
        .spawn()
        .unwrap();
    file_appears_empty_ok(&ready).await;
    agent.put_key("gc/config", b"keep me", 0).await;

    let out = output(run(&["gc", "--dry-run", "gc/"]), "lease gc --dry-run").await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let listed = String::from_utf8_lossy(&out.stdout);
    assert_eq!(listed.lines().count(), 4, "{listed}");
    assert!(
        listed.contains("would remove gc/a/.lock (lock index 1"),
        "{listed}"
    );
    assert_eq!(
        sorted_keys(&agent, "gc/").await.len(),
        6,
        "--dry-run removed nothing"
    );

    // --older-than: gc/c is taken and released during the watch, so it stays.
    let mut gc = run(&["gc", "--older-than", "2s", "gc/"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(gc.stderr.take().unwrap()).lines();
    within(T, "lease gc to start its watch", async {
        while let Some(line) = stderr.next_line().await.unwrap() {
            if line.contains("watching them for 2s") {
                return;
            }
        }
        panic!("lease gc ended its stderr without watching");
    })
    .await;
    release("gc/c").await;
    let out = within(T, "lease gc --older-than to finish", gc.wait_with_output())
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let removed = String::from_utf8_lossy(&out.stdout);
    assert_eq!(removed.lines().count(), 3, "{removed}");
    assert_eq!(
        sorted_keys(&agent, "gc/").await,
        ["gc/c/.lock", "gc/config", "gc/held/.lock"],
        "{removed}"
    );

    // Without a watch: the released gc/c goes, the held key and the plain key stay.
    let out = output(run(&["gc", "gc/"]), "lease gc").await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(
        sorted_keys(&agent, "gc/").await,
        ["gc/config", "gc/held/.lock"]
    );
    assert_eq!(
        agent.key("gc/config").await["Value"],
        "a2VlcCBtZQ==",
        "the plain key is untouched"
    );

    // A removed key is taken again, from a LockIndex of 1.
    let out = output(
        run(&["lock", "gc/a", "--", "sh", "-c", "echo $LEASE_SEQUENCER"]),
        "lease lock on a removed key",
    )
    .await;
    assert!(out.status.success(), "{out:?}");
    let sequencer: lease_core::Sequencer =
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    assert_eq!(sequencer.index(), 1);

    let out = output(run(&["gc", ""]), "lease gc ''").await;
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    send(held.id().unwrap(), Signal::SIGTERM);
    within(T, "the holder to exit", held.wait()).await.unwrap();
}

/// The keys under `prefix`, sorted.
async fn sorted_keys(agent: &Agent, prefix: &str) -> Vec<String> {
    let mut keys = agent.keys(prefix).await;
    keys.sort();
    keys
}
