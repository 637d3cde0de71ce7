//! A model of an etcd server (3.4, one member), as far as lease-etcd uses it, served over etcd's
//! own gRPC API to the real lease-etcd client.
//!
//! What lease-etcd calls, and what the model answers as etcd does (`state`, over `mvcc`,
//! `lessor` and `watch`):
//! - `KV/Range`: one key or a range, at a past revision, sorted, limited, keys only, only keys
//!   created by a revision; `mvcc: required revision has been compacted` and `… is a future
//!   revision`;
//! - `KV/Txn`: compares on a key's version or create revision (the only targets lease-etcd's
//!   messages carry), then ranges, puts (with a lease, or keeping the value or the lease) and
//!   deletes; etcd's validation, its errors and its revision rule (a transaction that changes
//!   nothing keeps the revision);
//! - `KV/DeleteRange` of a key or a range;
//! - `Lease/LeaseGrant` (IDs of the server's, from the seed), `LeaseRevoke` (every key of the
//!   lease deleted in one revision), `LeaseTimeToLive`, and the `LeaseKeepAlive` stream;
//!   expiry a TTL after the last keep-alive, revoked [`Config::revoke_late`] later;
//! - the `Watch` stream: many watches, created from a start revision, from the history if it
//!   is past, with `prev_kv` and progress notifications, cancelled, or cancelled by compaction;
//! - `Auth/Authenticate` and the `token` every call carries, when [`Config::auth`] is set.
//!
//! The messages are lease-etcd's own (`lease_etcd::proto`), so the model decodes exactly the
//! fields the client sends and answers exactly the fields it reads.
//!
//! Deterministic: every map is ordered, every random draw comes from [`Config::seed`], and time
//! is `tokio::time`'s only, so under the simulation's paused clock a run is a function of its
//! seed. The state sits behind one lock; its timed work (lease expiry, the watch sync loop,
//! progress notifications) is one background task, spawned through
//! [`spawn`](crate::server::spawn) when the model
//! first serves, sleeping until the next thing is due.
//!
//! For the fault injector and the checker: [`Model::revoke_lease`], [`Model::delete_key`],
//! [`Model::delete_prefix`], [`Model::compact`], [`Model::expire_tokens`],
//! [`Model::break_streams`], [`Model::restart`], and the inspection [`Model::leases`],
//! [`Model::keys`], [`Model::revision`], [`Model::watches`].

mod config;
mod error;
mod lessor;
mod mvcc;
mod server;
mod sim;
mod state;
mod watch;

#[cfg(test)]
mod tests;

use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use tokio::sync::Notify;
use tokio::time::Instant;

pub use config::{Config, Credentials};
pub use server::Service;

use mvcc::Span;
pub use sim::for_schedule;
use state::State;

/// A lease, as [`Model::leases`] lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseInfo {
    /// Its ID (lease-etcd names keys and holders by it in lowercase hex).
    pub id: i64,
    /// Its TTL, in seconds.
    pub ttl: i64,
    /// When it expires unless kept alive (it is revoked [`Config::revoke_late`] later).
    pub expires: Instant,
    /// The keys attached to it, in key order.
    pub keys: Vec<String>,
}

/// A key, as [`Model::keys`] lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyInfo {
    /// The key (lossily, if it is not UTF-8).
    pub key: String,
    /// Its value.
    pub value: Vec<u8>,
    /// The lease it is attached to; 0 for none.
    pub lease: i64,
    /// The revision it was created at.
    pub create_revision: i64,
    /// The revision it was last written at.
    pub mod_revision: i64,
    /// How many times it was written since it was created.
    pub version: i64,
}

/// What the model's handles share.
#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    /// Wakes the background task: something may be due sooner than it sleeps for.
    wake: Arc<Notify>,
    /// Bumped by [`Model::break_streams`] and [`Model::restart`]: every connection served ends.
    breaks: tokio::sync::watch::Sender<u64>,
    /// The revision after every change of the state ([`Model::writes`]).
    revisions: tokio::sync::watch::Sender<u64>,
    /// The background task, once started (again if the runtime it ran on ended).
    background: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        // The background task holds no strong handle: this wakes it to find the model gone.
        self.wake.notify_one();
    }
}

/// A model of one etcd member. Cloning is cheap; clones share the state.
#[derive(Clone, Debug)]
pub struct Model {
    shared: Arc<Shared>,
}

