//! Benchmark of the AMQP persistent semaphore against the real RabbitMQ.
//!
//! Measures acquire latency on a free 4-slot semaphore, and loss-detection latency when (a) the
//! broker closes the holder's connection (`rabbitmqctl close_connection`) and (b) an
//! administrator deletes the held slot queue A[L], with consumer-cancel notification (the default)
//! and, for comparison, a 50 ms verify loop. Needs RabbitMQ at `AMQP_URL` (default
//! amqp://guest:guest@127.0.0.1:5672/%2f) and `rabbitmqctl` (as root); ends with a `RESULT` line.
//!
//! ```text
//! cargo bench -p lease-amqp --bench amqp_semaphore
//! ```
//!
//! The quick mode CI runs (20 acquires, 3 connection closes, 5 and 3 slot deletes; a few seconds):
//!
//! ```text
//! LEASE_BENCH_QUICK=1 cargo test -p lease-amqp --bench amqp_semaphore
//! ```
//!
//! In every mode the run fails if a lease is lost while it is held (before the broker or the
//! administrator takes it away), if a loss is not noticed, noticed late (past [`fence`]: the
//! lease's fence interval, [`LeaseSpec::fence_after`], or the AMQP holder's own self-fence at
//! three quarters of a heartbeat, whichever is shorter), or reported with the wrong reason.
//!
//! Timing (a): `rabbitmqctl` itself takes ~0.5 s to start, so the holder connects through a relay
//! in this program that timestamps every chunk the broker sends; the latency is from the close
//! frame reaching the client's socket to `lost()` completing. Timing (b): from sending the
//! `queue.delete` to `lost()` completing, so it includes the broker's work.
#![allow(clippy::unwrap_used, clippy::missing_panics_doc)]

use std::net::SocketAddr;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lapin::options::QueueDeleteOptions;
use lapin::{Connection, ConnectionProperties};
use lease_amqp::{Amqp, DEFAULT_AMQP_URL, DEFAULT_HEARTBEAT, LossDetection};
use lease_core::{Backend, LeaseSpec, LostReason, Wait};
use lease_tests::stats::{percentile, scaled};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const ACQUIRES: usize = 200;
const CONN_SAMPLES: usize = 20;
const SLOT_SAMPLES: usize = 50;
const VERIFY_SAMPLES: usize = 20;
const LOSS_TIMEOUT: Duration = Duration::from_secs(10);

/// How late a loss may be noticed: the lease's fence interval, or the AMQP holder's own
/// self-fence (three quarters of the heartbeat, which these clients leave at its default) if that
/// is shorter. Past it, the broker could have handed the slot to someone else while the holder
/// still ran.
fn fence(spec: &LeaseSpec) -> Duration {
    spec.fence_after().min(DEFAULT_HEARTBEAT * 3 / 4)
}

/// Waits for `detected` (the lease's `lost()`, stamped), failing the run if the loss is not
/// noticed at all (within [`LOSS_TIMEOUT`]) or with another reason than `expected`.
async fn noticed(
    what: &str,
    detected: tokio::task::JoinHandle<(LostReason, Instant)>,
    expected: &LostReason,
) -> Instant {
    let (reason, at) = tokio::time::timeout(LOSS_TIMEOUT, detected)
        .await
        .unwrap_or_else(|_| panic!("{what}: the loss was not noticed within {LOSS_TIMEOUT:?}"))
        .unwrap();
    assert_eq!(&reason, expected, "{what}: lost for another reason");
    at
}

/// Fails the run if a loss was noticed `after` the event, past the lease's `fence`.
fn assert_within_fence(what: &str, after: Duration, fence: Duration) {
    assert!(
        after < fence,
        "{what}: the loss was noticed {after:?} after it happened, past the fence interval \
         {fence:?}"
    );
}

fn url() -> String {
    std::env::var("AMQP_URL").unwrap_or_else(|_| DEFAULT_AMQP_URL.to_owned())
}

fn unique(what: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!("bench/{what}/{}-{nanos}", std::process::id())
}

