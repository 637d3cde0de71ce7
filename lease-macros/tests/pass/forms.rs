//! Every place the attributes may be put, and the signature they produce.

use std::fmt::Display;
use std::sync::Arc;

use lease_core::{Backend, GuardError, leader_only, semaphore};

#[leader_only(key = "jobs/free")]
async fn free() {}

#[leader_only("jobs/positional", wait = "never")]
pub async fn positional() -> u32 {
    1
}

#[semaphore(
    name = "reports",
    limit = 3,
    wait = "1m30s",
    ttl = "30s",
    lock_delay = "0s"
)]
async fn named_semaphore() -> String {
    String::new()
}

#[semaphore("reports", 3u32, wait = "forever")]
async fn positional_semaphore() {}

#[leader_only(key = "jobs/generic")]
async fn generic<T: Display + Send>(value: T) -> String {
    value.to_string()
}

#[leader_only(key = "jobs/question-mark")]
async fn question_mark(text: &str) -> Result<u32, std::num::ParseIntError> {
    let n: u32 = text.parse()?;
    if n == 0 {
        return Ok(1);
    }
    Ok(n)
}

#[leader_only(key = "jobs/impl-trait")]
async fn impl_trait() -> impl Display {
    7
}

struct Service<B> {
    backend: B,
    runs: u32,
}

impl<B: Backend + Clone> Service<B> {
    #[leader_only(key = "jobs/ref", backend = &self.backend)]
    async fn by_ref(&self) -> u32 {
        self.runs
    }

    #[leader_only(key = "jobs/ref-mut", backend = self.backend.clone())]
    async fn by_mut(&mut self) -> u32 {
        self.runs += 1;
        self.runs
    }

    #[semaphore("jobs/value", 2, backend = self.backend.clone())]
    async fn by_value(self) -> u32 {
        self.runs
    }
}

trait Job {
    fn name(&self) -> &str;

    #[leader_only(key = "jobs/trait")]
    async fn run(&self) -> usize {
        self.name().len()
    }
}

fn arc_backend(
    backend: Arc<dyn Backend>,
) -> impl std::future::Future<Output = Result<(), GuardError>> {
    #[leader_only(key = "jobs/arc", backend = backend)]
    async fn with(backend: Arc<dyn Backend>) {}
    with(backend)
}

// Every form `backend = …` takes: a backend, a reference to one at any depth, a trait object,
// an `Arc` or `Box` of one, and expressions looser than `&` (which the macro parenthesizes).
#[leader_only(key = "jobs/ref-ref", backend = &backend)]
async fn reference_to_reference(backend: &lease_core::memory::Memory) {}

#[leader_only(key = "jobs/dyn", backend = backend)]
async fn trait_object(backend: &dyn Backend) {}

#[leader_only(key = "jobs/arc-ref", backend = &backend)]
#[semaphore("jobs/arc-ref-slots", 2, backend = backend.clone())]
async fn arc_by_reference_and_value(backend: Arc<lease_core::memory::Memory>) {}

#[leader_only(key = "jobs/box", backend = Box::new(lease_core::memory::Memory::new()))]
async fn boxed() {}

#[leader_only(key = "jobs/if", backend = if first { a } else { b })]
async fn conditional(first: bool, a: &dyn Backend, b: &dyn Backend) {}

#[leader_only(key = "jobs/cast", backend = backend as &dyn Backend)]
async fn cast(backend: &lease_core::memory::Memory) {}

mod keys {
    pub const COMPACT: &str = "jobs/compact";
    pub const REPORT_SLOTS: u32 = 4;
}

#[leader_only(key = keys::COMPACT)]
async fn constant_key() {}

#[leader_only(key = format!("tenants/{tenant}/compact"), wait = "never")]
async fn expression_key(tenant: u64) -> u64 {
    tenant
}

#[semaphore(name = String::from("reports/") + region, limit = keys::REPORT_SLOTS)]
async fn expression_name(region: &str) -> usize {
    region.len()
}

#[leader_only(key = "jobs/stacked")]
#[lease_core::semaphore("jobs/stacked-slots", 2)]
async fn stacked() -> u32 {
    1
}

#[leader_only(
    key = "jobs/scheduled",
    wait = "never",
    min_hold = "30s",
    max_run = "5m"
)]
async fn scheduled() {}

fn assert_send<F: std::future::Future + Send>(f: F) -> F {
    f
}

pub(super) fn compiles() {
    let _: fn() -> _ = || {
        let _ = assert_send(free());
        let _ = assert_send(generic(1));
        let _ = assert_send(question_mark("1"));
        let _ = assert_send(expression_key(7));
        let _ = assert_send(expression_name("eu"));
    };
    let _ = arc_backend;
    let _ = (
        reference_to_reference,
        trait_object,
        arc_by_reference_and_value,
        boxed,
    );
    let _ = (conditional, cast);
    let _ = assert_send::<std::future::Ready<()>>;
}

#[allow(dead_code)]
async fn signatures() {
    let _: Result<(), GuardError> = free().await;
    let _: Result<u32, GuardError> = positional().await;
    let _: Result<String, GuardError> = named_semaphore().await;
    let _: Result<(), GuardError> = positional_semaphore().await;
    let _: Result<String, GuardError> = generic("x").await;
    let _: Result<Result<u32, std::num::ParseIntError>, GuardError> = question_mark("2").await;
    let _: Result<(), GuardError> = constant_key().await;
    let _: Result<(), GuardError> = scheduled().await;
    // One Result for both attributes, not Result<Result<u32, GuardError>, GuardError>.
    let _: Result<u32, GuardError> = stacked().await;
    let _: Result<u64, GuardError> = expression_key(7).await;
    let _: Result<usize, GuardError> = expression_name("eu").await;
    let shown: Result<_, GuardError> = impl_trait().await;
    if let Ok(shown) = shown {
        let _ = shown.to_string();
    }
}
