//! Leader-only work: who leads, and one campaign per key that runs a worker only while elected.
//!
//! - [`observe`](LeaderWatch): [`Leader`] is who holds a leader key; a [`LeaderObserver`]
//!   (from [`Backend::observe_leader`](crate::Backend::observe_leader)) is one backend
//!   observation of it, which ends when the backend cannot confirm the key; [`LeaderWatch`]
//!   observes again with backoff, for as long as the process needs it.
//! - [`Campaign`] acquires a leader lease, runs the worker while it is held, cancels the worker
//!   the moment the lease is lost, campaigns again with backoff (retrying exactly the errors
//!   [`Error::is_transient`](crate::Error::is_transient) calls transient), and on shutdown steps
//!   down: it waits for the work in flight (bounded), then **releases at once**, so a follower
//!   takes over without waiting for the TTL or the lock-delay.
//! - A [`CampaignHandle`] shares that one election with the rest of the process: its current
//!   [`Term`] (a watch of it too), who leads, its [`CampaignState`] and its [`LeaderEvent`]s.
//!   A leader-only route (`lease-tower`'s `LeaderOnlyLayer`), a worker and a health check on
//!   the same key all read the same handle, so one process runs one election per key.
//!
//! # Example
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use lease_core::leader::{Campaign, CampaignState};
//! use lease_core::memory::Memory;
//! use lease_core::{BoxError, LeaseSpec};
//! use tokio::sync::mpsc;
//! use lease_core::CancellationToken;
//!
//! let campaign = Campaign::try_new(
//!     Memory::new(),
//!     LeaseSpec::leader("service/reports/leader").value("http://10.0.0.7:8080"),
//! )?;
//! let health = campaign.handle(); // e.g. for a /healthz route
//! let shutdown = CancellationToken::new();
//! let (ran, mut runs) = mpsc::unbounded_channel();
//! let running = tokio::spawn(campaign.run_until(shutdown.clone(), move |lease| {
//!     let ran = ran.clone();
//!     async move {
//!         // Runs only while elected; dropped at its next await point if the lease is lost.
//!         let _ = ran.send(lease.sequencer().clone());
//!         std::future::pending::<Result<(), BoxError>>().await
//!     }
//! }));
//!
//! let sequencer = runs.recv().await.expect("the worker runs once elected");
//! // The handle sees the term the worker runs under, and who leads.
//! assert_eq!(health.term().map(|t| t.sequencer().clone()), Some(sequencer.clone()));
//! assert_eq!(health.leader().map(|l| l.sequencer), Some(sequencer));
//!
//! shutdown.cancel(); // the worker is cancelled and the lease released
//! running.await??;
//! assert!(matches!(health.state(), CampaignState::Ended(_)));
//! # Ok(())
//! # }
//! ```

mod campaign;
mod event;
mod handle;
mod observe;

/// The level of a failure the campaign or its leader watch retries (an acquire, an
/// observation): one level for both, since both are the same outage seen from two sides. DEBUG,
/// as every retried backend request in this crate: the campaign reports its failures to the
/// application ([`LeaderEvent::AcquireFailed`], [`CampaignHandle::last_error`]), and at WARN an
/// outage would log a line per retry per campaign.
const RETRY_LEVEL: tracing::Level = tracing::Level::DEBUG;

pub use crate::observer::{Leader, LeaderObserver, Observation};
pub use campaign::{Campaign, run};
pub use event::{AfterWorker, CampaignEnd, LeaderEvent};
pub use handle::{CampaignHandle, CampaignState, Term, TermGuard};
pub use observe::{LeaderWatch, Observing};
