//! Sessions and the agent's checks, as `Session.Apply`, `state/session.go`, the session timers
//! (`session_ttl.go`) and the agent's TTL checks and reaper keep them.

use std::time::Duration;

use tokio::time::Instant;

use super::{
    AgentCheck, Behavior, CheckStatus, Entry, NewCheck, NewSession, SERF_HEALTH, Session, State,
};
use crate::consul::wire::{go_quote, parse_go_duration, parse_uuid, session_lookup_error};

/// Consul's `session_ttl_min` (default) and `structs.SessionTTLMax`.
const SESSION_TTL_MIN: Duration = Duration::from_secs(10);
const SESSION_TTL_MAX: Duration = Duration::from_secs(86_400);
/// `structs.MaxLockDelay`: a longer lock-delay is applied as this.
const MAX_LOCK_DELAY: Duration = Duration::from_secs(60);
/// The agent's `CheckDeregisterIntervalMin`: a shorter `DeregisterCriticalServiceAfter` is
/// raised to it.
const REAP_MIN: Duration = Duration::from_secs(60);
/// The agent's `CheckReapInterval`: how often it looks for services to reap.
const REAP_INTERVAL: Duration = Duration::from_secs(30);

impl State {
    // ---- Sessions, as Session.Apply and state/session.go ----

    /// `Session.Apply` (create): validates, then creates the session and starts its timer.
    pub(crate) fn session_create(
        &mut self,
        now: Instant,
        new: NewSession,
    ) -> Result<String, String> {
        self.leader()?;
        let behavior = match new.behavior.as_str() {
            "" | "release" => Behavior::Release,
            "delete" => Behavior::Delete,
            other => return Err(format!("Invalid Behavior setting '{other}'")),
        };
        let mut ttl_duration = None;
        if !new.ttl.is_empty() {
            let ttl = parse_go_duration(&new.ttl)
                .map_err(|e| format!("Session TTL '{}' invalid: {e}", new.ttl))?;
            let in_range = u64::try_from(ttl).is_ok_and(|ns| {
                let ttl = Duration::from_nanos(ns);
                (SESSION_TTL_MIN..=SESSION_TTL_MAX).contains(&ttl)
            });
            if ttl != 0 && !in_range {
                return Err(format!(
                    "Invalid Session TTL '{ttl}', must be between [10s=24h0m0s]"
                ));
            }
            ttl_duration = u64::try_from(ttl)
                .ok()
                .filter(|ns| *ns > 0)
                .map(Duration::from_nanos);
        }
        let node = new.node.unwrap_or_else(|| self.node.clone());
        if node != self.node {
            return Err("Missing node registration".to_owned());
        }
        for check in new
            .node_checks
            .iter()
            .chain(new.service_checks.iter().flatten())
        {
            match self.check_status(check) {
                None => return Err(format!("Missing check '{check}' registration")),
                Some(CheckStatus::Critical) => {
                    return Err(format!("Check '{check}' is in critical state"));
                }
                Some(_) => {}
            }
        }
        let id = loop {
            let id = self.rng.uuid();
            if !self.sessions.contains_key(&id) {
                break id;
            }
        };
        let index = self.next_index();
        let expires = ttl_duration.map(|ttl| now + ttl.mul_f64(self.multiplier));
        self.sessions.insert(
            id.clone(),
            Session {
                id: id.clone(),
                name: new.name,
                node,
                lock_delay: new.lock_delay,
                behavior,
                ttl: new.ttl,
                ttl_duration,
                node_checks: new.node_checks,
                service_checks: new.service_checks,
                create_index: index,
                modify_index: index,
                expires,
            },
        );
        self.sessions_index = index;
        Ok(id)
    }

    fn check_status(&self, id: &str) -> Option<CheckStatus> {
        if id == SERF_HEALTH {
            return Some(CheckStatus::Passing);
        }
        self.catalog_checks.get(id).copied()
    }

    fn session_id(id: &str) -> Result<String, String> {
        parse_uuid(id).map_err(|e| session_lookup_error(&e))
    }

