//! Redis behind Sentinel: a master, one replica and one sentinel (Debian's redis-server in its
//! three modes), the backend finding the master through `redis+sentinel://`, an acquisition that
//! returns only once the replica has it (`WAIT`), and a failover (`kill -9` of the master) that
//! the lease rides through: the replica promoted has the lease, the holder finds the new master
//! through the sentinel, and its token still rises for the next acquisition.
//!
//! Run: `cargo test -p lease-tests --test redis_sentinel` (about 15 s; in the second lane of
//! scripts/test.sh).

use std::time::Duration;

use lease_core::{Backend, LeaseSpec};
use lease_redis::Redis;
use lease_tests::redis::{Sentinel, Server};
use lease_tests::{init_tracing, within};
use tokio::time::Instant;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_rides_through_a_sentinel_failover() {
    init_tracing();
    let mut master = Server::start().await;
    let replica = Server::replica_of(&master).await;
    within(Duration::from_secs(20), "the replica in sync", async {
        loop {
            let info: String = replica.cmd(redis::cmd("INFO").arg("replication")).await;
            if info.contains("master_link_status:up") {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    let sentinel = Sentinel::watching(&master, Duration::from_millis(1000)).await;
    let redis = Redis::new(&sentinel.url()).unwrap();
    let spec = LeaseSpec::leader("jobs/failover").ttl(Duration::from_secs(15));
    let lease = redis.acquire(&spec).await.unwrap();
    // Returned after WAIT: the replica has the holder key already.
    let on_replica: Option<String> = replica
        .cmd(
            redis::cmd("HGET")
                .arg("lease:{jobs/failover}")
                .arg("holder"),
        )
        .await;
    assert_eq!(on_replica.as_deref(), Some(lease.sequencer().holder()));

    master.kill().await;
    let killed = Instant::now();
    within(
        Duration::from_secs(30),
        "the sentinel to promote the replica",
        async {
            while sentinel.master_port().await != replica.port() {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        },
    )
    .await;
    eprintln!("failover after {:?}", killed.elapsed());
    // The holder finds the new master and its lease there; it is not lost.
    within(
        Duration::from_secs(10),
        "a check on the new master",
        async {
            while lease.check().await.is_err() {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        },
    )
    .await;
    assert!(lease.is_held(), "{:?}", lease.lost_reason());
    let token = lease.sequencer().index();
    lease.release().await.unwrap();
    let next = redis.acquire(&spec).await.unwrap();
    assert!(next.sequencer().index() > token);
    next.release().await.unwrap();
}
