//! The CI sweep: seeds `0..150` of each backend's model, the two backends at once on every core,
//! every 100th seed run twice to check that one seed gives one history. The seeds are fixed, so
//! CI is deterministic: the wider search is `scripts/sim.sh N --from SEED`, which sweeps other
//! seeds in a release build.
//!
//! `LEASE_SIM_SCHEDULES=N` changes how many: 2,000 is the sweep the simulation was specified
//! with. In the test profile a schedule costs about 0.77 CPU-seconds (its dependencies build
//! optimized, our crates do not; see the workspace's `Cargo.toml`), so 150 is what a 2-core CI
//! run affords beside the other tests (about 115 s); a release build (`scripts/sim.sh`) runs
//! about 10 a second on two cores.

use lease_sim::sweep;

/// Schedules per backend: `LEASE_SIM_SCHEDULES`, or 150.
fn schedules() -> u64 {
    match std::env::var("LEASE_SIM_SCHEDULES") {
        Ok(count) => count.parse().unwrap_or_else(|_| {
            panic!("LEASE_SIM_SCHEDULES={count:?} is not a number of schedules")
        }),
        Err(_) => 150,
    }
}

/// Sweeps `backend` and fails with every problem found and the commands that replay them.
fn sweeps_clean(backend: &str) {
    let model = lease_sim::model_for(backend).expect("a backend with a model");
    // The two tests run at once: each takes half the cores.
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let jobs = (cores / 2).max(1);
    let report = sweep::sweep(model, 0, schedules(), jobs, 100);
    // Printed, not only the assertion's message: the simulation's panic hook records panics.
    print!("{}", report.problems(backend));
    println!("{}", report.result_line(backend));
    assert!(
        report.passed(),
        "{backend}'s sweep failed: see its problems above"
    );
}

#[test]
fn consul_schedules_keep_every_invariant() {
    sweeps_clean("consul");
}

#[test]
fn etcd_schedules_keep_every_invariant() {
    sweeps_clean("etcd");
}
