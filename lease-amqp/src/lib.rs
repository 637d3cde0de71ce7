//! RabbitMQ leases: the persistent semaphore of
//! [amqp-locks](https://github.com/zbentley/amqp-locks), over lapin on tokio.
//!
//! A semaphore `N` with C slots is the durable queues `N-1-A` … `N-C-A` (`A[L]`); whoever holds slot
//! L owns the exclusive queue `N-L-B` (`B[L]`), which RabbitMQ deletes the moment the owner's
//! connection closes. [`Amqp`] implements [`Backend`]:
//!
//! - `Target::Semaphore { prefix: N, limit }` takes a free slot of `N`; `Target::Leader { key }`
//!   is the one-slot semaphore `key` ("leader over AMQP"). The sequencer is
//!   `(N, L, "N-L-B#<nonce>")`: the holder queue, and a random nonce that makes every
//!   acquisition's sequencer different even when the same slot is taken again.
//! - **A semaphore that does not exist yet** is created with `limit` slots under the
//!   administration mutex by the first acquirer. **Once it exists, every contender must ask for
//!   its slot count**, as on Consul: asking for 3 slots of a 2-slot semaphore (or for 2 of a
//!   3-slot one) fails with [`Error::LimitMismatch`], read from the run of slot queues (`A[limit]`
//!   exists, `A[limit + 1]` does not). Change the count with [`Admin`], then the contenders'
//!   limit.
//! - **Kinds of lock are told apart only by their slot counts**: a leader lock asked for on a
//!   semaphore of more slots is refused with [`Error::FlagsConflict`], as on the other backends;
//!   but a leader lock's queues are a one-slot semaphore's, so a semaphore asked for on a leader
//!   lock's name gets [`Error::LimitMismatch`] (`stored: 1`) instead, and one asking for one slot
//!   shares the leader lock's slot (see `client`).
//! - **Waiting** (`Wait::UpTo`/`Wait::Forever`): RabbitMQ has no blocking query on a queue's
//!   existence, so a busy semaphore is re-scanned with jittered exponential backoff from 20 ms up
//!   to 1 s between scans. A scan of a full semaphore costs C + 2 confirmed publishes, so waiters
//!   stay cheap; a freed slot is found within about a second.
//! - **Loss**: the holder's channel or connection closing is [`LostReason::ConnectionClosed`] at
//!   once. An administrator deleting `A[L]` is [`LostReason::SlotRemoved`]: by default the holder
//!   consumes from `A[L]` and RabbitMQ cancels that consumer when the queue is deleted
//!   ([`LossDetection::ConsumerCancel`]; about 1 ms after the delete on a local broker), or a
//!   verify loop probes `A[L]` ([`LossDetection::Verify`]). Either way the holder also confirms its
//!   channel every quarter heartbeat and self-fences ([`LostReason::SelfFenced`]) when it has
//!   heard nothing for three quarters of a heartbeat, before the broker can drop the connection
//!   and give the slot away.
//! - **Settling, in place of a lock-delay**: the broker frees `B[L]` the moment it drops a
//!   holder's connection, before the holder has heard of it. So the holder also keeps a settle
//!   queue `N-L-C` (`C[L]`), declared with `x-expires` = its [`LeaseSpec::settle`] (100 ms by
//!   default) and consumed while it holds the slot. A clean release deletes it first; after any
//!   other end the broker deletes it one settle time after the holder's channel went, and until
//!   then acquirers count the slot as taken (a waiting acquirer finds it at a later scan). The
//!   old holder noticed a dropped connection 2.7 ms (p99) after the broker dropped it; once, on
//!   a 2-core machine under 11× load, 42 ms. The settle queue is our own addition to
//!   amqp-locks' protocol: a client that does not know it takes the slot at once, and fencing
//!   (checking the sequencer downstream) covers that, as it covers any lease.
//! - **Probes leave nothing behind**: existence checks are mandatory publishes with confirms, and
//!   every queue is declared with `x-max-length = 0`, so a probe that reaches a queue is dropped.
//!
//! # lapin's `NO_ROUTE` warnings
//!
//! A probe of a missing queue comes back as a returned message (`312 NO_ROUTE`), and an acquire
//! makes such probes as a matter of course (a free slot's holder queue, its settle queue, the
//! queue past the last slot). lapin logs every returned message at WARN from its own I/O thread,
//! with no setting to expect them, so a library cannot mute them for its own channels. Add
//! [`QUIET_PROBE_RETURNS`] to your filter (`lapin::returned_messages=off`, e.g.
//! `RUST_LOG=info,lapin::returned_messages=off`); it mutes lapin's returned-message warnings
//! for the whole process (`tests/tests/amqp_logs.rs` holds the directive to it).
//!
//! The alternatives keep amqp-locks' queues but are worse: a passive declare of a missing (or
//! another connection's exclusive) queue closes the channel, which lapin logs at ERROR and which
//! costs a new channel per probe; a probe without `mandatory` is confirmed the same whether or
//! not a queue took it; and a queue argument that makes a full queue refuse the probe
//! (`x-overflow`) changes the declaration every amqp-locks client must agree on (PRECONDITION_FAILED).
//!
//! # Connections, channels and scale
//!
//! **What a held lease costs the broker:** one channel, open for as long as the lease is held;
//! one consumer on its slot queue `A[L]` (none with [`LossDetection::Verify`]) and one on its
//! settle queue `C[L]` (none with a settle time of zero); the exclusive holder queue `B[L]` and
//! `C[L]`. Its semaphore's durable slot queues exist whether they are held or not. A
//! holder sends one confirmed probe every quarter heartbeat (2,000 leases at the default 10 s
//! heartbeat: 800 a second). An acquire that creates its semaphore uses a second channel for the
//! administration meanwhile, and [`check_sequencer`](lease_core::Backend::check_sequencer) one for its two
//! probes.
//!
//! **`channel_max`:** a connection carries at most the `channel_max` negotiated with the broker,
//! the lower of the broker's (`channel_max` in rabbitmq.conf, 2047 by default) and the URL's
//! `?channel_max=`. The leases of one [`Amqp`] fill its first connection up to `channel_max - 8`
//! (2,039 by default; the 8 are kept for brief channels and for closes still in flight), then go
//! on another, up to [`AmqpBuilder::max_connections`] connections ([`DEFAULT_MAX_CONNECTIONS`]: 8,
//! so 16,312 leases). Past that, acquire fails at once with [`AmqpError::ChannelsExhausted`], which
//! names both settings, and the leases already held are not touched. Checks and administration
//! may use half of the 8, so a full process can still check and administer its leases.
//!
//! Measured on RabbitMQ 3.10.8 with lapin 4.12 on a 2-core machine (debug build): before the
//! connections were pooled, one connection took 2,044 leases and lapin refused the next channel
//! itself (`ChannelsLimitReached`), leaving the connection and its 2,044 leases intact; RabbitMQ
//! closes a whole connection that opens more channels than negotiated, so the client-side limit is
//! what keeps a refusal from costing every lease on the connection. 2,000 leader leases, their
//! semaphores created on the way, are acquired 32 at a time in 10 to 16 s
//! (`tests/tests/amqp_scale.rs`) and released in about 2 s; holding them costs the client about a
//! third of a core and the broker roughly 150 KB each (its channel, its holder queue and its slot
//! queue). lapin does work for every frame it sends in proportion to the connection's open
//! channels, so fewer channels per connection are faster: with `?channel_max=256` and
//! `max_connections(9)` (248 leases on each connection) the same 2,000 leases were acquired in 10 s
//! instead of 15 s.
//!
//! **Leases and connections:** exclusive queues belong to a connection, so the backend remembers
//! which slots its own leases hold, across all its connections, and never takes one twice. A
//! connection that closes loses the leases on it, and only those. A lease that self-fences closes
//! its connection on purpose (it has stopped answering): the other leases on that connection are
//! lost with it, those on the backend's other connections are not, and later acquires go on the
//! other connections or a fresh one.
//!
//! [`LostReason::ConnectionClosed`]: lease_core::LostReason::ConnectionClosed
//! [`LostReason::SlotRemoved`]: lease_core::LostReason::SlotRemoved
//! [`LostReason::SelfFenced`]: lease_core::LostReason::SelfFenced
//! [`Backend`]: lease_core::Backend
//! [`Error::LimitMismatch`]: lease_core::Error::LimitMismatch
//! [`Error::FlagsConflict`]: lease_core::Error::FlagsConflict
//! [`LeaseSpec::settle`]: lease_core::LeaseSpec::settle

mod admin;
mod backend;
mod builder;
mod client;
mod config;
mod error;
mod handle;
mod hold;
mod holder;
mod naming;
mod pool;
mod wire;

pub use admin::Admin;
pub use builder::{
    AMQP_URL_ENV, AmqpBuilder, DEFAULT_AMQP_URL, DEFAULT_HEARTBEAT, DEFAULT_MAX_CONNECTIONS,
};
pub use config::LossDetection;
pub use error::AmqpError;
pub use handle::Amqp;

/// The tracing filter directive that mutes lapin's WARN for every returned message, which each
/// acquire's probes of missing queues cause (see [the module docs](self#lapins-no_route-warnings)).
///
/// It mutes lapin's returned-message warnings for the whole process, your own mandatory
/// publishes' included. With `tracing-subscriber`:
///
/// ```ignore
/// let filter = EnvFilter::new(format!("info,{}", lease_amqp::QUIET_PROBE_RETURNS));
/// ```
pub const QUIET_PROBE_RETURNS: &str = "lapin::returned_messages=off";

/// The examples of this crate's README (what crates.io shows), compiled as doctests so that the
/// front page cannot drift from the API; `tests/tests/readmes.rs` of the workspace checks the
/// features, commands and links it names.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
