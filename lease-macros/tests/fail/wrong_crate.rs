// A path that parses but does not lead to lease-core: the compiler's errors, at the literal.
#[lease_core::leader_only(key = "jobs/a", crate = "std::collections")]
async fn elsewhere() {}

#[lease_core::semaphore("reports", 3, crate = "facade")]
async fn missing() {}

fn main() {}
