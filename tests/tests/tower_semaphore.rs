//! The semaphore layer on real Consul and real HTTP: a cluster-wide limit across two instances.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use bytes::Bytes;
use lease_consul::Consul;
use lease_core::LeaseSpec;
use lease_tests::body::ChannelBody;
use lease_tests::consul::Agent;
use lease_tests::{init_tracing, within};
use lease_tower::semaphore::SemaphoreLayer;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};

const T: Duration = Duration::from_secs(60);

fn pooled(agent: &Agent) -> Arc<Consul> {
    Arc::new(
        Consul::builder()
            .address(agent.url())
            .semaphore_pool(Duration::from_secs(30))
            .build()
            .unwrap(),
    )
}

fn spec(prefix: &str, limit: u32) -> LeaseSpec {
    LeaseSpec::semaphore(prefix, limit)
        .ttl(Duration::from_secs(10))
        .lock_delay(Duration::ZERO)
}

async fn serve(app: Router) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

/// Counts the handlers running now and the most that ever ran at once.
#[derive(Clone, Default)]
struct Gauge {
    now: Arc<AtomicUsize>,
    max: Arc<AtomicUsize>,
}

impl Gauge {
    fn enter(&self) -> GaugeGuard {
        let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.max.fetch_max(now, Ordering::SeqCst);
        GaugeGuard(self.now.clone())
    }
}

struct GaugeGuard(Arc<AtomicUsize>);

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_requests_across_two_instances_never_run_more_than_two_handlers() {
    init_tracing();
    let agent = Agent::start().await;
    let gauge = Gauge::default();
    let (entered_tx, mut entered) = mpsc::unbounded_channel::<()>();
    let (gate_tx, gate) = watch::channel(false);
    let mut urls = Vec::new();
    for _ in 0..2 {
        let backend = pooled(&agent);
        let work = {
            let gauge = gauge.clone();
            move || {
                let gauge = gauge.clone();
                async move {
                    let _running = gauge.enter();
                    // Simulated work, long enough for requests to overlap.
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    "report"
                }
            }
        };
        let gated = {
            let gauge = gauge.clone();
            let entered_tx = entered_tx.clone();
            let gate = gate.clone();
            move || {
                let gauge = gauge.clone();
                let entered_tx = entered_tx.clone();
                let mut gate = gate.clone();
                async move {
                    let _running = gauge.enter();
                    let _ = entered_tx.send(());
                    let _ = gate.wait_for(|open| *open).await;
                    "gated"
                }
            }
        };
        let app = Router::new()
            .route("/report", get(work))
            .route_layer(
                SemaphoreLayer::new(backend.clone(), spec("tower/report", 2))
                    .max_wait(Duration::from_secs(30)),
            )
            .merge(
                Router::new().route("/gated", get(gated)).route_layer(
                    SemaphoreLayer::new(backend, spec("tower/report", 2))
                        .max_wait(Duration::from_millis(300))
                        .retry_after(Duration::from_secs(2)),
                ),
            );
        urls.push(serve(app).await);
    }
    let client = reqwest::Client::new();

    // 20 concurrent requests, alternating between the instances: all served, at most 2 at once.
    let requests: Vec<_> = (0..20)
        .map(|i| {
            let client = client.clone();
            let url = format!("{}/report", urls[i % 2]);
            tokio::spawn(async move { client.get(url).send().await.unwrap().status() })
        })
        .collect();
    for request in requests {
        assert_eq!(within(T, "a /report answer", request).await.unwrap(), 200);
    }
    let max = gauge.max.load(Ordering::SeqCst);
    assert!(max <= 2, "{max} handlers ran at once with a limit of 2");

    // Two requests hold both slots (one per instance); a third waits its 300 ms and gets 503.
    let held: Vec<_> = urls
        .iter()
        .map(|url| {
            let client = client.clone();
            let url = format!("{url}/gated");
            tokio::spawn(async move { client.get(url).send().await.unwrap().status() })
        })
        .collect();
    for _ in 0..2 {
        within(T, "a gated handler to start", entered.recv())
            .await
            .unwrap();
    }
    for url in &urls {
        let response = client.get(format!("{url}/gated")).send().await.unwrap();
        assert_eq!(response.status(), 503);
        assert_eq!(response.headers()["retry-after"], "2");
    }
    assert_eq!(gauge.now.load(Ordering::SeqCst), 2);
    gate_tx.send_replace(true);
    for request in held {
        assert_eq!(within(T, "a gated answer", request).await.unwrap(), 200);
    }
    assert!(gauge.max.load(Ordering::SeqCst) <= 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streaming_response_holds_its_slot_until_the_last_chunk() {
    init_tracing();
    let agent = Agent::start().await;
    let (body_tx, body_rx) = mpsc::unbounded_channel::<Bytes>();
    let body_rx = Arc::new(std::sync::Mutex::new(Some(body_rx)));
    let streaming = move || {
        let body_rx = body_rx.clone();
        async move {
            let rx = body_rx.lock().unwrap().take().unwrap();
            Body::new(ChannelBody(rx))
        }
    };
    let a = serve(
        Router::new()
            .route("/stream", get(streaming))
            .route_layer(SemaphoreLayer::new(pooled(&agent), spec("tower/stream", 1))),
    )
    .await;
    let backend = pooled(&agent);
    let b = serve(
        Router::new()
            .route("/quick", get(|| async { "quick" }))
            .route_layer(
                SemaphoreLayer::new(backend.clone(), spec("tower/stream", 1))
                    .max_wait(Duration::from_millis(300)),
            )
            .merge(
                Router::new()
                    .route("/patient", get(|| async { "patient" }))
                    .route_layer(
                        SemaphoreLayer::new(backend, spec("tower/stream", 1))
                            .max_wait(Duration::from_secs(30)),
                    ),
            ),
    )
    .await;
    let client = reqwest::Client::new();

    body_tx.send(Bytes::from_static(b"first chunk\n")).unwrap();
    let mut response = within(
        T,
        "the streaming response",
        client.get(format!("{a}/stream")).send(),
    )
    .await
    .unwrap();
    assert_eq!(response.status(), 200);
    let first = within(T, "the first chunk", response.chunk())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&first[..], b"first chunk\n");

    // The handler has returned, but the body is still streaming: the only slot is still taken.
    let busy = client.get(format!("{b}/quick")).send().await.unwrap();
    assert_eq!(busy.status(), 503);

    body_tx.send(Bytes::from_static(b"last chunk\n")).unwrap();
    drop(body_tx);
    let last = within(T, "the last chunk", response.chunk())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&last[..], b"last chunk\n");
    assert!(
        within(T, "the end of the body", response.chunk())
            .await
            .unwrap()
            .is_none()
    );

    // Once the body is done the slot is free again.
    let after = within(
        T,
        "a request after the stream",
        client.get(format!("{b}/patient")).send(),
    )
    .await
    .unwrap();
    assert_eq!(after.status(), 200);
}