fn report(what: &str, samples: &mut [Duration]) -> (f64, f64) {
    let ms: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
    let (p50, p99) = (percentile(&ms, 50.0), percentile(&ms, 99.0));
    let max = percentile(&ms, 100.0);
    println!(
        "{what}: n={} p50={p50:.2} ms p99={p99:.2} ms max={max:.2} ms",
        samples.len()
    );
    (p50, p99)
}

fn rabbitmqctl(args: &[&str]) -> String {
    let out = Command::new("rabbitmqctl")
        .args(args)
        .output()
        .expect("rabbitmqctl runs (install RabbitMQ's CLI, run as root)");
    assert!(
        out.status.success(),
        "rabbitmqctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A TCP relay to the broker that remembers when the broker last sent the client anything.
struct Relay {
    addr: SocketAddr,
    last_from_broker: Arc<Mutex<Option<Instant>>>,
}

impl Relay {
    async fn start(upstream: SocketAddr) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let last_from_broker = Arc::new(Mutex::new(None));
        let last = Arc::clone(&last_from_broker);
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(broker) = TcpStream::connect(upstream).await else {
                    continue;
                };
                let last = Arc::clone(&last);
                tokio::spawn(async move {
                    let (mut client_rx, mut client_tx) = client.into_split();
                    let (mut broker_rx, mut broker_tx) = broker.into_split();
                    let up = tokio::spawn(async move {
                        let _ = tokio::io::copy(&mut client_rx, &mut broker_tx).await;
                    });
                    let mut buf = vec![0u8; 16 * 1024];
                    loop {
                        match broker_rx.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => {
                                *last.lock().unwrap() = Some(Instant::now());
                                if client_tx.write_all(&buf[..n]).await.is_err() {
                                    break;
                                }
                            }
                        }
                    }
                    up.abort();
                });
            }
        });
        Relay {
            addr,
            last_from_broker,
        }
    }
}

fn broker_addr() -> SocketAddr {
    let url = url();
    let rest = url.split_once("://").map_or(url.as_str(), |(_, r)| r);
    let authority = rest.split('/').next().unwrap_or(rest);
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    std::net::ToSocketAddrs::to_socket_addrs(host_port)
        .unwrap()
        .next()
        .unwrap()
}

async fn bench_acquire(admin: &Amqp) -> f64 {
    let name = unique("acquire");
    admin.admin().create(&name, 4).await.unwrap();
    let client = Amqp::new(url()).unwrap();
    let spec = LeaseSpec::semaphore(&name, 4).wait(Wait::Never);
    // Warm-up: connect once, outside the measurement.
    client
        .acquire(&spec)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let acquires = scaled(ACQUIRES, 20);
    let mut samples = Vec::with_capacity(acquires);
    for _ in 0..acquires {
        let start = Instant::now();
        let lease = client.acquire(&spec).await.unwrap();
        samples.push(start.elapsed());
        // Lost while held (the release reports a loss): a failure.
        lease
            .release()
            .await
            .unwrap_or_else(|error| panic!("acquire: release: {error}"));
    }
    admin.admin().destroy(&name).await.unwrap();
    report(
        "acquire (free 4-slot semaphore, warm connection)",
        &mut samples,
    )
    .0
}

