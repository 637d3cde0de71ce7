//! The generated code uses absolute paths: the user's own `lease_core`, `tokio`, `core`,
//! `Result` and `Duration` do not capture them.

#![allow(dead_code)]

mod lease_core {
    pub struct GuardError;
    pub struct LeaseSpec;
    pub fn guarded() {}
}

mod tokio {}

mod core {}

struct Duration;

type Result<T> = std::result::Result<T, ()>;

#[::lease_core::leader_only(key = "jobs/shadowed", wait = "5s", ttl = "20s")]
async fn shadowed() -> u8 {
    1
}

#[::lease_core::semaphore("jobs/shadowed", 2, backend = ::lease_core::memory::Memory::new())]
async fn shadowed_semaphore() {}

async fn callers() {
    let _: std::result::Result<u8, ::lease_core::GuardError> = shadowed().await;
    let _: std::result::Result<(), ::lease_core::GuardError> = shadowed_semaphore().await;
}
