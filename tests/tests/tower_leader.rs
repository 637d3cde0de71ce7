//! The leader-only layer on real Consul and real HTTP: two app instances, one serves.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use lease_core::memory::Memory;
use lease_core::{Backend, LeaseSpec};
use lease_tests::consul::Agent;
use lease_tests::{init_tracing, within};
use lease_tower::extract::LeaseSequencer;
use lease_tower::leader::{LEADER_HEADER, LeaderOnlyLayer};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tower::ServiceExt;

const T: Duration = Duration::from_secs(60);
const KEY: &str = "service/tower-test/leader";

/// Sends on the channel when dropped: proves a handler's future was dropped (cancelled).
struct DropSignal(mpsc::UnboundedSender<&'static str>);

impl Drop for DropSignal {
    fn drop(&mut self) {
        let _ = self.0.send("handler dropped");
    }
}

struct Instance {
    url: String,
    layer: LeaderOnlyLayer,
}

/// One app instance: its own Consul client, a leader-only router, served on a loopback port.
async fn instance(agent: &Agent, events: mpsc::UnboundedSender<&'static str>) -> Instance {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let layer = LeaderOnlyLayer::new(
        Arc::new(agent.backend()),
        LeaseSpec::leader(KEY)
            .ttl(Duration::from_secs(10))
            .lock_delay(Duration::ZERO)
            .value(url.clone()),
    );
    let app = Router::new()
        .route(
            "/admin/who",
            get(|LeaseSequencer(s): LeaseSequencer| async move { s.to_string() }),
        )
        .route(
            "/admin/slow",
            get(move || {
                let events = events.clone();
                async move {
                    let _signal = DropSignal(events.clone());
                    let _ = events.send("handler started");
                    std::future::pending::<()>().await;
                }
            }),
        )
        .route_layer(layer.clone());
    tokio::spawn(async move { axum::serve(listener, app).await });
    Instance { url, layer }
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
            tokio::task::yield_now().await;
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
    assert!(leader.layer.is_leader());
    assert!(!follower.layer.is_leader());

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

#[tokio::test]
async fn a_follower_can_redirect_to_the_leader() {
    let memory = Memory::new();
    let _other = memory
        .acquire(&LeaseSpec::leader(KEY).value("10.0.0.7:8080"))
        .await
        .unwrap();
    let layer = LeaderOnlyLayer::new(Arc::new(memory.clone()), LeaseSpec::leader(KEY))
        .redirect_to_leader(true);
    let app: Router = Router::new()
        .route("/admin/x", get(|| async { "led" }))
        .route_layer(layer.clone());
    let response = within(T, "a redirect", async {
        loop {
            let request = http::Request::get("/admin/x?y=1")
                .body(axum::body::Body::empty())
                .unwrap();
            let response = app.clone().oneshot(request).await.unwrap();
            if response.status() == 307 {
                return response;
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert_eq!(
        response.headers()["location"],
        "http://10.0.0.7:8080/admin/x?y=1"
    );
    assert!(!layer.is_leader());
}

#[tokio::test]
async fn handlers_without_the_layer_get_an_explanation() {
    let app: Router = Router::new().route(
        "/x",
        get(|LeaseSequencer(s): LeaseSequencer| async move { s.to_string() }),
    );
    let request = http::Request::get("/x")
        .body(axum::body::Body::empty())
        .unwrap();
    let response = app.oneshot(request).await.unwrap();
    assert_eq!(response.status(), 500);
    let body = axum::body::to_bytes(response.into_body(), 1 << 16)
        .await
        .unwrap();
    assert!(String::from_utf8_lossy(&body).contains("SequencerCheckLayer"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streaming_leader_response_is_cut_when_the_lease_is_lost() {
    init_tracing();
    let memory = Memory::new();
    let layer = LeaderOnlyLayer::new(
        Arc::new(memory.clone()),
        LeaseSpec::leader(KEY).lock_delay(Duration::ZERO),
    );
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
        .route_layer(layer.clone());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/stream", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    within(T, "this node to lead", async {
        while !layer.is_leader() {
            tokio::task::yield_now().await;
        }
    })
    .await;

    let mut response = reqwest::get(&url).await.unwrap();
    assert_eq!(response.status(), 200);
    chunks_tx.send(bytes::Bytes::from_static(b"first")).unwrap();
    let first = within(T, "the first chunk", response.chunk())
        .await
        .unwrap();
    assert_eq!(first.as_deref(), Some(&b"first"[..]));

    // The lease is taken away mid-stream: the response must end, not stream on under no leader.
    let session = memory
        .sessions()
        .into_iter()
        .next()
        .expect("the leader's session");
    assert!(memory.invalidate_session(&session));
    // Once this node knows it lost the lease, nothing more may be streamed under it.
    within(T, "this node to know it lost the lease", async {
        while layer.is_leader() {
            tokio::task::yield_now().await;
        }
    })
    .await;
    let _ = chunks_tx.send(bytes::Bytes::from_static(b"after the loss"));
    let rest = within(T, "the response to be cut", response.chunk()).await;
    assert!(
        rest.is_err(),
        "the body went on after the lease was lost: {rest:?}"
    );
}
