//! The leader lock: one holder of a key, interoperating with `consul lock`.
//!
//! Acquire (seed 002): create a session (behaviour release, as `consul lock` does), then
//! `PUT ?acquire=` the key with `consul lock`'s flags and the advertised value. A held key is
//! waited for with blocking queries on its index. A free key that refuses the acquire is under
//! lock-delay (its last holder's session was invalidated); we retry after a short, growing pause
//! rather than `consul lock`'s fixed 5 s.
//!
//! Hold: a consistent blocking query on the key. The lease is lost when the key is deleted, held by
//! another (LockIndex, Session), or no longer held (then one read of our session tells an
//! invalidated session from an operator's `?release=`), and when the session's renew loop gives
//! up (invalidated, or self-fenced).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::http::{ApiError, Behavior, Blocking, ConsulHttp, KvEntry};
use super::retry::{Backoff, retry_transient, within};
use super::session::{self, KeepAlive, Session, SessionEnd};
use crate::lease::{self, Checker, Hold};
use crate::{BackendKind, BoxFuture, Error, Lease, LeaseSpec, LostReason, Sequencer, Wait};

/// The flags `consul lock` (and Consul's Go `api.Lock`) put on a leader lock key.
pub(crate) const LEADER_FLAGS: u64 = 0x2ddc_cbc0_58a5_0c18;

/// How long one blocking query waits before Consul answers unchanged.
const WATCH_WAIT: Duration = Duration::from_secs(300);

/// First pause after an acquire refused by lock-delay; doubles up to [`LOCK_DELAY_MAX_PAUSE`].
const LOCK_DELAY_FIRST_PAUSE: Duration = Duration::from_millis(25);
const LOCK_DELAY_MAX_PAUSE: Duration = Duration::from_secs(1);

/// Acquires the leader lock `spec` names (validated by the caller).
pub(crate) async fn acquire(http: &Arc<ConsulHttp>, spec: &LeaseSpec) -> Result<Lease, Error> {
    let started = Instant::now();
    let deadline = match spec.wait_policy() {
        Wait::Forever => None,
        Wait::UpTo(d) => Some(started + d),
        Wait::Never => Some(started),
    };
    loop {
        let (session, mut keep_alive) = Session::create(http, spec, Behavior::Release).await?;
        let outcome = tokio::select! {
            biased;
            end = &mut keep_alive => Err(end),
            result = contend(http, session.id(), spec, started, deadline) => Ok(result),
        };
        match outcome {
            Ok(Ok(held)) => return Ok(hold(http, spec, session, keep_alive, held)),
            Ok(Err(error)) => {
                // Give the session back now, so a caller that asked not to wait leaves nothing behind.
                let _ = session.destroy().await;
                return Err(error);
            }
            // Our waiting session was destroyed (by an operator, or it expired): wait with a new one.
            Err(SessionEnd::Invalidated) => continue,
            Err(SessionEnd::Fenced { last_error, .. }) => {
                return Err(Error::Backend {
                    backend: "Consul",
                    operation: format!("keep a session alive while waiting for {:?}", spec.key()),
                    message: last_error.unwrap_or_else(|| "renewals did not succeed".into()),
                });
            }
        }
    }
}

/// What a successful contention learned about our acquisition.
struct Held {
    lock_index: u64,
    modify_index: u64,
}

