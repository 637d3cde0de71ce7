//! The real lease-etcd client against the etcd model, served on a real 127.0.0.1 port: a leader
//! acquired, observed, checked and released; a hand-over to a waiter; the losses when the
//! operator deletes the key or revokes the lease; a semaphore of 2 with 3 contenders; a holder's
//! watch that resumes after its stream broke, and a restart that keeps the holder's lease.
//! Real time (the client's sockets are real): every wait is bounded by [`EVENT`].
//!
//! Run: `cargo test -p lease-sim --test etcd_model`.

use std::time::Duration;

use lease_core::{Backend, Error, LeaseSpec, LostReason, Wait};
use lease_etcd::Etcd;
use lease_sim::etcd::{Config, Model};
use lease_tests::{assert_refined, within};
use tokio::net::TcpListener;

/// A bound on every wait for an event.
const EVENT: Duration = Duration::from_secs(10);

/// The model, served on a free port: every connection it accepts, until the test ends.
async fn serve(model: &Model) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("a free port");
    let url = format!("http://{}", listener.local_addr().expect("its address"));
    let model = model.clone();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            let model = model.clone();
            tokio::spawn(async move {
                let _ = socket.set_nodelay(true);
                let _ = model.serve_connection(socket).await;
            });
        }
    });
    url
}

fn client(url: &str) -> Etcd {
    Etcd::builder()
        .endpoints([url])
        .build()
        .expect("a valid configuration")
}

async fn model_and_url(seed: u64) -> (Model, String) {
    lease_tests::init_tracing();
    let model = Model::new(Config::new(seed));
    let url = serve(&model).await;
    (model, url)
}

fn leader(key: &str) -> LeaseSpec {
    LeaseSpec::leader(key).ttl(Duration::from_secs(10))
}

/// The etcd lease a holder string names (`<lease hex>` or `<lease hex>_<n>`).
fn lease_of(holder: &str) -> i64 {
    let hex = holder.split('_').next().unwrap_or_default();
    i64::from_str_radix(hex, 16).expect("a lease ID in hex")
}

