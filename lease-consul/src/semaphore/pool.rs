//! Idle semaphore sessions kept for reuse (opt-in, see `ConsulBuilder::semaphore_pool`).
//!
//! A pooled session still holds its contender key but no slot. An idle task renews it until it
//! is claimed, until it has been idle too long (then it is destroyed, which deletes its key), or
//! until Consul invalidates it.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::oneshot;

use crate::session::{Renewals, Session};

/// A session that holds its contender key but no slot.
pub(super) struct Pooled {
    pub(super) session: Session,
    pub(super) renewals: Renewals,
}

/// Idle sessions per prefix; each entry is a claim on an idle task.
#[derive(Default)]
pub(super) struct Pool {
    idle_for: Option<Duration>,
    idle: Mutex<BTreeMap<String, Vec<oneshot::Sender<oneshot::Sender<Pooled>>>>>,
}

impl fmt::Debug for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool")
            .field("idle_for", &self.idle_for)
            .finish_non_exhaustive()
    }
}

impl Pool {
    pub(super) fn new(idle_for: Option<Duration>) -> Self {
        Pool {
            idle_for,
            idle: Mutex::default(),
        }
    }

    /// Whether released sessions are kept for reuse.
    pub(super) fn enabled(&self) -> bool {
        self.idle_for.is_some()
    }

    /// Takes an idle session of `prefix`, if one is still alive.
    pub(super) async fn take(&self, prefix: &str) -> Option<Pooled> {
        loop {
            let claim = self.idle.lock().ok()?.get_mut(prefix)?.pop()?;
            let (reply_tx, reply_rx) = oneshot::channel();
            if claim.send(reply_tx).is_ok() {
                if let Ok(pooled) = reply_rx.await {
                    return Some(pooled);
                }
            }
        }
    }

    /// Parks `pooled` for reuse; gives it back if pooling is off.
    pub(super) fn put(&self, prefix: &str, pooled: Pooled) -> Result<(), Pooled> {
        let Some(idle_for) = self.idle_for else {
            return Err(pooled);
        };
        let Ok(mut idle) = self.idle.lock() else {
            return Err(pooled);
        };
        let (claim_tx, claim_rx) = oneshot::channel();
        let claims = idle.entry(prefix.to_owned()).or_default();
        claims.retain(|c| !c.is_closed());
        claims.push(claim_tx);
        lease_core::runtime::spawn(park(pooled, claim_rx, idle_for));
        Ok(())
    }
}

async fn park(
    pooled: Pooled,
    claim: oneshot::Receiver<oneshot::Sender<Pooled>>,
    idle_for: Duration,
) {
    let Pooled {
        mut session,
        mut renewals,
    } = pooled;
    tokio::select! {
        biased;
        claimed = claim => {
            if let Ok(reply) = claimed {
                // If the claimer went away meanwhile, the returned value is dropped: the session's
                // guard destroys it.
                let _ = reply.send(Pooled { session, renewals });
            }
        }
        () = tokio::time::sleep(idle_for) => {
            let _ = session.destroy().await;
        }
        _ = &mut renewals => {}
    }
}
