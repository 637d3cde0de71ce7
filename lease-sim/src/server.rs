//! What the simulation needs of a server model: to serve it, to build a real client of it, and to
//! read and change it as an operator would — the oracle the checks compare the clients with.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use lease_core::{Backend, Sequencer};

use crate::net::Listener;
use crate::world::Process;

/// A server model (Consul's, etcd's) as the simulation drives it.
pub trait Server: 'static {
    /// The backend's name, in reports and replay commands: `consul`, `etcd`.
    fn name(&self) -> &'static str;

    /// The port its clients dial on the server's host.
    fn port(&self) -> u16;

    /// Serves connections from `listener` inside `server` (the accept loop and the model's own
    /// background work are tasks of that process).
    fn serve(&self, server: &Process, listener: Listener);

    /// A real client backend (lease-consul's, lease-etcd's), for `process`, dialing `host`.
    fn client(&self, process: &Process, host: &str) -> Arc<dyn Backend>;

    /// Whether the server still has `sequencer`'s holder where the sequencer says.
    fn holds(&self, sequencer: &Sequencer) -> bool;

    /// An operator takes `sequencer`'s lease away (destroys its session, revokes its lease).
    fn revoke(&self, sequencer: &Sequencer);

    /// An operator deletes `key` (a leader key, a semaphore's `.lock` or a contender key).
    fn delete_key(&self, key: &str);

    /// The server restarted: what persists stays, what a restart resets is reset.
    fn restart(&self);

    /// What is left on the server that a process made: sessions or leases, keys held by one.
    fn leftovers(&self) -> Vec<String>;

    /// The server's index now (Consul's Raft index, etcd's revision): a key whose creation
    /// index is at or below it existed already.
    fn index(&self) -> u64;

    /// The server's index after every write, to wake on (the armed operator actions do).
    fn writes(&self) -> tokio::sync::watch::Receiver<u64>;

    /// Who stands in line for lock `key`, the oldest first, each as its key and the index that
    /// names its turn: etcd's contender keys under `<key>/` and their creation revisions;
    /// Consul's leader key while held, and its LockIndex; a Consul semaphore's contender keys
    /// and their creation indexes.
    fn line(&self, key: &str) -> Vec<(String, u64)>;

    /// Whether [`line`](Self::line) names every contender, waiting or not (etcd: a contender's
    /// key is its place in line from its join on), or only the holders (Consul: a leader key's
    /// waiters only read it; a semaphore contender writes its key in the transaction that admits
    /// it). Where it does not, the checks tell a contender that was in line by when it began to
    /// ask.
    fn line_shows_waiters(&self) -> bool;

    /// A copy of `key` as an operator would keep it to write it back (Consul's `.lock`), if it
    /// exists; `None` on etcd, whose locks have no key of their own to re-create.
    fn copy_key(&self, key: &str) -> Option<KeyCopy>;

    /// Writes `copy` back as a plain write, unless its key exists again.
    fn restore_key(&self, copy: &KeyCopy);

    /// How long after every process has stopped the server has forgotten what the killed ones
    /// left: their sessions' or leases' TTL, and whatever else the server reaps later.
    fn forgets_within(&self, ttl: Duration) -> Duration;
}

/// A key as [`Server::copy_key`] kept it.
#[derive(Clone, Debug)]
pub struct KeyCopy {
    /// The key.
    pub key: String,
    /// Its value.
    pub value: Vec<u8>,
    /// Its flags (Consul's).
    pub flags: u64,
}

impl KeyCopy {
    /// The copy of a Consul semaphore's `.lock` with no holders, as a writer re-creating it
    /// writes it before it takes a slot (`consul lock -n`); anything else as it was.
    pub fn without_holders(mut self) -> KeyCopy {
        if let Ok(mut lock) = serde_json::from_slice::<serde_json::Value>(&self.value) {
            if let Some(holders) = lock.get_mut("Holders") {
                *holders = serde_json::Value::Object(serde_json::Map::new());
                self.value = lock.to_string().into_bytes();
            }
        }
        self
    }
}

/// Spawns one of a model's tasks: its timers, a stream's reader, hyper's connection tasks. The
/// one place the models pick the runtime's spawn: lease-core's, so that in the simulation they
/// run among the server's own tasks.
pub fn spawn<F>(future: F) -> tokio::task::JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    lease_core::runtime::spawn(future)
}
