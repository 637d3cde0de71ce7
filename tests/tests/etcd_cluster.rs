//! A 3-member etcd cluster loses its raft leader (`kill -9`): holders keep their leases. Brief
//! trouble is not loss (a lease is lost only when the server says so, or by its own fence): a
//! keep-alive or a watch that fails during the election is retried on another member, well
//! within the self-fence.
//!
//! Run: `cargo test -p lease-tests --all-features --test etcd_cluster` (about 15 s: the holders
//! are watched for a whole TTL after the election, so keep-alives had to pass through the new
//! raft leader).

use std::time::Duration;

use lease_core::{Backend, LeaseSpec};
use lease_etcd::Etcd;
use lease_tests::etcd::{Cluster, READY_WITHIN};
use lease_tests::within;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holders_keep_their_leases_when_the_raft_leader_is_killed() {
    lease_tests::init_tracing();
    let mut cluster = Cluster::start().await;
    let etcd = Etcd::builder()
        .endpoints(cluster.endpoints().split(','))
        .build()
        .unwrap();
    let ttl = Duration::from_secs(10);
    let leader = etcd
        .acquire(&LeaseSpec::leader("cluster/leader").ttl(ttl))
        .await
        .unwrap();
    let slot = etcd
        .acquire(&LeaseSpec::semaphore("cluster/semaphore", 2).ttl(ttl))
        .await
        .unwrap();

    let old = within(READY_WITHIN, "a raft leader", async {
        loop {
            if let Some(i) = cluster.leader().await {
                return i;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    cluster.kill9(old).await;
    let new = within(READY_WITHIN, "a new raft leader", async {
        loop {
            match cluster.leader().await {
                Some(i) if i != old => return i,
                _ => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    })
    .await;
    eprintln!(
        "raft leader m{old} killed; m{new} elected; logs {:?}",
        cluster.logs()
    );

    // A whole TTL after the election: every keep-alive in it went through the new leader.
    let (lost_leader, lost_slot) = (leader.lost(), slot.lost());
    let loss = tokio::time::timeout(ttl + Duration::from_secs(1), async {
        tokio::select! {
            reason = lost_leader => ("leader", reason),
            reason = lost_slot => ("semaphore", reason),
        }
    })
    .await;
    assert!(
        loss.is_err(),
        "a holder lost its lease to the raft election: {loss:?}"
    );
    assert!(leader.is_held() && slot.is_held());
    leader.check().await.unwrap();
    slot.check().await.unwrap();

    cluster.restart(old);
    leader.release().await.unwrap();
    slot.release().await.unwrap();
    let api = lease_tests::etcd::Api::new(
        cluster
            .url(new)
            .trim_start_matches("http://")
            .parse()
            .unwrap(),
        None,
    );
    assert!(api.leases().await.is_empty(), "a lease was left behind");
}
