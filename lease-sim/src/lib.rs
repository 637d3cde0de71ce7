//! Deterministic simulation of lease's Consul and etcd backends: the real clients (lease-consul,
//! lease-etcd, and lease-core's leader and semaphore machinery above them) against models of
//! their servers, served over the real protocols, under a seeded network and clock.

pub mod check;
pub mod consul;
pub mod etcd;
pub mod net;
pub mod panics;
pub mod rng;
pub mod run;
pub mod schedule;
pub mod server;
pub mod sweep;
pub mod trace;
pub mod workload;
pub mod world;

/// The model of the backend named `name` (`consul`, `etcd`), as sweeps and replays name it.
pub fn model_for(name: &str) -> Option<sweep::ModelFor> {
    match name {
        "consul" => Some(consul::for_schedule),
        "etcd" => Some(etcd::for_schedule),
        _ => None,
    }
}
