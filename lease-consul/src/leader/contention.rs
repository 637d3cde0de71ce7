//! One contention for a leader key: reading and watching it, judging each state (who holds it,
//! whether its last holder may still be stopping), and the acquire transaction.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::client::Client;
use crate::kind::{LEADER_FLAGS, OtherKind, Verdict};
use crate::session::{Holding, ReleasedSessions};
use crate::watch::{Interest, Listing, Watched};
use crate::wire::{ApiError, ConsulHttp, KvEntry, TxnOp};
use lease_core::semaphore::{SEMAPHORE_FLAGS, lock_key};
use lease_core::{Error, LeaseSpec};
use lease_http::retry_transient;

/// First pause after an acquire refused by lock-delay; doubles up to [`LOCK_DELAY_MAX_PAUSE`].
const LOCK_DELAY_FIRST_PAUSE: Duration = Duration::from_millis(25);
const LOCK_DELAY_MAX_PAUSE: Duration = Duration::from_secs(1);
/// The least time a read of the key gets, whatever the acquire's deadline.
const READ_GRACE: Duration = Duration::from_secs(5);

/// How a contention ended, short of an error.
pub(super) enum Contended {
    Acquired(Acquired),
    /// The session we contend with no longer exists.
    SessionGone,
}

/// What a successful contention learned about our acquisition.
pub(super) struct Acquired {
    pub(super) lock_index: u64,
    pub(super) modify_index: u64,
    /// The key's CreateIndex: the sequencer's generation, so that a re-created key's holders
    /// (whose LockIndex restarts at 1) order after the old key's.
    pub(super) create_index: u64,
}

/// Tries to take the key until it is ours or the deadline passes.
///
/// A holder that loses the key without a clean release (the key deleted, or its session
/// invalidated under a lock-delay of 0) is still stopping its work for a moment: the key is left
/// alone until `LeaseSpec::settle_time` after that was seen. The contender keeps watching while
/// it settles, so a holder that takes the key meanwhile and loses it the same way is seen too;
/// every state read, whether from the watch or after a refused acquire, is judged the same way.
/// A holder that came and went between two reads (the watch answers with the latest state; a
/// refused acquire means another contender won) shows in what the two imply: the key gone, or
/// a LockIndex never seen held, is such a loss, and the contender settles for it as well,
/// unless this client gave that holding back itself (see `ReleasedSessions`).
pub(super) async fn contend(
    client: &Client,
    session: &str,
    spec: &LeaseSpec,
    started: Instant,
    deadline: Option<Instant>,
) -> Result<Contended, Error> {
    let mut contention = Contention::new(client, session, spec, started, deadline);
    let mut watched = client
        .watches()
        .watch(Interest::Key(spec.key().to_owned()), false, None);
    loop {
        let entry = contention.next_state(&mut watched).await?;
        if contention.held_by_another(entry.as_ref()).await? {
            continue;
        }
        contention.settle_after_last_holder(entry.as_ref()).await;
        if contention.settling()? {
            // Wait for the next state or the settle's end, whichever comes first.
            continue;
        }
        match contention.try_lock_watching(&mut watched).await? {
            Attempt::Acquired(acquired) => return Ok(Contended::Acquired(acquired)),
            Attempt::Again => continue,
            Attempt::Refused => {}
        }
        if contention.after_refusal().await? {
            return Ok(Contended::SessionGone);
        }
    }
}

/// What one `?acquire=` transaction came to.
enum Attempt {
    Acquired(Acquired),
    /// The key was ours to take, but the semaphore check failed on a state now understood: try
    /// again on the same state.
    Again,
    /// Someone else won the race, the key is under lock-delay, or our session is gone.
    Refused,
}

/// One contention for a leader key: what [`contend`] has learned so far.
struct Contention<'a> {
    http: &'a ConsulHttp,
    /// The sessions this client released cleanly (no settling after those).
    released: &'a ReleasedSessions,
    session: &'a str,
    spec: &'a LeaseSpec,
    key: &'a str,
    started: Instant,
    deadline: Option<Instant>,
    /// Where a semaphore on this name would be, and what the acquire asserts of it (see `kind`).
    semaphore_lock: String,
    semaphore: OtherKind,
    /// The index of the last state judged; `None`: read the key afresh.
    index: Option<u64>,
    /// A state already read (after a refused acquire), to judge before waiting for the next.
    read: Option<Option<KvEntry>>,
    /// The last state judged (judged again when a settle ends with nothing new); `None` until
    /// one was.
    last: Option<Option<KvEntry>>,
    /// The state judged before `last`; `None` until two were.
    previous: Option<Option<KvEntry>>,
    lock_delay_pause: Duration,
    /// The other session last seen holding the key, and its lock-delay once read.
    seen_holder: Option<(String, Option<Duration>)>,
    settle_until: Option<Instant>,
}

