//! What every `lease` CLI test shares: running the binary against a real agent or broker, and
//! children that write their own timestamps.
#![allow(dead_code, unreachable_pub)]

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

use lease_tests::consul::{Agent, workspace_root};
use lease_tests::overlap::{Timeline, now_ns};
use tokio::process::Command;

/// The bound on any single wait in these tests.
pub const T: Duration = Duration::from_secs(20);

/// `lease ARGS…` aimed at `consul_addr` (through CONSUL_HTTP_ADDR), stdin closed.
pub fn lease(consul_addr: &str) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_lease"));
    cmd.env("CONSUL_HTTP_ADDR", consul_addr)
        .env_remove("CONSUL_HTTP_TOKEN")
        .env_remove("CONSUL_HTTP_TOKEN_FILE")
        .env_remove("AMQP_URL")
        // Neither may move a test onto etcd, or onto an etcd it did not start.
        .env_remove("LEASE_ETCD_ENDPOINTS")
        .env_remove("ETCD_ENDPOINTS")
        // Nor onto a PostgreSQL server.
        .env_remove("LEASE_POSTGRES_URL")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    cmd
}

/// `lease ARGS…` with no Consul, RabbitMQ, etcd or PostgreSQL configured (Consul's address is a
/// closed port): the flags or the test's variables say which backend.
pub fn lease_cmd() -> Command {
    lease("127.0.0.1:1")
}

/// `lease ARGS…`, none configured ([`lease_cmd`]), run to completion (bounded).
pub async fn run(args: &[&str]) -> Output {
    let mut cmd = lease_cmd();
    cmd.args(args);
    output(cmd, &format!("lease {args:?}")).await
}

/// What a command of `lease lock` was given: its LEASE_SEQUENCER, LEASE_KEY and LEASE_HOLDER.
pub struct LockEnv {
    pub sequencer: String,
    pub key: String,
    pub holder: String,
}

/// `lease lock BACKEND_FLAG URL --value VALUE KEY -- <a gated command>` (`backend_flag` as
/// `--etcd`), stderr piped, once its command runs: the process, the command (still gated: see
/// [`Gated::open`]) and what it was given.
pub async fn lock_gated(
    scratch: &Scratch,
    name: &str,
    backend_flag: &str,
    url: &str,
    value: &str,
    key: &str,
) -> (tokio::process::Child, Gated, LockEnv) {
    let gated = Gated::new(scratch, name, "$LEASE_SEQUENCER $LEASE_KEY $LEASE_HOLDER");
    let child = lease_cmd()
        .args(["lock", backend_flag, url, "--value", value, key])
        .args(["--", "sh", "-c", &gated.script])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let env = file_appears(&gated.env).await;
    let words: Vec<&str> = env.split_whitespace().collect();
    let [sequencer, key, holder] = words[..] else {
        panic!("{name}: expected a sequencer, a key and a holder, not {env:?}");
    };
    let env = LockEnv {
        sequencer: sequencer.to_owned(),
        key: key.to_owned(),
        holder: holder.to_owned(),
    };
    (child, gated, env)
}

/// `lease ARGS…` against `agent`.
pub fn lease_on(agent: &Agent) -> Command {
    lease(&agent.addr().to_string())
}

/// Runs `cmd` to completion (bounded), capturing its output.
/// A panic of `lease` on any thread (a background task's too, which does not end the process)
/// fails the test: the default hook's `panicked at` line on its stderr is the record.
pub async fn output(mut cmd: Command, what: &str) -> Output {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let out = lease_tests::within(T, what, cmd.output())
        .await
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("panicked at"),
        "{what} panicked; its stderr:\n{stderr}"
    );
    out
}

/// The exit code and stderr of `out`, for assertions.
pub fn code_and_stderr(out: &Output) -> (Option<i32>, String) {
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A scratch directory for one test, removed when dropped.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(test: &str) -> Scratch {
        let dir = workspace_root()
            .join("target/lease-cli-tests")
            .join(format!("{test}-{}-{}", std::process::id(), now_ns()));
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("test files kept in {}", self.0.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// A shell child that appends `start end` (its own wall-clock ns) to `file` around `hold`.
pub fn stamping_child(file: &Path, hold: &str) -> String {
    format!(
        "s=$(date +%s%N); sleep {hold}; e=$(date +%s%N); echo \"$s $e\" >> {}",
        file.display()
    )
}

/// Waits (bounded) until `path` exists and returns its contents.
pub async fn file_appears(path: &Path) -> String {
    lease_tests::workers::wait_for(
        T,
        || format!("{} to appear", path.display()),
        || std::fs::read_to_string(path).ok().filter(|s| !s.is_empty()),
    )
    .await
}

/// Whether process `pid` runs: it exists and is not a zombie. A process killed together with its
/// parent (a command's group killed with `lease`'s supervisor) is reparented to init and stays a
/// zombie until init reaps it, which some containers' init never does: it has stopped running all
/// the same.
pub fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let state = stat
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .next()?
                .to_owned();
            Some(state != "Z")
        })
        .unwrap_or(false)
}

