//! The etcd backend: leases on etcd leases, revisions and watches, over etcd's v3 gRPC API.
//!
//! [`Etcd`] is a cheap, cloneable handle (two HTTP/2 connections per endpoint in use, shared by
//! its clones): one carries the calls, the other one `Watch` stream with every watch of the
//! process and one `LeaseKeepAlive` stream. A lease or a waiter costs no connection of its own.
//! Acquisitions attach their keys to a few pooled etcd leases per TTL, each kept alive every
//! TTL/3 for all the keys on it, so keep-alives do not grow with the leases held.
//!
//! - **Leader**: the recipe of etcd's `concurrency.Election`, so a lease here and
//!   `etcdctl elect <name>` exclude each other on the same name: each contender creates
//!   `<key>/<lease ID in hex>` with its lease (`<key>/<lease ID in hex>_<n>` for the second and
//!   later contenders of this process on one name and lease), the oldest key (lowest create
//!   revision) leads, and a waiter watches only the key just before its own.
//! - **Semaphore (limit N)**: the N oldest keys under `<prefix>/` hold; waiters are admitted in
//!   arrival order (FIFO), each time a key ahead of them is deleted.
//! - **One kind per name**: a key's value says whether it is a semaphore contender (our format)
//!   or a leader contender, and a contender that finds the other kind ahead of it is refused at
//!   once with [`Error::FlagsConflict`](lease_core::Error::FlagsConflict), at no extra request.
//! - **Sequencer**: `etcd:<create revision>:<holder>:<key>`, the holder being the own key's part
//!   after `<key>/` (`<lease ID hex>` or `<lease ID hex>_<n>`) and the key the election name for a
//!   leader, the holder's own key for a semaphore. The create revision rises with every write
//!   anywhere in the cluster, so a downstream system can refuse any token older than the newest
//!   it has seen, even across keys: a property Consul's per-key LockIndex lacks.
//! - **Loss**: the own key deleted or its lease revoked (a watch on the own key), the keep-alive
//!   ending (etcd says the lease is gone), or the self-fence: no keep-alive answered for
//!   [`LeaseSpec::fence_after`](lease_core::LeaseSpec::fence_after) (the TTL less a tenth, at
//!   least a second), which is before etcd could expire the lease.
//! - **No lock-delay; waiters settle instead**: etcd has none, and the spec's lock-delay is
//!   ignored. A holder releases by touching its key, then deleting it, so waiters can tell
//!   a release (taken at once) from a key that went under a holder still running (deleted by an
//!   operator, its lease revoked or expired): after that, they wait
//!   [`LeaseSpec::settle_time`](lease_core::LeaseSpec::settle_time) while the old holder
//!   notices and stops. A holder that is slower than that is fenced by the next holder's higher
//!   revision: downstream systems that check the sequencer refuse it.
//!
//! The messages are hand-written prost structs for the few calls used, so a build needs no
//! protobuf compiler and no build script. An etcd lease is shared by the acquisitions on it: one
//! revoked (`etcdctl lease revoke`, [`Etcd::revoke_lease`]) or expired loses every lease of this
//! process on it.

mod backend;
mod check;
mod client;
mod config;
mod leader;
mod observe;
mod pool;
mod queue;
mod semaphore;
mod session;
mod slot;
mod watch;
mod wire;

pub use backend::Etcd;
pub use config::EtcdBuilder;
/// How the client opens its connections ([`EtcdBuilder::dial`]): lease-http's, re-exported.
pub use lease_http::dial;

/// etcd's v3 gRPC messages as this crate writes and reads them, for lease-sim's model of etcd
/// and its differential test only: not part of the API (see the module's docs).
#[doc(hidden)]
pub use wire::proto;

/// The examples of this crate's README (what crates.io shows), compiled as doctests so that the
/// front page cannot drift from the API; `tests/tests/readmes.rs` of the workspace checks the
/// features, commands and links it names.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