    /// `Session.Renew`: restarts the session's timer; `None` if it does not exist.
    pub(crate) fn session_renew(
        &mut self,
        now: Instant,
        id: &str,
    ) -> Result<Option<Session>, String> {
        self.leader()?;
        let id = Self::session_id(id)?;
        let multiplier = self.multiplier;
        Ok(self.sessions.get_mut(&id).map(|session| {
            if let Some(ttl) = session.ttl_duration {
                session.expires = Some(now + ttl.mul_f64(multiplier));
            }
            session.clone()
        }))
    }

    /// `Session.Get`: the session (if any) and the sessions table's index.
    pub(crate) fn session_info(&self, id: &str) -> Result<(u64, Option<Session>), String> {
        self.leader()?;
        let id = Self::session_id(id)?;
        Ok((self.sessions_index.max(1), self.sessions.get(&id).cloned()))
    }

    /// `Session.List`: every session, in ID order.
    pub(crate) fn session_list(&self) -> Result<(u64, Vec<Session>), String> {
        self.leader()?;
        Ok((
            self.sessions_index.max(1),
            self.sessions.values().cloned().collect(),
        ))
    }

    /// `Session.Apply` (destroy): invalidates the session if it exists.
    pub(crate) fn session_destroy(&mut self, now: Instant, id: &str) -> Result<(), String> {
        self.leader()?;
        let id = Self::session_id(id)?;
        let index = self.next_index();
        self.invalidate(now, index, &id);
        Ok(())
    }

    /// `deleteSessionTxn`: removes the session and, as its behavior says, releases or deletes the
    /// keys it holds, each then under its lock-delay.
    fn invalidate(&mut self, now: Instant, index: u64, id: &str) -> bool {
        let Some(session) = self.sessions.remove(id) else {
            return false;
        };
        self.sessions_index = index;
        let delay = u64::try_from(session.lock_delay)
            .map(Duration::from_nanos)
            .unwrap_or_default()
            .min(MAX_LOCK_DELAY);
        let held: Vec<Entry> = (self.kv.values())
            .filter(|e| e.session == session.id)
            .cloned()
            .collect();
        for mut entry in held {
            let key = entry.key.clone();
            match session.behavior {
                Behavior::Release => {
                    entry.session = String::new();
                    self.kv_set(index, entry, true);
                }
                Behavior::Delete => self.kv_delete(index, &key),
            }
            if !delay.is_zero() {
                self.lock_delays.insert(key, now + delay);
            }
        }
        true
    }

    // ---- The agent's checks and their sync to the catalog ----

    /// `PUT /v1/agent/service/register`: the service and its TTL check (started now).
    pub(crate) fn register_service(
        &mut self,
        now: Instant,
        service: &str,
        check: Option<NewCheck>,
    ) {
        self.services.insert(service.to_owned(), service.to_owned());
        if let Some(check) = check {
            let critical = check.status == CheckStatus::Critical;
            self.agent_checks.insert(
                check.id,
                AgentCheck {
                    service: service.to_owned(),
                    ttl: check.ttl,
                    status: check.status,
                    expires: now.checked_add(check.ttl),
                    critical_since: critical.then_some(now),
                    reap_after: check.reap_after.map(|after| after.max(REAP_MIN)),
                },
            );
        }
        self.sync(now);
    }

    /// `PUT /v1/agent/check/pass/<id>`: the check passes and its timer restarts.
    pub(crate) fn check_pass(&mut self, now: Instant, id: &str) -> Result<(), String> {
        let Some(check) = self.agent_checks.get_mut(id) else {
            return Err(format!(
                "CheckID {} does not have associated TTL",
                go_quote(id)
            ));
        };
        check.status = CheckStatus::Passing;
        check.expires = now.checked_add(check.ttl);
        check.critical_since = None;
        self.sync(now);
        Ok(())
    }

    /// `PUT /v1/agent/service/deregister/<id>`: the service and its checks go (a service the
    /// agent does not know is no error).
    pub(crate) fn deregister_service(&mut self, now: Instant, service: &str) {
        if self.services.remove(service).is_none() {
            return;
        }
        self.agent_checks
            .retain(|_, check| check.service != service);
        self.sync(now);
    }

