//! What the layers cost per request, over loopback HTTP with many concurrent connections.
//!
//! Starts a real Consul dev agent (as the integration tests do), then measures with an in-process
//! load generator (reqwest, `CONNECTIONS` concurrent clients):
//!
//! 1. requests/s of a bare axum router and of the same router behind `LeaderOnlyLayer` on the
//!    leader, in alternating rounds so drift on a shared machine hits both alike;
//! 2. requests/s of a route behind `SemaphoreLayer` at limit 8 on Consul with the session pool,
//!    and Consul writes per request.
//!
//! Run: `cargo bench -p lease-tower --bench layer_overhead`. The last line is
//! `RESULT leader_layer_ratio=… semaphore_rps=… consul_writes_per_request=…`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::get;
use lease_core::LeaseSpec;
use lease_core::consul::Consul;
use lease_core::leader::Campaign;
use lease_tests::consul::Agent;
use lease_tower::leader::LeaderOnlyLayer;
use lease_tower::semaphore::SemaphoreLayer;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

const CONNECTIONS: usize = 64;
/// Twice the limit: enough to keep every slot busy; more would only queue in the layer.
const SEMAPHORE_CONNECTIONS: usize = 16;
const ROUND: Duration = Duration::from_millis(1500);
const ROUNDS: usize = 8;
const SEMAPHORE_RUN: Duration = Duration::from_secs(4);

fn main() {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("cannot start a Tokio runtime: {error}");
            std::process::exit(1);
        }
    };
    runtime.block_on(run());
}

