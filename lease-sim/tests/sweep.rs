//! The CI sweep: seeds `0..500` of each backend's model, the two backends at once on every core,
//! every 100th seed run twice to check that one seed gives one history. The seeds are fixed, so
//! CI is deterministic: the wider search is `scripts/sim.sh N --from SEED`, which sweeps other
//! seeds.
//!
//! `LEASE_SIM_SCHEDULES=N` changes how many: 100 for a developer's quick look, 2,000 for the
//! sweep the simulation was specified with (about 400 s on two cores: a schedule costs 0.17-0.19
//! CPU-seconds in the test profile, where the simulated crates and their hot dependencies build
//! optimized; see the workspace's `Cargo.toml`). 500 is what CI's time allows beside the rest.

use lease_sim::sweep;

/// Schedules per backend: `LEASE_SIM_SCHEDULES`, or 500.
fn schedules() -> u64 {
    match std::env::var("LEASE_SIM_SCHEDULES") {
        Ok(count) => count.parse().unwrap_or_else(|_| {
            panic!("LEASE_SIM_SCHEDULES={count:?} is not a number of schedules")
        }),
        Err(_) => 500,
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
