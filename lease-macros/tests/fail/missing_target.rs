use lease_core::{leader_only, semaphore};

#[leader_only]
async fn no_arguments() {}

#[leader_only(wait = "never")]
async fn no_key() {}

#[semaphore(name = "reports")]
async fn no_limit() {}

#[semaphore(limit = 3)]
async fn no_name() {}

#[semaphore]
async fn nothing() {}

fn main() {}
