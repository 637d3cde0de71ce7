//! What reaches a coordinator through its channel: a take or a give-back, and whom to answer.

use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use lease_core::Error;
use lease_core::semaphore::{Give, Take, Taken};

/// How long a give-back is retried through trouble before it is reported failed.
const GIVE_UP_AFTER: Duration = Duration::from_secs(5);

/// What a queued take carries for the coordinator: what to write, and whom to answer.
#[derive(Debug)]
pub(super) struct TakeReply {
    pub(super) value: Vec<u8>,
    pub(super) answer: oneshot::Sender<Result<Taken, Error>>,
}

/// What a queued give-back carries: until when to retry it, and whom to answer (nobody for a
/// slot the coordinator gives back itself).
#[derive(Debug)]
pub(super) struct GiveReply {
    pub(super) give_up: Instant,
    pub(super) answer: Option<oneshot::Sender<Result<(), Error>>>,
}

impl GiveReply {
    /// For a give-back the caller waits for, answered on `answer`.
    pub(super) fn to(answer: oneshot::Sender<Result<(), Error>>) -> Self {
        GiveReply {
            give_up: Instant::now() + GIVE_UP_AFTER,
            answer: Some(answer),
        }
    }

    /// For a slot the coordinator gives back itself: admitted after its caller went away.
    pub(super) fn unanswered() -> Self {
        GiveReply {
            give_up: Instant::now() + GIVE_UP_AFTER,
            answer: None,
        }
    }

    pub(super) fn send(self, result: Result<(), Error>) {
        if let Some(answer) = self.answer {
            let _ = answer.send(result);
        }
    }
}

pub(super) enum Request {
    Take(Take, TakeReply),
    Give(Give, GiveReply),
}
