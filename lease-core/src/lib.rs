//! Distributed leases that cancel the work they guard when they are lost.
//!
//! Work that must run on at most one node (a leader) or at most N nodes (a semaphore) is wrapped
//! in a [`Lease`]: acquired before the work starts, watched while it runs, and the work is
//! cancelled — its future dropped at its next await point — the moment the lease is known lost.
//!
//! Backends, all behind the same [`Backend`] trait: this crate's in-process `memory::Memory`
//! (feature `memory`, on by default: no server, the same semantics), and one crate per server:
//!
//! - `lease-consul`: Consul sessions + KV, interoperating with `consul lock` and `consul lock -n`;
//! - `lease-etcd`: etcd leases, revisions and watches, interoperating with `etcdctl elect`; its
//!   sequencer's index is a cluster-wide, ever-rising revision;
//! - `lease-amqp`: the RabbitMQ persistent semaphore; a leader is one slot.
//!
//! Ways to use a lease:
//!
//! - by hand: [`Backend::acquire`] and [`Lease::run`], as below;
//! - around one call: [`guarded`], or the attributes `#[leader_only]` and `#[semaphore]` (feature
//!   `macros`);
//! - for a background worker: [`leader::Campaign`] runs it only while this node leads, and
//!   [`Backend::observe_leader`] lets any node follow who leads;
//! - in an axum/tower service: the `lease-tower` crate.
//!
//! Before the process exits, await [`Backend::shutdown`]: every lease is released and the next
//! holder takes over at once (a process that skips it still releases its leases while the
//! runtime shuts down, within about a second).
//!
//! A lease is held while nobody has declared it lost *and* its self-fencing deadline has not
//! passed: [`Lease::is_held`] and [`Lease::run`] read the monotonic clock before every poll, so a
//! process resumed after a pause longer than its TTL never runs guarded work again. A pause can
//! still fall between that check and a write, which is why downstream systems check the
//! [`Sequencer`] they are handed.
//!
//! To add a backend, implement [`Backend`] and build leases with the parts in [`backend`]
//! ([`backend::Keepers`], [`backend::Hold`], [`backend::Fence`], [`backend::instrument_acquire`],
//! [`backend::ReachabilityTracker`]), with [`backoff`], [`address`], [`metrics`] and, for a
//! semaphore kept in a key-value store, [`mod@semaphore`]. The backend crates of this repository use
//! nothing else of this crate: they are separate crates, so the compiler holds them to it.
//!
//! # Example
//!
//! ```
//! # #[cfg(feature = "memory")]
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), lease_core::Error> {
//! use lease_core::memory::Memory;
//! use lease_core::{Backend, LeaseSpec, LostReason, Wait};
//!
//! let backend = Memory::new(); // or lease_consul::Consul::from_env()?, ...
//! let lease = backend.acquire(&LeaseSpec::leader("service/billing/leader")).await?;
//! // The fencing token to hand to downstream systems: memory:1:<session>:service/billing/leader
//! let token = lease.sequencer().to_string();
//!
//! // Another contender is told the lease is busy.
//! let busy = backend.acquire(&LeaseSpec::leader("service/billing/leader").wait(Wait::Never)).await;
//! assert!(busy.unwrap_err().is_busy());
//!
//! // Work runs while the lease is held...
//! assert_eq!(lease.run(async { 2 + 2 }).await, Ok(4));
//! // ...and is dropped at its next await point when it is lost (here, an operator's action).
//! backend.invalidate_session(lease.sequencer().holder());
//! let cancelled = lease.run(std::future::pending::<()>()).await;
//! assert_eq!(cancelled, Err(LostReason::SessionInvalidated));
//! # let _ = token;
//! # Ok(())
//! # }
//! # #[cfg(not(feature = "memory"))]
//! # fn main() {}
//! ```

// On docs.rs (`--cfg docsrs`), a feature-gated item shows the feature it needs.
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod address;
pub mod backend;
pub mod backoff;
mod default_backend;
mod error;
mod guard;
pub mod leader;
mod lease;
mod limits;
#[cfg(feature = "memory")]
pub mod memory;
pub mod metrics;
mod observer;
pub mod runtime;
pub mod semaphore;
mod sequencer;
mod shutdown;
mod spec;

pub use backend::Backend;
pub use default_backend::{default_backend, set_default_backend, with_default_backend};
pub use error::{BackendError, BoxError, Error, ErrorKind, LostReason};
#[doc(hidden)]
pub use guard::__private;
pub use guard::{GuardError, current_lease, current_sequencer, guarded, guarded_by_default};
pub use lease::{BoxFuture, Lease, LeaseWatcher};
pub use limits::{MAX_LOCK_DELAY, MAX_TTL, MIN_TTL};
pub use sequencer::{BackendKind, CustomKind, ParseSequencerError, Sequencer};
pub use shutdown::{StopSignal, shutdown_signal};
pub use spec::{LeaseSpec, Target, Wait, key_rule_broken, validate_key};
/// The token that stops a [`Campaign`](leader::Campaign) ([`run_until`](leader::Campaign::run_until),
/// [`hold_until`](leader::Campaign::hold_until)): tokio-util's, re-exported so that using this
/// crate needs no dependency of its own on tokio-util. Cancel it (from a signal handler, or
/// axum's graceful shutdown) and the campaign steps down in order.
pub use tokio_util::sync::CancellationToken;

#[cfg(feature = "macros")]
pub use lease_macros::{leader_only, semaphore};

/// The examples of this crate's README (what crates.io shows), compiled as doctests so that the
/// front page cannot drift from the API; `tests/tests/readmes.rs` of the workspace checks the
/// features, commands and links it names.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