/// Tries to take the key until it is ours or the deadline passes.
async fn contend(
    http: &ConsulHttp,
    session: &str,
    spec: &LeaseSpec,
    started: Instant,
    deadline: Option<Instant>,
) -> Result<Held, Error> {
    let key = spec.key();
    let busy = || Error::Busy {
        key: key.to_owned(),
        waited: started.elapsed(),
    };
    let mut index = 0;
    let mut lock_delay_pause = LOCK_DELAY_FIRST_PAUSE;
    loop {
        let blocking = match deadline {
            _ if index == 0 => None,
            None => Some(Blocking {
                index,
                wait: WATCH_WAIT,
            }),
            Some(deadline) => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(busy());
                }
                Some(Blocking {
                    index,
                    wait: left.min(WATCH_WAIT),
                })
            }
        };
        let (entry, new_index) = read_retrying(http, key, blocking, deadline).await?;
        // Consul's rule for blocking queries: an index that went backwards means start over.
        index = if new_index < index {
            0
        } else {
            new_index.max(1)
        };
        if let Some(entry) = &entry {
            if entry.flags != LEADER_FLAGS {
                return Err(Error::FlagsConflict {
                    key: key.to_owned(),
                    found: entry.flags,
                    expected: LEADER_FLAGS,
                });
            }
            if entry.holder().is_some_and(|h| h != session) {
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    return Err(busy());
                }
                continue;
            }
        }
        let acquired = http
            .kv_acquire(key, session, LEADER_FLAGS, spec.advertised_value())
            .await
            .map_err(|e| e.into_error(http, format_args!("acquire {key:?}")))?;
        if acquired {
            let (entry, _) = read_retrying(http, key, None, None).await?;
            match entry {
                Some(e) if e.holder() == Some(session) => {
                    return Ok(Held {
                        lock_index: e.lock_index,
                        modify_index: e.modify_index,
                    });
                }
                // Taken from us between the acquire and the read (an operator): contend again.
                _ => {
                    index = 0;
                    continue;
                }
            }
        }
        // Refused. Either someone else won the race (the next read shows them), or the key is
        // free but under lock-delay: then pause briefly, growing, never past the deadline.
        let (entry, new_index) = read_retrying(http, key, None, deadline).await?;
        index = new_index.max(1);
        if entry.as_ref().is_some_and(|e| e.holder().is_some()) {
            continue;
        }
        let pause_until = Instant::now() + lock_delay_pause;
        if let Some(d) = deadline {
            if pause_until >= d {
                return Err(busy());
            }
        }
        tracing::debug!(pause = ?lock_delay_pause, "key is free but under lock-delay");
        tokio::time::sleep_until(pause_until).await;
        lock_delay_pause = (lock_delay_pause * 2).min(LOCK_DELAY_MAX_PAUSE);
        index = 0;
    }
}

/// Reads `key`, retrying transient failures until `deadline` (if any).
async fn read_retrying(
    http: &ConsulHttp,
    key: &str,
    blocking: Option<Blocking>,
    deadline: Option<Instant>,
) -> Result<(Option<KvEntry>, u64), Error> {
    retry_transient(deadline, || http.kv_get(key, blocking))
        .await
        .map_err(|e| e.into_error(http, format_args!("read {key:?}")))
}

/// Turns a successful contention into a lease and starts its holder task.
fn hold(
    http: &Arc<ConsulHttp>,
    spec: &LeaseSpec,
    session: Session,
    keep_alive: KeepAlive,
    held: Held,
) -> Lease {
    let key = spec.key().to_owned();
    let sequencer = Sequencer::new(BackendKind::Consul, &key, held.lock_index, session.id());
    let (lease, holding) = Lease::new(
        sequencer.clone(),
        Box::new(LeaderChecker {
            http: Arc::clone(http),
        }),
    );
    tracing::info!(%sequencer, "lease acquired");
    lease::spawn_keeper(
        holding,
        LeaderHold {
            session,
            keep_alive,
            key,
            lock_index: held.lock_index,
            index: held.modify_index,
        },
    );
    lease
}

/// Compares the key as read with the acquisition `sequencer` names: `None` if it still holds.
async fn verdict(
    http: &ConsulHttp,
    entry: Option<&KvEntry>,
    sequencer_session: &str,
    lock_index: u64,
) -> Option<LostReason> {
    let Some(entry) = entry else {
        return Some(LostReason::KeyDeleted);
    };
    match entry.holder() {
        Some(holder) if holder == sequencer_session && entry.lock_index == lock_index => None,
        Some(holder) => Some(LostReason::KeyTaken {
            lock_index: entry.lock_index,
            session: holder.to_owned(),
        }),
        // Released: by an operator, or because the session was invalidated. One read tells.
        None => match http.session_exists(sequencer_session).await {
            Ok(false) => Some(LostReason::SessionInvalidated),
            Ok(true) | Err(_) => Some(LostReason::KeyReleased),
        },
    }
}

