//! What the simulation needs of a server model: to serve it, to build a real client of it, and to
//! read and change it as an operator would — the oracle the checks compare the clients with.

use std::sync::Arc;

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
}