impl<'a> Contention<'a> {
    fn new(
        client: &'a Client,
        session: &'a str,
        spec: &'a LeaseSpec,
        started: Instant,
        deadline: Option<Instant>,
    ) -> Self {
        let key = spec.key();
        Contention {
            http: client.wire(),
            released: client.released(),
            session,
            spec,
            key,
            started,
            deadline,
            semaphore_lock: lock_key(key),
            semaphore: OtherKind::Absent,
            index: None,
            read: None,
            last: None,
            previous: None,
            lock_delay_pause: LOCK_DELAY_FIRST_PAUSE,
            seen_holder: None,
            settle_until: None,
        }
    }

    fn busy(&self) -> Error {
        Error::Busy {
            key: self.key.to_owned(),
            waited: self.started.elapsed(),
        }
    }

    fn past_deadline(&self, at: Instant) -> bool {
        self.deadline.is_some_and(|d| at >= d)
    }

    /// The next state of the key to judge: one already read, a fresh read, the watch's next
    /// change, or (when a settle ends with nothing new) the last state again.
    async fn next_state(&mut self, watched: &mut Watched) -> Result<Option<KvEntry>, Error> {
        let entry = match (self.read.take(), self.index) {
            (Some(entry), _) => entry,
            (None, None) => {
                let (entry, read_at) = read_retrying(self.http, self.key, self.deadline).await?;
                self.index = Some(read_at);
                entry
            }
            (None, Some(read_at)) => {
                let changed = async {
                    loop {
                        if let Ok(listing) = watched.next(read_at + 1).await {
                            return listing;
                        }
                    }
                };
                // While settling, wake when the settle ends too, to judge the last state again.
                let settling = self.settle_until.filter(|until| *until > Instant::now());
                let listing = match [settling, self.deadline].into_iter().flatten().min() {
                    None => Some(changed.await),
                    Some(wake) => tokio::time::timeout_at(wake, changed).await.ok(),
                };
                match listing {
                    Some(listing) => {
                        self.index = Some(listing.index);
                        listing.get(self.key).cloned()
                    }
                    None if self.past_deadline(Instant::now()) => return Err(self.busy()),
                    None => self.last.clone().flatten(),
                }
            }
        };
        self.judging(entry.clone());
        Ok(entry)
    }

    /// `entry` is the state judged next: the last one judged becomes the one before it.
    fn judging(&mut self, entry: Option<KvEntry>) {
        self.previous = self.last.replace(entry);
    }

    /// Whether another session holds the key (then wait for the next state); refuses a key of
    /// another kind.
    async fn held_by_another(&mut self, entry: Option<&KvEntry>) -> Result<bool, Error> {
        let Some(entry) = entry else {
            return Ok(false);
        };
        if entry.flags != LEADER_FLAGS {
            return Err(Error::FlagsConflict {
                key: self.key.to_owned(),
                found: entry.flags,
                expected: LEADER_FLAGS,
            });
        }
        if !self.note_holder(entry).await {
            return Ok(false);
        }
        if self.past_deadline(Instant::now()) {
            return Err(self.busy());
        }
        Ok(true)
    }

    /// Whether another session holds `entry`: remembered as the holder last seen (with its
    /// lock-delay, read once).
    async fn note_holder(&mut self, entry: &KvEntry) -> bool {
        let Some(holder) = entry.holder().filter(|h| *h != self.session) else {
            return false;
        };
        if self
            .seen_holder
            .as_ref()
            .is_none_or(|(seen, _)| seen != holder)
        {
            let key = self.key;
            tracing::debug!(%key, %holder, "the key is held by another session; waiting");
            let lock_delay = self.http.session_lock_delay(holder).await.ok().flatten();
            self.seen_holder = Some((holder.to_owned(), lock_delay));
        }
        true
    }

