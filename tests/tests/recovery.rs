//! Recovery after a server outage, with no traffic: a node with a campaign on one backend handle
//! and a cluster-wide limit on another (a route's semaphore), both reported by one `Health`. The
//! server is frozen (etcd, Consul: `kill -STOP` of the server process the test started;
//! PostgreSQL: a proxy in front of the test's own database holds every byte, since the
//! machine's server is shared) long enough for the node to go unready, with one request sent to
//! the limit's handle during the outage (as a request to a route would: a slot of the limit, or a
//! sequencer check), then healed. With nothing sent
//! by anyone after that, readiness must come back within one TTL plus the probe's pause (and a
//! margin for a loaded machine), a leader must run again, and nothing may panic.
//!
//! Before the backends probed an unreachable server, the limit's handle, which had nothing more
//! to send, stayed unreachable for good, and `/readyz` with it (etcd: still 503 75 s after the
//! server came back).
//!
//! Each test prints `RESULT recovery_<backend> outage_s=… reelected=… leader_back_ms=…
//! ready_back_ms=…`, counted from the heal (`reelected`: the term was lost to the outage). CI freezes for 4 s (the leases, 10 s TTL, survive it);
//! `LEASE_RECOVERY_OUTAGE_SECS=20` gives the figures of a 20 s outage (the leases self-fence and
//! the leader is elected anew):
//!
//! ```sh
//! LEASE_RECOVERY_OUTAGE_SECS=20 cargo test -p lease-tests --all-features --test recovery -- --nocapture
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use http::{Request, StatusCode};
use lease_consul::Consul;
use lease_core::leader::{Campaign, CampaignHandle, LeaderEvent};
use lease_core::{Backend, CancellationToken, LeaseSpec, Wait};
use lease_etcd::Etcd;
use lease_postgres::Postgres;
use lease_tests::postgres::{TestDb, server_addr, through};
use lease_tests::proxy::Proxy;
use lease_tests::workers::signal;
use lease_tests::{init_tracing, within};
use lease_tower::health::{Health, HealthService};
use tokio::time::Instant;
use tower::ServiceExt;

const TTL: Duration = Duration::from_secs(10);
const NOT_READY_AFTER: Duration = Duration::from_secs(1);
/// The most a campaign pauses between attempts.
const MAX_BACKOFF: Duration = Duration::from_millis(500);
/// The probe's longest pause (lease-http's `PROBE_EVERY`), and a margin for a machine that
/// compiles and runs other tests meanwhile.
const PROBE_PAUSE: Duration = Duration::from_secs(1);
const MARGIN: Duration = Duration::from_secs(5);
const T: Duration = Duration::from_secs(60);

/// How long the server is frozen: 4 s, or `LEASE_RECOVERY_OUTAGE_SECS`.
fn outage() -> Duration {
    let secs = std::env::var("LEASE_RECOVERY_OUTAGE_SECS")
        .ok()
        .map(|s| {
            s.parse::<u64>()
                .unwrap_or_else(|_| panic!("LEASE_RECOVERY_OUTAGE_SECS={s:?}: whole seconds"))
        })
        .unwrap_or(4);
    Duration::from_secs(secs)
}

/// Counts panics anywhere in this process (a holder task's too, which no test would see).
static PANICS: AtomicUsize = AtomicUsize::new(0);

fn count_panics() {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS.fetch_add(1, Ordering::SeqCst);
            default(info);
        }));
    });
}

async fn readiness(service: &HealthService) -> (StatusCode, String) {
    let response = service
        .clone()
        .oneshot(Request::new(()))
        .await
        .unwrap_or_else(|never| match never {});
    (response.status(), response.into_body())
}

/// The node of the test: a campaign on `leader` (run until `shutdown`), and one `Health` over
/// `leader` and `limits`.
struct Node {
    handle: CampaignHandle,
    readiness: HealthService,
    shutdown: CancellationToken,
    running: tokio::task::JoinHandle<Result<lease_core::leader::CampaignEnd, lease_core::Error>>,
}

impl Node {
    async fn start(name: &str, leader: Arc<dyn Backend>, limits: Arc<dyn Backend>) -> Node {
        let campaign = Campaign::try_new(
            leader.clone(),
            LeaseSpec::leader(format!("recovery/{name}/leader"))
                .ttl(TTL)
                .lock_delay(Duration::ZERO),
        )
        .unwrap()
        .backoff(Duration::from_millis(100), MAX_BACKOFF);
        let handle = campaign.handle();
        let readiness = Health::new(leader)
            .backend("limits", limits)
            .campaign(handle.clone())
            .not_ready_after(NOT_READY_AFTER)
            .readiness();
        let mut events = handle.events();
        let shutdown = CancellationToken::new();
        let running = tokio::spawn(campaign.hold_until(shutdown.clone()));
        within(T, "the election", async {
            while !matches!(events.recv().await, Ok(LeaderEvent::Elected { .. })) {}
        })
        .await;
        Node {
            handle,
            readiness,
            shutdown,
            running,
        }
    }

    fn leads(&self) -> bool {
        self.handle.term().is_some_and(|term| term.is_held())
    }
}

/// The request a route sends to the `limits` handle during the outage.
#[derive(Clone, Copy, Debug)]
enum Route {
    /// A slot of the cluster-wide limit (`SemaphoreLayer`).
    Limit,
    /// A check of a sequencer (`SequencerCheckLayer`). PostgreSQL's acquisition, given up on,
    /// is finished and given back in the background, which would send requests after the heal
    /// by itself; a check leaves nothing behind.
    Check,
}

