use lease_core::{leader_only, semaphore};

#[leader_only(wait = "never", "jobs/a")]
async fn positional_after_named() {}

#[leader_only("jobs/a", "jobs/b")]
async fn two_keys() {}

#[semaphore("reports", 3, 4)]
async fn three_positional() {}

fn main() {}
