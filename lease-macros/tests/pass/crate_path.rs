//! `crate = "…"`: the generated code reaches lease-core through the path given, as a crate that
//! re-exports lease-core (a facade, or `pub use lease_core as lease;`) needs.

use std::sync::atomic::Ordering;

/// An application's own name for lease-core.
pub mod facade {
    pub use lease_core as lease;
}

/// A facade that is lease-core but for `__private::body`, which counts the bodies it is given:
/// `::lease_core` still resolves here (it is a dependency), so a count is how the test tells the
/// generated code went through the path given.
pub mod counting {
    pub use lease_core::*;

    pub mod __private {
        use std::future::Future;
        use std::sync::atomic::{AtomicUsize, Ordering};

        pub use lease_core::__private::*;

        pub static BODIES: AtomicUsize = AtomicUsize::new(0);

        pub fn body<T, F: Future<Output = T>>(body: F) -> F {
            BODIES.fetch_add(1, Ordering::SeqCst);
            lease_core::__private::body::<T, F>(body)
        }
    }
}

#[facade::lease::leader_only(key = "jobs/facade", wait = "never", crate = "facade::lease")]
async fn through_facade() -> u8 {
    1
}

// The stacked attribute is named by the facade's path and recognised by its last segment; the
// `crate` given on either of them is the one path for the whole function.
#[facade::lease::leader_only(key = "jobs/facade-stacked", backend = backend)]
#[facade::lease::semaphore(
    "jobs/facade-slots",
    2,
    backend = backend,
    crate = "self::facade::lease"
)]
async fn stacked(backend: &facade::lease::memory::Memory) -> u8 {
    2
}

#[counting::leader_only(key = "jobs/counted", wait = "never", backend = backend, crate = "counting")]
#[counting::semaphore("jobs/counted-slots", 2, crate = "counting", backend = backend)]
async fn counted(backend: &counting::memory::Memory) -> u8 {
    3
}

#[counting::semaphore(
    name = "jobs/counted-alone",
    limit = 1,
    crate = "counting",
    max_run = "1m"
)]
async fn counted_with_default_backend() {}

pub(super) async fn runs() {
    let backend = facade::lease::memory::Memory::new();
    let _: Result<u8, facade::lease::GuardError> = through_facade().await;
    assert_eq!(stacked(&backend).await.ok(), Some(2));

    let before = counting::__private::BODIES.load(Ordering::SeqCst);
    assert_eq!(counted(&backend).await.ok(), Some(3));
    assert_eq!(
        counting::__private::BODIES.load(Ordering::SeqCst),
        before + 1,
        "the body went through `crate = \"counting\"`"
    );
    let _: fn() -> _ = counted_with_default_backend;
}
