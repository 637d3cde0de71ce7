//! The simulator's own promises: latency in order, held links, resets, lost answers, frozen and
//! killed processes, all on the paused clock, and the same seed giving the same run.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::task::LocalSet;
use tokio::time::Instant;

use lease_sim::net::{Net, NetConfig};
use lease_sim::rng::Rng;
use lease_sim::world::{self, Process};

/// Runs `f` in a fresh world: a paused runtime, a root set, a network seeded with `seed`.
fn simulate<F, Fut>(seed: u64, f: F) -> Fut::Output
where
    F: FnOnce(Net) -> Fut,
    Fut: std::future::Future,
{
    let runtime = world::runtime(seed).expect("runtime");
    let root = LocalSet::new();
    let net = Net::new(Rng::new(seed), NetConfig::default());
    root.block_on(&runtime, f(net))
}

/// An echo server on `server:7`.
fn echo(server: &Process, net: &Net) {
    let listener = net.listen(server.name(), 7).expect("listen");
    let host = server.clone();
    drop(server.spawn(async move {
        loop {
            let mut stream = listener.accept().await;
            drop(host.spawn(async move {
                let mut buf = [0; 1024];
                while let Ok(n) = stream.read(&mut buf).await {
                    if n == 0 || stream.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            }));
        }
    }));
}

#[test]
fn bytes_arrive_in_order_after_the_latency() {
    simulate(1, |net| async move {
        let (server, client) = (
            Process::start("server", &net, 1),
            Process::start("client", &net, 2),
        );
        echo(&server, &net);
        let net2 = net.clone();
        let answer = client
            .spawn(async move {
                let mut stream = net2.connect("client", "server", 7).await.expect("connect");
                let start = Instant::now();
                for i in 0..50u8 {
                    stream.write_all(&[i]).await.expect("write");
                }
                let mut got = vec![0; 50];
                stream.read_exact(&mut got).await.expect("read");
                (got, start.elapsed())
            })
            .await
            .expect("client");
        assert_eq!(answer.0, (0..50).collect::<Vec<u8>>());
        let (low, high) = NetConfig::default().latency;
        assert!(
            answer.1 >= low * 2 && answer.1 <= high * 2 + Duration::from_millis(1),
            "{:?}",
            answer.1
        );
    });
}

#[test]
fn a_held_link_delivers_on_release_and_connects_wait_for_it() {
    simulate(2, |net| async move {
        let (server, client) = (
            Process::start("server", &net, 1),
            Process::start("client", &net, 2),
        );
        echo(&server, &net);
        let n = net.clone();
        let task = client.spawn(async move {
            let mut stream = n.connect("client", "server", 7).await.expect("connect");
            n.hold("client", "server");
            stream.write_all(b"ping").await.expect("write");
            let mut got = [0; 4];
            stream.read_exact(&mut got).await.expect("read");
            let answered = Instant::now();
            n.hold("server", "client");
            let connect =
                tokio::time::timeout(Duration::from_secs(3), n.connect("client", "server", 7))
                    .await;
            (answered, connect.is_err())
        });
        let start = Instant::now();
        tokio::time::sleep(Duration::from_secs(10)).await;
        net.release("client", "server");
        let (answered, connect_hung) = task.await.expect("client");
        assert!(
            answered - start >= Duration::from_secs(10),
            "answered before the release"
        );
        assert!(connect_hung, "a connect across a held link must hang");
    });
}

#[test]
fn a_lost_answer_resets_its_connection_after_the_server_got_the_request() {
    simulate(3, |net| async move {
        let (server, client) = (
            Process::start("server", &net, 1),
            Process::start("client", &net, 2),
        );
        let listener = net.listen("server", 7).expect("listen");
        let received = Rc::new(RefCell::new(Vec::new()));
        let seen = Rc::clone(&received);
        drop(server.spawn(async move {
            let mut stream = listener.accept().await;
            let mut buf = [0; 4];
            stream.read_exact(&mut buf).await.expect("request");
            seen.borrow_mut().extend_from_slice(&buf);
            let _ = stream.write_all(b"pong").await;
            std::future::pending::<()>().await;
        }));
        net.lose_next("server", "client", 1);
        let n = net.clone();
        let read = client
            .spawn(async move {
                let mut stream = n.connect("client", "server", 7).await.expect("connect");
                stream.write_all(b"ping").await.expect("write");
                let mut got = [0; 4];
                stream.read_exact(&mut got).await
            })
            .await
            .expect("client");
        assert_eq!(
            read.expect_err("lost").kind(),
            std::io::ErrorKind::ConnectionReset
        );
        assert_eq!(
            &*received.borrow(),
            b"ping",
            "the server applied the request"
        );
    });
}

#[test]
fn a_frozen_process_runs_its_overdue_timers_when_resumed_and_a_killed_one_closes() {
    simulate(4, |net| async move {
        let (server, sleeper) = (
            Process::start("server", &net, 1),
            Process::start("sleeper", &net, 2),
        );
        echo(&server, &net);
        let start = Instant::now();
        let woke = sleeper.spawn(async move {
            tokio::time::sleep(Duration::from_secs(10)).await;
            Instant::now()
        });
        tokio::time::sleep(Duration::from_secs(5)).await;
        sleeper.freeze();
        tokio::time::sleep(Duration::from_secs(20)).await;
        sleeper.resume();
        let woke = woke.await.expect("sleeper");
        assert_eq!(
            woke - start,
            Duration::from_secs(25),
            "ran at the resume, late"
        );

        let client = Process::start("client", &net, 3);
        let n = net.clone();
        let eof = client.spawn(async move {
            let mut stream = n.connect("client", "server", 7).await.expect("connect");
            stream.write_all(b"x").await.expect("write");
            let mut got = [0; 1];
            stream.read_exact(&mut got).await.expect("echo");
            stream.read(&mut got).await
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        server.kill();
        assert_eq!(eof.await.expect("client").expect("a clean close"), 0, "EOF");
        let refused = net
            .connect("client", "server", 7)
            .await
            .expect_err("nothing listens");
        assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);
    });
}

#[test]
fn the_same_seed_gives_the_same_run() {
    let run = |seed| {
        simulate(seed, |net| async move {
            let (server, client) = (
                Process::start("server", &net, 1),
                Process::start("client", &net, 2),
            );
            echo(&server, &net);
            client
                .spawn(async move {
                    let mut stream = net.connect("client", "server", 7).await.expect("connect");
                    let start = Instant::now();
                    let mut times = Vec::new();
                    for i in 0..20u8 {
                        stream.write_all(&[i]).await.expect("write");
                        let mut got = [0; 1];
                        stream.read_exact(&mut got).await.expect("read");
                        let jitter = lease_core::backoff::random_below(1000);
                        tokio::time::sleep(Duration::from_micros(jitter)).await;
                        times.push((start.elapsed(), jitter));
                    }
                    times
                })
                .await
                .expect("client")
        })
    };
    assert_eq!(run(9), run(9));
    assert_ne!(run(9), run(10));
}
