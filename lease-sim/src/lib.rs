//! Deterministic simulation of lease's Consul and etcd backends: the real clients (lease-consul,
//! lease-etcd, and lease-core's leader and semaphore machinery above them) against models of
//! their servers, served over the real protocols, under a seeded network and clock.

pub mod consul;
pub mod etcd;
pub mod net;
pub mod rng;
pub mod world;
