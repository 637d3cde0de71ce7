//! The etcd model as the simulation drives it: served on the server's host, the real lease-etcd
//! client dialing it over the simulated network, and the oracle's reading of who holds what.

use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use lease_core::{Backend, Sequencer};
use lease_etcd::Etcd;

use super::{Config, Model};
use crate::net::Listener;
use crate::schedule::Schedule;
use crate::server::{KeyCopy, Server};
use crate::world::Process;

/// The port clients dial, etcd's client port.
const PORT: u16 = 2379;

/// The model of `schedule`: its seed, and its lessor's lateness drawn in [0, 500 ms].
pub fn for_schedule(schedule: &Schedule) -> Rc<dyn Server> {
    let late = Duration::from_millis(schedule.server_knob * 5);
    Rc::new(Model::new(Config::new(schedule.seed).revoke_late(late)))
}

/// The etcd lease a holder (`<lease hex>` or `<lease hex>_<n>`) is on.
fn lease_of(holder: &str) -> Option<i64> {
    let hex = holder.split('_').next()?;
    i64::from_str_radix(hex, 16).ok()
}

/// A sequencer's contender key: its key for a semaphore holder (`<prefix>/<holder>`), the
/// leader key's `<key>/<holder>` for a leader.
fn contender_key(sequencer: &Sequencer) -> String {
    let key = sequencer.key();
    if key
        .rsplit_once('/')
        .is_some_and(|(_, last)| last == sequencer.holder())
    {
        key.to_owned()
    } else {
        format!("{key}/{}", sequencer.holder())
    }
}

impl Server for Model {
    fn name(&self) -> &'static str {
        "etcd"
    }

    fn port(&self) -> u16 {
        PORT
    }

    fn serve(&self, server: &Process, listener: Listener) {
        let (model, host) = (self.clone(), server.clone());
        drop(server.spawn(async move {
            loop {
                let stream = listener.accept().await;
                let model = model.clone();
                drop(host.spawn(async move {
                    let _ = model.serve_connection(stream).await;
                }));
            }
        }));
    }

    fn client(&self, process: &Process, host: &str) -> Arc<dyn Backend> {
        let built = Etcd::builder()
            .endpoints([format!("http://{host}:{PORT}")])
            .dial(process.dial())
            .build();
        match built {
            Ok(etcd) => Arc::new(etcd),
            // The builder refuses only bad settings, and these are fixed: a bug in the
            // simulation, which its first run shows.
            Err(error) => panic!("the simulated etcd client could not be built: {error}"),
        }
    }

    fn holds(&self, sequencer: &Sequencer) -> bool {
        let (key, lease) = (contender_key(sequencer), lease_of(sequencer.holder()));
        self.keys().iter().any(|k| {
            k.key == key
                && Some(k.lease) == lease
                && u64::try_from(k.create_revision).ok() == Some(sequencer.index())
        })
    }

    fn revoke(&self, sequencer: &Sequencer) {
        if let Some(lease) = lease_of(sequencer.holder()) {
            self.revoke_lease(lease);
        }
    }

    fn delete_key(&self, key: &str) {
        // A leader key names its queue: delete its holder's contender key, as an operator who
        // deletes "the lock" of `etcdctl lock` does.
        if self.keys().iter().any(|k| k.key == key) {
            Model::delete_key(self, key);
            return;
        }
        let prefix = format!("{key}/");
        let head = (self.keys().into_iter())
            .filter(|k| k.key.starts_with(&prefix))
            .min_by_key(|k| k.create_revision);
        if let Some(head) = head {
            Model::delete_key(self, &head.key);
        }
    }

    fn restart(&self) {
        Model::restart(self);
    }

    fn index(&self) -> u64 {
        u64::try_from(self.revision()).unwrap_or(0)
    }

    fn writes(&self) -> tokio::sync::watch::Receiver<u64> {
        Model::writes(self)
    }

    fn line(&self, key: &str) -> Vec<(String, u64)> {
        let prefix = format!("{key}/");
        let mut line: Vec<(String, u64)> = (self.keys().into_iter())
            .filter(|k| k.key.starts_with(&prefix))
            .map(|k| (k.key, u64::try_from(k.create_revision).unwrap_or(0)))
            .collect();
        line.sort_by_key(|(_, revision)| *revision);
        line
    }

    fn line_shows_waiters(&self) -> bool {
        true
    }

    fn copy_key(&self, _key: &str) -> Option<KeyCopy> {
        None
    }

    fn restore_key(&self, _copy: &KeyCopy) {}

    /// The TTL, and the lessor's lateness (at most half a second).
    fn forgets_within(&self, ttl: Duration) -> Duration {
        ttl + Duration::from_secs(1)
    }

    fn leftovers(&self) -> Vec<String> {
        let leases = (self.leases().into_iter())
            .map(|l| format!("lease {:x} (TTL {} s) with keys {:?}", l.id, l.ttl, l.keys));
        let keys = (self.keys().into_iter())
            .filter(|k| k.lease != 0)
            .map(|k| format!("key {} on lease {:x}", k.key, k.lease));
        leases.chain(keys).collect()
    }
}
