//! Health and readiness endpoints: this node's campaigns, its leases and whether its backends
//! answer, as JSON (the counterpart of client-go's `HealthzAdaptor`).
//!
//! [`Health`] is built once with what to report, and gives two tower services that answer any
//! request (mount them with axum's `route_service`):
//!
//! - [`liveness`](Health::liveness) (`/healthz`): always `200 OK`, with the report;
//! - [`readiness`](Health::readiness) (`/readyz`): `200 OK` with the report, or `503 Service
//!   Unavailable` with `"status": "not ready"` and the `"reasons"` why, once a backend has been
//!   unreachable for longer than [`not_ready_after`](Health::not_ready_after), or, sooner, once a
//!   campaign or lease it reports on has fenced itself during the outage, and as soon as a
//!   campaign it reports on has failed: a load balancer stops sending traffic to a node that can
//!   neither lead nor check a sequencer no later than the node stops serving.
//!
//! A service whose leases live on several backends (a leader on PostgreSQL, a limit on etcd)
//! reports them all in one `/readyz`: [`Health::new`] takes the first, reported as `"backend"`,
//! and [`Health::backend`] adds each other one by name, reported under `"backends"`; the node is
//! ready while every one of them is.
//!
//! Neither service sends anything to a backend itself: reachability is what the backend's own
//! requests (renewals, watches, acquisitions) found ([`Backend::reachability`]), and while a
//! backend finds its server unreachable it probes it about every second (Consul, etcd,
//! PostgreSQL, RabbitMQ), so the report turns ready again when the server is back, with no other traffic.
//! A backend that tracks no reachability (`"reachable": null`) is always ready. A refused or reset
//! connection counts at once; a request that hangs (a partition, a frozen agent) counts once it
//! has gone a second without an answer while nothing else was answered, and the outage is dated
//! from when it was sent, so `not_ready_after` means the same for a backend that hangs as for one
//! that refuses. (Watch reads, which may rightly wait, do not count.)
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
//! as text). `state` is `not_started`, `running`, `ended`, `failed` or `abandoned`; a failed
//! campaign also carries its `"error"`.
//!
//! Not ready, with a second backend added as `Health::new(postgres).backend("etcd", etcd)`:
//!
//! ```json
//! {
//!   "status": "not ready",
//!   "reasons": [ "backend etcd: unreachable for 12034 ms (not ready after 10000 ms)",
//!                "campaign service/api/leader failed: …" ],
//!   "backend": { "reachable": true, "unreachable_for_ms": null },
//!   "backends": { "etcd": { "reachable": false, "unreachable_for_ms": 12034 } },
//!   "campaigns": [ { "key": "service/api/leader", "state": "failed", "error": "…", "role": "follower",
//!                    "sequencer": null, "leader": null } ],
//!   "leases": []
//! }
//! ```
//!
//! `"reasons"` is there only while the node is not ready, and `"backends"` only when backends
//! were added by name.

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
/// let limits = Memory::new(); // e.g. etcd, for a route's cluster-wide limit
/// let health = Health::new(backend)
///     .backend("limits", limits)
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
/// assert!(health.report().contains(r#""backends":{"limits":{"reachable":true"#));
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
#[must_use = "a Health reports nothing until its services are mounted"]
pub struct Health {
    backend: Arc<dyn Backend>,
    /// The backends added by name, in the order they were added.
    named: Vec<(String, Arc<dyn Backend>)>,
    campaigns: Vec<CampaignHandle>,
    leases: Vec<LeaseWatcher>,
    not_ready_after: Duration,
}

impl Health {
    /// The default of [`not_ready_after`](Self::not_ready_after).
    pub const DEFAULT_NOT_READY_AFTER: Duration = Duration::from_secs(10);

    /// Reports on `backend`'s reachability (as `"backend"`); add campaigns and leases to report
    /// them too, and other backends with [`backend`](Self::backend). Takes any backend, by value
    /// or as an `Arc<dyn Backend>` ([`into_shared`](lease_core::backend::into_shared)).
    pub fn new(backend: impl Backend) -> Self {
        Health {
            backend: lease_core::backend::into_shared(backend),
            named: Vec::new(),
            campaigns: Vec::new(),
            leases: Vec::new(),
            not_ready_after: Self::DEFAULT_NOT_READY_AFTER,
        }
    }

