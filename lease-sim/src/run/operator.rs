//! The operator's side of a run: its actions recorded with what they took, and the armed ones,
//! which wait for a moment of the protocol (`Fault::Armed`).

use std::rc::Rc;
use std::time::Duration;

use tokio::time::Instant;

use super::{SERVER, Sim};
use crate::check::{self, Action};
use crate::schedule::{ARMED_FOR, SEMAPHORE, SLOW_FOR, Trap};

/// How long every holder writes densely after an operator's action (see
/// [`crate::workload::Pace`]): past the settle (100 ms) and how late a slowed holder hears
/// ([`crate::schedule::SLOW`]), so an overlap of an old holder and a new one shows.
const DENSE_FOR: Duration = Duration::from_millis(250);

impl Sim {
    /// Waits, [`ARMED_FOR`] at most, for the moment `trap` names, woken by every write of the
    /// server, and acts then: at the instant of the write, before its answer reaches anyone. The
    /// processes whose leases it takes hear from the server `slow` late for [`SLOW_FOR`].
    pub(super) async fn armed(self: Rc<Self>, trap: Trap, slow: Duration) {
        let act = |action: &dyn Fn()| {
            let victims = self.act(action);
            self.slow_down(&victims, slow);
        };
        let mut writes = self.model.writes();
        let until = Instant::now() + ARMED_FOR;
        let line_of = |key| self.model.line(key);
        let mut head = match trap {
            Trap::DeleteHolderOnJoin { key } | Trap::DeleteNewHolder { key, .. } => {
                line_of(key).first().cloned()
            }
            Trap::RecreateLock { .. } => None,
        };
        loop {
            match trap {
                Trap::DeleteHolderOnJoin { key } => {
                    let line = line_of(key);
                    let index = self.model.index();
                    if let [first, .., newest] = &line[..] {
                        if newest.1 == index {
                            self.shared
                                .trace
                                .note("armed", format!("{trap:?}: {} joined", newest.0));
                            let holder = first.0.clone();
                            act(&|| self.model.delete_key(&holder));
                            return;
                        }
                    }
                }
                Trap::DeleteNewHolder { key, after } => {
                    let now = line_of(key).first().cloned();
                    if let Some(taken) = now.clone().filter(|taken| Some(taken) != head.as_ref()) {
                        self.shared
                            .trace
                            .note("armed", format!("{trap:?}: {} took it", taken.0));
                        tokio::time::sleep(after).await;
                        if line_of(key).first() == Some(&taken) {
                            act(&|| self.model.delete_key(&taken.0));
                        }
                        return;
                    }
                    head = now;
                }
                Trap::RecreateLock { after, afresh } => {
                    let lock = format!("{SEMAPHORE}/.lock");
                    if let Some(mut copy) = self.model.copy_key(&lock) {
                        self.shared
                            .trace
                            .note("armed", format!("{trap:?}: {lock} deleted"));
                        act(&|| self.model.delete_key(&lock));
                        tokio::time::sleep(after).await;
                        if afresh {
                            copy = copy.without_holders();
                        }
                        self.model.restore_key(&copy);
                        self.shared.pace.dense_for(DENSE_FOR);
                        self.shared
                            .trace
                            .note("armed", format!("{lock} written back"));
                        return;
                    }
                }
            }
            tokio::select! {
                biased;
                changed = writes.changed() => if changed.is_err() { return },
                () = tokio::time::sleep_until(until) => {
                    self.shared.trace.note("armed", format!("{trap:?}: its moment did not come"));
                    return;
                }
            }
        }
    }

    /// An operator's `action`, recorded with the leases it took: those the server held before it
    /// and not after (revoking one etcd lease takes every key on it, deleting a `.lock` every
    /// slot). Every holder writes densely for a while after it. Returns the processes whose
    /// leases it took.
    pub(super) fn act(&self, action: impl FnOnce()) -> Vec<u32> {
        let at = self.now_ns();
        let index = self.model.index();
        let held = self.shared.registry.held();
        let before: Vec<bool> = held
            .iter()
            .map(|h| self.model.holds(h.lease.sequencer()))
            .collect();
        let lines = || -> Vec<(String, u64)> {
            (check::keys().iter())
                .flat_map(|(key, _)| self.model.line(key))
                .collect()
        };
        let lined = lines();
        action();
        let taken: Vec<(u32, String)> = (held.iter().zip(before))
            .filter(|(h, was)| *was && !self.model.holds(h.lease.sequencer()))
            .map(|(h, _)| (h.pid, h.lease.sequencer().to_string()))
            .collect();
        let took: Vec<String> = taken.iter().map(|(_, seq)| seq.clone()).collect();
        let still = lines();
        let removed: Vec<(String, u64)> = (lined.iter())
            .filter(|entry| !still.contains(entry))
            .cloned()
            .collect();
        self.shared
            .trace
            .note("operator", format!("took {took:?}, removed {removed:?}"));
        self.seen.borrow_mut().actions.push(Action {
            at,
            took,
            removed,
            lined,
            index,
        });
        self.shared.pace.dense_for(DENSE_FOR);
        let mut victims: Vec<u32> = taken.into_iter().map(|(pid, _)| pid).collect();
        victims.dedup();
        victims
    }

    /// The processes `pids` hear from the server `late` for [`SLOW_FOR`] (what it sends them
    /// arrives that much later): slow, not cut off.
    fn slow_down(&self, pids: &[u32], late: Duration) {
        let hosts: Vec<String> = (self.slots.borrow().iter())
            .filter(|slot| slot.running.as_ref().is_some_and(|r| pids.contains(&r.pid)))
            .map(|slot| slot.process.name().to_owned())
            .collect();
        if hosts.is_empty() {
            return;
        }
        self.shared
            .trace
            .note("slowed", format!("{hosts:?} hear {late:?} late"));
        for host in &hosts {
            self.net.slow(SERVER, host, late);
        }
        let net = self.net.clone();
        drop(tokio::task::spawn_local(async move {
            tokio::time::sleep(SLOW_FOR).await;
            for host in &hosts {
                net.slow(SERVER, host, Duration::ZERO);
            }
        }));
    }
}
