//! Acquiring a lease, and checking a sequencer.
//!
//! An attempt is one call of the `acquire` script on the name's keys (see the `wire` module's
//! scripts for the layout). It counts the name's holders: live ones (their holder keys exist),
//! and those removed without a release (an operator's `DEL`, an eviction) whose settle time,
//! counted from the moment a script first noticed, has not run out (never past the expiry they
//! had: by then they fenced themselves); it forgets the rest. A leader key admits one holder, a
//! semaphore `limit`. Waiters stand in line, in a sorted set ordered by a ticket drawn when they
//! first join: a free slot goes to the first waiter in line, so leader waiters and semaphore
//! waiters are served in FIFO order, and a contender that does not wait (`Wait::Never`) does not
//! jump the line. The taker gets a fencing token: above the name's previous token and at least
//! the server's clock in microseconds, so tokens rise with every acquisition even if the
//! name's keys were deleted (or lost in a failover) meanwhile, as long as the server's clock
//! does not step back past them.
//!
//! **Waiting without polling.** A waiter subscribes to its name's wake-up channel before its
//! first attempt. A script that frees a slot (a release, a waiter leaving the line) publishes the
//! IDs of the waiters now first in line, and only those try again; a holder found gone wakes
//! every waiter of the name (each learns its bar). Otherwise a waiter sleeps until the time its
//! attempt answered: when the holder's key expires, a bar ends, or a waiter ahead of it whose
//! process died loses its place. A waiter refreshes its place in line every TTL/3 (its place
//! expires a TTL after its last attempt), so a dead waiter holds up the line for one TTL at most.
//!
//! **Replicas.** When the server has replicas and the handle waits for them (the default), an
//! acquisition is returned only after `WAIT` saw it reach all of them; otherwise it is given
//! back and tried again within the wait (`Redis`'s docs say what that promises).
//!
//! A cancelled acquisition gives back what its attempt may have taken, and its place in line, in
//! the background.

use std::sync::Arc;
use std::time::Duration;

use lease_core::backend::Fence;
use lease_core::{
    Backend, BackendKind, Error, Lease, LeaseSpec, LostReason, Sequencer, Target, Wait,
};
use redis::Value;
use tokio::time::Instant;

use crate::client::Shared;
use crate::hold::KeyHold;
use crate::renew::Kind;
use crate::wire::{
    ACQUIRE, CHECK, Interested, Keys, LEAVE, Note, RELEASE, RedisFailure, check_name,
};

/// How long an acquisition the server has never answered retries before it gives up with
/// `Unreachable` (or its wait, if longer).
const RETRY_GRACE: Duration = Duration::from_secs(5);

/// A new holder ID: 128 random bits in hex, unique per acquisition.
fn new_holder() -> String {
    use lease_core::backoff::random_below;
    format!(
        "{:016x}{:016x}",
        random_below(u64::MAX),
        random_below(u64::MAX)
    )
}

/// What one attempt answered.
enum Answer {
    Acquired {
        token: u64,
        holders: usize,
    },
    Busy {
        holders: usize,
        retry_in: Option<Duration>,
    },
    Kind(String),
    Limit(u64),
}

fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(n) => Some(n.to_string()),
        _ => None,
    }
}

fn number(value: Option<&Value>) -> Option<i64> {
    match value? {
        Value::Int(n) => Some(*n),
        other => text(other)?.parse().ok(),
    }
}

impl Answer {
    fn read(value: &Value) -> Result<Answer, RedisFailure> {
        let malformed =
            || RedisFailure::Malformed(format!("the acquire script answered {value:?}"));
        let Value::Array(parts) = value else {
            return Err(malformed());
        };
        let outcome = parts.first().and_then(text).ok_or_else(malformed)?;
        let count = |i: usize| number(parts.get(i)).and_then(|n| usize::try_from(n).ok());
        match outcome.as_str() {
            "acquired" => Ok(Answer::Acquired {
                token: number(parts.get(1))
                    .and_then(|t| u64::try_from(t).ok())
                    .ok_or_else(malformed)?,
                holders: count(2).unwrap_or(1),
            }),
            "busy" => Ok(Answer::Busy {
                holders: count(1).unwrap_or(0),
                retry_in: number(parts.get(2))
                    .and_then(|ms| u64::try_from(ms).ok())
                    .map(|ms| Duration::from_millis(ms.min(86_400_000))),
            }),
            "kind" => Ok(Answer::Kind(
                parts.get(1).and_then(text).unwrap_or_default(),
            )),
            "limit" => Ok(Answer::Limit(
                number(parts.get(1))
                    .and_then(|l| u64::try_from(l).ok())
                    .unwrap_or_default(),
            )),
            _ => Err(malformed()),
        }
    }
}

/// Gives a half-taken acquisition back if `acquire` is dropped: the attempt may have taken the
/// lease after all, or left its place in line.
struct Pending {
    shared: Arc<Shared>,
    base: String,
    holder: String,
    kind: Kind,
    /// An attempt may have taken the lease.
    taken: bool,
    /// The holder may stand in line.
    queued: bool,
}

