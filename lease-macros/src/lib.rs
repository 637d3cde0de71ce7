//! `#[leader_only]` and `#[semaphore]`: run an `async fn` only while holding a lease.
//!
//! Use them through `lease-core` with its `macros` feature (`lease_core::leader_only`,
//! `lease_core::semaphore`); this crate only holds the macros. The generated code calls
//! [`lease_core::guarded`](https://docs.rs/lease-core), which acquires the lease, runs the body
//! under it, cancels the body the moment the lease is known lost, and releases the lease when the
//! body is done.
//!
//! # What the attribute does to your function
//!
//! ```text
//! #[leader_only(key = "jobs/compact")]
//! async fn compact(db: &Db) -> T { body }
//! ```
//!
//! becomes exactly
//!
//! ```text
//! async fn compact(db: &Db) -> Result<T, lease_core::GuardError> { … }
//! ```
//!
//! (`()` when there is no return type). The signature is rewritten in the source, so rustdoc,
//! rust-analyzer and the compiler all see the `Result`. Calling the function:
//!
//! 1. acquires the lease, waiting as `wait` says;
//! 2. runs `body` under it; `lease_core::current_sequencer()` returns the lease's fencing token;
//! 3. if the lease is lost first, drops `body` at its next `.await` (its destructors run);
//! 4. releases the lease, then returns.
//!
//! | outcome | result | did the body run? |
//! | --- | --- | --- |
//! | finished while the lease was held | `Ok(value)` | yes, to the end |
//! | held elsewhere past `wait` | `Err(GuardError::Busy { .. })` | no |
//! | the lease was lost | `Err(GuardError::Lost(reason))` | started, cancelled |
//! | ran past `max_run` | `Err(GuardError::TimedOut { .. })` | started, cancelled |
//! | nested in guarded work of this task on the same key | `Err(GuardError::AlreadyHeld { .. })`, at once, whatever `wait` | no |
//! | the backend failed, no default backend… | `Err(GuardError::Backend(error))` | no |
//!
//! A body that itself returns `Result<U, E>` gives `Result<Result<U, E>, GuardError>`: the two
//! kinds of failure stay apart. `impl Trait` return types keep their meaning
//! (`Result<impl Trait, GuardError>`), and `return` and `?` in the body behave as before.
//!
//! # Arguments
//!
//! | argument | meaning | default |
//! | --- | --- | --- |
//! | `key = …` (`#[leader_only]`, or first positional) | the leader key: a literal, a constant or an expression | required |
//! | `name = …` (`#[semaphore]`, or first positional) | the semaphore's prefix: a literal, a constant or an expression | required |
//! | `limit = …` (`#[semaphore]`, or second positional) | slots, 1 to 4294967295: a literal, or a `u32` constant or expression | required |
//! | `wait = "30s"` / `"forever"` / `"never"` | how long to wait when held elsewhere | `"forever"` |
//! | `ttl = "15s"` | session TTL, whole seconds, 10s to 24h | `"15s"` |
//! | `lock_delay = "0s"` | lock-delay after loss, at most 60s | `"15s"` |
//! | `min_hold = "30s"` | keep the lease at least this long after the body started (ShedLock's `lockAtLeastFor`), released in the background | `"0s"` |
//! | `max_run = "5m"` | cancel the body if it runs longer (ShedLock's `lockAtMostFor`): `Err(GuardError::TimedOut { .. })` | no bound |
//! | `backend = <expr>` | the backend to acquire from: a backend or a reference to one | the default backend (scoped, else process-wide) |
//! | `crate = "my_facade::lease"` | the path the generated code names lease-core by, for a crate that re-exports it: a path in a string | `"::lease_core"` |
//!
//! Durations are a number and a unit (`ms`, `s`, `m`, `h`), repeatable: `"1m30s"`. Durations,
//! literal keys and literal limits are checked at compile time, with the error at your token; the
//! function is still emitted, so the rest of your crate keeps compiling against it. A literal key
//! is checked by lease-core's own key rule (`lease_core::key_rule_broken`, a `const fn`): the one
//! rule `LeaseSpec::validate` applies at run time, so the two never disagree (`key = "/jobs/a"`
//! fails the build with "evaluation panicked: keys are relative: remove the leading '/'"). So are the names: an argument the attribute does not take is one
//! error at its name, listing the ones it does, and asking "did you mean" the nearest one when
//! it looks like a misspelling of it (`kye` for `key`).
//!
//! A key, name or limit that is not a literal (`key = KEYS::COMPACT`,
//! `key = format!("tenant/{tenant}/compact")`) is evaluated on every call, inside the function,
//! so it may use the arguments; it is checked at run time, before anything is acquired: a bad
//! one returns `Err(GuardError::Backend(Error::InvalidKey { .. }))` (or `InvalidLimit`) and the
//! body does not run. A key is anything `LeaseSpec::leader` takes (`&str`, `String`).
//!
//! `backend` is evaluated on every call, inside the function, so it may use the arguments and
//! `self` (`backend = &self.backend`). It must be a lease backend, that is a value whose type
//! implements `lease_core::Backend` (`Memory`, `Consul`, `Etcd`, `Amqp`, an `Arc` or a `Box` of
//! one, an `Arc<dyn Backend>`), or a reference to one (`&consul`, `&self.backend`, a
//! `&dyn Backend`); a value of any other type is a compile error at the expression, saying so.
//! A backend behind another smart pointer (a `LazyLock` static, an `Rc`) is not looked through:
//! borrow the backend itself (`backend = &*BACKEND`). With a `&mut self` or `self` receiver, give
//! it a value that does not borrow `self` (`backend = self.backend.clone()`), because the body
//! takes `self`. Without `backend`, the lease comes from the backend set with
//! `lease_core::set_default_backend` at start-up; if none was set, the call returns
//! `Err(GuardError::Backend(Error::NoDefaultBackend))` and the body does not run.
//!
//! `crate` is for code that reaches lease-core through another crate, or under another name
//! (`pub use lease_core as lease;`), as tokio's and serde's `crate` arguments are: every path the
//! function's expansion names (`GuardError`, `LeaseSpec`, `Backend`, …) then starts with it
//! instead of `::lease_core`. It is a path without generic arguments, resolved where the
//! function is (`crate::…`, `self::…`, or a dependency's name); one that does not parse is an
//! error at the literal, and one that does not lead to lease-core is the compiler's error there.
//! Stacked attributes take one path for the function: `crate` given on any of them applies to
//! all, and two different ones are an error.
//!
//! # Examples
//!
//! A job that runs on one node at a time; the others skip it:
//!
//! ```
//! use lease_core::{GuardError, leader_only, memory::Memory};
//!
//! #[leader_only(key = "jobs/compact", wait = "never")]
//! async fn compact(tables: u32) -> u32 {
//!     // The fencing token to pass to the storage layer, so it can refuse a stale leader.
//!     let token = lease_core::current_sequencer().expect("inside a guarded fn");
//!     println!("compacting {tables} tables as {token}");
//!     tables
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! lease_core::set_default_backend(Memory::new());
//! match compact(3).await {
//!     Ok(done) => println!("compacted {done} tables"),
//!     Err(GuardError::Busy { .. }) => println!("another node is compacting"),
//!     Err(GuardError::Lost(reason)) => eprintln!("cancelled: {reason}"),
//!     Err(error) => eprintln!("not run: {error}"),
//! }
//! # }
//! ```
//!
//! A key per tenant, built from the arguments, and a key from a constant:
//!
//! ```
//! use lease_core::{leader_only, memory::Memory};
//!
//! struct Keys;
//! impl Keys {
//!     const NIGHTLY: &'static str = "jobs/nightly";
//! }
//!
//! #[leader_only(key = format!("tenants/{tenant}/compact"), wait = "never", backend = backend)]
//! async fn compact_tenant(backend: &Memory, tenant: u64) -> String {
//!     lease_core::current_sequencer().map(|s| s.key().to_owned()).unwrap_or_default()
//! }
//!
//! #[leader_only(key = Keys::NIGHTLY, backend = backend)]
//! async fn nightly(backend: &Memory) {}
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), lease_core::GuardError> {
//! let backend = Memory::new();
//! assert_eq!(compact_tenant(&backend, 7).await?, "tenants/7/compact");
//! nightly(&backend).await?;
//! # Ok(())
//! # }
//! ```
//!
//! At most three reports at a time, waiting up to 30 seconds for a slot, on a backend held by
//! the service:
//!
//! ```
//! use lease_core::{GuardError, memory::Memory, semaphore};
//!
//! struct Reports {
//!     backend: Memory,
//! }
//!
//! impl Reports {
//!     #[semaphore("reports", 3, wait = "30s", backend = &self.backend)]
//!     async fn render(&self, id: u64) -> Result<String, std::fmt::Error> {
//!         Ok(format!("report {id}"))
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), GuardError> {
//! let reports = Reports { backend: Memory::new() };
//! let rendered: Result<String, std::fmt::Error> = reports.render(7).await?;
//! assert_eq!(rendered.as_deref(), Ok("report 7"));
//! # Ok(())
//! # }
//! ```
//!
//! Through a crate that re-exports lease-core, with `crate` saying where it is:
//!
//! ```
//! // In the facade crate, or the application itself.
//! mod platform {
//!     pub use lease_core as lease;
//! }
//!
//! #[platform::lease::leader_only(key = "jobs/compact", crate = "crate::platform::lease")]
//! async fn compact() -> u32 {
//!     3
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! platform::lease::set_default_backend(platform::lease::memory::Memory::new());
//! let compacted: Result<u32, platform::lease::GuardError> = compact().await;
//! assert_eq!(compacted.ok(), Some(3));
//! # }
//! ```
//!
//! # Stacking
//!
//! `#[leader_only]` and `#[semaphore]` stack: the function runs while holding every lease named,
//! and still returns one `Result<T, GuardError>`. The top attribute's lease is acquired first
//! and released last; `lease_core::current_sequencer()` inside the body is the innermost
//! lease's. The first failure is the outcome (`Busy` on the key that was busy, `Lost` if any of
//! the leases is lost while the body runs).
//!
//! ```
//! use lease_core::{GuardError, leader_only, memory::Memory, semaphore};
//!
//! // One leader node runs the export, with at most two exports across all tenants' leaders.
//! #[leader_only(key = "jobs/export/leader", backend = backend)]
//! #[semaphore("jobs/export/slots", 2, backend = backend)]
//! async fn export(backend: &Memory) -> usize {
//!     3
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let exported: Result<usize, GuardError> = export(&Memory::new()).await;
//! assert_eq!(exported.ok(), Some(3));
//! # }
//! ```
//!
//! The attributes are recognised by name (`leader_only`, `semaphore`, with any path before it),
//! so another attribute of one of those names cannot sit below them.
//!
//! # Where it can be used
//!
//! On any `async fn` with a body: free functions, methods taking `&self`, `&mut self` or `self`,
//! generic functions, methods in impl blocks, and provided methods of traits. A trait method
//! without a body cannot be guarded; put the attribute on the implementation. The function's
//! future is `Send` when its body's is.

mod attr;
mod expand;

use proc_macro::TokenStream;

use crate::attr::Kind;

/// Runs the `async fn` only while holding the leader lease on `key`; its arguments, forms and
/// errors are in the `lease-macros` crate documentation.
///
/// `async fn f(..) -> T` becomes `async fn f(..) -> Result<T, lease_core::GuardError>`.
///
/// ```
/// # use lease_core::leader_only;
/// #[leader_only(key = "jobs/nightly", wait = "never", ttl = "30s", lock_delay = "0s")]
/// async fn nightly() {}
/// ```
#[proc_macro_attribute]
pub fn leader_only(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::lease_attribute(Kind::Leader, args.into(), item.into()).into()
}

/// Runs the `async fn` only while holding one of `limit` slots of the semaphore `name`; its
/// arguments, forms and errors are in the `lease-macros` crate documentation.
///
/// `async fn f(..) -> T` becomes `async fn f(..) -> Result<T, lease_core::GuardError>`.
///
/// ```
/// # use lease_core::semaphore;
/// #[semaphore(name = "reports", limit = 3, wait = "1m")]
/// async fn report() {}
///
/// #[semaphore("exports", 2)]
/// async fn export() {}
/// ```
#[proc_macro_attribute]
pub fn semaphore(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::lease_attribute(Kind::Semaphore, args.into(), item.into()).into()
}

/// The examples of this crate's README (what crates.io shows), compiled as doctests so that the
/// front page cannot drift from the API; `tests/tests/readmes.rs` of the workspace checks the
/// features, commands and links it names.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