/// Waits until the model has no lease and no key left.
async fn nothing_left(model: &Model) {
    within(EVENT, "every lease and key to be gone", async {
        while !(model.leases().is_empty() && model.keys().is_empty()) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

#[tokio::test]
async fn a_leader_is_acquired_observed_checked_and_released() {
    let (model, url) = model_and_url(1).await;
    let etcd = client(&url);
    let lease = etcd.acquire(&leader("svc/leader")).await.unwrap();
    let sequencer = lease.sequencer().clone();
    let holder = sequencer.holder().to_owned();
    let keys = model.keys();
    assert_eq!(keys.len(), 1);
    assert_eq!(keys[0].key, format!("svc/leader/{holder}"));
    assert_eq!(keys[0].lease, lease_of(&holder));
    assert_eq!(
        u64::try_from(keys[0].create_revision).unwrap(),
        sequencer.index()
    );
    assert_eq!(model.leases().len(), 1);
    etcd.check_sequencer(&sequencer).await.unwrap();
    let observer = etcd.observe_leader("svc/leader").await.unwrap();
    let current = observer.leader().expect("a leader");
    assert_eq!(current.sequencer, sequencer);
    // The holder cannot be had twice, by itself or anyone.
    let other = client(&url);
    let busy = other.acquire(&leader("svc/leader").wait(Wait::Never)).await;
    assert!(busy.unwrap_err().is_busy());
    lease.release().await.unwrap();
    nothing_left(&model).await;
    assert!(matches!(
        etcd.check_sequencer(&sequencer).await,
        Err(Error::Lost(_))
    ));
}

#[tokio::test]
async fn a_waiter_takes_over_when_the_holder_releases() {
    let (model, url) = model_and_url(2).await;
    let (first, second) = (client(&url), client(&url));
    let held = first.acquire(&leader("svc/handover")).await.unwrap();
    let waiter = tokio::spawn(async move {
        let lease = second.acquire(&leader("svc/handover")).await;
        (second, lease)
    });
    within(EVENT, "the waiter's key", async {
        while model.keys().len() < 2 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !waiter.is_finished(),
        "the waiter waits while the holder holds"
    );
    let before = held.sequencer().index();
    held.release().await.unwrap();
    let (second, taken) = within(EVENT, "the hand-over", waiter).await.unwrap();
    let taken = taken.unwrap();
    assert!(taken.sequencer().index() > before);
    second.check_sequencer(taken.sequencer()).await.unwrap();
    taken.release().await.unwrap();
    nothing_left(&model).await;
}

#[tokio::test]
async fn deleting_the_holders_key_loses_its_lease() {
    let (model, url) = model_and_url(3).await;
    let etcd = client(&url);
    let lease = etcd.acquire(&leader("svc/delete")).await.unwrap();
    let own = format!("svc/delete/{}", lease.sequencer().holder());
    assert_eq!(model.delete_key(&own), 1);
    let reason = within(EVENT, "loss after the key was deleted", lease.lost()).await;
    assert_eq!(reason, LostReason::KeyDeleted);
    // The clean-up after the loss revokes the etcd lease.
    nothing_left(&model).await;
    drop(lease);
}

#[tokio::test]
async fn revoking_the_holders_lease_loses_it() {
    let (model, url) = model_and_url(4).await;
    let etcd = client(&url);
    let lease = etcd.acquire(&leader("svc/revoke")).await.unwrap();
    let id = lease_of(lease.sequencer().holder());
    let work = async {
        tokio::join!(lease.run(std::future::pending::<()>()), async {
            model.revoke_lease(id)
        })
    };
    let (work, revoked) = within(EVENT, "work cancelled after the revoke", work).await;
    assert!(revoked);
    let reported = work.unwrap_err();
    assert_refined(&lease, &reported, LostReason::SessionInvalidated).await;
    nothing_left(&model).await;
}

#[tokio::test]
async fn a_semaphore_of_two_admits_two_of_three_contenders() {
    let (model, url) = model_and_url(5).await;
    let spec = LeaseSpec::semaphore("jobs/compact", 2).ttl(Duration::from_secs(10));
    let clients: Vec<Etcd> = (0..3).map(|_| client(&url)).collect();
    let a = clients[0].acquire(&spec).await.unwrap();
    let b = clients[1].acquire(&spec).await.unwrap();
    let third = tokio::spawn({
        let (etcd, spec) = (clients[2].clone(), spec.clone());
        async move { etcd.acquire(&spec).await }
    });
    within(EVENT, "the third contender's key", async {
        while model.keys().len() < 3 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!third.is_finished(), "two hold: the third waits");
    assert!(a.is_held() && b.is_held());
    b.release().await.unwrap();
    let c = within(EVENT, "the third admitted", third)
        .await
        .unwrap()
        .unwrap();
    assert!(a.is_held() && c.is_held());
    clients[0].check_sequencer(c.sequencer()).await.unwrap();
    a.release().await.unwrap();
    c.release().await.unwrap();
    nothing_left(&model).await;
}

#[tokio::test]
async fn a_holders_watch_resumes_after_its_stream_broke() {
    let (model, url) = model_and_url(6).await;
    let etcd = client(&url);
    let lease = etcd.acquire(&leader("svc/resume")).await.unwrap();
    let own = format!("svc/resume/{}", lease.sequencer().holder());
    within(EVENT, "the holder's watch", async {
        while model.watches() == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    model.break_streams();
    // The client opens its streams again and creates its watch again.
    within(EVENT, "the watch created again", async {
        loop {
            tokio::time::sleep(Duration::from_millis(20)).await;
            if model.watches() > 0 {
                return;
            }
        }
    })
    .await;
    assert!(lease.is_held(), "a broken stream is no loss");
    assert_eq!(model.delete_key(&own), 1);
    let reason = within(EVENT, "loss seen on the new stream", lease.lost()).await;
    assert_eq!(reason, LostReason::KeyDeleted);
    nothing_left(&model).await;
}

#[tokio::test]
async fn a_restart_keeps_the_holders_lease() {
    let (model, url) = model_and_url(7).await;
    let etcd = client(&url);
    let lease = etcd.acquire(&leader("svc/restart")).await.unwrap();
    let id = lease_of(lease.sequencer().holder());
    model.restart();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(lease.is_held(), "a restart is no loss");
    etcd.check_sequencer(lease.sequencer()).await.unwrap();
    within(EVENT, "the holder's watch created again", async {
        while model.watches() == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(model.revoke_lease(id));
    let reason = within(EVENT, "loss after the revoke", lease.lost()).await;
    assert_refined(&lease, &reason, LostReason::SessionInvalidated).await;
    nothing_left(&model).await;
}

#[tokio::test]
async fn with_authentication_an_expired_token_is_replaced_transparently() {
    lease_tests::init_tracing();
    let model = Model::new(Config::new(8).auth("root", "secret"));
    let url = serve(&model).await;
    let etcd = Etcd::builder()
        .endpoints([url.as_str()])
        .user("root", "secret")
        .build()
        .unwrap();
    let first = etcd.acquire(&leader("svc/auth/a")).await.unwrap();
    model.expire_tokens();
    // A call is refused its token once, authenticates again and is answered.
    etcd.check_sequencer(first.sequencer()).await.unwrap();
    // The watch stream's token is refused at the next watch's creation: the stream is opened
    // again with a new token, and every watch created again on it.
    let second = etcd.acquire(&leader("svc/auth/b")).await.unwrap();
    let own = format!("svc/auth/a/{}", first.sequencer().holder());
    assert_eq!(model.delete_key(&own), 1);
    let reason = within(EVENT, "the first holder's loss", first.lost()).await;
    assert_eq!(reason, LostReason::KeyDeleted);
    assert!(second.is_held());
    second.release().await.unwrap();
    let wrong = Etcd::builder()
        .endpoints([url.as_str()])
        .user("root", "wrong")
        .build()
        .unwrap();
    let refused = wrong.acquire(&leader("svc/auth/c")).await.unwrap_err();
    assert!(
        matches!(refused, Error::PermissionDenied { .. }),
        "{refused:?}"
    );
    nothing_left(&model).await;
}

/// An in-memory connection to the model, as the simulation's network hands the client one.
#[derive(Clone)]
struct InMemory(Model);

impl tower_service::Service<http::Uri> for InMemory {
    type Response = hyper_util::rt::TokioIo<tokio::io::DuplexStream>;
    type Error = std::io::Error;
    type Future = std::future::Ready<Result<Self::Response, std::io::Error>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), std::io::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: http::Uri) -> Self::Future {
        let (client, server) = tokio::io::duplex(1 << 16);
        let model = self.0.clone();
        tokio::spawn(async move {
            let _ = model.serve_connection(server).await;
        });
        std::future::ready(Ok(hyper_util::rt::TokioIo::new(client)))
    }
}

/// On the simulation's paused clock, over an in-memory connection: a keep-alive of a lease that
/// expired waits for the lessor's revocation, which lands `revoke_late` after the expiry, and then
/// answers TTL 0.
#[tokio::test(start_paused = true)]
async fn on_the_paused_clock_a_keep_alive_of_an_expired_lease_waits_for_its_revocation() {
    use lease_etcd::proto::{
        LeaseGrantRequest, LeaseGrantResponse, LeaseId, LeaseKeepAliveResponse, path,
    };
    use tokio::time::Instant;

    let late = Duration::from_millis(400);
    let model = Model::new(Config::new(11).revoke_late(late));
    let channel = tonic::transport::Endpoint::from_static("http://model.sim")
        .connect_with_connector(InMemory(model.clone()))
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let granted: LeaseGrantResponse = grpc
        .unary(
            tonic::Request::new(LeaseGrantRequest { ttl: 5 }),
            http::uri::PathAndQuery::from_static(path::LEASE_GRANT),
            tonic_prost::ProstCodec::<LeaseGrantRequest, LeaseGrantResponse>::default(),
        )
        .await
        .unwrap()
        .into_inner();
    let (keep_alive, outgoing) = tokio::sync::mpsc::unbounded_channel();
    grpc.ready().await.unwrap();
    let mut answers = grpc
        .streaming(
            tonic::Request::new(tokio_stream::wrappers::UnboundedReceiverStream::new(
                outgoing,
            )),
            http::uri::PathAndQuery::from_static(path::LEASE_KEEP_ALIVE),
            tonic_prost::ProstCodec::<LeaseId, LeaseKeepAliveResponse>::default(),
        )
        .await
        .unwrap()
        .into_inner();
    let id = granted.id;
    keep_alive.send(LeaseId { id }).unwrap();
    let kept = answers.message().await.unwrap().unwrap();
    let renewed = Instant::now();
    assert_eq!((kept.id, kept.ttl), (id, 5));
    tokio::time::sleep_until(renewed + Duration::from_millis(5_100)).await;
    assert_eq!(model.leases().len(), 1, "expired, not revoked yet");
    keep_alive.send(LeaseId { id }).unwrap();
    let gone = answers.message().await.unwrap().unwrap();
    assert_eq!((gone.id, gone.ttl), (id, 0));
    assert_eq!(Instant::now(), renewed + Duration::from_secs(5) + late);
    assert!(model.leases().is_empty());
}
