//! The semaphore recipe, on the shared queue (the `queue` module).
//!
//! A **semaphore of limit N**: the N oldest keys hold; the others wait in arrival order (FIFO).
//! A waiter's read also counts the keys ahead of it, and it counts their deletions down on the
//! process's one watch of the prefix (shared by all its waiters there: see the `watch`
//! module), so a release makes only the waiter whose turn may have come read, not every
//! waiter. Before, each waiter had a watch of its own and read on every release: 28 answers and
//! 28 reads per release at 32 jobs of limit 4, the stream's many small answers parked by etcd as a
//! "slow watcher" for 10 ms or more. The value is `{"limit": N, "value": <base64>}`: every
//! contender must ask for the limit of the oldest, or gets [`Error::LimitMismatch`].

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::queue::{Count, HISTORY_REPLAY, KeptWatch, Recipe, Removal, Turn, released};
use super::wire::proto::{Event, KeyValue, RangeRequest};
use lease_core::{Error, LeaseSpec};

/// How many of the keys ahead of a semaphore waiter its read counts (more if the limit is
/// higher); further back, it counts down from this many and reads again when that is done.
const COUNTED_AHEAD: usize = 1000;

/// How many keys ahead of it a waiter on a semaphore of `limit` counts: more than the limit, so
/// the count is exact whenever the waiter may be let in.
fn counted_ahead(limit: u32) -> usize {
    COUNTED_AHEAD.max(
        usize::try_from(limit)
            .unwrap_or(usize::MAX)
            .saturating_add(1),
    )
}

/// The semaphore recipe of limit `limit`: the `limit` oldest keys hold.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Semaphore {
    pub(crate) limit: u32,
}

impl Recipe for Semaphore {
    type Count = CountDown;

    fn value(self, spec: &LeaseSpec) -> Vec<u8> {
        SemaphoreValue::encode(self.limit, spec.advertised_value())
    }

    fn ahead(self, key: &str, _: i64) -> RangeRequest {
        RangeRequest::under(key)
            .by_creation(true)
            .limit(i64::from(self.limit))
    }

    fn holding(self, key: &str, created: i64) -> RangeRequest {
        // The slots are the oldest keys, which `ahead` reads.
        self.ahead(key, created)
    }

    /// The keys older than ours (at most [`counted_ahead`]): how many deletions a waiter waits
    /// for, and whether they are all of its kind and limit (see [`CountDown`]).
    fn older(self, key: &str, created: i64) -> Option<RangeRequest> {
        Some(
            RangeRequest::under(key)
                .created_by(created - 1)
                .limit(i64::try_from(counted_ahead(self.limit)).unwrap_or(i64::MAX)),
        )
    }

    fn judge(self, key: &str, own: &str, ahead: &[KeyValue]) -> Result<Turn, Error> {
        let limit = self.limit;
        if let Some(oldest) = ahead.first() {
            let Some(stored) = SemaphoreValue::parse(oldest) else {
                return Err(Error::leader_lock_in_the_way(key));
            };
            if stored.limit != limit {
                return Err(Error::LimitMismatch {
                    key: key.to_owned(),
                    stored: u64::from(stored.limit),
                    requested: u64::from(limit),
                });
            }
        }
        let Some(at) = ahead.iter().position(|kv| kv.key == own.as_bytes()) else {
            return Ok(Turn::WaitFor(RangeRequest::under(key)));
        };
        // A leader contender that joined behind a semaphore holder is refused by its
        // own judgment and goes; until it has, it is not let in beside us.
        if ahead[..at]
            .iter()
            .all(|kv| SemaphoreValue::parse(kv).is_some())
        {
            Ok(Turn::Mine)
        } else {
            Ok(Turn::WaitFor(RangeRequest::under(key)))
        }
    }

