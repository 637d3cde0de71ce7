use lease_core::{leader_only, semaphore};

#[leader_only(key = "jobs/sync")]
fn sync_job() {}

#[semaphore("reports", 3)]
pub fn sync_report() -> u32 {
    1
}

fn main() {
    // Still emitted unchanged next to the error, so callers do not add errors of their own.
    sync_job();
    let _: u32 = sync_report();
}
