//! Child processes of a test and their histories: `lease-worker`s (or `consul lock` children)
//! started under one directory, signalled, stopped with a bound on how long they may take, and
//! their histories merged (see [`crate::history`]).
//!
//! Files live under `target/<area>/<test>-…/` and are removed when the [`Run`] is dropped, unless
//! the test failed (then the path is printed).
//!
//! Every process a run starts records its panics in the run's directory (see [`crate::panics`]);
//! a run dropped with a panic record it has not reported through [`Run::panics`] fails its test
//! with the message.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use lease_core::Backend;

use tokio::process::{Child, ChildStdin, Command};
use tokio::time::Instant;

use crate::consul::workspace_root;
use crate::history::History;
use crate::overlap::now_ns;

/// One child process of a [`Run`], with its history file and its log (stderr).
#[derive(Debug)]
pub struct Worker {
    /// Its name in the run (the stem of its files).
    pub name: String,
    child: Child,
    /// Its process id.
    pub pid: u32,
    /// The history file it appends to.
    pub history: PathBuf,
    /// Its stderr.
    pub log: PathBuf,
    /// Whether it has been reaped.
    pub exited: bool,
}

/// The workers of one test, with their files under one directory.
#[derive(Debug)]
pub struct Run {
    /// Where the histories and logs are.
    pub dir: PathBuf,
    /// Every process started, in order.
    pub workers: Vec<Worker>,
    /// Keep the files when the run is dropped (set when something failed).
    pub keep: bool,
    /// How long a process may take to exit after SIGTERM before it counts as hung (10 s unless
    /// set).
    pub exit_within: Duration,
    worker_bin: PathBuf,
    /// Variables set for every process started from now on.
    env: Vec<(String, String)>,
    /// Whether [`Run::panics`] handed the panic records to a judge.
    panics_reported: bool,
}

