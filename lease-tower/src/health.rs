//! Health and readiness endpoints: this node's campaigns, its leases and whether its backend
//! answers, as JSON (the counterpart of client-go's `HealthzAdaptor`).
//!
//! [`Health`] is built once with what to report, and gives two tower services that answer any
//! request (mount them with axum's `route_service`):
//!
//! - [`liveness`](Health::liveness) (`/healthz`): always `200 OK`, with the report;
//! - [`readiness`](Health::readiness) (`/readyz`): `200 OK` with the report, or `503 Service
//!   Unavailable` with `"status": "not ready"` once the backend has been unreachable for longer
//!   than [`not_ready_after`](Health::not_ready_after), or, sooner, once a campaign or lease it
//!   reports on has fenced itself during the outage: a load balancer stops sending traffic to a
//!   node that can neither lead nor check a sequencer no later than the node stops serving.
//!
//! Neither sends anything to the backend: reachability is what the backend's own requests
//! (renewals, watches, acquisitions) found ([`Backend::reachability`]). A backend that tracks no
//! reachability (`"reachable": null`) is always ready. A refused or reset connection counts at
//! once; a request that hangs (a partition, a frozen agent) counts once it has gone a second
//! without an answer while nothing else was answered, and the outage is dated from when it was
//! sent, so `not_ready_after` means the same for a backend that hangs as for one that refuses.
//! (Watch reads, which may rightly wait, do not count.)
//!
//! The report:
//!
//! ```json
//! {
//!   "status": "ok",
//!   "backend": { "reachable": true, "unreachable_for_ms": null },
//!   "campaigns": [
//!     { "key": "service/api/leader", "state": "running", "role": "leader",
//!       "sequencer": "consul:12:<session>:service/api/leader",
//!       "leader": { "sequencer": "consul:12:<session>:service/api/leader", "value": "http://10.0.0.5:3000" } }
//!   ],
//!   "leases": [ { "sequencer": "consul:7:<session>:jobs/nightly", "held": true } ]
//! }
//! ```
//!
//! `role` is `leader` while this node's campaign holds its term, else `follower`; `sequencer` is
//! this node's current term (`null` as a follower); `leader` is who leads as the campaign sees it
//! (`null` while nobody does or nothing is known; its `value` is the leader's advertised value,
//! as text).

use std::convert::Infallible;
use std::fmt::Write as _;
use std::future::{Ready, ready};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{HeaderValue, Request, Response, StatusCode, header};
use lease_core::backend::Reachability;
use lease_core::leader::{CampaignHandle, CampaignState};
use lease_core::{Backend, LeaseWatcher, LostReason};
use tokio::time::Instant;

/// What a node reports about its leases, and the services that answer health checks with it.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use std::time::Duration;
/// use lease_core::leader::Campaign;
/// use lease_core::{Backend, LeaseSpec, memory::Memory};
/// use lease_tower::health::Health;
///
/// let backend: Arc<dyn Backend> = Arc::new(Memory::new());
/// let campaign = Campaign::try_new(backend.clone(), LeaseSpec::leader("service/api/leader"))?;
/// let health = Health::new(backend)
///     .campaign(campaign.handle())
///     .not_ready_after(Duration::from_secs(5));
/// # #[cfg(feature = "axum")] {
/// let app: axum::Router = axum::Router::new()
///     .route_service("/healthz", health.liveness())
///     .route_service("/readyz", health.readiness());
/// # let _ = app;
/// # }
/// assert!(health.is_ready());
/// assert!(health.report().contains(r#""role":"follower""#));
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
#[must_use = "a Health reports nothing until its services are mounted"]
pub struct Health {
    backend: Arc<dyn Backend>,
    campaigns: Vec<CampaignHandle>,
    leases: Vec<LeaseWatcher>,
    not_ready_after: Duration,
}

impl Health {
    /// The default of [`not_ready_after`](Self::not_ready_after).
    pub const DEFAULT_NOT_READY_AFTER: Duration = Duration::from_secs(10);

    /// Reports on `backend`'s reachability; add campaigns and leases to report them too. Takes
    /// any backend, by value or as an `Arc<dyn Backend>`
    /// ([`into_shared`](lease_core::backend::into_shared)).
    pub fn new(backend: impl Backend) -> Self {
        Health {
            backend: lease_core::backend::into_shared(backend),
            campaigns: Vec::new(),
            leases: Vec::new(),
            not_ready_after: Self::DEFAULT_NOT_READY_AFTER,
        }
    }

    /// Reports this campaign: its state, this node's role and term, and who leads.
    pub fn campaign(mut self, handle: CampaignHandle) -> Self {
        self.campaigns.push(handle);
        self
    }

    /// Reports this lease (held outside any campaign): its sequencer and whether it is held.
    pub fn lease(mut self, lease: LeaseWatcher) -> Self {
        self.leases.push(lease);
        self
    }

    /// How long the backend may go unanswered before [`readiness`](Self::readiness) answers 503.
    /// Default: [`DEFAULT_NOT_READY_AFTER`](Self::DEFAULT_NOT_READY_AFTER) (10 s). Whatever the
    /// bound, a node is unready from the moment a campaign or lease it reports on fences itself
    /// during the outage (it can no longer lead or hold); a bound shorter than the leases' fence
    /// interval turns it unready before that.
    pub fn not_ready_after(mut self, bound: Duration) -> Self {
        self.not_ready_after = bound;
        self
    }

