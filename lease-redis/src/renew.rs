//! Batched renewal: one script call renews every lease of a handle that is due, however many
//! names they hold.
//!
//! Each held lease is registered here with its base key, kind, TTL and [`Fence`]. One task per
//! handle wakes when a group of leases sharing a TTL is due (every TTL/3) and renews them all
//! with the `renew` script (up to [`BATCH`] leases a call): it compares each holder and pushes its
//! key's expiry and its slot's to the server's clock plus the TTL. The script's own writes make
//! the server forget the keys for client-side tracking (NOLOOP), so an `EXISTS` of every holder
//! key follows it in the same `MULTI` and arms tracking again. (A script that declared the keys
//! and read them itself would cost the server each declared key at each read it makes: the
//! first version did, and 1,000 leases stalled the server for five seconds.) Each lease renewed has its fence confirmed with the call's
//! send time; one missing is lost (`KeyDeleted`, or `KeyTaken` when another holder has the leader
//! key). A failed call is retried after TTL/10 (0.2–1 s); only the fence decides that trouble
//! lasted too long: no answered renewal for `LeaseSpec::fence_after` (TTL less a tenth, at least
//! a second) and the lease is `SelfFenced`, while its key still has that margin to live on the
//! server's clock.
//!
//! The same call checks a lease at once when its key's invalidation comes, or the command
//! connection is back after a break ([`Renewer::check_now`]): a check is a renewal, so it also
//! arms tracking again. The leases checked at one moment go together.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use lease_core::LostReason;
use lease_core::backend::Fence;
use redis::Value;
use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;

use crate::wire::{RENEW, Wire};
use lease_http::Task;

/// The most leases one renewal call carries: a call blocks the server while it runs (1,000
/// leases took 0.2–0.3 s of a server on a 2-core machine loaded by other builds).
pub(crate) const BATCH: usize = 2_000;

/// What kind of holder key a lease has, as the scripts name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Leader,
    Semaphore,
}

impl Kind {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Kind::Leader => "leader",
            Kind::Semaphore => "semaphore",
        }
    }
}

/// One registered lease.
#[derive(Debug)]
struct Renewed {
    base: String,
    kind: Kind,
    ttl: Duration,
    fence: Fence,
    lost: oneshot::Sender<LostReason>,
}

#[derive(Debug, Default)]
struct State {
    leases: BTreeMap<String, Renewed>,
    /// When each TTL's group is renewed next.
    due: BTreeMap<Duration, Instant>,
    /// Holders to check (renew) at once.
    now: BTreeSet<String>,
}

/// The renewals of one backend handle.
#[derive(Debug, Default)]
pub(crate) struct Renewer {
    renewals: Arc<Renewals>,
    /// Wakes the task: a registration, a check, or the handle gone (this dropped with it).
    wake: Arc<Notify>,
    task: Task,
}

#[derive(Debug, Default)]
struct Renewals {
    state: Mutex<State>,
}

impl Drop for Renewer {
    fn drop(&mut self) {
        self.wake.notify_one();
    }
}

impl Renewer {
    /// Renews `holder`'s lease from now on; the receiver completes if a renewal finds it gone.
    pub(crate) fn register(
        &self,
        wire: &Arc<Wire>,
        holder: &str,
        base: &str,
        kind: Kind,
        ttl: Duration,
        fence: Fence,
    ) -> oneshot::Receiver<LostReason> {
        let (lost, rx) = oneshot::channel();
        let confirmed = fence.confirmed_at().unwrap_or_else(Instant::now);
        let mut state = self.renewals.lock();
        state.leases.insert(
            holder.to_owned(),
            Renewed {
                base: base.to_owned(),
                kind,
                ttl,
                fence,
                lost,
            },
        );
        let due = confirmed + ttl / 3;
        let entry = state.due.entry(ttl).or_insert(due);
        *entry = (*entry).min(due);
        drop(state);
        self.start(wire);
        rx
    }

    fn start(&self, wire: &Arc<Wire>) {
        self.task.ensure(|| {
            renew_all(
                Arc::downgrade(&self.renewals),
                Arc::clone(&self.wake),
                Arc::downgrade(wire),
            )
        });
        self.wake.notify_one();
    }

    /// Checks `holder`'s lease at once (with the others checked at this moment).
    pub(crate) fn check_now(&self, wire: &Arc<Wire>, holder: &str) {
        let mut state = self.renewals.lock();
        if state.leases.contains_key(holder) {
            state.now.insert(holder.to_owned());
            drop(state);
            self.start(wire);
        }
    }

    /// Stops renewing `holder` (released, or lost).
    pub(crate) fn unregister(&self, holder: &str) {
        let mut state = self.renewals.lock();
        state.leases.remove(holder);
        state.now.remove(holder);
    }

    /// How many leases are renewed.
    pub(crate) fn len(&self) -> usize {
        self.renewals.lock().leases.len()
    }
}