    /// After the holder last seen let go, or one this contender did not see: settle if it may
    /// still be stopping its work.
    async fn settle_after_last_holder(&mut self, entry: Option<&KvEntry>) {
        let unseen = self.previous.as_ref().and_then(|previous| {
            unseen_holding(previous.as_ref(), entry).and_then(|loss| match (loss, entry) {
                (UnseenLoss::Removed, _) => Some(self.spec.settle_after_removal()),
                // Given back by this very client: its work has stopped.
                (UnseenLoss::Released, Some(now))
                    if self.released.gave_back(&self.holding(now)) =>
                {
                    None
                }
                (UnseenLoss::Released, _) => Some(self.spec.settle_time()),
            })
        });
        let seen = match self.seen_holder.take() {
            None => None,
            Some((previous, lock_delay)) => match entry {
                // Deleted under its holder: no lock-delay applies.
                None => Some(self.spec.settle_after_removal()),
                // Released. Cleanly (its session still exists, or its lock-delay protects the
                // key, and Consul refuses us while it runs), or by an invalidation Consul does
                // not delay.
                Some(_) if lock_delay.is_some_and(|d| d >= self.spec.settle_time()) => None,
                // Released cleanly by this very client.
                Some(_) if self.released.contains(&previous) => None,
                Some(_) => match self.http.session_exists(&previous).await {
                    Ok(true) => None,
                    Ok(false) | Err(_) => Some(self.spec.settle_time()),
                },
            },
        };
        if let Some(settle) = seen.max(unseen) {
            self.settle_for(settle);
        }
    }

    /// The holding `entry` (a state of the key) shows the last holder had.
    fn holding(&self, entry: &KvEntry) -> Holding {
        Holding {
            key: self.key.to_owned(),
            create_index: entry.create_index,
            lock_index: entry.lock_index,
        }
    }

    /// Leaves the key alone for `settle` from now, or longer if a settle already runs longer.
    fn settle_for(&mut self, settle: Duration) {
        let until = Instant::now() + settle;
        self.settle_until = Some(self.settle_until.map_or(until, |u| u.max(until)));
    }

    /// Whether a settle is still running (busy if it would outlast the deadline).
    fn settling(&self) -> Result<bool, Error> {
        let Some(until) = self.settle_until.filter(|until| *until > Instant::now()) else {
            return Ok(false);
        };
        if self.past_deadline(until) {
            return Err(self.busy());
        }
        tracing::debug!(
            ?until,
            "the last holder lost the key without a release; settling"
        );
        Ok(true)
    }

    /// [`try_lock`](Self::try_lock), following the watch while it is on its way: an acquire
    /// that waits its turn for a connection (a client's budget shared by many leases) may find
    /// the key free only because a holder came and went meanwhile, one the watch showed. Those
    /// states are judged as any other once the key is ours, and the work starts only when the
    /// settle they call for ends (lease-sim's Consul seeds 271, 1684, 1805, 2427, 2477: a
    /// contender took the key 4 ms after an operator deleted it under a holder that had it for
    /// 1 ms, the listing that showed it held having come while the acquire waited).
    async fn try_lock_watching(&mut self, watched: &mut Watched) -> Result<Attempt, Error> {
        let after = self.index.map_or(0, |index| index + 1);
        let mut meanwhile = Vec::new();
        let attempt = {
            let lock = self.try_lock();
            tokio::pin!(lock);
            loop {
                tokio::select! {
                    biased;
                    attempt = &mut lock => break attempt?,
                    Ok(listing) = watched.next(after) => meanwhile.push(listing),
                }
            }
        };
        if let Attempt::Acquired(acquired) = &attempt {
            self.judge_meanwhile(&meanwhile, acquired).await;
            if let Some(until) = self.settle_until.filter(|until| *until > Instant::now()) {
                tracing::debug!(
                    ?until,
                    "a holder came and went while the acquire was on its way; settling before the work starts"
                );
                tokio::time::sleep_until(until).await;
            }
        }
        Ok(attempt)
    }

