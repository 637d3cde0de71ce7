//! An axum service run as several instances against one Consul: a leader-only
//! `/admin/compact`, a `/report` limited to 2 concurrent requests across all instances, and a
//! downstream `/downstream/apply` that accepts work only from the current leader's sequencer,
//! and `/healthz` and `/readyz` reporting the election and the agent's reachability as JSON.
//!
//! Run two instances (with `consul agent -dev` running, or `CONSUL_HTTP_ADDR` set):
//!
//! ```sh
//! cargo run -p lease-axum-cluster -- 3001
//! cargo run -p lease-axum-cluster -- 3002
//! ```
//!
//! See the section "axum: leader-only routes and a cluster-wide limit" of the workspace's
//! ARCHITECTURE.md for what `curl` answers on each.
//!
//! One campaign per process serves the leader-only routes and runs a leader-only worker (a
//! heartbeat in the log); the fenced route follows the same key through the campaign's watch.
//! On SIGTERM or Ctrl-C the server drains and the campaign steps down: requests in flight finish (up to
//! 10 s), then the lease is released and the other instance leads at once.

use std::time::Duration;

use axum::Router;
use axum::routing::{get, post};
use lease_consul::Consul;
use lease_core::CancellationToken;
use lease_core::leader::{Campaign, LeaderEvent};
use lease_core::{BoxError, LeaseSpec, LeaseWatcher};
use lease_tower::extract::LeaseSequencer;
use lease_tower::fence::SequencerCheckLayer;
use lease_tower::health::Health;
use lease_tower::leader::LeaderOnlyLayer;
use lease_tower::semaphore::SemaphoreLayer;

const LEADER_KEY: &str = "service/axum-cluster/leader";

#[tokio::main]
async fn main() {
    if let Err(error) = run().await {
        eprintln!("axum_cluster: {error}");
        std::process::exit(1);
    }
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let port: u16 = match std::env::args().nth(1) {
        Some(port) => port
            .parse()
            .map_err(|_| format!("the port {port:?} is not a number; usage: axum_cluster PORT"))?,
        None => 3000,
    };
    let consul = Consul::builder()
        .address(std::env::var("CONSUL_HTTP_ADDR").unwrap_or_else(|_| "127.0.0.1:8500".into()))
        .semaphore_pool(Duration::from_secs(60))
        .build()?;
    // Every constructor below takes the backend as it is; a Consul clone shares its client.
    let backend = consul;
    let shutdown = CancellationToken::new();
    let me = format!("http://127.0.0.1:{port}");

    let campaign = Campaign::try_new(
        backend.clone(),
        LeaseSpec::leader(LEADER_KEY)
            .value(me.clone())
            .lock_delay(Duration::ZERO),
    )?
    .drain_timeout(Duration::from_secs(10))
    .on_event(|event| match event {
        LeaderEvent::Elected { sequencer } => println!("elected: {sequencer}"),
        LeaderEvent::Lost { reason, .. } => println!("lost the lead: {reason}"),
        LeaderEvent::Released { .. } => println!("stepped down; the lease is released"),
        _ => {}
    });
    let leader_only = LeaderOnlyLayer::new(campaign.handle());
    let fenced = match campaign.handle().leader_watch() {
        Some(watch) => SequencerCheckLayer::with_watch(watch.clone()),
        None => SequencerCheckLayer::new(backend.clone(), LEADER_KEY),
    };

    let admin = Router::new()
        .route(
            "/admin/compact",
            post(|LeaseSequencer(s): LeaseSequencer| async move {
                format!("compacted by the leader under {s}\n")
            }),
        )
        .route(
            "/admin/sequencer",
            get(|LeaseSequencer(s): LeaseSequencer| async move { format!("{s}\n") }),
        )
        .route_layer(leader_only);
    let report = Router::new()
        .route(
            "/report",
            get(|| async {
                // A slow report: at most two run at once across every instance.
                tokio::time::sleep(Duration::from_secs(3)).await;
                "report done\n"
            }),
        )
        .route_layer(
            SemaphoreLayer::new(
                backend.clone(),
                LeaseSpec::semaphore("service/axum-cluster/report", 2),
            )
            .max_wait(Duration::from_secs(1)),
        );
    let downstream =
        Router::new()
            .route(
                "/downstream/apply",
                post(|LeaseSequencer(s): LeaseSequencer| async move {
                    format!("applied work from {s}\n")
                }),
            )
            .route_layer(fenced);
    // Health checks: who leads and the Consul agent's reachability, as JSON; readiness turns
    // 503 once the agent has gone unanswered for 5 s, before the 10 s session TTL self-fences.
    let health = Health::new(backend.clone())
        .campaign(campaign.handle())
        .not_ready_after(Duration::from_secs(5));
    let probes = Router::new()
        .route_service("/healthz", health.liveness())
        .route_service("/readyz", health.readiness());
    let app = admin.merge(report).merge(downstream).merge(probes);

    // The one election of this process: the routes above and this worker share it.
    let campaign = tokio::spawn(campaign.run_until(shutdown.clone(), heartbeat));

    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    println!("listening on {me}");
    let stop = shutdown.clone();
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            // SIGTERM (systemd, Kubernetes, `docker stop`) or Ctrl-C.
            lease_core::shutdown_signal().await;
            // Steps down: new leader-only requests get 503, those in flight finish, then the
            // lease is released and the other instance takes over.
            stop.cancel();
        })
        .await?;
    // Wait for the release: exiting first would leave the lease to expire with its TTL.
    campaign.await??;
    Ok(())
}

/// The leader-only worker: runs while this instance leads, dropped the moment it does not.
async fn heartbeat(lease: LeaseWatcher) -> Result<(), BoxError> {
    let mut beat = tokio::time::interval(Duration::from_secs(5));
    loop {
        beat.tick().await;
        println!("leader heartbeat under {}", lease.sequencer());
    }
}