impl Run {
    /// A run whose files go under `target/<area>/<test>-<pid>-<ns>/`, starting `worker_bin`
    /// (`env!("CARGO_BIN_EXE_lease-worker")` in an integration test).
    pub fn new(area: &str, test: &str, worker_bin: &Path) -> Run {
        let dir = workspace_root().join("target").join(area).join(format!(
            "{test}-{}-{}",
            std::process::id(),
            now_ns()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        Run {
            dir,
            workers: Vec::new(),
            keep: false,
            exit_within: Duration::from_secs(10),
            worker_bin: worker_bin.to_path_buf(),
            env: Vec::new(),
            panics_reported: false,
        }
    }

    /// Sets the variable `key` to `value` for every process started from now on.
    pub fn env(&mut self, key: &str, value: &str) {
        self.env.push((key.to_owned(), value.to_owned()));
    }

    /// The panic records of every process of the run so far (see [`crate::panics`]), in time
    /// order. The caller judges them: once called, dropping the run no longer fails on them.
    pub fn panics(&mut self) -> Vec<crate::history::Line> {
        self.panics_reported = true;
        crate::panics::read_dir(&self.dir)
    }

    /// Starts a worker with `args` (its `--history` is added); returns its index.
    pub fn spawn(&mut self, name: &str, args: &[String]) -> usize {
        let mut command = Command::new(&self.worker_bin);
        command
            .args(args)
            .arg("--history")
            .arg(self.history_path(name))
            .env("RUST_LOG", crate::log_filter("info"));
        self.spawn_command(name, command)
    }

    /// [`spawn`](Run::spawn) with a pipe to the worker's stdin, returned.
    pub fn spawn_with_stdin(&mut self, name: &str, args: &[String]) -> (usize, ChildStdin) {
        let mut command = Command::new(&self.worker_bin);
        command
            .args(args)
            .arg("--history")
            .arg(self.history_path(name))
            .env("RUST_LOG", crate::log_filter("debug"));
        let i = self.start(name, command, Stdio::piped());
        let stdin = self.workers[i].child.stdin.take().expect("a piped stdin");
        (i, stdin)
    }

    /// The history file of the process called `name`.
    pub fn history_path(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.history"))
    }

    /// Starts `command` as the process called `name` (stdout discarded, stderr to its log); it
    /// is expected to append to [`history_path(name)`](Run::history_path). Returns its index.
    pub fn spawn_command(&mut self, name: &str, command: Command) -> usize {
        self.start(name, command, Stdio::null())
    }

    fn start(&mut self, name: &str, mut command: Command, stdin: Stdio) -> usize {
        let history = self.history_path(name);
        let log = self.dir.join(format!("{name}.log"));
        command.env(crate::panics::DIR_ENV, &self.dir);
        for (key, value) in &self.env {
            command.env(key, value);
        }
        let child = command
            .stdin(stdin)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {command:?}: {e}"));
        let pid = child.id().unwrap();
        self.workers.push(Worker {
            name: name.to_owned(),
            child,
            pid,
            history,
            log,
            exited: false,
        });
        self.workers.len() - 1
    }

    /// The process id of worker `i`.
    pub fn pid(&self, i: usize) -> u32 {
        self.workers[i].pid
    }

    /// The merged histories of `which`.
    pub fn history(&self, which: &[usize]) -> History {
        let paths: Vec<&Path> = which
            .iter()
            .map(|&i| self.workers[i].history.as_path())
            .collect();
        History::load(&paths)
    }

    /// Every history of the run, merged.
    pub fn all(&self) -> History {
        History::load_dir(&self.dir)
    }

    /// Where to look when something failed.
    pub fn files(&self) -> String {
        format!("histories and worker logs in {}", self.dir.display())
    }

    /// Fails if a worker died on its own (a crash, a bad argument): its log says why.
    pub fn assert_alive(&mut self) {
        for w in &mut self.workers {
            if w.exited {
                continue;
            }
            if let Ok(Some(status)) = w.child.try_wait() {
                let log = std::fs::read_to_string(&w.log).unwrap_or_default();
                self.keep = true;
                panic!(
                    "worker {} (pid {}) exited by itself with {status}; its log:\n{log}",
                    w.name, w.pid
                );
            }
        }
    }

    /// `kill -9` of process `i`, reaped at once (so its pid is never signalled again).
    pub async fn kill9(&mut self, i: usize) {
        let w = &mut self.workers[i];
        if w.exited {
            return;
        }
        let _ = w.child.start_kill();
        let _ = w.child.wait().await;
        w.exited = true;
    }

    /// Whether process `i` is still running (not reaped, and not exited by itself).
    pub fn running(&mut self, i: usize) -> bool {
        let w = &mut self.workers[i];
        !w.exited && matches!(w.child.try_wait(), Ok(None))
    }

    /// Sends SIGTERM to `which` and waits (bounded) for each to exit.
    pub async fn terminate(&mut self, which: &[usize]) -> Result<(), String> {
        let pids: Vec<u32> = which
            .iter()
            .filter(|&&i| !self.workers[i].exited)
            .map(|&i| self.workers[i].pid)
            .collect();
        signal("CONT", &pids);
        signal("TERM", &pids);
        let within = self.exit_within;
        let mut slow = Vec::new();
        for &i in which {
            let w = &mut self.workers[i];
            if w.exited {
                continue;
            }
            match tokio::time::timeout(within, w.child.wait()).await {
                Ok(_) => w.exited = true,
                Err(_) => {
                    let _ = w.child.start_kill();
                    let _ = w.child.wait().await;
                    w.exited = true;
                    slow.push(format!("{} (pid {})", w.name, w.pid));
                }
            }
        }
        if slow.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "did not exit within {within:?} of SIGTERM (killed): {}",
                slow.join(", ")
            ))
        }
    }

    /// [`terminate`](Run::terminate) for every process.
    pub async fn terminate_all(&mut self) -> Result<(), String> {
        let all: Vec<usize> = (0..self.workers.len()).collect();
        self.terminate(&all).await
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        // Children are killed by `kill_on_drop`. A panic nobody judged fails the test; keep the
        // files of a failed test.
        if !self.panics_reported && !std::thread::panicking() {
            let records = crate::panics::read_dir(&self.dir);
            if !records.is_empty() {
                self.keep = true;
                panic!(
                    "{} panic record(s) in the processes of this run:\n{}\n({})",
                    records.len(),
                    crate::panics::describe(&records),
                    self.files()
                );
            }
        }
        if self.keep || std::thread::panicking() {
            eprintln!("{}", self.files());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// `kill -<sig> <pids…>`: one command, so all of them get it at once.
pub fn signal(sig: &str, pids: &[u32]) {
    if pids.is_empty() {
        return;
    }
    let status = std::process::Command::new("kill")
        .arg(format!("-{sig}"))
        .args(pids.iter().map(u32::to_string))
        .status()
        .unwrap_or_else(|e| panic!("cannot run kill: {e}"));
    assert!(status.success(), "kill -{sig} {pids:?} failed");
}

/// The backend a worker binary's flags name: `--consul URL`, else `--etcd URL[,URL…]`, else
/// `--postgres URL`, else `--redis URL`, else the RabbitMQ `--amqp URL` (the caller checks that
/// one is given). One place for every worker binary, so they all build their clients alike.
pub fn worker_backend(
    consul: Option<&str>,
    etcd: Option<&str>,
    postgres: Option<&str>,
    redis: Option<&str>,
    amqp: Option<&str>,
) -> Result<Arc<dyn Backend>, lease_core::Error> {
    if let Some(url) = redis {
        return Ok(Arc::new(lease_redis::Redis::new(url)?));
    }
    if let Some(url) = consul {
        return Ok(Arc::new(
            lease_consul::Consul::builder().address(url).build()?,
        ));
    }
    if let Some(urls) = etcd {
        return Ok(Arc::new(
            lease_etcd::Etcd::builder()
                .endpoints(urls.split(','))
                .build()?,
        ));
    }
    if let Some(url) = postgres {
        return Ok(Arc::new(lease_postgres::Postgres::new(url)?));
    }
    Ok(Arc::new(
        lease_amqp::Amqp::builder(amqp.unwrap_or_default())
            .connection_name(format!("lease-worker-{}", std::process::id()))
            .build()?,
    ))
}

/// Polls `check` (every 20 ms) until it gives a value; panics after `limit` with `what()`.
pub async fn wait_for<T>(
    limit: Duration,
    what: impl Fn() -> String,
    mut check: impl FnMut() -> Option<T>,
) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = check() {
            return v;
        }
        if Instant::now() >= deadline {
            panic!("timed out after {limit:?} waiting for {}", what());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// [`wait_for`] with an async check.
pub async fn wait_for_async<T, F: std::future::Future<Output = Option<T>>>(
    limit: Duration,
    what: impl Fn() -> String,
    mut check: impl FnMut() -> F,
) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        if Instant::now() >= deadline {
            panic!("timed out after {limit:?} waiting for {}", what());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