/// Sends `signal` to `pid`.
pub fn send(pid: u32, signal: nix::sys::signal::Signal) {
    let pid = nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap());
    nix::sys::signal::kill(pid, signal).unwrap();
}

/// The session holding `key` on `agent`, once one does.
pub async fn holder_session(agent: &Agent, key: &str) -> String {
    lease_tests::workers::wait_for_async(
        T,
        || format!("a session to hold {key}"),
        || async { agent.key(key).await["Session"].as_str().map(str::to_owned) },
    )
    .await
}

/// The sessions on `agent` whose name mentions `prefix` (ours are `lease lock KEY: …`,
/// `consul lock`'s `Consul lock for '…' at 'PREFIX'`).
pub async fn sessions_of(agent: &Agent, prefix: &str) -> Vec<serde_json::Value> {
    let body = reqwest::get(format!("{}/v1/session/list?consistent", agent.url()))
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    let all: Vec<serde_json::Value> = serde_json::from_slice(&body).unwrap();
    all.into_iter()
        .filter(|s| s["Name"].as_str().is_some_and(|n| n.contains(prefix)))
        .collect()
}

/// The keys under `prefix` that are left behind: all of them, except a lock nobody holds: a
/// leader key with no session (`lease lock` keeps a released leader key, so its LockIndex keeps
/// rising for database fences) or a semaphore's `.lock` that names no holder. When the last two
/// contenders of `consul lock -n` (or `lease lock -n`, which cleans up the same way) leave at the
/// same moment, each still sees the other's contender key and neither deletes `.lock`; an empty
/// `.lock` holds nothing and the next acquirer reuses it.
pub async fn leftover_keys(agent: &Agent, prefix: &str) -> Vec<String> {
    let mut left = Vec::new();
    for key in agent.keys(prefix).await {
        if key.ends_with("/.lock") && !holds_anyone(agent, &key).await {
            continue;
        }
        left.push(key);
    }
    left
}

/// Whether `key` is held: a leader key with a session, a semaphore `.lock` with holders, or
/// anything else (an unknown key counts as held).
async fn holds_anyone(agent: &Agent, key: &str) -> bool {
    let url = format!("{}/v1/kv/{key}?consistent", agent.url());
    let Ok(response) = reqwest::get(url).await else {
        return true;
    };
    let Ok(body) = response.bytes().await else {
        return true;
    };
    let Ok(entries) = serde_json::from_slice::<serde_json::Value>(&body) else {
        return true;
    };
    if entries[0]["Flags"].as_u64() == Some(lease_core::Error::LEADER_FLAGS) {
        return entries[0].get("Session").is_some();
    }
    let raw = reqwest::get(format!("{}/v1/kv/{key}?raw&consistent", agent.url())).await;
    let Ok(body) = raw.map(reqwest::Response::bytes) else {
        return true;
    };
    let Ok(body) = body.await else {
        return true;
    };
    match serde_json::from_slice::<serde_json::Value>(&body) {
        Ok(value) => value["Holders"]
            .as_object()
            .is_none_or(|holders| !holders.is_empty()),
        Err(_) => true,
    }
}

/// The sessions not made by `consul lock` (which names its sessions `Consul lock for …`).
fn ours(sessions: Vec<serde_json::Value>) -> Vec<serde_json::Value> {
    sessions
        .into_iter()
        .filter(|s| {
            !s["Name"]
                .as_str()
                .is_some_and(|n| n.starts_with("Consul lock for"))
        })
        .collect()
}