    /// Whether the backend has answered within the bound (or does not track reachability).
    pub fn is_ready(&self) -> bool {
        self.ready_given(self.backend.reachability())
    }

    fn ready_given(&self, reachability: Reachability) -> bool {
        reachability
            .unreachable_for()
            .is_none_or(|outage| outage < self.not_ready_after && !self.fenced_during(outage))
    }

    /// Whether a lease this reports on has fenced itself during the current outage (which began
    /// `outage` ago): the node is unready by then, whatever `not_ready_after` says, since it can
    /// no longer do what it reports.
    fn fenced_during(&self, outage: Duration) -> bool {
        let self_fenced = |reason: &LostReason| matches!(reason, LostReason::SelfFenced { .. });
        let since = Instant::now().checked_sub(outage);
        let campaigns = self.campaigns.iter().any(|campaign| {
            let term_fenced = campaign
                .term()
                .and_then(|term| term.lease().lost_reason())
                .is_some_and(|reason| self_fenced(&reason));
            let last_fenced = campaign.last_loss().is_some_and(|(reason, at)| {
                self_fenced(&reason) && since.is_none_or(|since| at >= since)
            });
            term_fenced || last_fenced
        });
        campaigns
            || (self.leases.iter()).any(|lease| {
                lease
                    .lost_reason()
                    .is_some_and(|reason| self_fenced(&reason))
            })
    }

    /// The report, as JSON (see the [module docs](self) for its fields).
    pub fn report(&self) -> String {
        self.render().1
    }

    /// Whether the node is ready, and the report that says so, from one look at the backend.
    fn render(&self) -> (bool, String) {
        // One look, so the status and the backend's fields agree.
        let reachability = self.backend.reachability();
        let mut out = String::from("{\"status\":");
        let ready = self.ready_given(reachability);
        string(&mut out, if ready { "ok" } else { "not ready" });
        let reachable = match reachability {
            Reachability::Reachable => "true",
            Reachability::Unreachable { .. } => "false",
            _ => "null",
        };
        let _ = write!(
            out,
            ",\"backend\":{{\"reachable\":{reachable},\"unreachable_for_ms\":"
        );
        match reachability.unreachable_for() {
            Some(outage) => {
                let _ = write!(out, "{}", outage.as_millis());
            }
            None => out.push_str("null"),
        }
        out.push_str("},\"campaigns\":[");
        for (i, campaign) in self.campaigns.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            campaign_json(&mut out, campaign);
        }
        out.push_str("],\"leases\":[");
        for (i, lease) in self.leases.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str("{\"sequencer\":");
            string(&mut out, &lease.sequencer().to_string());
            let _ = write!(out, ",\"held\":{}}}", lease.is_held());
        }
        out.push_str("]}");
        (ready, out)
    }

    /// A service answering every request with `200 OK` and the report: the process is alive.
    pub fn liveness(&self) -> HealthService {
        HealthService {
            health: Arc::new(self.clone()),
            readiness: false,
        }
    }

    /// A service answering `200 OK` with the report while the node is ready, and `503 Service
    /// Unavailable` with it once the backend has been unreachable past
    /// [`not_ready_after`](Self::not_ready_after).
    pub fn readiness(&self) -> HealthService {
        HealthService {
            health: Arc::new(self.clone()),
            readiness: true,
        }
    }
}

fn campaign_json(out: &mut String, campaign: &CampaignHandle) {
    out.push_str("{\"key\":");
    string(out, campaign.key());
    out.push_str(",\"state\":");
    let state = match campaign.state() {
        CampaignState::NotStarted => "not_started",
        CampaignState::Running => "running",
        CampaignState::Ended(_) => "ended",
        CampaignState::Failed(_) => "failed",
        CampaignState::Abandoned => "abandoned",
        _ => "unknown",
    };
    string(out, state);
    let term = campaign.term();
    out.push_str(",\"role\":");
    string(out, if term.is_some() { "leader" } else { "follower" });
    out.push_str(",\"sequencer\":");
    match &term {
        Some(term) => string(out, &term.sequencer().to_string()),
        None => out.push_str("null"),
    }
    out.push_str(",\"leader\":");
    match campaign.leader() {
        Some(leader) => {
            out.push_str("{\"sequencer\":");
            string(out, &leader.sequencer.to_string());
            out.push_str(",\"value\":");
            string(out, &String::from_utf8_lossy(&leader.value));
            out.push('}');
        }
        None => out.push_str("null"),
    }
    out.push('}');
}

/// Appends `s` as a JSON string.
fn string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Answers every request with a [`Health`] report: see [`Health::liveness`] and
/// [`Health::readiness`].
#[derive(Clone, Debug)]
pub struct HealthService {
    health: Arc<Health>,
    readiness: bool,
}

impl<B> tower::Service<Request<B>> for HealthService {
    type Response = Response<String>;
    type Error = Infallible;
    type Future = Ready<Result<Response<String>, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _request: Request<B>) -> Self::Future {
        let (is_ready, report) = self.health.render();
        let status = if self.readiness && !is_ready {
            StatusCode::SERVICE_UNAVAILABLE
        } else {
            StatusCode::OK
        };
        let mut response = Response::new(report);
        *response.status_mut() = status;
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        ready(Ok(response))
    }
}

#[cfg(test)]
mod tests {
    use super::string;

    #[test]
    fn strings_are_escaped_as_json_requires() {
        let mut out = String::new();
        string(&mut out, "a\"b\\c\nd\u{1}é");
        assert_eq!(out, r#""a\"b\\c\nd\u0001é""#);
    }
}
