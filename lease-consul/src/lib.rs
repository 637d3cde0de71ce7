//! The Consul backend: leases on Consul sessions and KV.
//!
//! [`Consul`] is a cheap, cloneable handle: its clones share one client (the HTTP wire client,
//! the prefix watches, the heartbeats, the holder tasks) and the semaphore coordinators. Each
//! acquired lease has its own session, and is watched with blocking queries, so loss is noticed
//! as soon as Consul knows it.
//!
//! # Many leases per process
//!
//! A client uses at most [`ConsulBuilder::max_connections`] connections (default 8) however many
//! leases it holds, so ten processes on one host stay under the agent's default limit of 200 per
//! client IP (`limits.http_max_conns_per_client`):
//!
//! - **Connections are counted.** The client's connector holds one of `max_connections`
//!   permits per open connection (plain or TLS), from connect to close. Through a client of your
//!   own, requests are bounded instead; see [`ConsulBuilder::max_connections`].
//! - **Watches are shared.** Every blocking query goes through at most `max_connections − 2`
//!   recursive prefix watches covering every key some lease, waiter or observer cares about; an
//!   answer wakes only the watchers whose keys changed. Every key someone cares about is covered
//!   by a blocking read at every moment, except while its watch starts, widens or recovers from a
//!   failed read (one plain listing: milliseconds); a held lease that no read covers stops
//!   counting its heartbeat from that moment, so it self-fences rather than run unwatched. The
//!   price: an answer carries every key under its prefix, so a loss among many keys in one
//!   directory is read as one large listing (the workspace's BENCHMARKS.md has the figures).
//! - **One heartbeat keeps every session alive.** Sessions are tied to one agent TTL check per
//!   process (a service `lease`), passed every TTL/2: idle traffic does not grow with the number
//!   of leases, and each lease keeps its own session, so destroying one session loses one lease.
//!   A process that dies loses its leases one TTL after its last pass. See [`KeepAlive`] for the
//!   per-session alternative (and the ACL it needs).
//! - **No retry storms.** After a refused, dropped or unreachable request the client sends one
//!   request at a time, paced by a jittered backoff from 100 ms to 2 s: at most 20 requests per
//!   second during an outage. Leases are still given up at their fence deadline, never later.
//!
//! Await [`Backend::shutdown`](lease_core::Backend::shutdown) before the process exits to give every lease back at once; a
//! process that exits without it (its runtime dropping the holder tasks) still releases its keys
//! and destroys its sessions from a detached runtime, within about a second.
//!
//! Interoperation: `consul lock PREFIX cmd` holds the key `PREFIX/.lock`; a leader lease on that
//! key uses the same flags, so the two exclude each other. A semaphore on `PREFIX` shares its
//! slots with `consul lock -n N PREFIX cmd`.

mod backend;
mod client;
mod config;
mod keepalive;
mod kind;
mod leader;
mod observe;
mod semaphore;
mod session;
mod watch;
mod wire;

pub use backend::Consul;
pub use config::ConsulBuilder;
pub use keepalive::KeepAlive;
pub use leader::UnheldKey;
/// How the client opens its connections ([`ConsulBuilder::dial`]): lease-http's, re-exported.
pub use lease_http::dial;
pub use semaphore::{SemaphoreHolder, SemaphoreState};

/// The examples of this crate's README (what crates.io shows), compiled as doctests so that the
/// front page cannot drift from the API; `tests/tests/readmes.rs` of the workspace checks the
/// features, commands and links it names.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
