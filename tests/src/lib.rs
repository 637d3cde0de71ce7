//! Support code for the integration tests: real services, started and faulted on demand.
//!
//! - [`amqp`]: the RabbitMQ the AMQP tests use (URL, unique names, closing a connection with
//!   `rabbitmqctl`).
//! - [`consul`]: a `consul agent -dev` per test on free ports, stopped when dropped, and the
//!   operator actions tests perform on it (destroy a session, delete a key, list sessions).
//! - [`etcd`]: an `etcd` per test on free ports with a temporary data directory, a 3-member
//!   cluster, and the operator actions tests perform on them (revoke a lease, delete keys).
//! - [`postgres`]: the PostgreSQL the fence tests use, a database of its own per test.
//! - [`redis`]: a `redis-server` per test on a free port, restarted, paused or killed on demand,
//!   a replica and a sentinel, and the operator's plain commands.
//! - [`capture`]: a tracing layer that records spans (parents, follows-from) and events, for tests
//!   of what the library logs and how its spans nest.
//! - [`body`]: a response body the test feeds chunk by chunk, for streaming responses.
//! - [`stats`]: percentiles, the quick mode and the scale sizes for the benchmarks.
//! - [`sockets`]: a client's connections to a server, counted from outside the client (the
//!   kernel's socket table), and their peak while a test runs.
//! - [`history`]: the histories `lease-worker` processes write, and verdicts judged from them.
//! - [`proxy`]: a TCP proxy between a client and a service that can stop forwarding, cut every
//!   connection, or answer HTTP requests with 500 — the faults the leases must survive or detect.
//!
//! - [`workers`]: child processes (`lease-worker`, `consul lock`) with their histories, signalled
//!   and stopped with a bound.
//! - [`panics`]: the panic hook every test binary installs, so that no panic goes unseen.
//! - [`chaos`]: the randomized fault-injection driver and the checker that judges its histories.
//!
//! Helpers here panic with a message that says how to fix the environment: a test that cannot
//! reach its service fails; it never passes by skipping.
#![allow(clippy::unwrap_used, clippy::missing_panics_doc)]

pub mod amqp;
pub mod body;
pub mod capture;
pub mod chaos;
pub mod cluster;
pub mod consul;
pub mod etcd;
pub mod history;
pub mod overlap;
pub mod panics;
pub mod postgres;
pub mod proxy;
pub mod redis;
pub mod sockets;
pub mod stats;
pub mod workers;

/// The waits and loss assertions the conformance scenarios are written with, shared by every
/// test here.
pub use lease_conformance::support::{assert_refined, release_lost, within};

/// An `EnvFilter` directive for the log of lease-core and every backend crate at `level`.
pub fn log_filter(level: &str) -> String {
    [
        "lease_core",
        "lease_consul",
        "lease_etcd",
        "lease_amqp",
        "lease_http",
        "lease_redis",
    ]
    .map(|target| format!("{target}={level}"))
    .join(",")
}

/// Installs a tracing subscriber for test output (`RUST_LOG` filters it); safe to call repeatedly.
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| log_filter("debug").into()),
        )
        .with_test_writer()
        .try_init();
}

/// The Rust examples of the workspace README, compiled as doctests of this crate (which has every
/// backend feature, lease-tower and axum): `cargo test -p lease-tests --doc` runs those that need
/// no server and compiles the `no_run` ones.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;

/// The Rust examples of ARCHITECTURE.md, compiled (and run where they need no server) the same way.
#[cfg(doctest)]
#[doc = include_str!("../../ARCHITECTURE.md")]
pub struct ArchitectureDoctests;