    /// Reports on one more backend, as the field `name` of `"backends"`: for a service whose
    /// leases live on several (a leader on PostgreSQL, a limit on etcd). The node is ready while
    /// every backend is. A name given twice keeps the later backend.
    pub fn backend(mut self, name: impl Into<String>, backend: impl Backend) -> Self {
        let name = name.into();
        let backend = lease_core::backend::into_shared(backend);
        self.named.retain(|(other, _)| *other != name);
        self.named.push((name, backend));
        self
    }

    /// Reports this campaign: its state, this node's role and term, and who leads. A campaign
    /// that has failed (`run_until` returned an error) makes the node not ready.
    pub fn campaign(mut self, handle: CampaignHandle) -> Self {
        self.campaigns.push(handle);
        self
    }

    /// Reports this lease (held outside any campaign): its sequencer and whether it is held.
    pub fn lease(mut self, lease: LeaseWatcher) -> Self {
        self.leases.push(lease);
        self
    }

    /// How long a backend may go unanswered before [`readiness`](Self::readiness) answers 503.
    /// Default: [`DEFAULT_NOT_READY_AFTER`](Self::DEFAULT_NOT_READY_AFTER) (10 s). Whatever the
    /// bound, a node is unready from the moment a campaign or lease it reports on fences itself
    /// during the outage (it can no longer lead or hold); a bound shorter than the leases' fence
    /// interval turns it unready before that.
    pub fn not_ready_after(mut self, bound: Duration) -> Self {
        self.not_ready_after = bound;
        self
    }

    /// Whether the node is ready: every backend has answered within the bound (or does not
    /// track reachability), and no campaign it reports on has failed.
    pub fn is_ready(&self) -> bool {
        self.look().reasons.is_empty()
    }

