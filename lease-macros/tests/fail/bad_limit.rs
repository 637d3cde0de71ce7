use lease_core::semaphore;

#[semaphore("reports", 0)]
async fn zero() {}

#[semaphore(name = "reports", limit = "3")]
async fn string() {}

#[semaphore(name = "reports", limit = -1)]
async fn negative() {}

#[semaphore(name = "reports", limit = 1.5)]
async fn float() {}

#[semaphore(name = "reports", limit = 5000000000)]
async fn too_big() {}

// A constant is checked at run time, but its type at compile time.
#[semaphore(name = "reports", limit = SLOTS)]
async fn constant_of_another_type() {}

const SLOTS: u64 = 3;

fn main() {}
