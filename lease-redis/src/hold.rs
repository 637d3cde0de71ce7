//! Holding a lease: the [`Hold`] lease-core's holder task drives for each one. It watches for
//! the loss (a renewal that finds the holder key gone or taken; an invalidation of the key, which
//! is checked at once with one renewal; the command connection gone, which suspends the fence
//! until a renewal on its successor), gives the lease back, or keeps it until its `min_hold`
//! ends; and when the runtime that holds it ends, a [`Detached`] copy of what the wire connects
//! with gives it back on a connection of its own, from lease-core's detached runtime.

use std::sync::Arc;
use std::time::Duration;

use lease_core::backend::{Fence, Hold};
use lease_core::{BoxFuture, Error, LostReason};
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::client::Shared;
use crate::renew::Kind;
use crate::wire::{Connector, Interested, KEEP, Note, RELEASE, RedisFailure, Script};

/// The [`Hold`] of one lease.
pub(crate) struct KeyHold {
    pub(crate) shared: Arc<Shared>,
    /// The name's base key.
    pub(crate) base: String,
    pub(crate) holder: String,
    pub(crate) kind: Kind,
    pub(crate) fence: Fence,
    /// Completes when a renewal finds the lease gone.
    pub(crate) lost: oneshot::Receiver<LostReason>,
    /// The holder key's invalidations, and the command connection's breaks.
    pub(crate) notes: Interested,
    /// Set by [`Hold::keep_until`]: a release before it leaves the lease to expire then.
    pub(crate) keep_until: Option<Instant>,
}

impl KeyHold {
    fn to_keep(&self) -> Option<Duration> {
        self.keep_until
            .map(|until| until.saturating_duration_since(Instant::now()))
            .filter(|left| !left.is_zero())
    }
}

impl Hold for KeyHold {
    async fn watch(&mut self) -> LostReason {
        loop {
            tokio::select! {
                biased;
                reason = &mut self.lost => return reason.unwrap_or(LostReason::KeyDeleted),
                note = self.notes.next() => match note {
                    Note::Changed(_) | Note::Resync => self.shared.check_now(&self.holder),
                    Note::Blind(since) => self.fence.suspend(since),
                },
            }
        }
    }

    fn keep_until(&mut self, until: Instant) -> bool {
        self.keep_until = Some(until);
        true
    }

    async fn release(&mut self) -> Result<(), Error> {
        self.shared.stop_renewing(&self.holder);
        let wire = &self.shared.wire;
        let (script, left) = match self.to_keep() {
            Some(left) => (&KEEP, Some(left)),
            None => (&RELEASE, None),
        };
        let left_ms = kept_ms(left);
        let args: Vec<&[u8]> = vec![
            self.holder.as_bytes(),
            self.kind.as_str().as_bytes(),
            left_ms.as_bytes(),
        ];
        let give_up = Instant::now() + lease_core::backend::RELEASE_BOUND;
        let mut pause = lease_http::backoff();
        let answer = loop {
            match wire.script(script, &[&self.base], &args, true).await {
                Err(error)
                    if error.is_transient()
                        && Instant::now() + Duration::from_millis(100) < give_up =>
                {
                    tracing::debug!(%error, "release failed; retrying");
                    tokio::time::sleep(pause.next_pause().min(give_up - Instant::now())).await;
                }
                other => break other,
            }
        };
        let (answer, _, _) = answer
            .map_err(|e| e.into_error(&wire.address, format_args!("release {:?}", self.base)))?;
        if self.kind == Kind::Leader {
            wire.changed_here(&self.base);
        }
        match answer {
            redis::Value::Int(1) => {
                tracing::debug!(base = %self.base, holder = %self.holder, kept = ?left, "lease given back");
                Ok(())
            }
            _ => Err(Error::Lost(LostReason::KeyDeleted)),
        }
    }

    async fn clean_up(&mut self, _reason: &LostReason) {
        // The key is gone, or (self-fenced) it is left to expire: giving it back now would hand
        // the lease on before the server's own deadline, while this holder may be stopping.
        self.shared.stop_renewing(&self.holder);
    }

    fn abandon(self) -> Option<BoxFuture<'static, ()>> {
        self.shared.stop_renewing(&self.holder);
        let detached = Detached(self.shared.wire.connector.clone());
        let left = self.to_keep();
        Some(detached.give_back(self.base, self.holder, self.kind, left))
    }
}

/// What giving a lease back needs without the handle's connections: for a runtime that is
/// ending (they belong to it).
pub(crate) struct Detached(pub(crate) Connector);

impl Detached {
    /// Releases (or, with `left`, keeps for that long) `holder`'s lease of `base` on a
    /// connection of its own; nothing if the server cannot be reached (the key then expires
    /// with its TTL).
    pub(crate) fn give_back(
        self,
        base: String,
        holder: String,
        kind: Kind,
        left: Option<Duration>,
    ) -> BoxFuture<'static, ()> {
        Box::pin(async move {
            let Ok(opened) = self.0.open(None).await else {
                return;
            };
            let mut conn = opened.conn;
            let script: &Script = if left.is_some() { &KEEP } else { &RELEASE };
            let left_ms = kept_ms(left);
            let answer: Result<redis::Value, RedisFailure> = redis::cmd("EVAL")
                .arg(script.source)
                .arg(1)
                .arg(&base)
                .arg(&holder)
                .arg(kind.as_str())
                .arg(&left_ms)
                .query_async(&mut conn)
                .await
                .map_err(RedisFailure::from);
            if let Err(error) = answer {
                tracing::debug!(%error, "a detached release failed; the lease expires with its TTL");
            }
        })
    }
}

/// The whole milliseconds to keep a released key for (`KEEP`'s argument; empty for none),
/// rounded up: a lease kept until its release time must not expire before it, and Redis counts
/// whole milliseconds (`conformance`'s `release_at_outlives_the_holders_shutdown`, which once saw
/// 2,999.9 ms kept as 2,999 and a contender in before the time).
fn kept_ms(left: Option<Duration>) -> String {
    left.map(|l| l.as_nanos().div_ceil(1_000_000).to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_time_is_rounded_up_to_whole_milliseconds() {
        assert_eq!(kept_ms(Some(Duration::from_micros(2_999_900))), "3000");
        assert_eq!(kept_ms(Some(Duration::from_millis(5))), "5");
        assert_eq!(kept_ms(None), "");
    }
}