    /// One look at every backend and campaign: what the report says, and why the node is not
    /// ready (nothing if it is).
    fn look(&self) -> Look {
        let backends: Vec<Reachability> = std::iter::once(&self.backend)
            .chain(self.named.iter().map(|(_, backend)| backend))
            .map(|backend| backend.reachability())
            .collect();
        let mut reasons = Vec::new();
        for (i, reachability) in backends.iter().enumerate() {
            let Some(outage) = reachability.unreachable_for() else {
                continue;
            };
            let name = match i {
                0 => String::from("backend"),
                i => format!("backend {}", self.named[i - 1].0),
            };
            if outage >= self.not_ready_after {
                reasons.push(format!(
                    "{name}: unreachable for {} ms (not ready after {} ms)",
                    outage.as_millis(),
                    self.not_ready_after.as_millis()
                ));
            } else if self.fenced_during(outage) {
                reasons.push(format!(
                    "{name}: unreachable for {} ms, and a lease reported here fenced itself \
                     meanwhile",
                    outage.as_millis()
                ));
            }
        }
        for campaign in &self.campaigns {
            if let CampaignState::Failed(error) = campaign.state() {
                reasons.push(format!("campaign {} failed: {error}", campaign.key()));
            }
        }
        Look { backends, reasons }
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

    /// Whether the node is ready, and the report that says so, from one look at the backends.
    fn render(&self) -> (bool, String) {
        // One look, so the status, its reasons and the backends' fields agree.
        let look = self.look();
        let ready = look.reasons.is_empty();
        let mut out = String::from("{\"status\":");
        string(&mut out, if ready { "ok" } else { "not ready" });
        if !ready {
            out.push_str(",\"reasons\":[");
            for (i, reason) in look.reasons.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                string(&mut out, reason);
            }
            out.push(']');
        }
        out.push_str(",\"backend\":");
        reachability_json(&mut out, look.backends[0]);
        if !self.named.is_empty() {
            out.push_str(",\"backends\":{");
            for (i, ((name, _), reachability)) in
                self.named.iter().zip(&look.backends[1..]).enumerate()
            {
                if i > 0 {
                    out.push(',');
                }
                string(&mut out, name);
                out.push(':');
                reachability_json(&mut out, *reachability);
            }
            out.push('}');
        }
        out.push_str(",\"campaigns\":[");
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
    /// Unavailable` with it (and the reasons) once a backend has been unreachable past
    /// [`not_ready_after`](Self::not_ready_after), or a campaign it reports on has failed.
    pub fn readiness(&self) -> HealthService {
        HealthService {
            health: Arc::new(self.clone()),
            readiness: true,
        }
    }
}

/// What one look at a [`Health`]'s backends found: each one's reachability (the first backend's,
/// then the named ones' in order), and why the node is not ready.
struct Look {
    backends: Vec<Reachability>,
    reasons: Vec<String>,
}

/// Appends a backend's `{"reachable": …, "unreachable_for_ms": …}`.
fn reachability_json(out: &mut String, reachability: Reachability) {
    let reachable = match reachability {
        Reachability::Reachable => "true",
        Reachability::Unreachable { .. } => "false",
        _ => "null",
    };
    let _ = write!(out, "{{\"reachable\":{reachable},\"unreachable_for_ms\":");
    match reachability.unreachable_for() {
        Some(outage) => {
            let _ = write!(out, "{}", outage.as_millis());
        }
        None => out.push_str("null"),
    }
    out.push('}');
}

fn campaign_json(out: &mut String, campaign: &CampaignHandle) {
    out.push_str("{\"key\":");
    string(out, campaign.key());
    out.push_str(",\"state\":");
    let state = campaign.state();
    let name = match &state {
        CampaignState::NotStarted => "not_started",
        CampaignState::Running => "running",
        CampaignState::Ended(_) => "ended",
        CampaignState::Failed(_) => "failed",
        CampaignState::Abandoned => "abandoned",
        _ => "unknown",
    };
    string(out, name);
    if let CampaignState::Failed(error) = &state {
        out.push_str(",\"error\":");
        string(out, error);
    }
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
    use std::time::Duration;

    use lease_core::leader::{Campaign, CampaignState};
    use lease_core::memory::Memory;
    use lease_core::{Backend, CancellationToken, LeaseSpec};

    use super::{Health, string};

    /// A campaign that ended in `Failed` (here: its key is a semaphore's, which no retry cures)
    /// can no longer lead: the node is not ready, and the report says why.
    #[tokio::test]
    async fn a_failed_campaign_makes_the_node_unready_with_its_error() {
        let backend = Memory::new();
        let _semaphore = backend
            .acquire(&LeaseSpec::semaphore("service/api/leader", 2))
            .await
            .expect("the semaphore");
        let campaign =
            Campaign::try_new(backend.clone(), LeaseSpec::leader("service/api/leader")).unwrap();
        let handle = campaign.handle();
        let health = Health::new(backend).campaign(handle.clone());
        assert!(health.is_ready(), "{}", health.report());

        let ended = campaign.hold_until(CancellationToken::new()).await;
        assert!(ended.is_err(), "{ended:?}");
        assert!(matches!(handle.state(), CampaignState::Failed(_)));
        assert!(!health.is_ready());
        let report = health.report();
        assert!(
            report.starts_with(
                r#"{"status":"not ready","reasons":["campaign service/api/leader failed: "#
            ),
            "{report}"
        );
        assert!(
            report
                .contains(r#""state":"failed","error":"key \"service/api/leader/.lock\" is used"#),
            "{report}"
        );
    }

    /// Several backends: one field each under `"backends"`, and the node ready only while all
    /// of them are.
    #[tokio::test]
    async fn each_named_backend_has_its_field_and_counts_for_readiness() {
        let health = Health::new(Memory::new())
            .backend("etcd", Memory::new())
            .backend("postgres", Memory::new())
            .not_ready_after(Duration::from_secs(1));
        assert!(health.is_ready());
        assert_eq!(
            health.report(),
            concat!(
                r#"{"status":"ok","backend":{"reachable":true,"unreachable_for_ms":null},"#,
                r#""backends":{"etcd":{"reachable":true,"unreachable_for_ms":null},"#,
                r#""postgres":{"reachable":true,"unreachable_for_ms":null}},"#,
                r#""campaigns":[],"leases":[]}"#
            )
        );
    }

    #[test]
    fn strings_are_escaped_as_json_requires() {
        let mut out = String::new();
        string(&mut out, "a\"b\\c\nd\u{1}é");
        assert_eq!(out, r#""a\"b\\c\nd\u0001é""#);
    }
}