impl Pending {
    fn disarm(&mut self) {
        self.taken = false;
        self.queued = false;
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if !self.taken && !self.queued {
            return;
        }
        let shared = Arc::clone(&self.shared);
        let (base, holder, kind, taken) = (
            self.base.clone(),
            self.holder.clone(),
            self.kind,
            self.taken,
        );
        let detached = crate::hold::Detached(shared.wire.connector.clone());
        let abandoned = (base.clone(), holder.clone());
        self.shared.keepers.spawn_clean_up(
            async move {
                let script = if taken { &RELEASE } else { &LEAVE };
                let args: [&[u8]; 2] = [holder.as_bytes(), kind.as_str().as_bytes()];
                let _ = shared.wire.script(script, &[&base], &args, true).await;
            },
            move || Some(detached.give_back(abandoned.0, abandoned.1, kind, None)),
        );
    }
}

/// Acquires what `spec` names (validated by the caller).
pub(crate) async fn acquire(
    shared: &Arc<Shared>,
    spec: &LeaseSpec,
    backend: Arc<dyn Backend>,
) -> Result<Lease, Error> {
    let (kind, limit) = match spec.target() {
        Target::Leader { .. } => (Kind::Leader, 1),
        Target::Semaphore { limit, .. } => (Kind::Semaphore, *limit),
        other => return Err(other.unsupported("Redis")),
    };
    let name = spec.key();
    check_name(name)?;
    let wire = &shared.wire;
    let keys = wire.keys(name);
    let started = Instant::now();
    let deadline = spec.wait_policy().deadline(started);
    let waits = !matches!(spec.wait_policy(), Wait::Never);
    let busy = || Error::Busy {
        key: name.to_owned(),
        waited: started.elapsed(),
    };
    let holder = new_holder();
    let holder_key = match kind {
        Kind::Leader => keys.base.clone(),
        Kind::Semaphore => keys.holder(&holder),
    };
    // Followed before the first attempt, and subscribed: no invalidation of a key taken, and no
    // wake-up sent after an answer, is missed.
    let notes = wire.track(&holder_key);
    let mut wakes = match waits {
        true => Some(wire.subscribe(&keys.wake()).await),
        false => None,
    };
    let mut pending = Pending {
        shared: Arc::clone(shared),
        base: keys.base.clone(),
        holder: holder.clone(),
        kind,
        taken: false,
        queued: false,
    };
    let ttl_ms = spec.session_ttl().as_millis().to_string();
    let settle_ms = spec.settle_after_removal().as_millis().to_string();
    let limit_text = limit.to_string();
    let enqueue = if waits { "1" } else { "0" };
    let args: [&[u8]; 8] = [
        holder.as_bytes(),
        kind.as_str().as_bytes(),
        limit_text.as_bytes(),
        ttl_ms.as_bytes(),
        settle_ms.as_bytes(),
        spec.advertised_value(),
        enqueue.as_bytes(),
        ttl_ms.as_bytes(),
    ];
    let mut answered = false;
    loop {
        let give_up = if answered {
            deadline
        } else {
            Some(deadline.unwrap_or(started).max(started + RETRY_GRACE))
        };
        let mut pause = lease_http::backoff();
        let attempt = loop {
            pending.taken = true;
            pending.queued |= waits;
            let attempt = wire
                .script(&ACQUIRE, &[&keys.base, &holder_key], &args, true)
                .await;
            let attempt = match attempt {
                Ok((value, sent, ran)) => match Answer::read(&value) {
                    Ok(Answer::Acquired { token, holders }) => {
                        match wire.sync_replicas(&ran).await {
                            Ok(()) => Ok((Answer::Acquired { token, holders }, sent)),
                            Err(error) => {
                                tracing::warn!(%error, key = name, "giving the acquisition back: it did not reach the replicas");
                                let release: [&[u8]; 2] =
                                    [holder.as_bytes(), kind.as_str().as_bytes()];
                                let _ = wire.script(&RELEASE, &[&keys.base], &release, true).await;
                                Err(error)
                            }
                        }
                    }
                    other => other.map(|answer| (answer, sent)),
                },
                Err(error) => Err(error),
            };
            match attempt {
                Err(error)
                    if error.is_transient()
                        && give_up.is_none_or(|g| Instant::now() + pause_peek(&pause) < g) =>
                {
                    tracing::debug!(%error, key = name, "acquire attempt failed; retrying");
                    tokio::time::sleep(pause.next_pause()).await;
                }
                other => break other,
            }
        };
        let (answer, sent) =
            attempt.map_err(|e| e.into_error(&wire.address, format_args!("acquire {name:?}")))?;
        answered = true;
        match answer {
            Answer::Acquired { token, holders } => {
                pending.disarm();
                if kind == Kind::Leader {
                    wire.changed_here(&keys.base);
                }
                if kind == Kind::Semaphore {
                    lease_core::metrics::semaphore_slots_in_use(BackendKind::Redis, name, holders);
                }
                let sequencer_key = match kind {
                    Kind::Leader => name.to_owned(),
                    Kind::Semaphore => format!("{name}/{holder}"),
                };
                let sequencer =
                    Sequencer::new(BackendKind::Redis, sequencer_key, token, holder.clone());
                tracing::info!(%sequencer, "lease acquired");
                let fence = Fence::new(spec.fence_after(), sent);
                let lost =
                    shared.renew(&holder, &keys.base, kind, spec.session_ttl(), fence.clone());
                let hold = KeyHold {
                    shared: Arc::clone(shared),
                    base: keys.base.clone(),
                    holder,
                    kind,
                    fence: fence.clone(),
                    lost,
                    notes,
                    keep_until: None,
                };
                return Ok(shared.keepers.start(sequencer, fence, backend, hold));
            }
            Answer::Kind(found) => {
                pending.taken = false;
                return Err(if found == Kind::Leader.as_str() {
                    Error::leader_lock_in_the_way(name)
                } else {
                    Error::semaphore_in_the_way(name)
                });
            }
            Answer::Limit(stored) => {
                pending.taken = false;
                return Err(Error::LimitMismatch {
                    key: name.to_owned(),
                    stored,
                    requested: u64::from(limit),
                });
            }
            Answer::Busy { holders, retry_in } => {
                pending.taken = false;
                if kind == Kind::Semaphore {
                    lease_core::metrics::semaphore_slots_in_use(BackendKind::Redis, name, holders);
                }
                let Some(wakes) = wakes.as_mut() else {
                    return Err(busy());
                };
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    return Err(busy());
                }
                // Try again when woken, when the answer said, and to refresh the place in line.
                let refresh = spec.session_ttl() / 3;
                let at = Instant::now() + retry_in.map_or(refresh, |r| r.min(refresh));
                let at = deadline.map_or(at, |d| at.min(d));
                wait_for_turn(wakes, &holder, at).await;
            }
        }
    }
}