impl Model {
    /// An empty etcd (revision 1, no keys, no leases), configured by `config`. Needs no runtime;
    /// its clock starts at `tokio::time::Instant::now()`.
    pub fn new(config: Config) -> Model {
        let state = State::new(config, Instant::now());
        Model {
            shared: Arc::new(Shared {
                state: Mutex::new(state),
                wake: Arc::new(Notify::new()),
                breaks: tokio::sync::watch::Sender::new(0),
                revisions: tokio::sync::watch::Sender::new(1),
                background: Mutex::new(None),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.shared
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `f` on the state, then wakes the background task (`f` may have made something due).
    fn with_state<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        let (answer, revision) = {
            let mut state = self.lock();
            let answer = f(&mut state);
            (answer, state.revision())
        };
        let revision = u64::try_from(revision).unwrap_or(0);
        self.shared.revisions.send_if_modified(|sent| {
            let changed = *sent != revision;
            *sent = revision;
            changed
        });
        self.shared.wake.notify_one();
        answer
    }

    /// The revision after every write, to wake on.
    pub fn writes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.shared.revisions.subscribe()
    }

    /// Starts the background task (lease expiry, the watch sync loop, progress notifications)
    /// if it is not running: on the runtime that serves the model, through
    /// [`spawn`](crate::server::spawn).
    fn ensure_background(&self) {
        let mut task = self
            .shared
            .background
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if task
            .as_ref()
            .is_none_or(tokio::task::JoinHandle::is_finished)
        {
            *task = Some(crate::server::spawn(background(
                Arc::downgrade(&self.shared),
                Arc::clone(&self.shared.wake),
            )));
        }
    }

    // --- the state machine, for the server ---

    pub(crate) fn state<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        self.with_state(f)
    }

    // --- operator actions ---

    /// Revokes lease `id` (`etcdctl lease revoke`): its keys go in one revision. False if it did
    /// not exist.
    pub fn revoke_lease(&self, id: i64) -> bool {
        self.with_state(|state| state.revoke(id))
    }

    /// Deletes `key` (`etcdctl del <key>`); how many keys went (0 or 1).
    pub fn delete_key(&self, key: &str) -> i64 {
        self.with_state(|state| state.delete(&Span::Key(key.as_bytes().to_vec())).0)
    }

    /// Deletes every key starting with `prefix` (`etcdctl del --prefix <prefix>`); how many
    /// went. (A lock's contenders are the keys under `<name>/`.)
    pub fn delete_prefix(&self, prefix: &str) -> i64 {
        let span = match prefix_end(prefix.as_bytes()) {
            Some(end) => Span::Range(prefix.as_bytes().to_vec(), end),
            None => Span::From(prefix.as_bytes().to_vec()),
        };
        self.with_state(|state| state.delete(&span).0)
    }

    /// Compacts the history at `revision` (`etcdctl compaction`): reads and watches from before
    /// it are refused from then on. etcd's errors if it is compacted already or in the future.
    pub fn compact(&self, revision: i64) -> Result<(), tonic::Status> {
        self.with_state(|state| state.compact(revision))
    }

    /// Invalidates every auth token (as their TTL passing would): the next call with one is
    /// refused `invalid auth token`.
    pub fn expire_tokens(&self) {
        self.with_state(State::expire_tokens);
    }

    /// Ends every connection and stream served (a proxy or a network blip between the clients
    /// and etcd), the state untouched: the clients reconnect and open their streams again.
    pub fn break_streams(&self) {
        self.shared.breaks.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// What restarting etcd (or a new leader) does: keys, revisions, history and leases persist;
    /// every connection, stream and watch ends; the tokens go; the new leader's lessor extends
    /// every lease to its full TTL plus the election timeout (`Promote`), whether or not it had
    /// expired meanwhile.
    pub fn restart(&self) {
        self.with_state(|state| state.restart(Instant::now()));
        self.break_streams();
    }

    // --- inspection ---

    /// Every lease, by ID.
    pub fn leases(&self) -> Vec<LeaseInfo> {
        self.lock()
            .leases()
            .into_iter()
            .map(|lease| LeaseInfo {
                id: lease.id,
                ttl: lease.ttl,
                expires: lease.expiry,
                keys: lease.keys.iter().map(|k| lossy(k)).collect(),
            })
            .collect()
    }

    /// Every key, in key order.
    pub fn keys(&self) -> Vec<KeyInfo> {
        self.lock()
            .keys()
            .into_iter()
            .map(|kv| KeyInfo {
                key: lossy(&kv.key),
                value: kv.value,
                lease: kv.lease,
                create_revision: kv.create_revision,
                mod_revision: kv.mod_revision,
                version: kv.version,
            })
            .collect()
    }

    /// The current revision.
    pub fn revision(&self) -> i64 {
        self.lock().revision()
    }

    /// The revision compacted at (-1 if never).
    pub fn compacted(&self) -> i64 {
        self.lock().compacted()
    }

    /// How many watches are open, over every stream.
    pub fn watches(&self) -> usize {
        self.lock().watch_count()
    }
}

fn lossy(key: &[u8]) -> String {
    String::from_utf8_lossy(key).into_owned()
}

/// The end of the keys starting with `prefix` (etcd's `GetPrefixRangeEnd`): `None` if every key
/// from `prefix` on starts with it (it is all `0xff`).
fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

/// The background task: does what is due (expired leases revoked, the watch sync loop, progress
/// notifications), then sleeps until the next thing is, or until woken. Ends with the model.
async fn background(shared: Weak<Shared>, wake: Arc<Notify>) {
    loop {
        let next = {
            let Some(shared) = shared.upgrade() else {
                return;
            };
            let mut state = shared.state.lock().unwrap_or_else(PoisonError::into_inner);
            let now = Instant::now();
            state.run_due(now);
            state.next_deadline(now)
        };
        let sleep = async {
            match next {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            () = wake.notified() => {}
            () = sleep => {}
        }
    }
}
