//! The leader-only layer on real Consul and real HTTP: two app instances, one serves; a route and
//! a worker share one election; the lease itself cancels requests in flight; graceful shutdown
//! drains them before the hand-off; permanent errors are answered with 500.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::{MethodRouter, get};
use lease_core::CancellationToken;
use lease_core::leader::{Campaign, CampaignEnd, CampaignHandle, CampaignState, Term};
use lease_core::memory::Memory;
use lease_core::{Backend, BoxError, Error, LeaseSpec, Sequencer};
use lease_tests::consul::Agent;
use lease_tests::proxy::{Mode, Proxy};
use lease_tests::{init_tracing, within};
use lease_tower::extract::LeaseSequencer;
use lease_tower::leader::{LEADER_HEADER, LeaderOnlyLayer, Refusal};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tower::ServiceExt;

const T: Duration = Duration::from_secs(60);
const KEY: &str = "service/tower-test/leader";

fn spec() -> LeaseSpec {
    LeaseSpec::leader(KEY)
        .ttl(Duration::from_secs(10))
        .lock_delay(Duration::ZERO)
}

/// Sends on the channel when dropped: proves a handler's future was dropped (cancelled).
struct DropSignal(mpsc::UnboundedSender<&'static str>);

impl Drop for DropSignal {
    fn drop(&mut self) {
        let _ = self.0.send("handler dropped");
    }
}

/// A handler that reports its start and its drop on `events`, and never finishes by itself.
fn slow_handler(events: mpsc::UnboundedSender<&'static str>) -> MethodRouter {
    get(move || {
        let events = events.clone();
        async move {
            let _signal = DropSignal(events.clone());
            let _ = events.send("handler started");
            std::future::pending::<()>().await;
        }
    })
}

/// Runs `campaign` without a worker until the returned token is cancelled.
fn hold(
    campaign: Campaign,
) -> (
    CancellationToken,
    tokio::task::JoinHandle<Result<CampaignEnd, Error>>,
) {
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(campaign.hold_until(shutdown.clone()));
    (shutdown, running)
}

async fn serve(app: Router) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

async fn term_of(campaign: &CampaignHandle) -> Term {
    let mut terms = campaign.terms();
    within(T, "a term", terms.wait_for(Option::is_some))
        .await
        .unwrap()
        .clone()
        .unwrap()
}

async fn text(response: axum::response::Response) -> String {
    let body = axum::body::to_bytes(response.into_body(), 1 << 16)
        .await
        .unwrap();
    String::from_utf8_lossy(&body).into_owned()
}

fn get_request(path: &str) -> http::Request<axum::body::Body> {
    http::Request::get(path)
        .body(axum::body::Body::empty())
        .unwrap()
}

struct Instance {
    url: String,
    campaign: CampaignHandle,
}

/// One app instance: its own Consul client and campaign, a leader-only router, served on a
/// loopback port.
async fn instance(agent: &Agent, events: mpsc::UnboundedSender<&'static str>) -> Instance {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let campaign = Campaign::try_new(Arc::new(agent.backend()), spec().value(url.clone())).unwrap();
    let handle = campaign.handle();
    let app = Router::new()
        .route(
            "/admin/who",
            get(|LeaseSequencer(s): LeaseSequencer| async move { s.to_string() }),
        )
        .route("/admin/slow", slow_handler(events.clone()))
        .route_layer(LeaderOnlyLayer::new(campaign.handle()));
    tokio::spawn(campaign.hold_until(CancellationToken::new()));
    tokio::spawn(async move { axum::serve(listener, app).await });
    Instance {
        url,
        campaign: handle,
    }
}

async fn get_until(
    client: &reqwest::Client,
    url: &str,
    ok: impl Fn(&reqwest::Response) -> bool,
) -> reqwest::Response {
    within(T, &format!("an expected answer from {url}"), async {
        loop {
            let response = client.get(url).send().await.unwrap();
            if ok(&response) {
                return response;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_instance_serves_and_the_other_takes_over() {
    init_tracing();
    let agent = Agent::start().await;
    let observer_backend = agent.backend();
    let mut observer = observer_backend.observe_leader(KEY).await.unwrap();
    let (events_tx, mut events) = mpsc::unbounded_channel();
    let a = instance(&agent, events_tx.clone()).await;
    let b = instance(&agent, events_tx).await;
    let client = reqwest::Client::new();

    let first = within(T, "a leader", observer.wait_for(|l| l.is_some()))
        .await
        .unwrap()
        .unwrap();
    let first_url = first.value_str().unwrap().to_owned();
    let (leader, follower) = if first_url == a.url {
        (&a, &b)
    } else {
        (&b, &a)
    };
    assert_eq!(first_url, leader.url);

    // The leader serves, with its lease's sequencer in the request.
    let response = get_until(&client, &format!("{}/admin/who", leader.url), |r| {
        r.status() == 200
    })
    .await;
    assert_eq!(response.text().await.unwrap(), first.sequencer.to_string());
    assert!(leader.campaign.is_leader());
    assert!(!follower.campaign.is_leader());

    // The follower answers 503 with Retry-After and the leader's advertised value.
    let response = get_until(&client, &format!("{}/admin/who", follower.url), |r| {
        r.headers().contains_key(LEADER_HEADER.as_str())
    })
    .await;
    assert_eq!(response.status(), 503);
    assert_eq!(response.headers()["retry-after"], "1");
    assert_eq!(
        response.headers()[LEADER_HEADER.as_str()],
        leader.url.as_str()
    );

    // A request in flight on the leader...
    let slow = tokio::spawn({
        let client = client.clone();
        let url = format!("{}/admin/slow", leader.url);
        async move { client.get(url).send().await.unwrap() }
    });
    assert_eq!(
        within(T, "the slow handler to start", events.recv()).await,
        Some("handler started")
    );

    // ...is cancelled when the leader's session is destroyed, and the client gets 503.
    agent.destroy_session(first.sequencer.holder()).await;
    assert_eq!(
        within(T, "the slow handler to be dropped", events.recv()).await,
        Some("handler dropped")
    );
    let response = within(T, "the in-flight response", slow).await.unwrap();
    assert_eq!(response.status(), 503);

    // The other instance takes over (lock-delay 0) and serves.
    let second = within(
        T,
        "the other instance to lead",
        observer.wait_for(|l| l.is_some_and(|l| l.value == follower.url.as_bytes())),
    )
    .await
    .unwrap()
    .unwrap();
    assert!(second.sequencer.index() > first.sequencer.index());
    let response = get_until(&client, &format!("{}/admin/who", follower.url), |r| {
        r.status() == 200
    })
    .await;
    assert_eq!(response.text().await.unwrap(), second.sequencer.to_string());
    // The old leader is now a follower pointing to the new one.
    let response = get_until(&client, &format!("{}/admin/who", leader.url), |r| {
        r.headers()
            .get(LEADER_HEADER.as_str())
            .is_some_and(|v| v == follower.url.as_str())
    })
    .await;
    assert_eq!(response.status(), 503);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_and_a_worker_on_one_key_run_one_election_on_consul() {
    init_tracing();
    let agent = Agent::start().await;
    let campaign = Campaign::try_new(Arc::new(agent.backend()), spec()).unwrap();
    let app = Router::new()
        .route(
            "/admin/who",
            get(|LeaseSequencer(s): LeaseSequencer| async move { s.to_string() }),
        )
        .route_layer(LeaderOnlyLayer::new(campaign.handle()));
    let url = serve(app).await;
    let (worker_tx, mut worker_terms) = mpsc::unbounded_channel::<Sequencer>();
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(campaign.run_until(shutdown.clone(), move |lease| {
        let _ = worker_tx.send(lease.sequencer().clone());
        std::future::pending::<Result<(), BoxError>>()
    }));
    let client = reqwest::Client::new();

    for term in 0..2 {
        let worker_saw = within(T, "the worker to start", worker_terms.recv())
            .await
            .unwrap();
        // The route serves under the very term the worker runs under...
        let response = get_until(&client, &format!("{url}/admin/who"), |r| r.status() == 200).await;
        assert_eq!(response.text().await.unwrap(), worker_saw.to_string());
        // ...from the one session this process holds for the key.
        assert_eq!(agent.sessions().await, vec![worker_saw.holder().to_owned()]);
        if term == 0 {
            agent.destroy_session(worker_saw.holder()).await;
        }
    }
    shutdown.cancel();
    let end = within(T, "the campaign to stop", running).await.unwrap();
    assert_eq!(end.unwrap(), CampaignEnd::Shutdown);
    assert!(agent.sessions().await.is_empty());
}

#[tokio::test]
async fn a_route_and_a_worker_on_one_key_run_one_election_on_memory() {
    let memory = Memory::new();
    let campaign = Campaign::try_new(Arc::new(memory.clone()), spec()).unwrap();
    let handle = campaign.handle();
    let app: Router = Router::new()
        .route(
            "/admin/who",
            get(|LeaseSequencer(s): LeaseSequencer| async move { s.to_string() }),
        )
        .route_layer(LeaderOnlyLayer::new(campaign.handle()));
    let (worker_tx, mut worker_terms) = mpsc::unbounded_channel::<Sequencer>();
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(campaign.run_until(shutdown.clone(), move |lease| {
        let _ = worker_tx.send(lease.sequencer().clone());
        std::future::pending::<Result<(), BoxError>>()
    }));
    let worker_saw = within(T, "the worker to start", worker_terms.recv())
        .await
        .unwrap();
    let response = app.oneshot(get_request("/admin/who")).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(text(response).await, worker_saw.to_string());
    assert_eq!(memory.sessions(), vec![worker_saw.holder().to_owned()]);
    assert_eq!(
        handle.term().map(|t| t.sequencer().clone()),
        Some(worker_saw.clone())
    );
    assert_eq!(
        handle.leader().map(|l| l.sequencer),
        Some(worker_saw.clone())
    );
    // One acquisition: the first of the key.
    assert_eq!(worker_saw.index(), 1);
    shutdown.cancel();
    within(T, "the campaign to stop", running)
        .await
        .unwrap()
        .unwrap();
    assert!(memory.sessions().is_empty());
}

#[tokio::test]
async fn a_follower_can_redirect_to_the_leader() {
    let memory = Memory::new();
    let _other = memory
        .acquire(&LeaseSpec::leader(KEY).value("10.0.0.7:8080"))
        .await
        .unwrap();
    let campaign = Campaign::try_new(Arc::new(memory.clone()), LeaseSpec::leader(KEY)).unwrap();
    let handle = campaign.handle();
    let app: Router = Router::new()
        .route("/admin/x", get(|| async { "led" }))
        .route_layer(LeaderOnlyLayer::new(campaign.handle()).redirect_to_leader(true));
    let _running = hold(campaign);
    let response = within(T, "a redirect", async {
        loop {
            let response = app
                .clone()
                .oneshot(get_request("/admin/x?y=1"))
                .await
                .unwrap();
            if response.status() == 307 {
                return response;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert_eq!(
        response.headers()["location"],
        "http://10.0.0.7:8080/admin/x?y=1"
    );
    assert!(!handle.is_leader());
}

#[tokio::test]
async fn handlers_without_the_layer_get_an_explanation() {
    let app: Router = Router::new().route(
        "/x",
        get(|LeaseSequencer(s): LeaseSequencer| async move { s.to_string() }),
    );
    let response = app.oneshot(get_request("/x")).await.unwrap();
    assert_eq!(response.status(), 500);
    assert!(text(response).await.contains("SequencerCheckLayer"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streaming_leader_response_is_cut_when_the_lease_is_lost() {
    init_tracing();
    let memory = Memory::new();
    let campaign = Campaign::try_new(
        Arc::new(memory.clone()),
        LeaseSpec::leader(KEY).lock_delay(Duration::ZERO),
    )
    .unwrap();
    let handle = campaign.handle();
    let (chunks_tx, chunks_rx) = mpsc::unbounded_channel::<bytes::Bytes>();
    let chunks_rx = Arc::new(std::sync::Mutex::new(Some(chunks_rx)));
    let stream = move || {
        let chunks_rx = chunks_rx.clone();
        async move {
            let rx = chunks_rx.lock().unwrap().take().unwrap();
            axum::body::Body::new(lease_tests::body::ChannelBody(rx))
        }
    };
    let app = Router::new()
        .route("/stream", get(stream))
        .route_layer(LeaderOnlyLayer::new(campaign.handle()));
    let _running = hold(campaign);
    let url = format!("{}/stream", serve(app).await);
    let term = term_of(&handle).await;

    let mut response = reqwest::get(&url).await.unwrap();
    assert_eq!(response.status(), 200);
    chunks_tx.send(bytes::Bytes::from_static(b"first")).unwrap();
    let first = within(T, "the first chunk", response.chunk())
        .await
        .unwrap();
    assert_eq!(first.as_deref(), Some(&b"first"[..]));

    // The lease is taken away mid-stream: the response must end, not stream on under no leader.
    assert!(memory.invalidate_session(term.sequencer().holder()));
    // Once this node knows it lost the lease, nothing more may be streamed under it.
    within(
        T,
        "this node to know it lost the lease",
        term.lease().lost(),
    )
    .await;
    let _ = chunks_tx.send(bytes::Bytes::from_static(b"after the loss"));
    let rest = within(T, "the response to be cut", response.chunk()).await;
    assert!(
        rest.is_err(),
        "the body went on after the lease was lost: {rest:?}"
    );
}

/// Blocks its thread for a while when dropped: a worker that takes long to stop.
struct SlowToDrop(Duration);

impl Drop for SlowToDrop {
    fn drop(&mut self) {
        std::thread::sleep(self.0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_flight_request_is_woken_by_the_loss_itself_not_by_the_campaign() {
    init_tracing();
    let memory = Memory::new();
    let campaign = Campaign::try_new(
        Arc::new(memory.clone()),
        LeaseSpec::leader(KEY).lock_delay(Duration::ZERO),
    )
    .unwrap();
    let handle = campaign.handle();
    // The campaign (with the lease's holder task and the worker) runs on a runtime of its own,
    // where the worker takes 2 s to stop: the campaign cannot act on the loss before that.
    let shutdown = CancellationToken::new();
    let campaign_thread = std::thread::spawn({
        let shutdown = shutdown.clone();
        move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(campaign.run_until(shutdown, |_lease| async move {
                let _slow = SlowToDrop(Duration::from_secs(2));
                std::future::pending::<Result<(), BoxError>>().await
            }))
        }
    });
    let (events_tx, mut events) = mpsc::unbounded_channel();
    let app: Router = Router::new()
        .route("/slow", slow_handler(events_tx.clone()))
        .route_layer(LeaderOnlyLayer::new(handle.clone()));
    let term = term_of(&handle).await;
    let request = tokio::spawn(app.oneshot(get_request("/slow")));
    assert_eq!(
        within(T, "the handler to start", events.recv()).await,
        Some("handler started")
    );

    let lost_at = Instant::now();
    assert!(memory.invalidate_session(term.sequencer().holder()));
    let response = within(T, "the in-flight response", request)
        .await
        .unwrap()
        .unwrap();
    let answered_after = lost_at.elapsed();
    assert_eq!(response.status(), 503);
    assert!(text(response).await.contains("lost the leader lease"));
    assert_eq!(events.recv().await, Some("handler dropped"));
    assert!(
        answered_after < Duration::from_millis(500),
        "the request was cancelled {answered_after:?} after the loss: it waited for the campaign"
    );
    shutdown.cancel();
    tokio::task::spawn_blocking(move || campaign_thread.join())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

/// A leader serving `app` over HTTP with axum's graceful shutdown, which steps its campaign
/// down; and a follower campaigning for the same key.
struct HandOff {
    url: String,
    leader: CampaignHandle,
    leader_run: tokio::task::JoinHandle<Result<CampaignEnd, Error>>,
    follower: CampaignHandle,
    stop_server: CancellationToken,
    app: Router,
    /// Notified when a request enters the `/slow` handler.
    slow_started: Arc<tokio::sync::Notify>,
}

async fn hand_off(drain_timeout: Duration, handler_takes: Duration) -> HandOff {
    init_tracing();
    let memory = Memory::new();
    // A lock-delay longer than any test: only an explicit release lets the follower in at once.
    let spec = LeaseSpec::leader(KEY).lock_delay(Duration::from_secs(15));
    let campaign = Campaign::try_new(Arc::new(memory.clone()), spec.clone().value("leader"))
        .unwrap()
        .drain_timeout(drain_timeout);
    let leader = campaign.handle();
    let slow_started = Arc::new(tokio::sync::Notify::new());
    let started = Arc::clone(&slow_started);
    let app: Router = Router::new()
        .route(
            "/slow",
            get(move || {
                started.notify_one();
                async move {
                    tokio::time::sleep(handler_takes).await;
                    "done"
                }
            }),
        )
        .route_layer(LeaderOnlyLayer::new(campaign.handle()));
    let shutdown = CancellationToken::new();
    let leader_run = tokio::spawn(campaign.hold_until(shutdown.clone()));
    term_of(&leader).await;
    let follower = Campaign::try_new(Arc::new(memory), spec.value("follower")).unwrap();
    let follower_handle = follower.handle();
    tokio::spawn(follower.hold_until(CancellationToken::new()));

    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let stop_server = CancellationToken::new();
    let stop = stop_server.clone();
    let served = app.clone();
    tokio::spawn(async move {
        axum::serve(listener, served)
            .with_graceful_shutdown(async move {
                stop.cancelled().await;
                shutdown.cancel(); // the README's pattern: step down as the server drains
            })
            .await
    });
    HandOff {
        url,
        leader,
        leader_run,
        follower: follower_handle,
        stop_server,
        app,
        slow_started,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_lets_in_flight_requests_finish_before_the_hand_off() {
    let node = hand_off(Duration::from_secs(10), Duration::from_secs(2)).await;
    let sent = Instant::now();
    let slow = tokio::spawn(reqwest::get(format!("{}/slow", node.url)));
    within(
        T,
        "the request to reach its handler",
        node.slow_started.notified(),
    )
    .await;
    node.stop_server.cancel();

    // Stepping down: new leader-only requests are turned away, and the lease is still held.
    within(T, "the leader to step down", async {
        while !node.leader.term().is_some_and(|t| t.is_stepping_down()) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    let response = node
        .app
        .clone()
        .oneshot(get_request("/slow"))
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    assert!(text(response).await.contains("stepping down"));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        node.leader.is_leader(),
        "released before the work in flight finished"
    );
    assert!(!node.follower.is_leader());

    // The request in flight completes, with its answer, not a 503...
    let response = within(T, "the slow response", slow).await.unwrap().unwrap();
    let finished = sent.elapsed();
    assert_eq!(response.status(), 200);
    assert_eq!(response.text().await.unwrap(), "done");
    assert!(finished >= Duration::from_secs(2), "{finished:?}");
    // ...and then the lease is handed on at once (a release: no lock-delay).
    let term = within(
        Duration::from_secs(2),
        "the follower to lead",
        term_of(&node.follower),
    )
    .await;
    assert!(term.is_held());
    let end = within(T, "the leader's campaign to end", node.leader_run)
        .await
        .unwrap();
    assert_eq!(end.unwrap(), CampaignEnd::Shutdown);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_drain_timeout_bounds_how_long_the_hand_off_waits() {
    let node = hand_off(Duration::from_millis(300), Duration::from_secs(30)).await;
    let slow = tokio::spawn(reqwest::get(format!("{}/slow", node.url)));
    within(
        T,
        "the request to reach its handler",
        node.slow_started.notified(),
    )
    .await;
    let stopped = Instant::now();
    node.stop_server.cancel();

    let response = within(T, "the slow response", slow).await.unwrap().unwrap();
    let cut_after = stopped.elapsed();
    assert_eq!(response.status(), 503);
    assert!(
        response
            .text()
            .await
            .unwrap()
            .contains("lost the leader lease")
    );
    assert!(
        cut_after >= Duration::from_millis(250) && cut_after < Duration::from_secs(3),
        "cancelled {cut_after:?} after the shutdown began"
    );
    within(
        Duration::from_secs(2),
        "the follower to lead",
        term_of(&node.follower),
    )
    .await;
    assert!(!node.leader.is_leader());
}

#[tokio::test]
async fn an_invalid_key_fails_the_campaign_up_front_or_is_answered_with_500() {
    let memory: Arc<dyn Backend> = Arc::new(Memory::new());
    let error =
        Campaign::try_new(Arc::clone(&memory), LeaseSpec::leader("/absolute/key")).unwrap_err();
    assert!(matches!(error, Error::InvalidKey { .. }), "{error:?}");

    // Built without the check, the campaign fails when it runs, and says why, for good.
    let campaign = Campaign::new(memory, LeaseSpec::leader("/absolute/key"));
    let handle = campaign.handle();
    let app: Router = Router::new()
        .route("/admin/x", get(|| async { "led" }))
        .route_layer(LeaderOnlyLayer::new(campaign.handle()));
    let (_, running) = hold(campaign);
    let error = within(T, "the campaign to fail", running)
        .await
        .unwrap()
        .unwrap_err();
    assert!(matches!(error, Error::InvalidKey { .. }), "{error:?}");
    assert!(matches!(handle.state(), CampaignState::Failed(_)));
    let response = app.oneshot(get_request("/admin/x")).await.unwrap();
    assert_eq!(response.status(), 500);
    // The client learns that retrying will not help, not the error (it is in the logs).
    assert_eq!(text(response).await, Refusal::CampaignFailed.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_used_by_another_kind_of_lock_is_answered_with_500_on_consul() {
    init_tracing();
    let agent = Agent::start().await;
    // The flags `consul lock -n` puts on a semaphore's keys.
    agent
        .put_key(KEY, b"a semaphore", 0xe0f6_9a2b_aa41_4de0)
        .await;
    let campaign = Campaign::try_new(Arc::new(agent.backend()), spec()).unwrap();
    let handle = campaign.handle();
    let app: Router = Router::new()
        .route("/admin/x", get(|| async { "led" }))
        .route_layer(LeaderOnlyLayer::new(campaign.handle()));
    let (_, running) = hold(campaign);
    let error = within(T, "the campaign to fail", running)
        .await
        .unwrap()
        .unwrap_err();
    assert!(matches!(error, Error::FlagsConflict { .. }), "{error:?}");
    assert!(!error.is_transient());
    let response = app.oneshot(get_request("/admin/x")).await.unwrap();
    assert_eq!(response.status(), 500);
    assert_eq!(text(response).await, Refusal::CampaignFailed.text());
    assert!(
        matches!(handle.state(), CampaignState::Failed(message) if message.contains("another kind of lock"))
    );
    assert!(agent.sessions().await.is_empty());
}

/// A follower's 503 tells the client what it can act on, nothing more: not the error of its last
/// failed attempt (which named the backend's address), not after the backend has recovered, and
/// in the words the application chose when it chose some.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_s_answer_names_no_internals_and_no_stale_error() {
    init_tracing();
    let agent = Agent::start().await;
    let proxy = Proxy::start(agent.addr()).await.unwrap();
    let address = proxy.url();
    proxy.set_mode(Mode::Refuse);
    let backend = lease_consul::Consul::builder()
        .address(address.clone())
        .build()
        .unwrap();
    let campaign = Campaign::try_new(Arc::new(backend), spec()).unwrap();
    let handle = campaign.handle();
    let plain: Router = Router::new()
        .route("/admin/x", get(|| async { "led" }))
        .route_layer(LeaderOnlyLayer::new(handle.clone()));
    let worded: Router = Router::new()
        .route("/admin/x", get(|| async { "led" }))
        .route_layer(
            LeaderOnlyLayer::new(handle.clone()).refusal_body(|refusal| match refusal {
                Refusal::NoLeader => "electing; come back soon\n".to_owned(),
                other => format!("{} ({other:?})\n", other.status()),
            }),
        );
    let (shutdown, running) = hold(campaign);

    // The backend refuses: no leader is known, and the campaign's last attempt failed.
    within(T, "a failed attempt", async {
        while handle.last_error().is_none() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    let error = handle.last_error().unwrap().to_string();
    let host = address.trim_start_matches("http://");
    assert!(error.contains(host), "the error names the address: {error}");
    let response = plain
        .clone()
        .oneshot(get_request("/admin/x"))
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    let body = text(response).await;
    assert_eq!(body, Refusal::NoLeader.text());
    assert!(!body.contains(host) && !body.contains(KEY), "{body}");
    let response = worded
        .clone()
        .oneshot(get_request("/admin/x"))
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(text(response).await, "electing; come back soon\n");

    // Another node leads; this one reaches Consul again and follows: the old error is gone.
    let other = agent.backend();
    let leader = other
        .acquire(&spec().value("http://node-2:3000"))
        .await
        .unwrap();
    proxy.set_mode(Mode::Forward);
    within(T, "the leader to be seen", async {
        while handle.leader().is_none() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(handle.last_error().is_none(), "{:?}", handle.last_error());
    let response = plain.oneshot(get_request("/admin/x")).await.unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(
        response.headers().get(LEADER_HEADER).unwrap(),
        "http://node-2:3000"
    );
    assert_eq!(text(response).await, Refusal::NotLeader.text());
    let response = worded.oneshot(get_request("/admin/x")).await.unwrap();
    assert_eq!(
        text(response).await,
        "503 Service Unavailable (NotLeader)\n"
    );

    leader.release().await.unwrap();
    shutdown.cancel();
    within(T, "the campaign to end", running)
        .await
        .unwrap()
        .unwrap();
}
