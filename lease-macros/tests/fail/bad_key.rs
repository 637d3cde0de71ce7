use lease_core::{leader_only, semaphore};

#[leader_only(key = jobs)]
async fn ident() {}

#[leader_only(key = "")]
async fn empty() {}

#[semaphore(name = 3, limit = 3)]
async fn number() {}

fn main() {}
