//! The sequencer check on real Consul and real HTTP: stale leaders are refused with 409.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::post;
use lease_core::{Backend, LeaseSpec, Sequencer};
use lease_tests::consul::Agent;
use lease_tests::{init_tracing, within};
use lease_tower::extract::LeaseSequencer;
use lease_tower::fence::{MissingSequencer, SEQUENCER_HEADER, SequencerCheckLayer};
use tokio::net::TcpListener;
use tokio::time::Instant;

const T: Duration = Duration::from_secs(60);
const KEY: &str = "service/tower-fence/leader";

fn spec() -> LeaseSpec {
    LeaseSpec::leader(KEY)
        .ttl(Duration::from_secs(10))
        .lock_delay(Duration::ZERO)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_current_sequencer_passes_and_a_stale_one_gets_409() {
    init_tracing();
    let agent = Agent::start().await;
    let receiver_backend = Arc::new(agent.backend());
    let echo = |LeaseSequencer(s): LeaseSequencer| async move { s.to_string() };
    let app = Router::new()
        .route("/apply", post(echo))
        .route_layer(SequencerCheckLayer::new(receiver_backend.clone(), KEY))
        .merge(
            Router::new()
                .route("/lenient", post(|| async { "unchecked" }))
                .route_layer(
                    SequencerCheckLayer::new(receiver_backend, KEY).missing(MissingSequencer::Pass),
                ),
        );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    let client = reqwest::Client::new();
    let send = |sequencer: Option<String>| {
        let mut request = client.post(format!("{url}/apply"));
        if let Some(sequencer) = sequencer {
            request = request.header(SEQUENCER_HEADER.as_str(), sequencer);
        }
        async move { within(T, "an answer", request.send()).await.unwrap() }
    };

    let first_node = agent.backend();
    let first = first_node.acquire(&spec()).await.unwrap();
    let response = send(Some(first.sequencer().to_string())).await;
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.text().await.unwrap(),
        first.sequencer().to_string()
    );

    // Re-election: the first leader's session is destroyed and another node takes the key.
    let stale: Sequencer = first.sequencer().clone();
    agent.destroy_session(stale.holder()).await;
    within(T, "the first lease to be lost", first.lost()).await;
    let second_node = agent.backend();
    let second = within(T, "re-election", second_node.acquire(&spec()))
        .await
        .unwrap();
    assert!(second.sequencer().index() > stale.index());

    let response = send(Some(stale.to_string())).await;
    assert_eq!(response.status(), 409);
    assert!(response.text().await.unwrap().contains("stale sequencer"));
    let response = send(Some(second.sequencer().to_string())).await;
    assert_eq!(response.status(), 200);

    // Missing and malformed headers.
    assert_eq!(send(None).await.status(), 428);
    assert_eq!(send(Some("not a sequencer".into())).await.status(), 400);
    let other_key = Sequencer::new(second.sequencer().backend(), "other/key", 1, "x");
    assert_eq!(send(Some(other_key.to_string())).await.status(), 409);
    let lenient = client.post(format!("{url}/lenient")).send().await.unwrap();
    assert_eq!(lenient.status(), 200);

    // After the second leader releases, its sequencer is stale too: refused once the receiver
    // learns of the release, which its watch usually tells it within milliseconds and the
    // contract bounds by `max_staleness` and one read. Until then it may still pass.
    let released = second.sequencer().clone();
    second.release().await.unwrap();
    let bound = SequencerCheckLayer::DEFAULT_MAX_STALENESS
        + SequencerCheckLayer::DEFAULT_READ_TIMEOUT
        + Duration::from_secs(1);
    within(bound, "the released sequencer to be refused", async {
        loop {
            match send(Some(released.to_string())).await.status().as_u16() {
                409 => return,
                200 => tokio::time::sleep(Duration::from_millis(10)).await,
                other => panic!("a released sequencer answered {other}"),
            }
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cache_that_can_no_longer_confirm_does_not_pass_the_last_leader() {
    init_tracing();
    let agent = Agent::start().await;
    let (proxy, receiver) = behind_a_proxy(&agent).await;
    let app = Router::new()
        .route("/apply", post(|| async { "applied" }))
        .route_layer(SequencerCheckLayer::new(receiver, KEY));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/apply", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    let client = reqwest::Client::new();

    let leader = agent.backend().acquire(&spec()).await.unwrap();
    let stamp = leader.sequencer().to_string();
    let status = |client: reqwest::Client, url: String, stamp: String| async move {
        let request = client.post(url).header(SEQUENCER_HEADER.as_str(), stamp);
        within(T, "an answer", request.send())
            .await
            .unwrap()
            .status()
    };
    assert_eq!(
        status(client.clone(), url.clone(), stamp.clone()).await,
        200
    );

    // Consul turns away the receiver (a leader election, a proxy in trouble): its watch can no
    // longer confirm the key, and its reads fail, so the cached leader must not keep passing.
    proxy.set_http_500(true);
    within(
        T,
        "the watch to try the key again",
        proxy.answered_500(&format!("/v1/kv/{KEY}")),
    )
    .await;
    // What was confirmed before the trouble passes no longer than the freshness bound.
    let trouble = Instant::now();
    within(T, "the stamp to be refused", async {
        while status(client.clone(), url.clone(), stamp.clone()).await == 200 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(
        trouble.elapsed()
            <= SequencerCheckLayer::DEFAULT_MAX_STALENESS + Duration::from_millis(500)
    );
    assert_eq!(
        status(client.clone(), url.clone(), stamp.clone()).await,
        503
    );

    proxy.set_http_500(false);
    leader.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_network_stops_passing_the_last_leader_within_the_freshness_bound() {
    init_tracing();
    let agent = Agent::start().await;
    let (proxy, receiver) = behind_a_proxy(&agent).await;
    let max_staleness = SequencerCheckLayer::DEFAULT_MAX_STALENESS;
    let read_timeout = SequencerCheckLayer::DEFAULT_READ_TIMEOUT;
    let app = Router::new()
        .route("/apply", post(|| async { "applied" }))
        .route_layer(SequencerCheckLayer::new(receiver, KEY));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/apply", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    let client = reqwest::Client::new();
    let send = |stamp: String| {
        let request = client
            .post(url.clone())
            .header(SEQUENCER_HEADER.as_str(), stamp);
        async move { within(T, "an answer", request.send()).await.unwrap() }
    };

    let first_node = agent.backend();
    let leader = first_node.acquire(&spec()).await.unwrap();
    let stamp = leader.sequencer().to_string();
    assert_eq!(send(stamp.clone()).await.status(), 200);
    // A quiet key on a healthy network: past the bound, a consistent read confirms the leader.
    tokio::time::sleep(max_staleness + Duration::from_millis(500)).await;
    assert_eq!(send(stamp.clone()).await.status(), 200);

    // The receiver's network goes silent (no error, no answer), and the leadership moves on.
    proxy.set_blackhole(true);
    let silent_since = Instant::now();
    agent.destroy_session(leader.sequencer().holder()).await;
    within(T, "the first lease to be lost", leader.lost()).await;
    let second_node = agent.backend();
    let second = within(T, "re-election", second_node.acquire(&spec()))
        .await
        .unwrap();

    // The last leader's work stops passing within the freshness bound plus one bounded read.
    let refused = within(T, "the old stamp to be refused", async {
        loop {
            let response = send(stamp.clone()).await;
            if response.status() != 200 {
                return response;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let refused_after = silent_since.elapsed();
    assert_eq!(refused.status(), 503);
    assert_eq!(refused.headers()["retry-after"], "1");
    let text = refused.text().await.unwrap();
    assert!(text.contains("did not confirm"), "{text}");
    assert!(
        refused_after <= max_staleness + read_timeout + Duration::from_millis(500),
        "the last leader's stamp passed for {refused_after:?} on a silent network"
    );
    // Nothing fresh is known, so it stays refused.
    assert_eq!(send(stamp.clone()).await.status(), 503);

    // The network is back: the old stamp is stale, the new one passes.
    proxy.set_blackhole(false);
    within(T, "the old stamp to get 409", async {
        while send(stamp.clone()).await.status() != 409 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert_eq!(send(second.sequencer().to_string()).await.status(), 200);
    second.release().await.unwrap();
}

/// A receiving backend that reaches `agent` through a fault-injecting proxy.
async fn behind_a_proxy(agent: &Agent) -> (lease_tests::proxy::Proxy, Arc<dyn Backend>) {
    let proxy = lease_tests::proxy::Proxy::start(agent.addr())
        .await
        .unwrap();
    let receiver: Arc<dyn Backend> = Arc::new(
        lease_consul::Consul::builder()
            .address(proxy.url())
            .build()
            .unwrap(),
    );
    (proxy, receiver)
}
