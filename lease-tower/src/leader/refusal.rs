//! [`Refusal`]: why a leader-only route did not serve a request, and what the client is told.

use std::fmt;

use http::StatusCode;

/// Why a [`LeaderOnly`](super::LeaderOnly) service answered a request itself instead of passing
/// it on. Each has a status and a default body ([`text`](Self::text)) that says only what a
/// client can act on: never an error message, a key or a backend address (those go to tracing
/// and metrics). [`LeaderOnlyLayer::refusal_body`](super::LeaderOnlyLayer::refusal_body)
/// replaces the bodies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Refusal {
    /// Another node leads: `503` with `Retry-After` and the [`LEADER_HEADER`](super::LEADER_HEADER).
    NotLeader,
    /// Another node leads and redirects are on: `307 Temporary Redirect` to it.
    Redirect,
    /// No leader is known yet (an election is under way, or the backend cannot be reached):
    /// `503` with `Retry-After`.
    NoLeader,
    /// This node is stepping down (it is shutting down): `503` with `Retry-After`.
    SteppingDown,
    /// This node's campaign has not started, or has ended: `503` with `Retry-After`.
    NotCampaigning,
    /// This node's campaign failed on an error retrying cannot fix (logged at ERROR when it
    /// happened): `500`, so clients do not retry forever.
    CampaignFailed,
}

impl Refusal {
    /// The status of the answer.
    pub fn status(self) -> StatusCode {
        match self {
            Refusal::Redirect => StatusCode::TEMPORARY_REDIRECT,
            Refusal::CampaignFailed => StatusCode::INTERNAL_SERVER_ERROR,
            Refusal::NotLeader
            | Refusal::NoLeader
            | Refusal::SteppingDown
            | Refusal::NotCampaigning => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// The default body: one line, for the client.
    pub fn text(self) -> &'static str {
        match self {
            Refusal::NotLeader => {
                "this node is not the leader; send the request to the node named in the lease-leader header, or retry after the delay in Retry-After\n"
            }
            Refusal::Redirect => "this node is not the leader; follow the redirect to the leader\n",
            Refusal::NoLeader => "no leader is known yet; retry after the delay in Retry-After\n",
            Refusal::SteppingDown => {
                "this node is stepping down as leader; retry on the next leader after the delay in Retry-After\n"
            }
            Refusal::NotCampaigning => {
                "this node does not serve this route now; retry after the delay in Retry-After\n"
            }
            Refusal::CampaignFailed => {
                "this node cannot serve this route; retrying will not help until its operator fixes it\n"
            }
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.text().trim_end())
    }
}