struct LeaderHold {
    session: Session,
    keep_alive: KeepAlive,
    key: String,
    lock_index: u64,
    index: u64,
}

impl Hold for LeaderHold {
    async fn watch(&mut self) -> LostReason {
        // The renew loop is polled here, in the same task, so the self-fencing deadline fires even
        // while the blocking queries hang on a dead network. The session's own watch names an
        // invalidation at once; the key's watch catches every other way to lose the key.
        tokio::select! {
            biased;
            end = &mut self.keep_alive => end.into(),
            end = session::watch_invalidation(self.session.http(), self.session.id()) => end.into(),
            reason = monitor_key(&self.session, &self.key, self.lock_index, &mut self.index) => reason,
        }
    }

    async fn release(self) -> Result<(), Error> {
        let http = Arc::clone(self.session.http());
        let released = release_key(&http, &self.key, self.session.id()).await;
        // Destroying the session also releases the key if the release above failed (subject to
        // lock-delay then), so do it in every case.
        let destroyed = self.session.destroy().await;
        released.and(destroyed)
    }

    async fn clean_up(self) {
        if let Err(error) = self.session.destroy().await {
            tracing::warn!(%error, "could not destroy the session of a lost lease; it expires with its TTL");
        }
    }
}

/// Blocks on the key until it no longer shows our acquisition. Borrows only what it needs, so
/// the renew loop can be polled beside it.
async fn monitor_key(session: &Session, key: &str, lock_index: u64, index: &mut u64) -> LostReason {
    let http = session.http();
    let mut backoff = Backoff::new();
    loop {
        let blocking = Blocking {
            index: *index,
            wait: WATCH_WAIT,
        };
        match http.kv_get(key, Some(blocking)).await {
            Ok((entry, new_index)) => {
                backoff.reset();
                if let Some(reason) = verdict(http, entry.as_ref(), session.id(), lock_index).await
                {
                    return reason;
                }
                *index = if new_index < *index { 0 } else { new_index };
            }
            // Brief trouble is not loss: retry; the renew loop self-fences if it lasts.
            Err(error) => {
                tracing::debug!(%error, "watching the lease failed; retrying");
                backoff.wait().await;
            }
        }
    }
}

/// `PUT ?release=`, retrying brief trouble for a few seconds. A `false` answer means the key
/// was no longer ours: nothing to give back.
async fn release_key(http: &ConsulHttp, key: &str, session: &str) -> Result<(), Error> {
    retry_transient(within(Duration::from_secs(5)), || {
        http.kv_release(key, session, LEADER_FLAGS)
    })
    .await
    .map(drop)
    .map_err(|e| e.into_error(http, format_args!("release {key:?}")))
}

/// `Lease::check` for a leader lock: one consistent read of the key.
struct LeaderChecker {
    http: Arc<ConsulHttp>,
}

impl Checker for LeaderChecker {
    fn check<'a>(&'a self, sequencer: &'a Sequencer) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(check_sequencer(&self.http, sequencer))
    }
}

/// Whether `sequencer` is still the current holder of its leader key.
pub(crate) async fn check_sequencer(http: &ConsulHttp, sequencer: &Sequencer) -> Result<(), Error> {
    let (entry, _) = http
        .kv_get(sequencer.key(), None)
        .await
        .map_err(|e: ApiError| e.into_error(http, format_args!("read {:?}", sequencer.key())))?;
    match verdict(http, entry.as_ref(), sequencer.holder(), sequencer.index()).await {
        None => Ok(()),
        Some(reason) => Err(Error::Lost(reason)),
    }
}