/// The test: `freeze` the server, send one request through `route`, wait until the node is
/// unready, keep it frozen for the outage, `heal` it, and time the recovery with no traffic.
async fn recovers_without_traffic(
    name: &str,
    leader: Arc<dyn Backend>,
    limits: Arc<dyn Backend>,
    route: Route,
    freeze: impl FnOnce(),
    heal: impl FnOnce(),
) {
    count_panics();
    let outage = outage();
    let limit = LeaseSpec::semaphore(format!("recovery/{name}/limit"), 2)
        .ttl(TTL)
        .wait(Wait::Never);
    let node = Node::start(name, leader, limits.clone()).await;
    // The route works: its handle has answered.
    let slot = limits.acquire(&limit).await.expect("a slot of the limit");
    let sequencer = slot.sequencer().clone();
    slot.release().await.expect("the slot given back");
    let (status, body) = readiness(&node.readiness).await;
    assert_eq!(status, StatusCode::OK, "{body}");

    let mut events = node.handle.events();
    freeze();
    let frozen = Instant::now();
    // A request to the route during the outage: it hangs, and is given up on.
    let given_up = 2 * NOT_READY_AFTER;
    match route {
        Route::Limit => drop(tokio::time::timeout(given_up, limits.acquire(&limit)).await),
        Route::Check => {
            drop(tokio::time::timeout(given_up, limits.check_sequencer(&sequencer)).await)
        }
    }
    let body = within(
        outage,
        "the node to turn unready during the outage",
        async {
            loop {
                let (status, body) = readiness(&node.readiness).await;
                if status == StatusCode::SERVICE_UNAVAILABLE {
                    return body;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        },
    )
    .await;
    assert!(body.contains(r#""limits":{"reachable":false"#), "{body}");
    // The outage lasts as long as it was asked to.
    tokio::time::sleep_until(frozen + outage).await;
    let (status, body) = readiness(&node.readiness).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    heal();
    let healed = Instant::now();

    // Nothing is sent to the limit from now on: only the health check looks.
    let bound = TTL + PROBE_PAUSE + MARGIN;
    let (mut leader_back, mut ready_back) = (None, None);
    let mut last = String::new();
    while leader_back.is_none() || ready_back.is_none() {
        if leader_back.is_none() && node.leads() {
            leader_back = Some(healed.elapsed());
        }
        if ready_back.is_none() {
            let (status, body) = readiness(&node.readiness).await;
            if status == StatusCode::OK {
                ready_back = Some(healed.elapsed());
            }
            last = body;
        }
        assert!(
            healed.elapsed() < bound,
            "{name}: {bound:?} after the heal, leader back after {leader_back:?}, ready after \
             {ready_back:?}; /readyz: {last}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (leader_back, ready_back) = (leader_back.unwrap(), ready_back.unwrap());
    // Whether the leader lost its term to the outage (it self-fences once it has gone a TTL
    // without confirming it), and was elected anew.
    let mut reelected = false;
    while let Ok(event) = events.try_recv() {
        reelected |= matches!(event, LeaderEvent::Lost { .. });
    }
    println!(
        "RESULT recovery_{name} outage_s={} reelected={reelected} leader_back_ms={} \
         ready_back_ms={}",
        outage.as_secs(),
        leader_back.as_millis(),
        ready_back.as_millis()
    );
    let (status, body) = readiness(&node.readiness).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body.contains(r#""role":"leader""#), "{body}");

    node.shutdown.cancel();
    within(T, "the campaign to end", node.running)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        PANICS.load(Ordering::SeqCst),
        0,
        "a panic in this process (this test's, or another one's of this binary: see above)"
    );
}

#[tokio::test]
async fn etcd_frozen_then_resumed_recovers_readiness_and_leader_without_traffic() {
    init_tracing();
    let server = lease_tests::etcd::Server::start().await;
    let backend = || -> Arc<dyn Backend> {
        Arc::new(Etcd::builder().endpoints([server.url()]).build().unwrap())
    };
    let pid = server.pid();
    recovers_without_traffic(
        "etcd",
        backend(),
        backend(),
        Route::Limit,
        || signal("STOP", &[pid]),
        || signal("CONT", &[pid]),
    )
    .await;
}

#[tokio::test]
async fn consul_frozen_then_resumed_recovers_readiness_and_leader_without_traffic() {
    init_tracing();
    let agent = lease_tests::consul::Agent::start().await;
    let backend = || -> Arc<dyn Backend> {
        Arc::new(Consul::builder().address(agent.url()).build().unwrap())
    };
    let pid = agent.pid();
    recovers_without_traffic(
        "consul",
        backend(),
        backend(),
        Route::Limit,
        || signal("STOP", &[pid]),
        || signal("CONT", &[pid]),
    )
    .await;
}

/// PostgreSQL: the machine's server is shared, so the outage is a proxy in front of the test's
/// own database that holds every byte (a frozen server, as the node sees it).
#[tokio::test]
async fn postgres_cut_off_then_back_recovers_readiness_and_leader_without_traffic() {
    init_tracing();
    let db = TestDb::create("recovery").await;
    let proxy = Proxy::start(server_addr(db.url())).await.unwrap();
    let backend = |app: &str| -> Arc<dyn Backend> {
        Arc::new(Postgres::new(&through(db.url(), proxy.addr(), app)).unwrap())
    };
    recovers_without_traffic(
        "postgres",
        backend("lease-recovery-leader"),
        backend("lease-recovery-limits"),
        Route::Check,
        || proxy.set_blackhole(true),
        || proxy.set_blackhole(false),
    )
    .await;
}
