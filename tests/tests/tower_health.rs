//! `lease_tower::health` on an axum router, against a real Consul agent behind a proxy the test
//! cuts: the JSON report while this node leads, and readiness turning 503 when the agent has
//! gone unanswered past the bound, then 200 again once it answers.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use http::{Request, StatusCode};
use lease_consul::Consul;
use lease_core::CancellationToken;
use lease_core::leader::{Campaign, LeaderEvent};
use lease_core::{Backend, LeaseSpec};
use lease_tests::consul::Agent;
use lease_tests::proxy::{Mode, Proxy};
use lease_tests::{init_tracing, within};
use lease_tower::health::Health;
use tokio::sync::broadcast;
use tower::ServiceExt;

const T: Duration = Duration::from_secs(30);
const KEY: &str = "health/leader";

async fn get(app: &Router, path: &str) -> (StatusCode, String) {
    let request = Request::get(path).body(Body::empty()).unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let body = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    (status, String::from_utf8(body.to_vec()).unwrap())
}

/// Waits for the next event `matches` accepts.
async fn next_event(
    events: &mut broadcast::Receiver<LeaderEvent>,
    what: &str,
    matches: impl Fn(&LeaderEvent) -> bool,
) -> LeaderEvent {
    within(T, what, async {
        loop {
            match events.recv().await {
                Ok(event) if matches(&event) => return event,
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => panic!("the campaign ended"),
            }
        }
    })
    .await
}