    /// Judges the states the watch showed while the acquire was on its way (those before it),
    /// then the key as it was just before the acquisition: released at the LockIndex before
    /// ours, or gone (our acquire created it again), which tells of a holder seen losing it, or
    /// of one never seen (see [`unseen_holding`]).
    async fn judge_meanwhile(&mut self, meanwhile: &[Arc<Listing>], acquired: &Acquired) {
        for listing in meanwhile
            .iter()
            .take_while(|listing| listing.index < acquired.modify_index)
        {
            let entry = listing.get(self.key).cloned();
            self.judging(entry.clone());
            if let Some(held) = &entry {
                if self.note_holder(held).await {
                    continue;
                }
            }
            self.settle_after_last_holder(entry.as_ref()).await;
        }
        let lock_index = acquired.lock_index.saturating_sub(1);
        let before = match self.last.clone().flatten() {
            Some(last) if last.create_index == acquired.create_index => Some(KvEntry {
                session: None,
                lock_index,
                ..last
            }),
            Some(_) => None,
            None if lock_index > 0 => Some(KvEntry {
                key: self.key.to_owned(),
                flags: LEADER_FLAGS,
                value: None,
                session: None,
                lock_index,
                modify_index: 0,
                create_index: acquired.create_index,
            }),
            None => None,
        };
        self.judging(before.clone());
        self.settle_after_last_holder(before.as_ref()).await;
    }

    /// `?acquire=` as a transaction: its answer carries the LockIndex, so no read follows (none
    /// that could hang after the lock is ours). Its first operation asserts that no semaphore
    /// uses the name (see `kind`): no request of its own.
    async fn try_lock(&mut self) -> Result<Attempt, Error> {
        let (http, key) = (self.http, self.key);
        let check = self.semaphore.check(&self.semaphore_lock);
        let lock_op = usize::from(check.is_some());
        let lock = TxnOp::Lock {
            key,
            session: self.session,
            value: self.spec.advertised_value(),
            flags: LEADER_FLAGS,
        };
        let ops: Vec<TxnOp<'_>> = check.into_iter().chain([lock]).collect();
        let locked = http
            .txn(&ops)
            .await
            .map_err(|e| e.into_error(http, format_args!("acquire {key:?}")))?;
        let failed = match locked {
            Ok(entries) => {
                let ours = entries.iter().find(|e| e.key == key);
                return ours
                    .map(|e| {
                        Attempt::Acquired(Acquired {
                            lock_index: e.lock_index,
                            modify_index: e.modify_index,
                            create_index: e.create_index,
                        })
                    })
                    .ok_or_else(|| Error::Backend {
                        backend: "Consul",
                        operation: format!("acquire {key:?}"),
                        message: "the transaction's answer does not name the key".into(),
                        transient: false,
                    });
            }
            Err(failed) => failed,
        };
        if lock_op == 1 && failed.contains(&0) {
            // `<key>/.lock` exists, or changed since we read it: one read tells a semaphore
            // (refused for good) from anything else (asserted from now on).
            let semaphore_lock = &self.semaphore_lock;
            let lock_read = read_raw(http, semaphore_lock, self.deadline).await;
            let verdict =
                OtherKind::after_failed_check(lock_read.map(|(entry, _)| entry), SEMAPHORE_FLAGS)
                    .map_err(|e| e.into_error(http, format_args!("read {semaphore_lock:?}")))?;
            match verdict {
                Verdict::Refuse => return Err(Error::semaphore_in_the_way(&**semaphore_lock)),
                Verdict::Assert(next) => self.semaphore = next,
            }
            if !failed.contains(&lock_op) {
                // The key itself was ours to take: try again on the same state.
                self.read = Some(self.last.clone().flatten());
                return Ok(Attempt::Again);
            }
        }
        Ok(Attempt::Refused)
    }

    /// After a refused acquire: either someone else won the race (the next read shows them), or
    /// the key is free but under lock-delay, or our session is gone (`true`): then pause
    /// briefly, growing, never past the deadline.
    async fn after_refusal(&mut self) -> Result<bool, Error> {
        let (entry, read_at) = read_retrying(self.http, self.key, self.deadline).await?;
        self.index = Some(read_at);
        if entry.as_ref().is_some_and(|e| e.holder().is_some()) {
            // Judged like any other state: its holder is seen, so a deletion under it settles.
            self.read = Some(entry);
            return Ok(false);
        }
        if let Ok(false) = self.http.session_exists(self.session).await {
            return Ok(true);
        }
        if entry.is_none() {
            // Refused a key that is not there: another contender took it and lost it to a
            // deletion before this read (or Consul's lock-delay outlives the key).
            self.settle_for(self.spec.settle_after_removal());
        }
        let pause_until = Instant::now() + self.lock_delay_pause;
        if self.past_deadline(pause_until) {
            return Err(self.busy());
        }
        tracing::debug!(pause = ?self.lock_delay_pause, "key is free but under lock-delay");
        tokio::time::sleep_until(pause_until).await;
        self.lock_delay_pause = (self.lock_delay_pause * 2).min(LOCK_DELAY_MAX_PAUSE);
        self.index = None;
        Ok(false)
    }
}

