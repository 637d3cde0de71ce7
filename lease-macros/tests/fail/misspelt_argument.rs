use lease_core::{leader_only, semaphore};

// One error per misspelt name, at the name, naming the argument it looks like; not also a
// "missing `key`" for the argument it was meant to be.
#[leader_only(kye = "jobs/a")]
async fn transposed() {}

#[leader_only(key = "jobs/a", wiat = "never", lock_dealy = "0s")]
async fn optional_ones() {}

#[semaphore(nmae = "reports", limt = 3)]
async fn both_targets() {}

#[leader_only(Key = "jobs/a", delay_lock = "0s")]
async fn case_and_word_order() {}

// Unknown and not close to any argument: no hint, and the key is still reported missing.
#[leader_only(lease = "jobs/a")]
async fn not_close() {}

fn main() {}
