//! Benchmark of the AMQP persistent semaphore against the real RabbitMQ.
//!
//! Measures acquire latency on a free 4-slot semaphore, and loss-detection latency when (a) the
//! broker closes the holder's connection (`rabbitmqctl close_connection`) and (b) an
//! administrator deletes the held slot queue A[L], with consumer-cancel notification (the default)
//! and, for comparison, a 50 ms verify loop. Needs RabbitMQ at `AMQP_URL` (default
//! amqp://guest:guest@127.0.0.1:5672/%2f) and `rabbitmqctl` (as root); ends with a `RESULT` line.
//!
//! ```text
//! cargo bench -p lease-core --bench amqp_semaphore --features amqp
//! ```
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
use lease_core::amqp::{Amqp, DEFAULT_AMQP_URL, LossDetection};
use lease_core::{Backend, LeaseSpec, LostReason, Wait};
use lease_tests::stats::percentile;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const ACQUIRES: usize = 200;
const CONN_SAMPLES: usize = 20;
const SLOT_SAMPLES: usize = 50;
const VERIFY_SAMPLES: usize = 20;
const LOSS_TIMEOUT: Duration = Duration::from_secs(10);

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
    let mut samples = Vec::with_capacity(ACQUIRES);
    for _ in 0..ACQUIRES {
        let start = Instant::now();
        let lease = client.acquire(&spec).await.unwrap();
        samples.push(start.elapsed());
        lease.release().await.unwrap();
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
    for _ in 0..CONN_SAMPLES {
        let name = unique("conn");
        let conn_name = unique("holder");
        let holder = Amqp::builder(format!("amqp://{userinfo}{}/%2f", relay.addr))
            .connection_name(&conn_name)
            .build()
            .unwrap();
        let lease = holder.acquire(&LeaseSpec::leader(&name)).await.unwrap();
        let lost = lease.lost();
        let detected = tokio::spawn(async move {
            let reason = lost.await;
            (reason, Instant::now())
        });
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
        let (reason, at) = tokio::time::timeout(LOSS_TIMEOUT, detected)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(reason, LostReason::ConnectionClosed);
        let close_frame = relay.last_from_broker.lock().unwrap().unwrap();
        // The close frame is the last thing the broker sent before the loss was reported.
        samples.push(at.saturating_duration_since(close_frame));
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
    for _ in 0..n {
        admin.admin().create(&name, 1).await.unwrap();
        let lease = holder.acquire(&LeaseSpec::leader(&name)).await.unwrap();
        let lost = lease.lost();
        let detected = tokio::spawn(async move {
            let reason = lost.await;
            (reason, Instant::now())
        });
        let start = Instant::now();
        channel
            .queue_delete(slot_queue.as_str().into(), QueueDeleteOptions::default())
            .await
            .unwrap();
        let (reason, at) = tokio::time::timeout(LOSS_TIMEOUT, detected)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(reason, LostReason::SlotRemoved);
        samples.push(at.saturating_duration_since(start));
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
    let slot_p99 = bench_slot_removed(&admin, LossDetection::ConsumerCancel, SLOT_SAMPLES).await;
    let verify = LossDetection::Verify {
        period: Duration::from_millis(50),
    };
    let _ = bench_slot_removed(&admin, verify, VERIFY_SAMPLES).await;
    println!("total run time {:.1} s", started.elapsed().as_secs_f64());
    println!(
        "RESULT amqp_acquire_p50_ms={acquire_p50:.2} amqp_loss_conn_p99_ms={conn_p99:.2} \
         amqp_loss_slot_removed_p99_ms={slot_p99:.2}"
    );
}