/// How a holder this contender never saw lost the key, judged from two states read one after
/// the other with the holding between them (the watch answers with the latest state only; a
/// refused acquire means someone else won).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum UnseenLoss {
    /// The key went (or went and came back): deleted, maybe under its holder.
    Removed,
    /// The key was taken and released in between, perhaps by an invalidation.
    Released,
}

fn unseen_holding(before: Option<&KvEntry>, now: Option<&KvEntry>) -> Option<UnseenLoss> {
    match (before, now) {
        (Some(_), None) => Some(UnseenLoss::Removed),
        (_, Some(now)) if now.holder().is_some() || now.lock_index == 0 => None,
        (Some(before), Some(now)) if now.create_index != before.create_index => {
            Some(UnseenLoss::Removed)
        }
        (Some(before), Some(now)) if now.lock_index > before.lock_index => {
            Some(UnseenLoss::Released)
        }
        (None, Some(_)) => Some(UnseenLoss::Released),
        _ => None,
    }
}

/// Reads `key`, retrying transient failures until `deadline` (if any). The deadline is how long
/// to wait for *another holder*; a read queued behind many of this client's own requests (its
/// connection budget) still gets [`READ_GRACE`] to answer.
async fn read_retrying(
    http: &ConsulHttp,
    key: &str,
    deadline: Option<Instant>,
) -> Result<(Option<KvEntry>, u64), Error> {
    read_raw(http, key, deadline)
        .await
        .map_err(|e| e.into_error(http, format_args!("read {key:?}")))
}

/// [`read_retrying`], with Consul's error as it came.
async fn read_raw(
    http: &ConsulHttp,
    key: &str,
    deadline: Option<Instant>,
) -> Result<(Option<KvEntry>, u64), ApiError> {
    let give_up = deadline.map(|d| d.max(Instant::now() + READ_GRACE));
    retry_transient(give_up, || http.kv_get(key)).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(session: Option<&str>, lock_index: u64, create_index: u64) -> KvEntry {
        KvEntry {
            key: "k".into(),
            flags: LEADER_FLAGS,
            value: None,
            session: session.map(str::to_owned),
            lock_index,
            modify_index: create_index + lock_index,
            create_index,
        }
    }

    #[test]
    fn a_holding_between_two_reads_is_judged_a_loss() {
        let unheld = key(None, 13, 5);
        // Gone since: deleted, perhaps under a holder never seen.
        assert_eq!(
            unseen_holding(Some(&unheld), None),
            Some(UnseenLoss::Removed)
        );
        // Gone and created again by an acquire, then released.
        let recreated = key(None, 1, 40);
        assert_eq!(
            unseen_holding(Some(&unheld), Some(&recreated)),
            Some(UnseenLoss::Removed)
        );
        // Taken and released in between.
        let next = key(None, 14, 5);
        assert_eq!(
            unseen_holding(Some(&unheld), Some(&next)),
            Some(UnseenLoss::Released)
        );
        assert_eq!(
            unseen_holding(None, Some(&recreated)),
            Some(UnseenLoss::Released)
        );
    }

    #[test]
    fn states_that_hide_no_holding_are_not() {
        let unheld = key(None, 13, 5);
        assert_eq!(unseen_holding(Some(&unheld), Some(&unheld)), None);
        assert_eq!(unseen_holding(None, None), None);
        // A holder now seen is judged when it lets go.
        let held = key(Some("s"), 14, 5);
        assert_eq!(unseen_holding(Some(&unheld), Some(&held)), None);
        // The holder last seen released it: judged by its session, not here.
        let released = key(None, 14, 5);
        assert_eq!(unseen_holding(Some(&held), Some(&released)), None);
        // A key never locked (not a holding).
        assert_eq!(unseen_holding(None, Some(&key(None, 0, 9))), None);
    }
}
