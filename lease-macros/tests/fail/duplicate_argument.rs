use lease_core::{leader_only, semaphore};

#[leader_only(key = "jobs/a", key = "jobs/b")]
async fn twice() {}

#[leader_only("jobs/a", key = "jobs/b")]
async fn positional_and_named() {}

#[semaphore("reports", 3, limit = 4)]
async fn limit_twice() {}

#[semaphore(name = "reports", limit = 3, wait = "never", wait = "5s")]
async fn wait_twice() {}

fn main() {}
