//! One firing of a scheduled job, as a cron-started process runs it: a `#[leader_only]` job with
//! `wait = "never"` and `min_hold = "5s"`, fired once, then the process exits. Appends `ran`
//! (with the lease's sequencer) or `skipped` to its history (see `lease_tests::history`), then
//! `exit`.
//!
//! ```text
//! lease-job (--consul URL | --etcd URLS | --postgres URL) --key KEY --history FILE
//!           [--exit shutdown|return]
//! ```
//!
//! `--exit shutdown` (default) awaits `Backend::shutdown` before `main` returns, as the README
//! asks of a service; `--exit return` returns from `main` at once, so the runtime drops the
//! holder task still keeping the lease for its `min_hold` (the last-resort path).
//!
//! The job's lease: TTL 10 s (Consul's shortest), lock-delay 0, `min_hold` 5 s. Exit status 0
//! after either outcome, 2 for bad arguments, 1 if the job could not be tried.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::sync::Arc;

use lease_core::{Backend, GuardError, leader_only};
use lease_tests::history::Recorder as History;

const USAGE: &str = "usage: lease-job (--consul URL | --etcd URLS | --postgres URL) --key KEY \
--history FILE [--exit shutdown|return]";

/// The job: records that it ran, under which lease.
#[leader_only(key = key, wait = "never", ttl = "10s", lock_delay = "0s", min_hold = "5s", backend = backend)]
async fn job(backend: &Arc<dyn Backend>, key: &str, history: &History) {
    let seq = lease_core::current_sequencer()
        .map(|seq| seq.to_string())
        .unwrap_or_default();
    history.log("ran", &seq, "");
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let (mut consul, mut etcd, mut postgres, mut key, mut history) = (None, None, None, None, None);
    let mut shutdown = true;
    while let Some(flag) = args.next() {
        let value = args.next();
        match (flag.as_str(), value) {
            ("--consul", Some(v)) => consul = Some(v),
            ("--etcd", Some(v)) => etcd = Some(v),
            ("--postgres", Some(v)) => postgres = Some(v),
            ("--key", Some(v)) => key = Some(v),
            ("--history", Some(v)) => history = Some(PathBuf::from(v)),
            ("--exit", Some(v)) if v == "shutdown" || v == "return" => shutdown = v == "shutdown",
            _ => {
                eprintln!("{USAGE}");
                std::process::exit(2);
            }
        }
    }
    let (Some(key), Some(history)) = (key, history) else {
        eprintln!("{USAGE}");
        std::process::exit(2);
    };
    let history = History::open(&history).unwrap();
    let backend = match lease_tests::workers::worker_backend(
        consul.as_deref(),
        etcd.as_deref(),
        postgres.as_deref(),
        None,
        None,
    ) {
        Ok(backend) => backend,
        Err(error) => {
            eprintln!("lease-job: {error}");
            std::process::exit(2);
        }
    };
    match job(&backend, &key, &history).await {
        Ok(()) => {}
        Err(GuardError::Busy { .. }) => history.log("skipped", "", ""),
        Err(error) => {
            history.log("failed", "", &error.to_string());
            std::process::exit(1);
        }
    }
    if shutdown {
        backend.shutdown().await;
    }
    history.log("exit", "", "");
}
