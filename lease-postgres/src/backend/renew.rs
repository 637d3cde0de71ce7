//! Batched renewal: one `UPDATE` per TTL every TTL/3 for every lease of a handle with that TTL.
//!
//! Each held lease is registered here with its TTL and its [`Fence`]. One task per handle wakes
//! when a group of leases sharing a TTL is due and renews them all with one statement, `UPDATE …
//! SET expires_at = now() + ttl WHERE holder = ANY($1) AND expires_at > now() RETURNING holder`:
//! each returned holder's fence is confirmed with the statement's send time, and a holder missing
//! from the answer has lost its row (deleted, or expired and taken), which is loss (`KeyDeleted`).
//! A failed renewal is retried after TTL/10 (0.2–1 s); only the fence decides that trouble lasted
//! too long: no answered renewal for `LeaseSpec::fence_after` (TTL less a tenth, at least a second,
//! as etcd's keep-alive) and the lease is `SelfFenced`, while the row still has at least that
//! margin to live on the database's clock, since `now() + ttl` is taken after the send
//! (`postgres_lease::a_partitioned_holder_self_fences_before_its_row_expires`, through a proxy that
//! holds every byte). 1,000 leases of one TTL cost three statements per TTL, on one connection.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use lease_core::LostReason;
use lease_core::backend::Fence;
use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;

use super::wire::Wire;
use lease_http::Task;

/// One registered lease.
#[derive(Debug)]
struct Renewed {
    ttl: Duration,
    fence: Fence,
    lost: oneshot::Sender<LostReason>,
}

#[derive(Debug, Default)]
struct State {
    holders: HashMap<String, Renewed>,
    /// When each TTL's group is renewed next.
    due: BTreeMap<Duration, Instant>,
}

/// The renewals of one backend handle.
#[derive(Debug, Default)]
pub(crate) struct Renewer {
    renewals: Arc<Renewals>,
    /// Wakes the task: a registration, or the handle gone (this dropped with it).
    wake: Arc<Notify>,
    task: Task,
}

/// The registered leases, which the renewal task is handed (weakly) when it starts.
#[derive(Debug, Default)]
struct Renewals {
    state: Mutex<State>,
}

impl Drop for Renewer {
    /// The last clone of the handle is gone: the task, which waits without keeping the
    /// renewals, wakes to find them gone and ends.
    fn drop(&mut self) {
        self.wake.notify_one();
    }
}

impl Renewer {
    /// Renews `holder`'s row from now on; the receiver completes if a renewal finds it gone.
    pub(crate) fn register(
        &self,
        wire: &Arc<Wire>,
        holder: &str,
        ttl: Duration,
        fence: Fence,
    ) -> oneshot::Receiver<LostReason> {
        let (lost, rx) = oneshot::channel();
        let mut state = self.renewals.lock();
        let confirmed = fence.confirmed_at().unwrap_or_else(Instant::now);
        state
            .holders
            .insert(holder.to_owned(), Renewed { ttl, fence, lost });
        let due = confirmed + ttl / 3;
        let entry = state.due.entry(ttl).or_insert(due);
        // A group renewed long ago waits for no newcomer's sake.
        *entry = (*entry).min(due);
        drop(state);
        self.task.ensure(|| {
            renew_all(
                Arc::downgrade(&self.renewals),
                Arc::clone(&self.wake),
                Arc::downgrade(wire),
            )
        });
        self.wake.notify_one();
        rx
    }

    /// Stops renewing `holder` (released, or lost).
    pub(crate) fn unregister(&self, holder: &str) {
        self.renewals.lock().holders.remove(holder);
    }
}

impl Renewals {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The group due first, and when; `None` when nothing is registered.
    fn next_due(&self) -> Option<(Duration, Instant)> {
        let mut state = self.lock();
        let live: Vec<Duration> = state.holders.values().map(|r| r.ttl).collect();
        state.due.retain(|ttl, _| live.contains(ttl));
        state
            .due
            .iter()
            .min_by_key(|(_, at)| **at)
            .map(|(ttl, at)| (*ttl, *at))
    }

    /// The holders of the group `ttl`.
    fn group(&self, ttl: Duration) -> Vec<String> {
        let state = self.lock();
        state
            .holders
            .iter()
            .filter(|(_, r)| r.ttl == ttl)
            .map(|(holder, _)| holder.clone())
            .collect()
    }

    /// What the renewal of `sent` found: `returned` still hold, the rest of `asked` lost theirs.
    fn renewed(&self, ttl: Duration, sent: Instant, asked: &[String], returned: &[String]) {
        let returned: std::collections::HashSet<&String> = returned.iter().collect();
        let mut state = self.lock();
        for holder in asked {
            if returned.contains(holder) {
                if let Some(renewed) = state.holders.get(holder) {
                    renewed.fence.confirm(sent);
                }
            } else if let Some(renewed) = state.holders.remove(holder) {
                tracing::debug!(holder, "the renewal found the row gone");
                let _ = renewed.lost.send(LostReason::KeyDeleted);
            }
        }
        state.due.insert(ttl, sent + ttl / 3);
    }

    fn retry_at(&self, ttl: Duration, at: Instant) {
        self.lock().due.insert(ttl, at);
    }
}

/// The renewal task of a handle. It keeps the renewals and the wire (and so its connections)
/// only while it sends a renewal: it waits for the next one with weak references, so the
/// handle's last clone going ends it at once ([`Renewer`]'s drop wakes it).
async fn renew_all(renewals: Weak<Renewals>, wake: Arc<Notify>, wire: Weak<Wire>) {
    loop {
        let Some(renewer) = renewals.upgrade() else {
            return;
        };
        let next = renewer.next_due();
        let ttl = match next {
            Some((ttl, at)) if at <= Instant::now() => ttl,
            // Nothing due yet (or nothing registered): wait for it, or for a registration.
            _ => {
                drop(renewer);
                match next {
                    Some((_, at)) => tokio::select! {
                        biased;
                        () = wake.notified() => {}
                        () = tokio::time::sleep_until(at) => {}
                    },
                    None => wake.notified().await,
                }
                continue;
            }
        };
        let asked = renewer.group(ttl);
        if asked.is_empty() {
            continue;
        }
        let Some(strong) = wire.upgrade() else {
            return;
        };
        let sql = strong.sql(
            "UPDATE lease.leases SET expires_at = now() + ttl \
             WHERE holder = ANY($1) AND expires_at > now() RETURNING holder",
        );
        let sent = Instant::now();
        let answer = strong
            .request(true, |client| {
                let asked = &asked;
                let sql = &sql;
                async move { client.query(sql, &[asked]).await }
            })
            .await;
        match answer {
            Ok(rows) => {
                let returned: Vec<String> = rows
                    .iter()
                    .filter_map(|row| row.try_get::<_, String>(0).ok())
                    .collect();
                renewer.renewed(ttl, sent, &asked, &returned);
            }
            Err(error) => {
                tracing::debug!(%error, ?ttl, leases = asked.len(), "renewal failed; retrying");
                let retry = (ttl / 10).clamp(Duration::from_millis(200), Duration::from_secs(1));
                renewer.retry_at(ttl, Instant::now() + retry);
            }
        }
    }
}
