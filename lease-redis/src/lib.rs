//! Redis (and Valkey) for the distributed leases of [`lease_core`]: leader and semaphore leases
//! whose loss reaches the holder within milliseconds, waiters woken in FIFO order, and fencing
//! tokens that rise with every acquisition.
//!
//! ```no_run
//! # async fn example() -> Result<(), lease_core::Error> {
//! use lease_core::{Backend, LeaseSpec};
//! use lease_redis::Redis;
//!
//! // Connects on first use; `Redis::from_env()` reads LEASE_REDIS_URL, else REDIS_URL.
//! let redis = Redis::new("redis://cache.internal:6379")?;
//! let lease = redis.acquire(&LeaseSpec::leader("jobs/billing")).await?;
//! lease.run(async { /* only one process at a time gets here */ }).await?;
//! lease.release().await?;
//!
//! // At most three of these at once, cluster-wide.
//! let slot = redis.acquire(&LeaseSpec::semaphore("jobs/reports", 3)).await?;
//! slot.release().await?;
//! redis.shutdown().await;
//! # Ok(())
//! # }
//! ```
//!
//! [`Redis`] says how it works. The modules, from the top down: `redis` (the [`Redis`] type and
//! its `impl Backend`) and `config` (the builder); the recipes `acquire` (an acquisition, and
//! checking a sequencer), `hold` (holding and giving back a lease) and `observe` (who leads a
//! key); `client` (`Shared`, the one owner of the machinery); `renew` (batched renewal); and
//! `wire` at the bottom (the connections, the scripts, errors), which imports none of them.
//!
//! # What is promised, per topology
//!
//! - **One server**: mutual exclusion while the server keeps its data; loss noticed within
//!   milliseconds through client-side tracking, or at the latest at the fence deadline (TTL less
//!   a tenth) when the server or the link is gone; tokens rise with every acquisition. A
//!   restart without persistence loses every lease: each holder learns it on reconnecting, and
//!   the tokens still rise (they follow the server's clock).
//! - **A master with replicas, failover by Sentinel** (`redis+sentinel://`): replication is
//!   asynchronous, so a failover can lose the last writes. With the replica sync on (the
//!   default), an acquisition is returned only once every replica the master had when the
//!   command connection opened has it, so a promoted replica has every lease that was
//!   returned; a renewal is not waited for, so the promoted replica may have an older expiry,
//!   never one later than the holder's own fence.
//!   What is not promised: a replica that connected after the command connection opened (or a
//!   `WAIT` answered by one replica while another is promoted) may lack it, and then two
//!   holders can overlap until the old one notices (its connection to the old master breaks, or
//!   its next renewal on the new one fails). The fencing token is what refuses the older
//!   holder's writes downstream, as long as the servers' clocks agree to within the failover's
//!   duration.
//! - **Redis Cluster**: a name's keys share one hash tag, `{<name>}`, so each script touches one
//!   slot; but this client connects to one node and does not follow `MOVED` redirections, so a
//!   cluster is not supported yet.

// On docs.rs (`--cfg docsrs`), a feature-gated item shows the feature it needs.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod acquire;
mod client;
mod config;
mod hold;
mod observe;
mod redis;
mod renew;
mod wire;

pub use crate::redis::Redis;
pub use config::{REDIS_URL_ENV, RedisBuilder, URL_ENV};
pub use wire::DEFAULT_PREFIX;

/// The examples of this crate's README (what crates.io shows), compiled as doctests so that the
/// front page cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
