//! Distributed leases that cancel the work they guard when they are lost.
//!
//! Work that must run on at most one node (a leader) or at most N nodes (a semaphore) is wrapped
//! in a [`Lease`]: acquired before the work starts, watched while it runs, and the work is
//! cancelled — its future dropped at its next await point — the moment the lease is known lost.
//!
//! Backends, one cargo feature each:
//!
//! - `consul`: Consul sessions + KV ([`consul::Consul`]), interoperating with `consul lock`.
//! - `amqp`: the RabbitMQ persistent semaphore ([`amqp::Amqp`]), leader = one slot.
//! - `memory` (default): in-process, no server, the same semantics ([`memory::Memory`]).
//!
//! [`leader`] runs a worker only while this node leads ([`leader::Campaign`]) and lets any node
//! observe who leads ([`Backend::observe_leader`]).
//!
//! # Example
//!
//! ```no_run
//! # #[cfg(feature = "consul")]
//! # async fn example() -> Result<(), lease_core::Error> {
//! use lease_core::{Backend, LeaseSpec, Wait};
//! use lease_core::consul::Consul;
//!
//! let consul = Consul::from_env()?;
//! let lease = consul.acquire(&LeaseSpec::leader("service/billing/leader")).await?;
//! println!("leading as {}", lease.sequencer());
//! match lease.run(async { /* leader-only work */ }).await {
//!     Ok(()) => lease.release().await?,
//!     Err(reason) => eprintln!("lost the lease: {reason}; the work was cancelled"),
//! }
//! # Ok(())
//! # }
//! ```

// Built without any backend (as lease-tower builds it on its own), the half of the lease model
// that backends call has no caller; that is expected, not dead code.
#![cfg_attr(
    not(any(feature = "memory", feature = "consul", feature = "amqp")),
    allow(dead_code)
)]

mod backend;
mod default_backend;
mod error;
mod guard;
mod lease;
mod sequencer;
mod spec;

#[cfg(feature = "consul")]
pub mod consul;
pub mod leader;
#[cfg(feature = "memory")]
pub mod memory;

#[cfg(feature = "amqp")]
pub mod amqp;

pub use backend::Backend;
pub use default_backend::{default_backend, set_default_backend};
pub use error::{BoxError, Error, LostReason};
#[doc(hidden)]
pub use guard::__private;
pub use guard::{GuardError, current_lease, current_sequencer, guarded, guarded_by_default};
pub use lease::{BoxFuture, Lease, LeaseWatcher};
pub use sequencer::{BackendKind, ParseSequencerError, Sequencer};
pub use spec::{LeaseSpec, MAX_LOCK_DELAY, MAX_TTL, MIN_TTL, Target, Wait};

#[cfg(feature = "macros")]
pub use lease_macros::{leader_only, semaphore};