    fn count(
        self,
        own: &str,
        created: i64,
        ahead_older: (&[KeyValue], &[KeyValue]),
        read_at: i64,
    ) -> Option<CountDown> {
        Some(CountDown::of(
            own,
            created,
            self.limit,
            ahead_older,
            read_at,
        ))
    }

    fn sequencer_key(self, _: &str, own: &str) -> String {
        own.to_owned()
    }
}

/// The value of a semaphore contender's key: `{"limit":N,"value":"<base64>"}`, exactly.
///
/// It is also what tells a semaphore contender from a leader contender, whose value is its
/// advertised value (`etcdctl elect`'s proposal, or empty for `etcdctl lock`): only a value of
/// exactly this form, a limit of at least 1 and valid base64, is a semaphore's. A leader whose
/// value is such a document would be taken for one.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SemaphoreValue {
    pub(crate) limit: u32,
    /// The advertised value, base64.
    value: String,
}

impl SemaphoreValue {
    pub(crate) fn encode(limit: u32, value: &[u8]) -> Vec<u8> {
        let value = SemaphoreValue {
            limit,
            value: BASE64.encode(value),
        };
        serde_json::to_vec(&value).unwrap_or_default()
    }

    /// The semaphore contender's value in `kv`; `None` if `kv` is a leader contender's.
    pub(crate) fn parse(kv: &KeyValue) -> Option<SemaphoreValue> {
        let parsed = serde_json::from_slice::<SemaphoreValue>(&kv.value).ok()?;
        let valid = parsed.limit >= 1 && BASE64.decode(&parsed.value).is_ok();
        valid.then_some(parsed)
    }

    pub(crate) fn limit_of(prefix: &str, kv: &KeyValue) -> Result<u32, Error> {
        Self::parse(kv)
            .map(|v| v.limit)
            .ok_or_else(|| Error::CorruptLockValue {
                key: kv.key_str(),
                reason: format!("not a semaphore contender of {prefix:?}"),
            })
    }
}

/// A semaphore waiter's place in the queue, kept up to date from the deletions under the prefix
/// so that it reads again only when its turn may have come (or its own key went), not on every
/// release ahead of it. The count never overstates what is ahead: keys only leave the queue ahead
/// of a waiter (a new key is newer than every key there), each deletion of an older key removes
/// exactly one, and the read counts at most [`counted_ahead`] of them.
///
/// When the read counted every key ahead and found them all semaphore contenders of our limit,
/// the count alone lets the waiter in (no read more): fewer than `limit` keys ahead of it at the
/// revision of the deletion that brought it there, every one of them of its kind, is what a read
/// at that revision would judge its turn (the watch delivers every event after the read, in
/// order, and the own key's deletion would have been among them). Otherwise it reads and judges
/// then.
pub(crate) struct CountDown {
    own: Vec<u8>,
    created: i64,
    limit: usize,
    /// Keys older than ours at the read (at least), less those deleted since.
    older: usize,
    /// Whether the read counted every key older than ours.
    exact: bool,
    /// Whether every key older than ours at the read is a semaphore contender of our limit.
    clean: bool,
    /// Whether our own key was seen deleted.
    own_gone: bool,
    /// The revision of the last deletion taken in.
    through: i64,
    /// The revision of the read.
    read_at: i64,
    /// The keys that held at the read and are not yet seen deleted.
    holding: Vec<Vec<u8>>,
    /// Whether a holder went since the read, so some waiter of then may hold now: a deletion
    /// without a release of any key ahead then counts as a holder's.
    moved_up: bool,
    /// The latest holder seen gone without a release.
    worst: Removal,
}

