//! The Consul model as the simulation drives it: served on the server's host, the real
//! lease-consul client dialing it over the simulated network, and the oracle's reading of who
//! holds what.

use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use lease_consul::Consul;
use lease_core::{Backend, Sequencer};

use super::{Config, Model};
use crate::net::Listener;
use crate::schedule::Schedule;
use crate::server::{KeyCopy, Server};
use crate::world::Process;

/// The port clients dial, Consul's HTTP port.
const PORT: u16 = 8500;

/// The model of `schedule`: its seed, its TTL multiplier drawn in [1, 2], and its clients'
/// connection budget.
pub fn for_schedule(schedule: &Schedule) -> Rc<dyn Server> {
    let multiplier = 1.0 + schedule.server_knob as f64 / 100.0;
    Rc::new(Model::new(
        Config::new(schedule.seed)
            .ttl_multiplier(multiplier)
            .client_connections(schedule.client_connections),
    ))
}

impl Server for Model {
    fn name(&self) -> &'static str {
        "consul"
    }

    fn port(&self) -> u16 {
        PORT
    }

    fn serve(&self, server: &Process, listener: Listener) {
        let (model, host) = (self.clone(), server.clone());
        drop(server.spawn(async move {
            model.start();
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
        let mut builder = Consul::builder()
            .address(format!("http://{host}:{PORT}"))
            .dial(process.dial());
        if let Some(budget) = self.config().client_connections {
            builder = builder.max_connections(budget);
        }
        let built = builder.build();
        match built {
            Ok(consul) => Arc::new(consul),
            // The builder refuses only bad settings, and these are fixed: a bug in the
            // simulation, which its first run shows.
            Err(error) => panic!("the simulated Consul client could not be built: {error}"),
        }
    }

    fn holds(&self, sequencer: &Sequencer) -> bool {
        let Some(entry) = self.entry(sequencer.key()) else {
            return false;
        };
        if entry.holder() != Some(sequencer.holder())
            || entry.lock_index != sequencer.index()
            || (sequencer.generation() != 0 && entry.create_index != sequencer.generation())
        {
            return false;
        }
        // A semaphore's contender key (`<prefix>/<session>`) holds a slot only while its session
        // is among the `.lock`'s holders.
        let Some((prefix, session)) = sequencer.key().rsplit_once('/') else {
            return true;
        };
        if session != sequencer.holder() {
            return true;
        }
        self.entry(&format!("{prefix}/.lock")).is_some_and(|lock| {
            serde_json::from_slice::<serde_json::Value>(&lock.value)
                .ok()
                .and_then(|value| value.get("Holders").cloned())
                .is_some_and(|holders| match holders {
                    serde_json::Value::Object(map) => map.contains_key(session),
                    serde_json::Value::Array(list) => list.iter().any(|s| s == session),
                    _ => false,
                })
        })
    }

    fn revoke(&self, sequencer: &Sequencer) {
        self.destroy_session(sequencer.holder());
    }

    fn delete_key(&self, key: &str) {
        Model::delete_key(self, key);
    }

    fn restart(&self) {
        Model::restart(self);
    }

    fn index(&self) -> u64 {
        *self.shared.applied.borrow()
    }

    fn writes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.shared.applied.subscribe()
    }

    fn line(&self, key: &str) -> Vec<(String, u64)> {
        if let Some(entry) = self.entry(key) {
            return match entry.holder() {
                Some(_) => vec![(entry.key, entry.lock_index)],
                None => Vec::new(),
            };
        }
        let prefix = format!("{key}/");
        let mut line: Vec<(String, u64)> = (self.keys().into_iter())
            .filter(|e| e.key.starts_with(&prefix) && !e.key.ends_with("/.lock"))
            .map(|e| (e.key, e.create_index))
            .collect();
        line.sort_by_key(|(_, index)| *index);
        line
    }

    fn line_shows_waiters(&self) -> bool {
        false
    }

    fn copy_key(&self, key: &str) -> Option<KeyCopy> {
        self.entry(key).map(|e| KeyCopy {
            key: e.key,
            value: e.value,
            flags: e.flags,
        })
    }

    fn restore_key(&self, copy: &KeyCopy) {
        if self.entry(&copy.key).is_none() {
            self.put_key(&copy.key, &copy.value, copy.flags);
        }
    }

    /// Twice the TTL (a session outlives its last renewal by up to that), or, for the heartbeat
    /// check of a process that could not deregister it, the agent's reap: a minute after it
    /// turned critical, at the agent's next 30 s tick.
    fn forgets_within(&self, ttl: Duration) -> Duration {
        (ttl * 2).max(ttl + Duration::from_secs(90))
    }

    fn leftovers(&self) -> Vec<String> {
        let sessions = self
            .sessions()
            .into_iter()
            .map(|s| format!("session {} ({}) holding {:?}", s.id, s.name, s.holds));
        let held = (self.keys().into_iter())
            .filter_map(|e| Some(format!("key {} held by {}", e.key, e.holder()?)));
        let checks = self.checks().into_iter().map(|c| format!("check {}", c.id));
        sessions.chain(held).chain(checks).collect()
    }
}
