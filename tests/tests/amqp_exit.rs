//! A process that ends while one of its acquires is connecting to RabbitMQ, the broker having
//! dropped the connections it had: nothing may panic, on any thread (lapin's I/O thread of that
//! connection included). In a binary of its own: the panic hook is the process's, and each round
//! ends a tokio runtime of its own, as `main` returning ends `#[tokio::main]`'s.
//!
//! lapin 4.12 connects on the connection's I/O thread, which the connect's first poll starts;
//! with lapin's own connect that thread awaited a `spawn_blocking` of the runtime (resolving the
//! host), and async-rs 0.8 panicked when the ending runtime cancelled it ("Task did not complete:
//! task N was cancelled"): process_edges' AMQP pause test recorded that panic in a worker in 4 of
//! 30 runs, and this test in 4 to 7 of its 12 rounds, in each of 6 runs.

use std::collections::HashSet;
use std::future::Future;
use std::sync::Mutex;
use std::task::Poll;
use std::time::Duration;

use lease_core::{Backend, LeaseSpec, Wait};
use lease_tests::amqp::{backend, close_connection, require_broker, unique};

/// Every panic of this process: its message, place and thread.
static PANICS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Runtimes ended with a connect under way: half of them after `Backend::shutdown`, a quarter
/// after the broker closed the backend's connection.
const ROUNDS: usize = 12;
/// Long enough for an I/O thread left connecting to get where it panicked (1 to 22 ms after the
/// `exit` line in the workers that recorded it).
const AFTER_THE_END: Duration = Duration::from_millis(500);
const T: Duration = Duration::from_secs(10);

/// The ids of this process's threads (`None` without `/proc`). A thread's name is set by the
/// thread itself, a moment after it starts, so a new one is told by its id.
fn threads() -> Option<HashSet<String>> {
    let tasks = std::fs::read_dir("/proc/self/task").ok()?;
    Some(
        tasks
            .filter_map(Result::ok)
            .map(|task| task.file_name().to_string_lossy().into_owned())
            .collect(),
    )
}

/// One process's end: a new acquire polled until it is connecting, then given up (and the
/// backend shut down first if `shut_down`), and the runtime ends. If `broker_closed`, the backend
/// held a lease first, whose connection the broker closed (the lease is lost), as in the pause
/// test. Returns whether the last acquire started a thread (lapin's I/O thread), when that can be
/// told.
fn a_runtime_ends_while_an_acquire_connects(broker_closed: bool, shut_down: bool) -> Option<bool> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let started = runtime.block_on(async {
        require_broker().await;
        let (amqp, connection) = backend();
        let spec = LeaseSpec::leader(unique("exit")).wait(Wait::Never);
        if broker_closed {
            let lease = amqp.acquire(&spec).await.unwrap();
            tokio::task::spawn_blocking(move || close_connection(&connection))
                .await
                .unwrap();
            tokio::time::timeout(T, lease.lost())
                .await
                .expect("the broker closed the lease's connection: it is lost");
        }
        // The pool has no connection (left): this acquire's first poll opens one, which starts
        // its I/O thread.
        let before = threads();
        let mut acquire = Box::pin(amqp.acquire(&spec));
        std::future::poll_fn(|cx| {
            let _ = acquire.as_mut().poll(cx);
            Poll::Ready(())
        })
        .await;
        let after = threads();
        // As a service leaves on SIGTERM: the acquire in progress dropped, the backend shut down
        // (or, as `main` returning leaves it, not).
        drop(acquire);
        if shut_down {
            amqp.shutdown().await;
        }
        before
            .zip(after)
            .map(|(before, after)| !after.is_subset(&before))
    });
    drop(runtime);
    started
}

#[test]
fn a_process_ending_while_an_acquire_connects_panics_nowhere() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let thread = std::thread::current();
        let record = format!("{info} (thread {})", thread.name().unwrap_or("unnamed"));
        PANICS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(record);
        previous(info);
    }));
    let mut connecting = 0;
    for round in 0..ROUNDS {
        let started = a_runtime_ends_while_an_acquire_connects(round % 4 == 0, round % 2 == 0);
        if started != Some(false) {
            connecting += 1;
        }
    }
    std::thread::sleep(AFTER_THE_END);
    let panics = PANICS.lock().unwrap_or_else(|e| e.into_inner()).clone();
    assert!(panics.is_empty(), "{} panics: {panics:#?}", panics.len());
    assert_eq!(
        connecting, ROUNDS,
        "an acquire's first poll started no thread (lapin's I/O thread): this test no longer \
         ends a runtime while a connection is being made"
    );
}
