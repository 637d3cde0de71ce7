//! What the layers cost per request: in process, and over loopback HTTP with many concurrent
//! connections.
//!
//! Starts a real Consul dev agent (as the integration tests do), campaigns for a leader key on
//! it, then measures:
//!
//! 1. in process, no sockets: nanoseconds per request through the built service
//!    (`ServiceExt::ready` + `call` + awaiting the response and dropping it) behind
//!    `LeaderOnlyLayer` on the leader and behind an identity layer, in alternating rounds of
//!    about a millisecond, counted in the thread's CPU time (on Linux). Twice: around a bare
//!    tower `service_fn` (the layer's own cost: `leader_layer_ns_over_identity`), and on an axum
//!    route with `route_layer` (what an application's router adds per request, a new response
//!    body type included: `leader_layer_ns_over_identity_on_axum_route`). Each figure is the
//!    median of the rounds' differences; each side's spread (interquartile range over median)
//!    says whether a 5% change would show;
//! 2. with an in-process load generator (reqwest, `CONNECTIONS` concurrent clients): requests/s
//!    of a bare axum router and of the same router behind `LeaderOnlyLayer` on the leader, in
//!    alternating rounds so drift on a shared machine hits both alike;
//! 3. requests/s of a route behind `SemaphoreLayer` at limit 8 on Consul with the session pool,
//!    and Consul writes per request.
//!
//! Run: `cargo bench -p lease-tower --bench layer_overhead`. The last line is
//! `RESULT leader_layer_ns_over_identity=… leader_layer_ns_over_identity_on_axum_route=…
//! leader_layer_ratio=… semaphore_rps=… consul_writes_per_request=…`.
//!
//! The quick mode CI runs (21 in-process rounds, one 0.3 s HTTP round per server, 1 s through
//! the semaphore; a few seconds): `LEASE_BENCH_QUICK=1 cargo test -p lease-tower --all-features
//! --bench layer_overhead`. In every mode the run fails if the leader's term is lost while the
//! benchmark runs on it, if a request behind either layer fails (or the in-process services
//! answer anything but success), if more requests than the semaphore's limit run at once in
//! the handler behind `SemaphoreLayer`, or if one of them runs on a lease no longer held.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::get;
use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use lease_consul::Consul;
use lease_core::CancellationToken;
use lease_core::LeaseSpec;
use lease_core::leader::Campaign;
use lease_tests::consul::Agent;
use lease_tests::stats::scaled;
use lease_tower::extract::HeldLease;
use lease_tower::leader::LeaderOnlyLayer;
use lease_tower::semaphore::SemaphoreLayer;
use tokio::net::TcpListener;
use tower::{Layer, Service, ServiceExt};

const CONNECTIONS: usize = 64;
/// The limit of the semaphore behind `SemaphoreLayer`.
const SEMAPHORE_LIMIT: u32 = 8;
/// Twice the limit: enough to keep every slot busy; more would only queue in the layer.
const SEMAPHORE_CONNECTIONS: usize = 16;
const ROUND: Duration = Duration::from_millis(1500);
const ROUNDS: usize = 8;
const SEMAPHORE_RUN: Duration = Duration::from_secs(4);
/// In-process rounds per side, and how long a round lasts. Short rounds, many of them: on a
/// shared machine another process takes the CPU every few milliseconds, which spoils a few
/// short rounds (the median and the interquartile range leave them out) rather than every long
/// round a little.
const IN_PROCESS_ROUNDS: usize = 401;
const IN_PROCESS_ROUND: Duration = Duration::from_millis(1);

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