impl Renewals {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// What to renew now: the holders to check at once, else the group due first if it is due;
    /// otherwise when the next group is due.
    fn next(&self) -> Result<(Option<Duration>, Vec<Asked>), Option<Instant>> {
        let mut state = self.lock();
        if !state.now.is_empty() {
            let now: Vec<String> = std::mem::take(&mut state.now).into_iter().collect();
            let asked = now
                .into_iter()
                .filter_map(|holder| state.leases.get(&holder).map(|r| Asked::of(holder, r)))
                .collect();
            return Ok((None, asked));
        }
        let live: BTreeSet<Duration> = state.leases.values().map(|r| r.ttl).collect();
        state.due.retain(|ttl, _| live.contains(ttl));
        let Some((ttl, at)) = state
            .due
            .iter()
            .min_by_key(|(_, at)| **at)
            .map(|(t, a)| (*t, *a))
        else {
            return Err(None);
        };
        if at > Instant::now() {
            return Err(Some(at));
        }
        let asked = state
            .leases
            .iter()
            .filter(|(_, r)| r.ttl == ttl)
            .map(|(holder, r)| Asked::of(holder.clone(), r))
            .collect();
        Ok((Some(ttl), asked))
    }

    /// What the renewal sent at `sent` answered for `asked`; `current`: it ran on the connection
    /// in use now (so tracking follows the keys it read again).
    fn renewed(&self, sent: Instant, asked: &[Asked], answers: &[Value], current: bool) {
        let mut state = self.lock();
        for (asked, answer) in asked.iter().zip(answers) {
            let lost = match answer {
                Value::Int(1) => {
                    if let Some(renewed) = state.leases.get(&asked.holder) {
                        if current {
                            renewed.fence.resume();
                        }
                        renewed.fence.confirm(sent);
                    }
                    continue;
                }
                Value::Array(taken) => LostReason::KeyTaken {
                    session: taken.first().and_then(text).unwrap_or_default(),
                    lock_index: taken
                        .get(1)
                        .and_then(text)
                        .and_then(|t| t.parse().ok())
                        .unwrap_or_default(),
                },
                _ => LostReason::KeyDeleted,
            };
            if let Some(renewed) = state.leases.remove(&asked.holder) {
                tracing::debug!(holder = %asked.holder, %lost, "the renewal found the lease gone");
                let _ = renewed.lost.send(lost);
            }
        }
    }

    /// Checks these leases at once.
    fn check_again(&self, asked: &[Asked]) {
        let mut state = self.lock();
        for asked in asked {
            if state.leases.contains_key(&asked.holder) {
                state.now.insert(asked.holder.clone());
            }
        }
    }

    fn due_again(&self, ttl: Duration, at: Instant) {
        self.lock().due.insert(ttl, at);
    }
}

fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

/// One lease of a renewal call.
#[derive(Debug)]
struct Asked {
    holder: String,
    base: String,
    holder_key: String,
    kind: Kind,
    ttl_ms: String,
}

impl Asked {
    fn of(holder: String, renewed: &Renewed) -> Asked {
        let holder_key = match renewed.kind {
            Kind::Leader => renewed.base.clone(),
            Kind::Semaphore => format!("{}:s:{holder}", renewed.base),
        };
        Asked {
            holder,
            holder_key,
            base: renewed.base.clone(),
            kind: renewed.kind,
            ttl_ms: renewed.ttl.as_millis().to_string(),
        }
    }
}

/// The renewal task of a handle: keeps the renewals and the wire only while it sends.
async fn renew_all(renewals: Weak<Renewals>, wake: Arc<Notify>, wire: Weak<Wire>) {
    loop {
        let Some(renewer) = renewals.upgrade() else {
            return;
        };
        let (ttl, asked) = match renewer.next() {
            Ok(next) => next,
            Err(next) => {
                drop(renewer);
                match next {
                    Some(at) => tokio::select! {
                        biased;
                        () = wake.notified() => {}
                        () = tokio::time::sleep_until(at) => {}
                    },
                    None => wake.notified().await,
                }
                continue;
            }
        };
        if let Some(ttl) = ttl {
            // Until this round is answered, the group is not due again.
            renewer.due_again(ttl, Instant::now() + ttl / 3);
        }
        let Some(strong) = wire.upgrade() else {
            return;
        };
        let mut failed = false;
        for batch in asked.chunks(BATCH) {
            let track: Vec<&str> = batch.iter().map(|a| a.holder_key.as_str()).collect();
            let args: Vec<&[u8]> = batch
                .iter()
                .flat_map(|a| {
                    [
                        a.base.as_bytes(),
                        a.holder.as_bytes(),
                        a.kind.as_str().as_bytes(),
                        a.ttl_ms.as_bytes(),
                    ]
                })
                .collect();
            match strong.script_then_track(&RENEW, &args, &track).await {
                Ok((Value::Array(answers), existing, sent, ran))
                    if answers.len() == batch.len() =>
                {
                    let current = strong.is_current(&ran);
                    let renewed = answers.iter().filter(|a| **a == Value::Int(1)).count();
                    renewer.renewed(sent, batch, &answers, current);
                    if existing < renewed {
                        // A key went between the script and the EXISTS that armed tracking
                        // again (the MULTI did not hold: a failover?): check the batch again.
                        renewer.check_again(batch);
                    }
                }
                Ok((other, _, _, _)) => {
                    tracing::warn!(answer = ?other, "a renewal answered what this client cannot read");
                    failed = true;
                }
                Err(error) => {
                    tracing::debug!(%error, leases = batch.len(), "renewal failed; retrying");
                    failed = true;
                }
            }
        }
        if failed {
            if let Some(ttl) = ttl {
                let retry = (ttl / 10).clamp(Duration::from_millis(200), Duration::from_secs(1));
                renewer.due_again(ttl, Instant::now() + retry);
            }
        }
    }
}