impl CountDown {
    /// The count-down of the waiter with the own key `own` (created at `created`), given the
    /// keys that hold (`ahead`) and the keys older than ours (`older`, read up to
    /// [`counted_ahead`] of them) at the read at revision `read_at`.
    fn of(
        own: &str,
        created: i64,
        limit: u32,
        (ahead, older): (&[KeyValue], &[KeyValue]),
        read_at: i64,
    ) -> CountDown {
        let clean = older
            .iter()
            .all(|kv| SemaphoreValue::parse(kv).is_some_and(|value| value.limit == limit));
        CountDown {
            read_at,
            own: own.as_bytes().to_vec(),
            created,
            limit: usize::try_from(limit).unwrap_or(usize::MAX),
            older: older.len(),
            exact: older.len() < counted_ahead(limit),
            clean,
            own_gone: false,
            through: read_at,
            holding: ahead.iter().map(|kv| kv.key.clone()).collect(),
            moved_up: false,
            worst: Removal::Released,
        }
    }
}

impl Count for CountDown {
    /// Takes in one deletion (after the read); true once the waiter should read again (or may
    /// be in: see [`turn_at`](CountDown::turn_at)).
    fn deleted(&mut self, event: &Event) -> bool {
        let key = event.kv.as_ref().map(|kv| kv.key.as_slice());
        self.through = self.through.max(event.kv().mod_revision);
        if key == Some(self.own.as_slice()) {
            // Our own key went: the read finds out and joins again.
            self.own_gone = true;
            return true;
        }
        let Some(prev) = &event.prev_kv else {
            // Cannot tell whose key it was (etcd compacted the previous revision), nor count it.
            self.worst = Removal::unannounced();
            self.exact = false;
            return true;
        };
        if prev.create_revision >= self.created {
            // Behind us.
            return false;
        }
        self.older = self.older.saturating_sub(1);
        let was_holding = match self.holding.iter().position(|k| *k == prev.key) {
            Some(at) => {
                self.holding.swap_remove(at);
                self.moved_up = true;
                true
            }
            None => self.moved_up,
        };
        if was_holding && !released(event) {
            // Settled for when our turn comes.
            self.worst = Removal::unannounced();
        }
        self.older < self.limit
    }

    /// The revision at which the waiter holds, if the count alone tells (see [`CountDown`]).
    fn turn_at(&self) -> Option<i64> {
        let counted = self.exact && self.clean && !self.own_gone;
        (counted && self.older < self.limit).then_some(self.through)
    }

    /// The latest holder gone without a release since the last call (or the read).
    fn take_worst(&mut self) -> Removal {
        std::mem::replace(&mut self.worst, Removal::Released)
    }

    /// After a read at `revision` found `older` keys ahead of us: the deletions it saw that the
    /// watch had not delivered yet (the count tells how many), taken from the watch, since one
    /// of them may have been a holder's without a release. Bounded by [`HISTORY_REPLAY`]; what
    /// cannot be told counts as a removal without a release.
    async fn catch_up(
        mut self,
        kept: &mut Option<KeptWatch>,
        revision: i64,
        older: usize,
    ) -> Removal {
        if older >= self.limit || self.older <= older && self.exact {
            // Not let in by this read, or nothing missed.
            return Removal::Released;
        }
        let Some(KeptWatch { stream, .. }) = kept.as_mut().filter(|_| self.exact) else {
            // We cannot tell what we missed.
            return Removal::unannounced();
        };
        let deadline = Instant::now() + HISTORY_REPLAY;
        while self.older > older {
            let Ok(Ok(batch)) = tokio::time::timeout_at(deadline, stream.next()).await else {
                *kept = None;
                return Removal::unannounced();
            };
            let (seen, later): (Vec<Event>, Vec<Event>) = batch
                .events
                .into_iter()
                .partition(|e| e.kv().mod_revision <= revision);
            let read_at = self.read_at;
            let since_count = |e: &&Event| e.is_delete() && e.kv().mod_revision > read_at;
            for deletion in seen.iter().filter(since_count) {
                self.deleted(deletion);
            }
            if !later.is_empty() {
                // The watch is past the read: it delivered everything the read saw.
                stream.put_back(later);
                if self.older > older {
                    return Removal::unannounced();
                }
            }
        }
        self.take_worst()
    }
}

#[cfg(test)]
mod tests;
