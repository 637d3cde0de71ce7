//! The 3-server cluster of `lease_tests::cluster`: it starts, its raft leader can be killed with
//! `kill -9`, another server takes over, and the killed one rejoins as itself.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use lease_tests::cluster::{Cluster, READY_WITHIN};

#[tokio::test]
async fn the_raft_leader_is_killed_and_another_takes_over_then_it_rejoins() {
    let mut cluster = Cluster::start(3).await;
    let leader = cluster.leader().await.expect("a leader once started");
    let t0 = tokio::time::Instant::now();
    cluster.kill9(leader).await;
    let next = cluster
        .await_leader(Some(leader), READY_WITHIN)
        .await
        .expect("a new leader");
    let election = t0.elapsed();
    assert_ne!(next, leader);
    println!("election after kill -9 of server {leader}: {election:?}; new leader {next}");
    let rejoin = cluster.restart(leader).await.unwrap();
    println!("server {leader} rejoined in {rejoin:?}");
    assert!(election < Duration::from_secs(30), "{election:?}");
    // The operator API answers through the client agent.
    assert!(cluster.sessions().await.is_empty());
}