async fn bench_connection_closed(admin: &Amqp) -> f64 {
    let relay = Relay::start(broker_addr()).await;
    let userinfo = url()
        .split_once("://")
        .and_then(|(_, r)| r.split_once('@'))
        .map(|(u, _)| format!("{u}@"))
        .unwrap_or_default();
    let mut samples = Vec::new();
    for _ in 0..scaled(CONN_SAMPLES, 3) {
        let name = unique("conn");
        let conn_name = unique("holder");
        let holder = Amqp::builder(format!("amqp://{userinfo}{}/%2f", relay.addr))
            .connection_name(&conn_name)
            .build()
            .unwrap();
        let spec = LeaseSpec::leader(&name);
        let lease = holder.acquire(&spec).await.unwrap();
        let lost = lease.lost();
        let detected = tokio::spawn(async move {
            let reason = lost.await;
            (reason, Instant::now())
        });
        // Held until the broker closes the connection.
        assert!(
            lease.is_held(),
            "connection closed: lease lost while held: {:?}",
            lease.lost_reason()
        );
        let needle = format!("{{\"connection_name\",\"{conn_name}\"}}");
        let pid = tokio::task::spawn_blocking(move || {
            let listing = rabbitmqctl(&["-q", "list_connections", "pid", "client_properties"]);
            let line = listing
                .lines()
                .find(|l| l.contains(&needle))
                .unwrap()
                .to_owned();
            let pid = line.split('\t').next().unwrap().to_owned();
            rabbitmqctl(&["close_connection", &pid, "benchmark"]);
        });
        pid.await.unwrap();
        let what = "connection closed";
        let at = noticed(what, detected, &LostReason::ConnectionClosed).await;
        let close_frame = relay.last_from_broker.lock().unwrap().unwrap();
        // The close frame is the last thing the broker sent before the loss was reported.
        let after = at.saturating_duration_since(close_frame);
        assert_within_fence(what, after, fence(&spec));
        samples.push(after);
        drop(lease);
        admin.admin().destroy(&name).await.unwrap();
    }
    report("loss (a): connection closed by the broker", &mut samples).1
}

async fn bench_slot_removed(admin: &Amqp, detection: LossDetection, n: usize) -> f64 {
    let name = unique("slot");
    let holder = Amqp::builder(url())
        .loss_detection(detection)
        .build()
        .unwrap();
    let raw = Connection::connect(&url(), ConnectionProperties::default())
        .await
        .unwrap();
    let channel = raw.create_channel().await.unwrap();
    let slot_queue = format!("{name}-1-A");
    let mut samples = Vec::with_capacity(n);
    let spec = LeaseSpec::leader(&name);
    for _ in 0..n {
        admin.admin().create(&name, 1).await.unwrap();
        let lease = holder.acquire(&spec).await.unwrap();
        let lost = lease.lost();
        let detected = tokio::spawn(async move {
            let reason = lost.await;
            (reason, Instant::now())
        });
        // Held until the administrator deletes its slot queue.
        assert!(
            lease.is_held(),
            "slot removed: lease lost while held: {:?}",
            lease.lost_reason()
        );
        let start = Instant::now();
        channel
            .queue_delete(slot_queue.as_str().into(), QueueDeleteOptions::default())
            .await
            .unwrap();
        let what = "slot removed";
        let at = noticed(what, detected, &LostReason::SlotRemoved).await;
        let after = at.saturating_duration_since(start);
        assert_within_fence(what, after, fence(&spec));
        samples.push(after);
        // A lease lost before its release reports the loss.
        assert!(matches!(
            lease.release().await,
            Err(lease_core::Error::Lost(LostReason::SlotRemoved))
        ));
    }
    admin.admin().destroy(&name).await.unwrap();
    let label = match detection {
        LossDetection::ConsumerCancel => {
            "loss (b): slot removed, consumer-cancel notification".to_owned()
        }
        other => format!("loss (b): slot removed, {other:?}"),
    };
    report(&label, &mut samples).1
}

#[tokio::main]
async fn main() {
    let admin = Amqp::new(url()).unwrap();
    if let Err(error) = admin.admin().slots("bench/reachability").await {
        eprintln!("cannot use RabbitMQ: {error}");
        std::process::exit(1);
    }
    let started = Instant::now();
    let acquire_p50 = bench_acquire(&admin).await;
    let conn_p99 = bench_connection_closed(&admin).await;
    let slot_p99 = bench_slot_removed(
        &admin,
        LossDetection::ConsumerCancel,
        scaled(SLOT_SAMPLES, 5),
    )
    .await;
    let verify = LossDetection::Verify {
        period: Duration::from_millis(50),
    };
    let _ = bench_slot_removed(&admin, verify, scaled(VERIFY_SAMPLES, 3)).await;
    println!("total run time {:.1} s", started.elapsed().as_secs_f64());
    println!(
        "RESULT amqp_acquire_p50_ms={acquire_p50:.2} amqp_loss_conn_p99_ms={conn_p99:.2} \
         amqp_loss_slot_removed_p99_ms={slot_p99:.2}"
    );
}
