//! The operator's side of a run: its actions recorded with what they took, and the armed ones,
//! which wait for a moment of the protocol (`Fault::Armed`).

use std::rc::Rc;

use tokio::time::Instant;

use super::Sim;
use crate::check::{self, Action};
use crate::schedule::{ARMED_FOR, SEMAPHORE, Trap};

impl Sim {
    /// Waits, [`ARMED_FOR`] at most, for the moment `trap` names, woken by every write of the
    /// server, and acts then: at the instant of the write, before its answer reaches anyone.
    pub(super) async fn armed(self: Rc<Self>, trap: Trap) {
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
                            self.trace
                                .note("armed", format!("{trap:?}: {} joined", newest.0));
                            let holder = first.0.clone();
                            self.act(|| self.model.delete_key(&holder));
                            return;
                        }
                    }
                }
                Trap::DeleteNewHolder { key, after } => {
                    let now = line_of(key).first().cloned();
                    if let Some(taken) = now.clone().filter(|taken| Some(taken) != head.as_ref()) {
                        self.trace
                            .note("armed", format!("{trap:?}: {} took it", taken.0));
                        tokio::time::sleep(after).await;
                        if line_of(key).first() == Some(&taken) {
                            self.act(|| self.model.delete_key(&taken.0));
                        }
                        return;
                    }
                    head = now;
                }
                Trap::RecreateLock { after } => {
                    let lock = format!("{SEMAPHORE}/.lock");
                    if let Some(copy) = self.model.copy_key(&lock) {
                        self.trace
                            .note("armed", format!("{trap:?}: {lock} deleted"));
                        self.act(|| self.model.delete_key(&lock));
                        tokio::time::sleep(after).await;
                        self.model.restore_key(&copy);
                        self.trace.note("armed", format!("{lock} written back"));
                        return;
                    }
                }
            }
            tokio::select! {
                biased;
                changed = writes.changed() => if changed.is_err() { return },
                () = tokio::time::sleep_until(until) => {
                    self.trace.note("armed", format!("{trap:?}: its moment did not come"));
                    return;
                }
            }
        }
    }

    /// An operator's `action`, recorded with the leases it took: those the server held before it
    /// and not after (revoking one etcd lease takes every key on it, deleting a `.lock` every
    /// slot).
    pub(super) fn act(&self, action: impl FnOnce()) {
        let at = self.now_ns();
        let index = self.model.index();
        let held = self.registry.held();
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
        let took: Vec<String> = (held.iter().zip(before))
            .filter(|(h, was)| *was && !self.model.holds(h.lease.sequencer()))
            .map(|(h, _)| h.lease.sequencer().to_string())
            .collect();
        let still = lines();
        let removed: Vec<(String, u64)> = (lined.into_iter())
            .filter(|entry| !still.contains(entry))
            .collect();
        self.trace
            .note("operator", format!("took {took:?}, removed {removed:?}"));
        self.seen.borrow_mut().actions.push(Action {
            at,
            took,
            removed,
            index,
        });
    }
}