/// Asserts (waiting a little for in-flight clean-up) that `agent` has no session of ours about
/// `prefix` and no key under it (see [`leftover_keys`]).
///
/// `consul lock`'s own sessions are not ours to judge: it destroys its session from the goroutine
/// that renews it, which races its own exit, so a `consul lock` that released and exited cleanly
/// may still leave its session to expire with its TTL (seen once in about fifty runs).
pub async fn assert_nothing_left(agent: &Agent, prefix: &str) {
    let clean = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            if ours(sessions_of(agent, prefix).await).is_empty()
                && leftover_keys(agent, prefix).await.is_empty()
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(
        clean.is_ok(),
        "left behind: sessions {:?}, keys {:?}",
        ours(sessions_of(agent, prefix).await),
        leftover_keys(agent, prefix).await
    );
}

/// A shell command for `lease lock` or another tool: writes `env` (shell words expanded) to its
/// env file, stamps its start, waits for its go file (at most 30 s, then exits 3), and appends
/// `start end` (its own wall-clock ns) to its stamps file.
pub struct Gated {
    pub script: String,
    pub env: PathBuf,
    pub go: PathBuf,
    pub stamps: PathBuf,
}

impl Gated {
    pub fn new(scratch: &Scratch, name: &str, env: &str) -> Gated {
        let (env_file, go, stamps) = (
            scratch.path(&format!("{name}-env")),
            scratch.path(&format!("{name}-go")),
            scratch.path(&format!("{name}-stamps")),
        );
        let script = format!(
            "echo \"{env}\" > {e}; s=$(date +%s%N); n=0; \
             until [ -e {g} ]; do n=$((n+1)); [ $n -gt 600 ] && exit 3; sleep 0.05; done; \
             e=$(date +%s%N); echo \"$s $e\" >> {st}",
            e = env_file.display(),
            g = go.display(),
            st = stamps.display()
        );
        Gated {
            script,
            env: env_file,
            go,
            stamps,
        }
    }

    /// One that runs through as soon as it starts.
    pub fn ungated(scratch: &Scratch, name: &str, env: &str) -> Gated {
        let gated = Gated::new(scratch, name, env);
        gated.open();
        gated
    }

    pub fn open(&self) {
        std::fs::write(&self.go, "").unwrap();
    }

    /// Its one `(start, end)`.
    pub fn interval(&self) -> (u128, u128) {
        let text = std::fs::read_to_string(&self.stamps).unwrap();
        let mut words = text.split_whitespace().map(|w| w.parse::<u128>().unwrap());
        (words.next().unwrap(), words.next().unwrap())
    }
}

/// Asserts that `first` ended before `second` started (both ran, one at a time).
pub fn assert_in_turn(first: (&str, &Gated), second: (&str, &Gated)) {
    let ((a, first), (b, second)) = (first, second);
    let timeline = Timeline::new();
    timeline.record_file(a, &first.stamps);
    timeline.record_file(b, &second.stamps);
    assert_eq!(timeline.len(), 2, "each command ran once");
    timeline.assert_at_most(1);
    let (first_end, second_start) = (first.interval().1, second.interval().0);
    assert!(
        first_end <= second_start,
        "{b} started at {second_start}, before {a} ended at {first_end}"
    );
    eprintln!(
        "{a} → {b}: hand-over in {:.1} ms",
        (second_start - first_end) as f64 / 1e6
    );
}

/// `lease lock ARGS… -- sh -c 'lease check "$LEASE_SEQUENCER"'`, with `lease` on the command's
/// PATH and no backend configured but by `args` (see [`lease_cmd`]), run to completion: `lease
/// lock` exits with the check's code (0 current, 2 the backend could not be asked).
pub async fn check_inside(args: &[&str]) -> Output {
    check_inside_with(lease_cmd(), args).await
}

/// [`check_inside`] from `cmd` (a [`lease_cmd`] with variables of the test's).
pub async fn check_inside_with(mut cmd: Command, args: &[&str]) -> Output {
    let bin = Path::new(env!("CARGO_BIN_EXE_lease"));
    let dir = bin.parent().unwrap();
    let path = std::env::var("PATH").unwrap_or_default();
    cmd.env("PATH", format!("{}:{path}", dir.display()))
        .arg("lock")
        .args(args)
        .args(["--", "sh", "-c", "lease check \"$LEASE_SEQUENCER\""]);
    output(cmd, &format!("lease check inside lease lock {args:?}")).await
}

/// Asserts that [`check_inside`]'s check found its sequencer current.
pub fn assert_checked_current(out: &Output) {
    let (code, stderr) = code_and_stderr(out);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(code, Some(0), "stdout: {stdout}\nstderr: {stderr}");
    assert!(stdout.starts_with("current: "), "{stdout}");
}
