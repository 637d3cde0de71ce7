use lease_core::{leader_only, semaphore};

#[leader_only(key = "")]
async fn empty() {}

#[semaphore(name = 3, limit = 3)]
async fn number() {}

#[leader_only(key = "/jobs/compact")]
async fn absolute() {}

#[leader_only(key = "jobs//compact")]
async fn empty_segment() {}

#[semaphore(name = "reports/", limit = 3)]
async fn trailing_slash() {}

fn main() {}
