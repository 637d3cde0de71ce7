//! Scheduled and concurrent jobs guarded by leases, on three simulated nodes.
//!
//! Three "nodes" (tasks sharing one in-process store, as three processes share one Consul) each
//! run the same schedule. The compaction job is `#[leader_only]`: on every tick exactly one node
//! runs it and the others skip it. The report job is `#[semaphore]` with a limit of 2: six
//! reports requested at once render two at a time. Finally an operator invalidates the session
//! of a running compaction, and the job is cancelled mid-way. The program ends by itself.
//!
//! Run it with:
//!
//! ```text
//! cargo run -p lease-jobs-example
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lease_core::Backend as _;
use lease_core::memory::Memory;
use lease_core::{GuardError, Sequencer, leader_only, semaphore};
use tokio::sync::oneshot;

const NODES: usize = 3;
const TICKS: usize = 3;
const REPORTS: u64 = 6;

/// The scheduled job: one node at a time, the others skip the tick. Uses the default backend.
#[leader_only(key = "jobs/compact", wait = "never", lock_delay = "0s")]
async fn compact(node: usize) {
    // The fencing token a storage layer would check before accepting the compacted segments.
    if let Some(token) = lease_core::current_sequencer() {
        println!("  node {node}: compacting under {token}");
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
}

/// The report job: at most two at once across all nodes, waiting up to 10 s for a slot.
#[semaphore("jobs/reports", 2, wait = "10s", backend = backend)]
async fn render_report(backend: &Memory, id: u64, rendering: &AtomicUsize) -> usize {
    let now = rendering.fetch_add(1, Ordering::SeqCst) + 1;
    println!("  report {id}: rendering ({now} at once)");
    tokio::time::sleep(Duration::from_millis(150)).await;
    rendering.fetch_sub(1, Ordering::SeqCst);
    now
}

/// A compaction that takes long enough for an operator to step in.
#[leader_only(key = "jobs/compact-long", lock_delay = "0s")]
async fn long_compaction(started: oneshot::Sender<Sequencer>) {
    if let Some(token) = lease_core::current_sequencer() {
        let _ = started.send(token);
    }
    tokio::time::sleep(Duration::from_secs(3600)).await;
    println!("  unreachable: the lease was lost long before this");
}

#[tokio::main]
async fn main() {
    let store = Memory::new();
    lease_core::set_default_backend(store.clone());

    println!("scheduled compaction on {NODES} nodes, {TICKS} ticks:");
    let mut ran = 0;
    for tick in 1..=TICKS {
        let nodes: Vec<_> = (1..=NODES)
            .map(|node| tokio::spawn(compact(node)))
            .collect();
        let (mut ran_now, mut skipped) = (0, 0);
        for node in nodes {
            match node.await {
                Ok(Ok(())) => ran_now += 1,
                Ok(Err(GuardError::Busy { .. })) => skipped += 1,
                Ok(Err(error)) => println!("  tick {tick}: compaction failed: {error}"),
                Err(panic) => println!("  tick {tick}: a node's task failed: {panic}"),
            }
        }
        println!("tick {tick}: ran on {ran_now} node(s), skipped on {skipped}");
        ran += ran_now;
    }

    println!("{REPORTS} reports requested at once, limit 2:");
    let rendering = Arc::new(AtomicUsize::new(0));
    let reports: Vec<_> = (1..=REPORTS)
        .map(|id| {
            let store = store.clone();
            let rendering = Arc::clone(&rendering);
            tokio::spawn(async move { render_report(&store, id, &rendering).await })
        })
        .collect();
    let mut most_at_once = 0;
    for report in reports {
        match report.await {
            Ok(Ok(at_once)) => most_at_once = most_at_once.max(at_once),
            Ok(Err(error)) => println!("  a report did not render: {error}"),
            Err(panic) => println!("  a report task failed: {panic}"),
        }
    }

    println!("an operator invalidates a running compaction's session:");
    let (started_tx, started_rx) = oneshot::channel();
    let job = tokio::spawn(long_compaction(started_tx));
    match started_rx.await {
        Ok(token) => {
            store.invalidate_session(token.holder());
        }
        Err(_) => println!("  the long compaction never started"),
    }
    match job.await {
        Ok(Err(GuardError::Lost(reason))) => println!("  cancelled: {reason}"),
        Ok(other) => println!("  unexpected outcome: {other:?}"),
        Err(panic) => println!("  the job's task failed: {panic}"),
    }

    println!(
        "done: compaction ran {ran} time(s) in {TICKS} ticks; at most {most_at_once} report(s) rendered at once"
    );
    // Give back whatever is still held before the process ends (on Consul: at once, instead of
    // after the session TTL and lock-delay).
    store.shutdown().await;
}
