use lease_core::{leader_only, semaphore};

#[leader_only(key = "jobs/a", crate = "not a path!")]
async fn not_a_path() {}

#[semaphore("reports", 3, crate = "")]
async fn empty() {}

#[leader_only(key = "jobs/a", crate = "lease_core::Wait<u8>")]
async fn generic_arguments() {}

#[leader_only(key = "jobs/a", crate = lease_core)]
async fn not_a_string() {}

#[leader_only(key = "jobs/a", crate = "lease_core", crate = "lease_core")]
async fn twice() {}

// Stacked attributes expand into one function, so they take one path for lease-core.
#[leader_only(key = "jobs/a", crate = "lease_core")]
#[semaphore("reports", 3, crate = "::lease_core")]
async fn two_paths() {}

fn main() {}
