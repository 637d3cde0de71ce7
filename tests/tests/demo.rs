//! The demo (`cargo run -p lease-demo`, the README's first command) runs to completion on the
//! memory backend, and its measured summary reports a failover, jobs run, and zero leader overlap.
//!
//! Run: `cargo test -p lease-tests --test demo`. The test runs the demo through cargo, so the
//! first run includes building it; the bound below covers that.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::process::Stdio;
use std::time::Duration;

use lease_tests::within;

/// Building the demo on a cold cache plus its ~8 s run.
const DEMO_LIMIT: Duration = Duration::from_secs(600);

#[tokio::test]
async fn the_demo_runs_to_completion_with_zero_leader_overlap() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let child = tokio::process::Command::new(cargo)
        .args(["run", "--quiet", "-p", "lease-demo"])
        .current_dir(lease_tests::consul::workspace_root())
        .env("RUST_LOG", "lease_demo=info,lease_core=error")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("cannot run cargo to start the demo");
    let output = within(DEMO_LIMIT, "the demo to finish", child.wait_with_output())
        .await
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
