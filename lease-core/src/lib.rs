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
//! - `memory` (default): in-process, no server, the same semantics.
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

mod backend;
mod error;
mod lease;
mod sequencer;
mod spec;

#[cfg(feature = "consul")]
pub mod consul;

#[cfg(feature = "amqp")]
pub mod amqp;

pub use backend::Backend;
pub use error::{BoxError, Error, LostReason};
pub use lease::{BoxFuture, Lease, LeaseWatcher};
pub use sequencer::{BackendKind, ParseSequencerError, Sequencer};
pub use spec::{LeaseSpec, MAX_LOCK_DELAY, MAX_TTL, MIN_TTL, Target, Wait};
