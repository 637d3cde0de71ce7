//! What a campaign tells the application: its [`LeaderEvent`]s, and how it ends
//! ([`CampaignEnd`], [`AfterWorker`]).

use std::sync::Arc;
use std::time::Duration;

use crate::observer::Leader;
use crate::{Error, LostReason, Sequencer};

/// What a campaign reports to the application, through [`Campaign::on_event`](super::Campaign::on_event) and
/// [`CampaignHandle::events`](super::CampaignHandle::events).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum LeaderEvent {
    /// This node was elected; the worker starts now.
    Elected {
        /// The new lease's fencing token; its index rises with every election.
        sequencer: Sequencer,
    },
    /// The lease was lost; the worker has already been cancelled (its future dropped).
    Lost {
        /// The lost lease's fencing token.
        sequencer: Sequencer,
        /// Why it was lost.
        reason: LostReason,
    },
    /// The worker returned `Ok`; the lease has been released.
    WorkerFinished {
        /// The released lease's fencing token.
        sequencer: Sequencer,
    },
    /// The worker returned `Err`; the lease has been released and the campaign backs off before
    /// campaigning again.
    WorkerFailed {
        /// The released lease's fencing token.
        sequencer: Sequencer,
        /// The worker's error.
        error: Arc<dyn std::error::Error + Send + Sync>,
    },
    /// The worker panicked; the lease has been released and the campaign backs off before
    /// campaigning again.
    WorkerPanicked {
        /// The released lease's fencing token.
        sequencer: Sequencer,
        /// The panic's message, when it was a string.
        message: String,
    },
    /// The campaign stopped on shutdown: the worker was cancelled, the work in flight drained
    /// (see [`Campaign::drain_timeout`](super::Campaign::drain_timeout)) and the lease released.
    Released {
        /// The released lease's fencing token.
        sequencer: Sequencer,
    },
    /// Acquiring failed with an error retrying can fix ([`Error::is_transient`]); the campaign
    /// tries again after `retry_in`.
    AcquireFailed {
        /// The error.
        error: Arc<Error>,
        /// The backoff before the next attempt.
        retry_in: Duration,
    },
    /// Who leads changed (for a leader key on a backend that supports
    /// [`Backend::observe_leader`](crate::Backend::observe_leader)); `None` while nobody leads or nothing can be confirmed.
    ///
    /// While this node holds its lease it is the leader reported, whatever the backend's watch
    /// says meanwhile: an outage that ends the watch does not report "nobody" while this node
    /// leads and runs its worker. Other nodes' terms come from the watch.
    LeaderChanged {
        /// The new leader.
        leader: Option<Leader>,
    },
}

/// What the campaign does when the worker returns `Ok(())` on its own.
///
/// A worker that returns `Err` or panics always makes the campaign step down (release the lease,
/// so another node can take over), back off, and campaign again.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum AfterWorker {
    /// Release the lease and end the campaign with [`CampaignEnd::WorkerFinished`]: the work is
    /// done.
    #[default]
    Stop,
    /// Release the lease and campaign again (another node may win).
    Recampaign,
}

/// Why a campaign ended without error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CampaignEnd {
    /// The shutdown token was cancelled; any lease was released.
    Shutdown,
    /// The worker returned `Ok` and [`AfterWorker::Stop`] was chosen; the lease was released.
    WorkerFinished,
}

/// Where [`Campaign::on_event`](super::Campaign::on_event)(super::Campaign::on_event) sends events.
pub(super) type EventSink = Arc<dyn Fn(LeaderEvent) + Send + Sync>;
