//! The demo (`cargo run -p lease-demo`, the README's first command) runs to completion on the
//! memory backend, and its measured summary reports a failover, jobs run, and zero leader overlap.
//!
//! Run: `cargo test -p lease-demo`. The test runs the binary cargo built for it (with the
//! features of this build), so `cargo test --workspace` does not build the demo a second time
//! with the demo's own feature set, as `cargo run -p lease-demo` would.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::process::Stdio;
use std::time::Duration;

/// The demo's ~8 s run, with room for a loaded machine.
const DEMO_LIMIT: Duration = Duration::from_secs(120);

#[tokio::test]
async fn the_demo_runs_to_completion_with_zero_leader_overlap() {
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_lease-demo"))
        .env(
            "RUST_LOG",
            "lease_demo=info,lease_core=error,lease_consul=error,lease_etcd=error,lease_amqp=error",
        )
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("cannot run cargo to start the demo");
    let output = tokio::time::timeout(DEMO_LIMIT, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("the demo did not finish within {DEMO_LIMIT:?}"))
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the demo failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    let summary: HashMap<&str, &str> = stdout
        .lines()
        .rev()
        .find_map(|line| line.strip_prefix("SUMMARY "))
        .unwrap_or_else(|| panic!("no SUMMARY line in the demo's output:\n{stdout}"))
        .split_whitespace()
        .filter_map(|pair| pair.split_once('='))
        .collect();
    let number = |key: &str| -> i64 {
        summary
            .get(key)
            .unwrap_or_else(|| panic!("SUMMARY lacks {key}: {summary:?}"))
            .parse()
            .unwrap()
    };
    assert_eq!(number("leader_overlaps"), 0, "{stdout}");
    assert_eq!(number("max_leaders"), 1, "{stdout}");
    assert!(number("failover_ms") >= 0, "no failover: {stdout}");
    assert!(number("elections") >= 2, "{stdout}");
    assert!(number("jobs_run") > 0, "{stdout}");
    assert!(number("max_jobs_in_flight") <= 2, "{stdout}");
    assert_eq!(number("stale_writes"), 0, "{stdout}");
    assert_eq!(number("sessions_left"), 0, "{stdout}");
}
