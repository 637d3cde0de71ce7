use lease_core::{leader_only, semaphore};

#[leader_only(key = "jobs/a", timeout = "3s")]
async fn unknown() {}

#[leader_only(key = "jobs/a", limit = 3)]
async fn limit_on_leader() {}

#[semaphore("reports", 3, key = "jobs/a")]
async fn key_on_semaphore() {}

#[leader_only(key = "jobs/a", type = "x")]
async fn keyword() {}

fn main() {
    // The functions are still emitted (unchanged), so their callers compile.
    let _ = unknown();
    let _ = limit_on_leader();
    let _ = key_on_semaphore();
    let _ = keyword();
}
