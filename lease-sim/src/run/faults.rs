//! The faults of a schedule, applied at their times and healed after their durations, and the
//! cut-offs they make (the spans in which a process could not hear from the server), which the
//! checks' exception reads.

use std::rc::Rc;
use std::time::Duration;

use lease_core::Sequencer;

use super::{SERVER, Sim};
use crate::check::CutOff;
use crate::schedule::{Fault, SEMAPHORE, Way};
use crate::world::Process;

impl Sim {
    fn cut_off(&self, pid: Option<u32>, lasting: Duration, frozen: bool) {
        let from = self.now_ns();
        self.seen.borrow_mut().cut_offs.push(CutOff {
            pid,
            from,
            to: from + lasting.as_nanos(),
            frozen,
        });
    }

    /// Applies `fault` now, and schedules its heal.
    pub(super) fn apply(self: Rc<Self>, server: &Process, fault: Fault) {
        self.shared.trace.note("fault", format!("{fault:?}"));
        let lasting = fault.lasting();
        match fault {
            Fault::Partition { process, way, .. } => {
                let host = self.host_of(process);
                let ways = match way {
                    Way::Both => vec![(host.clone(), SERVER.to_owned()), (SERVER.to_owned(), host)],
                    Way::FromProcess => vec![(host, SERVER.to_owned())],
                    Way::ToProcess => vec![(SERVER.to_owned(), host)],
                };
                for (from, to) in &ways {
                    self.net.hold(from, to);
                }
                self.cut_off(self.pid_of(process), lasting, false);
                self.heal_after(lasting, move |sim| {
                    for (from, to) in &ways {
                        sim.net.release(from, to);
                    }
                });
            }
            Fault::PartitionAll { .. } => {
                let hosts: Vec<String> = (0..self.schedule.processes)
                    .map(|s| self.host_of(s))
                    .collect();
                for host in &hosts {
                    self.net.hold(host, SERVER);
                    self.net.hold(SERVER, host);
                }
                self.cut_off(None, lasting, false);
                self.heal_after(lasting, move |sim| {
                    for host in &hosts {
                        sim.net.release(host, SERVER);
                        sim.net.release(SERVER, host);
                    }
                });
            }
            Fault::Delay { process, extra, .. } => {
                let host = self.host_of(process);
                self.net.delay(&host, SERVER, extra);
                self.net.delay(SERVER, &host, extra);
                self.cut_off(self.pid_of(process), lasting, false);
                self.heal_after(lasting, move |sim| {
                    sim.net.delay(&host, SERVER, Duration::ZERO);
                    sim.net.delay(SERVER, &host, Duration::ZERO);
                });
            }
            Fault::LoseAnswers { process, count } => {
                self.net.lose_next(SERVER, &self.host_of(process), count);
                self.cut_off(self.pid_of(process), Duration::from_secs(1), false);
            }
            Fault::Reset { process } => {
                self.net.reset_between(&self.host_of(process), SERVER);
                self.cut_off(self.pid_of(process), Duration::from_millis(100), false);
            }
            Fault::ServerRestart { .. } => {
                self.net.down(SERVER);
                server.freeze();
                self.cut_off(None, lasting, false);
                let server = server.clone();
                self.heal_after(lasting, move |sim| {
                    sim.model.restart();
                    server.resume();
                    sim.net.up(SERVER);
                });
            }
            Fault::Revoke { pick } => {
                let held = self.shared.registry.held();
                if let Some(h) = held.get((pick % held.len().max(1) as u64) as usize) {
                    let seq = h.lease.sequencer().clone();
                    self.act(|| self.model.revoke(&seq));
                }
            }
            Fault::DeleteKey { key } => {
                self.act(|| self.model.delete_key(key));
            }
            Fault::DeleteSemaphoreKey { pick } => {
                let holders: Vec<Sequencer> = (self.shared.registry.held().iter())
                    .map(|h| h.lease.sequencer().clone())
                    .filter(|s| s.key().starts_with(&format!("{SEMAPHORE}/")))
                    .collect();
                // Consul's semaphore lives in its `.lock`: deleting it takes every slot.
                if self.model.name() == "consul" && pick % 2 == 0 {
                    self.act(|| self.model.delete_key(&format!("{SEMAPHORE}/.lock")));
                } else if let Some(seq) = holders.get((pick % holders.len().max(1) as u64) as usize)
                {
                    self.act(|| self.model.delete_key(seq.key()));
                }
            }
            Fault::Armed { trap, slow } => {
                drop(tokio::task::spawn_local(Rc::clone(&self).armed(trap, slow)));
            }
            Fault::Freeze { process, .. } => {
                let slot = self.slots.borrow().get(process).map(|s| s.process.clone());
                if let Some(frozen) = slot {
                    frozen.freeze();
                    self.cut_off(self.pid_of(process), lasting, true);
                    self.heal_after(lasting, move |_| frozen.resume());
                }
            }
            Fault::Kill { process, .. } => {
                let killed = {
                    let slots = self.slots.borrow();
                    slots
                        .get(process)
                        .map(|s| (s.process.clone(), s.running.as_ref().map(|r| r.pid)))
                };
                // A process already killed, its replacement still to start, is not killed
                // again: its slot has one replacement coming, not two (the first of two would
                // run on unstopped, outside the slots, and outlive the run).
                if let Some((victim, _)) = killed.as_ref().filter(|(v, _)| v.is_killed()) {
                    let name = victim.name().to_owned();
                    self.shared
                        .trace
                        .note("skipped", format!("kill {name}: already dead"));
                } else if let Some((victim, pid)) = killed {
                    victim.kill();
                    if let Some(pid) = pid {
                        self.shared.registry.forget(pid);
                    }
                    self.heal_after(lasting, move |sim| {
                        let replacement = sim.start_process(process);
                        let mut slots = sim.slots.borrow_mut();
                        if let Some(slot) = slots.get_mut(process) {
                            let dead = std::mem::replace(slot, replacement);
                            sim.graveyard.borrow_mut().push(dead);
                        }
                    });
                }
            }
        }
    }

    fn heal_after(self: Rc<Self>, lasting: Duration, heal: impl FnOnce(&Sim) + 'static) {
        drop(tokio::task::spawn_local(async move {
            tokio::time::sleep(lasting).await;
            heal(&self);
            self.shared
                .trace
                .note("healed", format!("after {lasting:?}"));
        }));
    }
}