/// What the handler behind `SemaphoreLayer` saw.
#[derive(Default)]
struct SlotCheck {
    /// Requests in the handler now.
    in_handler: AtomicUsize,
    /// The most requests in the handler at once.
    peak: AtomicUsize,
    /// Requests whose lease was no longer held in the handler.
    not_held: AtomicU64,
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

/// Nanoseconds per request through `service`: ready, call with `request()`, await the response,
/// drop it.
///
/// The futures complete without yielding, so the work is all on this thread; on Linux it is
/// counted in the thread's CPU time, so the time other processes on a shared machine take the
/// CPU away does not count against either layer.
async fn ns_per_request<S, R, B>(service: &mut S, request: fn() -> Request<R>, requests: u32) -> f64
where
    S: Service<Request<R>, Response = Response<B>, Error = Infallible>,
{
    let started = thread_time();
    for _ in 0..requests {
        let ready = match service.ready().await {
            Ok(ready) => ready,
            Err(never) => match never {},
        };
        match ready.call(request()).await {
            Ok(response) => drop(std::hint::black_box(response)),
            Err(never) => match never {},
        }
    }
    (thread_time() - started).as_nanos() as f64 / f64::from(requests)
}

/// This thread's CPU time.
#[cfg(target_os = "linux")]
fn thread_time() -> Duration {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(
        u64::try_from(now.tv_sec).unwrap_or_default(),
        u32::try_from(now.tv_nsec).unwrap_or_default(),
    )
}

/// Wall time since the first call, where the thread's CPU time is not at hand.
#[cfg(not(target_os = "linux"))]
fn thread_time() -> Duration {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    START.get_or_init(Instant::now).elapsed()
}

/// The median and the spread (interquartile range over the median) of `values`.
fn median_and_spread(values: &mut [f64]) -> (f64, f64) {
    values.sort_by(f64::total_cmp);
    let at = |q: f64| values[((values.len() - 1) as f64 * q).round() as usize];
    let median = at(0.5);
    (median, (at(0.75) - at(0.25)) / median)
}

/// In-process rounds per side: [`IN_PROCESS_ROUNDS`], fewer in the quick mode.
fn in_process_rounds() -> usize {
    scaled(IN_PROCESS_ROUNDS, 21)
}

/// The status of one response from `service` to `request()`.
async fn answer<S, R, B>(service: &mut S, request: fn() -> Request<R>) -> http::StatusCode
where
    S: Service<Request<R>, Response = Response<B>, Error = Infallible>,
{
    let ready = match service.ready().await {
        Ok(ready) => ready,
        Err(never) => match never {},
    };
    match ready.call(request()).await {
        Ok(response) => response.status(),
        Err(never) => match never {},
    }
}

/// One in-process comparison of the leader layer with an identity layer.
struct Comparison {
    /// Requests per round.
    requests: u32,
    /// The median over rounds of the leader layer's ns per request less the identity's.
    over: f64,
    identity: f64,
    led: f64,
    identity_spread: f64,
    led_spread: f64,
}

impl Comparison {
    fn describe(&self, what: &str) -> String {
        format!(
            "{what}, {} rounds of {} requests: identity layer {:.1} ns/request (spread {:.1}%), LeaderOnlyLayer on the leader {:.1} ns/request (spread {:.1}%): {:.1} ns over identity",
            in_process_rounds(),
            self.requests,
            self.identity,
            self.identity_spread * 100.0,
            self.led,
            self.led_spread * 100.0,
            self.over
        )
    }
}

/// Alternating rounds of `identity` and `led`, each fed `request()`.
async fn compare<I, L, R, B1, B2>(
    identity: &mut I,
    led: &mut L,
    request: fn() -> Request<R>,
) -> Comparison
where
    I: Service<Request<R>, Response = Response<B1>, Error = Infallible>,
    L: Service<Request<R>, Response = Response<B2>, Error = Infallible>,
{
    // Warm caches and the allocator, and size the rounds.
    let warm_up = scaled(20_000, 2_000);
    ns_per_request(identity, request, warm_up).await;
    let slowest = ns_per_request(led, request, warm_up)
        .await
        .max(ns_per_request(identity, request, warm_up).await);
    let requests = (IN_PROCESS_ROUND.as_nanos() as f64 / slowest).max(100.0) as u32;
    let (mut identity_ns, mut led_ns, mut over) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..in_process_rounds() {
        let (a, b) = if round % 2 == 0 {
            let a = ns_per_request(identity, request, requests).await;
            (a, ns_per_request(led, request, requests).await)
        } else {
            let b = ns_per_request(led, request, requests).await;
            (ns_per_request(identity, request, requests).await, b)
        };
        identity_ns.push(a);
        led_ns.push(b);
        over.push(b - a);
    }
    // What was timed was the request served, not refused: both answer success.
    for (side, status) in [
        ("identity", answer(identity, request).await),
        ("leader-only", answer(led, request).await),
    ] {
        assert!(
            status.is_success(),
            "in process: the {side} service answered {status}"
        );
    }
    let (identity, identity_spread) = median_and_spread(&mut identity_ns);
    let (led, led_spread) = median_and_spread(&mut led_ns);
    let (over, _) = median_and_spread(&mut over);
    Comparison {
        requests,
        over,
        identity,
        led,
        identity_spread,
        led_spread,
    }
}

/// The leader layer's own cost per request, in process, on the leader: around a bare tower
/// service, and on an axum route (`route_layer`), as the application's router serves it.
async fn in_process(leader_layer: &LeaderOnlyLayer) -> (Comparison, Comparison) {
    let inner = tower::service_fn(|_request: Request<()>| async {
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"hello"))))
    });
    let bare = compare(
        &mut tower::layer::util::Identity::new().layer(inner),
        &mut leader_layer.layer(inner),
        || Request::new(()),
    )
    .await;
    let handler = || async { "hello" };
    let routed = compare(
        &mut Router::new()
            .route("/", get(handler))
            .route_layer(tower::layer::util::Identity::new()),
        &mut Router::new()
            .route("/", get(handler))
            .route_layer(leader_layer.clone()),
        || Request::new(axum::body::Body::empty()),
    )
    .await;
    (bare, routed)
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
    // The benchmark runs on this term from here on: lost, it would time refusals.
    let term = match terms.wait_for(Option::is_some).await {
        Ok(term) => term.clone(),
        Err(error) => fail(&format!("no leader elected: {error}")),
    }
    .unwrap_or_else(|| fail("no leader elected"));

    let (bare_stack, routed) = in_process(&leader_layer).await;
    println!(
        "{}",
        bare_stack.describe("in process, around a tower service_fn")
    );
    println!(
        "{}",
        routed.describe("in process, on an axum route (route_layer)")
    );

    // Warm both servers and the connection pool.
    let warm_up = scaled(Duration::from_millis(300), Duration::from_millis(100));
    let _ = load(&client, &bare, CONNECTIONS, warm_up).await;
    let _ = load(&client, &led, CONNECTIONS, warm_up).await;
    let _ = load(&client, &identity, CONNECTIONS, warm_up).await;
    let (mut bare_total, mut led_total) = (0.0, 0.0);
    let mut ratios = Vec::new();
    let mut identity_ratios = Vec::new();
    let (rounds, round_for) = (scaled(ROUNDS, 1), scaled(ROUND, Duration::from_millis(300)));
    for round in 1..=rounds {
        // Alternate which server goes first, so neither always runs on a warmer machine.
        let (bare_run, led_run) = if round % 2 == 1 {
            let bare_run = load(&client, &bare, CONNECTIONS, round_for).await;
            (bare_run, load(&client, &led, CONNECTIONS, round_for).await)
        } else {
            let led_run = load(&client, &led, CONNECTIONS, round_for).await;
            (load(&client, &bare, CONNECTIONS, round_for).await, led_run)
        };
        let ((bare_rps, _, bare_failed), (led_rps, _, led_failed)) = (bare_run, led_run);
        if bare_failed + led_failed > 0 {
            fail(&format!(
                "{bare_failed} bare and {led_failed} leader-only requests failed"
            ));
        }
        let (identity_rps, _, _) = load(&client, &identity, CONNECTIONS, round_for).await;
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
        led_total / rounds as f64,
        bare_total / rounds as f64
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
    // The handler behind the semaphore counts the requests in it at once (across an await, so
    // that they can overlap) and those that find their lease no longer held.
    let slots = Arc::new(SlotCheck::default());
    let limited_handler = {
        let slots = Arc::clone(&slots);
        move |HeldLease(lease): HeldLease| async move {
            let now = slots.in_handler.fetch_add(1, Ordering::SeqCst) + 1;
            slots.peak.fetch_max(now, Ordering::SeqCst);
            tokio::task::yield_now().await;
            if !lease.is_held() {
                slots.not_held.fetch_add(1, Ordering::SeqCst);
            }
            slots.in_handler.fetch_sub(1, Ordering::SeqCst);
            "hello"
        }
    };
    let limited = serve(
        Router::new().route("/", get(limited_handler)).route_layer(
            SemaphoreLayer::new(
                Arc::new(consul.clone()),
                LeaseSpec::semaphore("bench/tower/semaphore", SEMAPHORE_LIMIT)
                    .lock_delay(Duration::ZERO),
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
        scaled(Duration::from_millis(500), Duration::from_millis(200)),
    )
    .await;
    let writes_before = consul.writes_sent();
    let (semaphore_rps, served, failed) = load(
        &client,
        &limited,
        SEMAPHORE_CONNECTIONS,
        scaled(SEMAPHORE_RUN, Duration::from_secs(1)),
    )
    .await;
    let writes = consul.writes_sent() - writes_before;
    if failed > 0 {
        fail(&format!("{failed} semaphore requests failed"));
    }
    assert!(served > 0, "no request was served through the semaphore");
    let peak = slots.peak.load(Ordering::SeqCst);
    assert!(
        peak <= SEMAPHORE_LIMIT as usize,
        "{peak} requests at once behind the semaphore of limit {SEMAPHORE_LIMIT}"
    );
    let not_held = slots.not_held.load(Ordering::SeqCst);
    assert_eq!(
        not_held, 0,
        "{not_held} requests behind the semaphore ran on a lease no longer held"
    );
    let writes_per_request = writes as f64 / served.max(1) as f64;
    println!(
        "semaphore layer (limit 8, Consul, pooled sessions): {semaphore_rps:.0} req/s, {served} requests, {writes} Consul writes = {writes_per_request:.2} per request, {} lost CAS",
        consul.cas_conflicts()
    );
    // The leader held its first term throughout: every figure above was taken on it.
    assert!(
        term.is_held(),
        "the leader's term was lost while the benchmark ran on it: {:?}",
        term.lease().lost_reason()
    );
    assert_eq!(
        leader_layer
            .campaign()
            .term()
            .map(|t| t.sequencer().clone()),
        Some(term.sequencer().clone()),
        "the leader's term changed while the benchmark ran on it"
    );
    shutdown.cancel();
    match campaigning.await {
        Ok(Ok(_)) => {}
        Ok(Err(error)) => fail(&format!("the campaign failed: {error}")),
        Err(error) => fail(&format!("the campaign task failed: {error}")),
    }
    println!(
        "RESULT leader_layer_ns_over_identity={:.1} leader_layer_ns_over_identity_on_axum_route={:.1} leader_layer_ratio={ratio:.3} semaphore_rps={semaphore_rps:.0} consul_writes_per_request={writes_per_request:.2}",
        bare_stack.over, routed.over
    );
}