    /// The agent's anti-entropy: the catalog takes each check's status from the agent (every
    /// session tied to a check that turns critical or goes is invalidated), while a leader exists.
    pub(super) fn sync(&mut self, now: Instant) {
        if !self.leader {
            return;
        }
        let changed: Vec<(String, CheckStatus)> = (self.agent_checks.iter())
            .filter(|(id, check)| self.catalog_checks.get(*id) != Some(&check.status))
            .map(|(id, check)| (id.clone(), check.status))
            .collect();
        for (id, status) in changed {
            let index = self.next_index();
            self.catalog_checks.insert(id.clone(), status);
            if status == CheckStatus::Critical {
                self.invalidate_tied(now, index, &id);
            }
        }
        let gone: Vec<String> = (self.catalog_checks.keys())
            .filter(|id| !self.agent_checks.contains_key(*id))
            .cloned()
            .collect();
        for id in gone {
            let index = self.next_index();
            self.catalog_checks.remove(&id);
            self.invalidate_tied(now, index, &id);
        }
    }

    fn invalidate_tied(&mut self, now: Instant, index: u64, check: &str) {
        let tied: Vec<String> = (self.sessions.values())
            .filter(|s| s.checks().any(|c| c == check))
            .map(|s| s.id.clone())
            .collect();
        for id in tied {
            self.invalidate(now, index, &id);
        }
    }

    // ---- Timers ----

    /// When an agent check with `critical_since` is reaped: at the first reap tick past its
    /// `reap_after`.
    fn reap_at(&self, check: &AgentCheck) -> Option<Instant> {
        let since = check.critical_since?;
        let after = check.reap_after?;
        let base = since.checked_add(after)?;
        let elapsed = base.saturating_duration_since(self.started);
        let ticks = u32::try_from(elapsed.as_nanos() / REAP_INTERVAL.as_nanos()).ok()?;
        let tick = REAP_INTERVAL.checked_mul(ticks.checked_add(1)?)?;
        self.started.checked_add(tick)
    }

    /// The next instant a timer fires: a session's TTL (while a leader runs the timers), an agent
    /// check's TTL, a reap.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        let sessions = (self.sessions.values())
            .filter_map(|s| s.expires)
            .filter(|_| self.leader);
        let checks = self.agent_checks.values().filter_map(|c| c.expires);
        let reaps = (self.agent_checks.values()).filter_map(|c| self.reap_at(c));
        sessions.chain(checks).chain(reaps).min()
    }

    /// Fires every timer due at `now`, in the order they fell due.
    pub(crate) fn fire_timers(&mut self, now: Instant) {
        #[derive(PartialEq, Eq, PartialOrd, Ord)]
        enum Timer {
            Session(String),
            Check(String),
            Reap(String),
        }
        let mut due: Vec<(Instant, Timer)> = Vec::new();
        if self.leader {
            for session in self.sessions.values() {
                if let Some(at) = session.expires.filter(|at| *at <= now) {
                    due.push((at, Timer::Session(session.id.clone())));
                }
            }
        }
        for (id, check) in &self.agent_checks {
            if let Some(at) = check.expires.filter(|at| *at <= now) {
                due.push((at, Timer::Check(id.clone())));
            }
            if let Some(at) = self.reap_at(check).filter(|at| *at <= now) {
                due.push((at, Timer::Reap(id.clone())));
            }
        }
        due.sort();
        for (at, timer) in due {
            match timer {
                Timer::Session(id) => {
                    let still_due = self.sessions.get(&id).and_then(|s| s.expires) == Some(at);
                    if still_due && self.leader {
                        let index = self.next_index();
                        self.invalidate(now, index, &id);
                    }
                }
                Timer::Check(id) => {
                    if let Some(check) = self.agent_checks.get_mut(&id) {
                        if check.expires == Some(at) {
                            check.status = CheckStatus::Critical;
                            check.expires = None;
                            check.critical_since = Some(at);
                            self.sync(now);
                        }
                    }
                }
                Timer::Reap(id) => {
                    let reap = self.agent_checks.get(&id).and_then(|c| self.reap_at(c));
                    if reap == Some(at) {
                        if let Some(service) = self.agent_checks.get(&id).map(|c| c.service.clone())
                        {
                            self.deregister_service(now, &service);
                        }
                    }
                }
            }
        }
    }
}