async fn serve(app: Router) -> String {
    let listener = match TcpListener::bind("127.0.0.1:0").await {
        Ok(listener) => listener,
        Err(error) => fail(&format!("cannot bind a loopback port: {error}")),
    };
    let url = match listener.local_addr() {
        Ok(addr) => format!("http://{addr}"),
        Err(error) => fail(&format!("no local address: {error}")),
    };
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

fn fail(message: &str) -> ! {
    eprintln!("layer_overhead: {message}");
    std::process::exit(1)
}

/// Requests per second of `CONNECTIONS` clients hammering `url` for `period`; also the count of
/// non-2xx answers (which would make the figure meaningless).
async fn load(
    client: &reqwest::Client,
    url: &str,
    connections: usize,
    period: Duration,
) -> (f64, u64, u64) {
    let ok = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let deadline = started + period;
    let workers: Vec<_> = (0..connections)
        .map(|_| {
            let client = client.clone();
            let url = url.to_owned();
            let ok = Arc::clone(&ok);
            let failed = Arc::clone(&failed);
            tokio::spawn(async move {
                while Instant::now() < deadline {
                    let answer = client.get(&url).send().await;
                    let good = match answer {
                        Ok(response) => {
                            let status = response.status();
                            let body = response.bytes().await;
                            if !status.is_success() && failed.load(Ordering::Relaxed) == 0 {
                                eprintln!("first failure: {status} {body:?}");
                            }
                            body.is_ok() && status.is_success()
                        }
                        Err(_) => false,
                    };
                    let counter = if good { &ok } else { &failed };
                    counter.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for worker in workers {
        let _ = worker.await;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let ok = ok.load(Ordering::Relaxed);
    (ok as f64 / elapsed, ok, failed.load(Ordering::Relaxed))
}

async fn run() {
    let agent = Agent::start().await;
    let client = match reqwest::Client::builder()
        .pool_max_idle_per_host(CONNECTIONS)
        .build()
    {
        Ok(client) => client,
        Err(error) => fail(&format!("cannot build the HTTP client: {error}")),
    };

    let handler = || async { "hello" };
    let bare = serve(Router::new().route("/", get(handler))).await;
    let campaign = match Campaign::try_new(
        Arc::new(agent.backend()),
        LeaseSpec::leader("bench/tower/leader").lock_delay(Duration::ZERO),
    ) {
        Ok(campaign) => campaign,
        Err(error) => fail(&format!("invalid campaign: {error}")),
    };
    let leader_layer = LeaderOnlyLayer::new(campaign.handle());
    let shutdown = CancellationToken::new();
    let campaigning = tokio::spawn(campaign.hold_until(shutdown.clone()));
    let led = serve(
        Router::new()
            .route("/", get(handler))
            .route_layer(leader_layer.clone()),
    )
    .await;
    // The floor any route_layer costs in axum (a boxed service per route, the body boxed), to
    // read the leader layer's own share against.
    let identity = serve(
        Router::new()
            .route("/", get(handler))
            .route_layer(tower::layer::layer_fn(|service| service)),
    )
    .await;
    let mut terms = leader_layer.campaign().terms();
    if let Err(error) = terms.wait_for(Option::is_some).await {
        fail(&format!("no leader elected: {error}"));
    }

    // Warm both servers and the connection pool.
    let _ = load(&client, &bare, CONNECTIONS, Duration::from_millis(300)).await;
    let _ = load(&client, &led, CONNECTIONS, Duration::from_millis(300)).await;
    let _ = load(&client, &identity, CONNECTIONS, Duration::from_millis(300)).await;
    let (mut bare_total, mut led_total) = (0.0, 0.0);
    let mut ratios = Vec::new();
    let mut identity_ratios = Vec::new();
    for round in 1..=ROUNDS {
        // Alternate which server goes first, so neither always runs on a warmer machine.
        let (bare_run, led_run) = if round % 2 == 1 {
            let bare_run = load(&client, &bare, CONNECTIONS, ROUND).await;
            (bare_run, load(&client, &led, CONNECTIONS, ROUND).await)
        } else {
            let led_run = load(&client, &led, CONNECTIONS, ROUND).await;
            (load(&client, &bare, CONNECTIONS, ROUND).await, led_run)
        };
        let ((bare_rps, _, bare_failed), (led_rps, _, led_failed)) = (bare_run, led_run);
        if bare_failed + led_failed > 0 {
            fail(&format!(
                "{bare_failed} bare and {led_failed} leader-only requests failed"
            ));
        }
        let (identity_rps, _, _) = load(&client, &identity, CONNECTIONS, ROUND).await;
        println!(
            "round {round}: bare axum {bare_rps:.0} req/s, behind LeaderOnlyLayer (leader) {led_rps:.0} req/s, behind an identity route_layer {identity_rps:.0} req/s"
        );
        ratios.push(led_rps / bare_rps);
        identity_ratios.push(identity_rps / bare_rps);
        bare_total += bare_rps;
        led_total += led_rps;
    }
    // The median of the rounds' ratios: one round disturbed by another process on this shared
    // machine must not decide the figure.
    ratios.sort_by(f64::total_cmp);
    let ratio = ratios[ratios.len() / 2];
    identity_ratios.sort_by(f64::total_cmp);
    let identity_ratio = identity_ratios[identity_ratios.len() / 2];
    println!(
        "leader-only layer: {:.0} vs {:.0} req/s bare, median ratio {ratio:.3} ({CONNECTIONS} connections)",
        led_total / ROUNDS as f64,
        bare_total / ROUNDS as f64
    );
    println!(
        "for reference, an identity route_layer: median ratio {identity_ratio:.3}; the leader layer's own share is about {:.1}%",
        100.0 * (identity_ratio - ratio).max(0.0)
    );

    let consul = match Consul::builder()
        .address(agent.url())
        .semaphore_pool(Duration::from_secs(60))
        .build()
    {
        Ok(consul) => consul,
        Err(error) => fail(&format!("cannot build the Consul client: {error}")),
    };
    let limited = serve(
        Router::new().route("/", get(handler)).route_layer(
            SemaphoreLayer::new(
                Arc::new(consul.clone()),
                LeaseSpec::semaphore("bench/tower/semaphore", 8).lock_delay(Duration::ZERO),
            )
            .max_wait(Duration::from_secs(30)),
        ),
    )
    .await;
    // Fill the session pool first: steady state is what the figure is about.
    let _ = load(
        &client,
        &limited,
        SEMAPHORE_CONNECTIONS,
        Duration::from_millis(500),
    )
    .await;
    let writes_before = consul.writes_sent();
    let (semaphore_rps, served, failed) =
        load(&client, &limited, SEMAPHORE_CONNECTIONS, SEMAPHORE_RUN).await;
    let writes = consul.writes_sent() - writes_before;
    if failed > 0 {
        fail(&format!("{failed} semaphore requests failed"));
    }
    let writes_per_request = writes as f64 / served.max(1) as f64;
    println!(
        "semaphore layer (limit 8, Consul, pooled sessions): {semaphore_rps:.0} req/s, {served} requests, {writes} Consul writes = {writes_per_request:.2} per request, {} lost CAS",
        consul.cas_conflicts()
    );
    shutdown.cancel();
    match campaigning.await {
        Ok(Ok(_)) => {}
        Ok(Err(error)) => fail(&format!("the campaign failed: {error}")),
        Err(error) => fail(&format!("the campaign task failed: {error}")),
    }
    println!(
        "RESULT leader_layer_ratio={ratio:.3} semaphore_rps={semaphore_rps:.0} consul_writes_per_request={writes_per_request:.2}"
    );
}