/// The next pause of `pause`, without taking it.
fn pause_peek(pause: &lease_core::backoff::Backoff) -> Duration {
    pause.clone().next_pause()
}

/// Until this waiter is woken (named, or all), the subscription is resynced, or `at` (a
/// little after, so that the server's clock has passed it too).
async fn wait_for_turn(wakes: &mut Interested, holder: &str, at: Instant) {
    let timer = tokio::time::sleep_until(at + Duration::from_millis(2));
    tokio::pin!(timer);
    loop {
        tokio::select! {
            biased;
            note = wakes.next() => match note {
                Note::Changed(woken) if woken == "*" || woken.split(' ').any(|w| w == holder) => return,
                Note::Resync => return,
                _ => {}
            },
            () = &mut timer => return,
        }
    }
}

/// The name and kind a sequencer of this backend names: a semaphore holder's key is
/// `<name>/<holder>`.
pub(crate) fn target_of(sequencer: &Sequencer) -> (&str, Kind) {
    match sequencer
        .key()
        .strip_suffix(sequencer.holder())
        .and_then(|prefix| prefix.strip_suffix('/'))
    {
        Some(name) => (name, Kind::Semaphore),
        None => (sequencer.key(), Kind::Leader),
    }
}

/// Whether `sequencer` names a current holder: one read of its holder key.
pub(crate) async fn check_sequencer(shared: &Shared, sequencer: &Sequencer) -> Result<(), Error> {
    if sequencer.backend() != BackendKind::Redis {
        return Err(Error::Lost(LostReason::KeyDeleted));
    }
    let (name, kind) = target_of(sequencer);
    if check_name(name).is_err() {
        return Err(Error::Lost(LostReason::KeyDeleted));
    }
    let wire = &shared.wire;
    let keys: Keys = wire.keys(name);
    let token = sequencer.index().to_string();
    let args: [&[u8]; 3] = [
        sequencer.holder().as_bytes(),
        kind.as_str().as_bytes(),
        token.as_bytes(),
    ];
    let mut pause = lease_http::backoff();
    let give_up = Instant::now() + RETRY_GRACE;
    let answer = loop {
        match wire.script(&CHECK, &[&keys.base], &args, false).await {
            Err(error) if error.is_transient() && Instant::now() + pause_peek(&pause) < give_up => {
                tokio::time::sleep(pause.next_pause()).await;
            }
            other => break other,
        }
    };
    let (value, _, _) =
        answer.map_err(|e| e.into_error(&wire.address, format_args!("check {sequencer}")))?;
    let Value::Array(parts) = &value else {
        return Err(
            RedisFailure::Malformed(format!("the check script answered {value:?}"))
                .into_error(&wire.address, format_args!("check {sequencer}")),
        );
    };
    match parts.first().and_then(text).as_deref() {
        Some("held") => Ok(()),
        Some("taken") => Err(Error::Lost(LostReason::KeyTaken {
            session: parts.get(1).and_then(text).unwrap_or_default(),
            lock_index: number(parts.get(2))
                .and_then(|t| u64::try_from(t).ok())
                .unwrap_or_default(),
        })),
        _ => Err(Error::Lost(LostReason::KeyDeleted)),
    }
}