/// Reports when it is dropped: the handler's future was cancelled.
struct DroppedSignal(Option<tokio::sync::oneshot::Sender<()>>);

impl Drop for DroppedSignal {
    fn drop(&mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_lost_mid_request_cancels_the_handler_with_503() {
    init_tracing();
    let agent = Agent::start().await;
    let (session_tx, mut session_rx) = mpsc::unbounded_channel::<String>();
    let (dropped_tx, dropped_rx) = tokio::sync::oneshot::channel();
    let dropped_tx = Arc::new(std::sync::Mutex::new(Some(dropped_tx)));
    let handler = move |lease_tower::extract::HeldLease(lease): lease_tower::extract::HeldLease| {
        let session_tx = session_tx.clone();
        let dropped_tx = dropped_tx.clone();
        async move {
            let _signal = DroppedSignal(dropped_tx.lock().unwrap().take());
            let _ = session_tx.send(lease.sequencer().holder().to_owned());
            // Work that only ends when it is cancelled.
            std::future::pending::<&'static str>().await
        }
    };
    let url = serve(
        Router::new()
            .route("/slow", get(handler))
            .route_layer(SemaphoreLayer::new(pooled(&agent), spec("tower/lost", 1))),
    )
    .await;
    let request =
        tokio::spawn(async move { reqwest::get(format!("{url}/slow")).await.unwrap().status() });
    let session = within(T, "the handler to start", session_rx.recv())
        .await
        .unwrap();
    agent.destroy_session(&session).await;
    within(T, "the handler to be dropped", dropped_rx)
        .await
        .unwrap();
    assert_eq!(within(T, "the answer", request).await.unwrap(), 503);
}