#[tokio::test]
async fn health_reports_the_term_and_readiness_follows_the_agents_reachability() {
    init_tracing();
    let agent = Agent::start().await;
    let proxy = Proxy::start(agent.addr()).await.unwrap();
    let backend: Arc<dyn Backend> =
        Arc::new(Consul::builder().address(proxy.url()).build().unwrap());
    let campaign = Campaign::try_new(
        backend.clone(),
        LeaseSpec::leader(KEY)
            .value("http://node-1:3000")
            .ttl(Duration::from_secs(10))
            .lock_delay(Duration::ZERO),
    )
    .unwrap()
    .backoff(Duration::from_millis(100), Duration::from_millis(500));
    let handle = campaign.handle();
    let health = Health::new(backend)
        .campaign(handle.clone())
        .not_ready_after(Duration::from_secs(1));
    let app = Router::new()
        .route_service("/healthz", health.liveness())
        .route_service("/readyz", health.readiness());

    let mut events = handle.events();
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(campaign.hold_until(shutdown.clone()));
    let elected = next_event(&mut events, "the election", |e| {
        matches!(e, LeaderEvent::Elected { .. })
    })
    .await;
    let LeaderEvent::Elected { sequencer } = elected else {
        unreachable!()
    };

    let (status, body) = get(&app, "/healthz").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let expected_campaign = format!(
        r#"{{"key":"{KEY}","state":"running","role":"leader","sequencer":"{sequencer}","leader":{{"sequencer":"{sequencer}","value":"http://node-1:3000"}}}}"#
    );
    assert_eq!(
        body,
        format!(
            r#"{{"status":"ok","backend":{{"reachable":true,"unreachable_for_ms":null}},"campaigns":[{expected_campaign}],"leases":[]}}"#
        )
    );
    let (status, body) = get(&app, "/readyz").await;
    assert_eq!(status, StatusCode::OK, "{body}");

    // The agent stops answering: every connection is cut and every new one refused. The lease
    // self-fences within its TTL, long after the 1 s bound, so by the loss the node is not ready.
    proxy.set_mode(Mode::Refuse);
    next_event(&mut events, "the loss", |e| {
        matches!(e, LeaderEvent::Lost { .. })
    })
    .await;
    let (status, body) = get(&app, "/readyz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(
        body.starts_with(r#"{"status":"not ready","reasons":["backend: unreachable for "#),
        "{body}"
    );
    assert!(
        body.contains(r#""backend":{"reachable":false,"unreachable_for_ms":"#),
        "{body}"
    );
    assert!(
        body.contains(r#""role":"follower","sequencer":null"#),
        "{body}"
    );
    // Liveness stays 200: the process is alive, only its backend is not.
    let (status, body) = get(&app, "/healthz").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body.starts_with(r#"{"status":"not ready""#), "{body}");

    // The agent answers again: the campaign is elected anew and the node is ready.
    proxy.set_mode(Mode::Forward);
    next_event(&mut events, "the re-election", |e| {
        matches!(e, LeaderEvent::Elected { .. })
    })
    .await;
    let (status, body) = get(&app, "/readyz").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body.contains(r#""reachable":true"#), "{body}");
    assert!(body.contains(r#""role":"leader""#), "{body}");

    shutdown.cancel();
    within(T, "the campaign to end", running)
        .await
        .unwrap()
        .unwrap();
}

/// A campaign on Consul behind `proxy`, with this TTL, reported by a `Health` with this bound.
fn leader_behind(proxy: &Proxy, ttl: Duration, not_ready_after: Duration) -> (Campaign, Router) {
    let backend: Arc<dyn Backend> =
        Arc::new(Consul::builder().address(proxy.url()).build().unwrap());
    let campaign = Campaign::try_new(
        backend.clone(),
        LeaseSpec::leader(KEY).ttl(ttl).lock_delay(Duration::ZERO),
    )
    .unwrap()
    .backoff(Duration::from_millis(100), Duration::from_millis(500));
    let health = Health::new(backend)
        .campaign(campaign.handle())
        .not_ready_after(not_ready_after);
    let app = Router::new().route_service("/readyz", health.readiness());
    (campaign, app)
}

/// A campaign running, and elected.
struct Leading {
    handle: lease_core::leader::CampaignHandle,
    events: broadcast::Receiver<LeaderEvent>,
    shutdown: CancellationToken,
    running: tokio::task::JoinHandle<Result<lease_core::leader::CampaignEnd, lease_core::Error>>,
}

/// Runs `campaign` (without a worker) until it is elected.
async fn lead(campaign: Campaign) -> Leading {
    let handle = campaign.handle();
    let mut events = handle.events();
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(campaign.hold_until(shutdown.clone()));
    next_event(&mut events, "the election", |e| {
        matches!(e, LeaderEvent::Elected { .. })
    })
    .await;
    Leading {
        handle,
        events,
        shutdown,
        running,
    }
}

/// An agent that hangs (every byte held, nothing refused) turns the node unready after
/// `not_ready_after`, counted from the first request left unanswered: well before the lease
/// self-fences, while the node still leads.
#[tokio::test]
async fn a_hanging_agent_turns_the_node_unready_after_the_bound_before_the_fence() {
    init_tracing();
    let agent = Agent::start().await;
    let proxy = Proxy::start(agent.addr()).await.unwrap();
    let (campaign, app) = leader_behind(&proxy, Duration::from_secs(10), Duration::from_secs(1));
    let Leading {
        handle,
        shutdown,
        running,
        ..
    } = lead(campaign).await;
    assert_eq!(get(&app, "/readyz").await.0, StatusCode::OK);

    proxy.set_mode(Mode::Blackhole);
    let body = within(T, "readiness to turn 503", async {
        loop {
            let (status, body) = get(&app, "/readyz").await;
            if status == StatusCode::SERVICE_UNAVAILABLE {
                return body;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    // The fence interval of a 10 s TTL is 9 s from the last renewal; a hung request counted only
    // when it timed out (10 s) would turn the node unready after it.
    assert!(
        handle.term().is_some_and(|term| term.is_held()),
        "unready only once the lease was gone: {body}"
    );
    assert!(body.contains(r#""role":"leader""#), "{body}");

    proxy.set_mode(Mode::Forward);
    shutdown.cancel();
    within(T, "the campaign to end", running)
        .await
        .unwrap()
        .unwrap();
}

/// However long `not_ready_after` is, the node is unready by the time its leader lease fences
/// itself during an outage: it can no longer lead, so it must not look ready.
#[tokio::test]
async fn the_node_is_unready_no_later_than_its_lease_fences_itself() {
    init_tracing();
    let agent = Agent::start().await;
    let proxy = Proxy::start(agent.addr()).await.unwrap();
    let (campaign, app) = leader_behind(&proxy, Duration::from_secs(10), Duration::from_secs(600));
    let Leading {
        mut events,
        shutdown,
        running,
        ..
    } = lead(campaign).await;

    proxy.set_mode(Mode::Blackhole);
    let lost = next_event(&mut events, "the self-fence", |e| {
        matches!(e, LeaderEvent::Lost { .. })
    })
    .await;
    let LeaderEvent::Lost { reason, .. } = &lost else {
        unreachable!()
    };
    assert!(
        matches!(reason, lease_core::LostReason::SelfFenced { .. }),
        "{lost:?}"
    );
    let (status, body) = get(&app, "/readyz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(body.contains(r#""role":"follower""#), "{body}");

    // Once the agent answers again, the node is ready again.
    proxy.set_mode(Mode::Forward);
    within(T, "readiness to return", async {
        while get(&app, "/readyz").await.0 != StatusCode::OK {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    shutdown.cancel();
    within(T, "the campaign to end", running)
        .await
        .unwrap()
        .unwrap();
}
