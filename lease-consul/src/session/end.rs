//! How a session's life ends ([`SessionEnd`]), and what keeps it alive until then ([`Renewals`]).

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use lease_core::backend::Fence;
use lease_core::{Error, LostReason};

/// How a session's life ended, as seen by its renew loop.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum SessionEnd {
    /// Consul no longer knows the session (destroyed, expired, checks failed).
    Invalidated,
    /// No renewal succeeded for TTL − margin: the session must be treated as lost, for
    /// `reason` (self-fenced, or this process was paused: see [`SessionEnd::fenced`]).
    Fenced {
        reason: LostReason,
        last_error: Option<String>,
    },
}

impl SessionEnd {
    /// The session's `fence` passed (or a renewal ran into its deadline): the loss the fence
    /// declares ([`Fence::expired`]), which names a pause of this process rather than Consul when
    /// the fence's timer ran late; `SelfFenced` if the deadline is, just, not behind us.
    pub(crate) fn fenced(fence: &Fence, last_error: Option<String>) -> SessionEnd {
        let reason = fence.expired().unwrap_or_else(|| LostReason::SelfFenced {
            unconfirmed_for: fence.confirmed_at().map_or(Duration::ZERO, |c| c.elapsed()),
        });
        SessionEnd::Fenced { reason, last_error }
    }

    /// The error for an `acquire` whose waiting session could not be kept alive: Consul's
    /// failure, or (this process was paused, and Consul was not even asked) the loss.
    pub(crate) fn into_wait_error(self, key: &str) -> Error {
        let message = match self {
            SessionEnd::Invalidated => "the session was invalidated".into(),
            SessionEnd::Fenced {
                reason: reason @ LostReason::ProcessPaused { .. },
                ..
            } => return Error::Lost(reason),
            SessionEnd::Fenced { last_error, .. } => {
                last_error.unwrap_or_else(|| "renewals did not succeed".into())
            }
        };
        Error::Backend {
            backend: "Consul",
            operation: format!("keep a session alive while waiting for {key:?}"),
            message,
            transient: true,
        }
    }
}

impl From<SessionEnd> for LostReason {
    fn from(end: SessionEnd) -> Self {
        match end {
            SessionEnd::Invalidated => LostReason::SessionInvalidated,
            SessionEnd::Fenced { reason, .. } => reason,
        }
    }
}

/// What keeps a session alive (its renew loop, or its share of the heartbeat), boxed so acquire
/// can poll it while waiting and then hand it to the holder task. It ends when the session must
/// be considered gone.
pub(crate) type Renewals = Pin<Box<dyn Future<Output = SessionEnd> + Send>>;
