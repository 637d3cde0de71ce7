//! What one layer's services know about a leader key's current holder, and how fresh it is.
//!
//! Two sources feed it: the crate-wide observe loop ([`LeaderWatch`]), started by the first
//! request that needs it and stopped when the last layer or service is dropped, and the
//! consistent reads the layer makes when the cache cannot answer. An answer is trusted to pass a
//! request only while it is younger than the layer's freshness bound: a backend's watch reports
//! changes, not silence, so on a silent network (no error, no answer) an old answer would
//! otherwise pass the last leader for as long as the watch's request takes to time out.

use std::fmt;
use std::sync::{OnceLock, PoisonError, RwLock};
use std::time::Duration;

use lease_core::Sequencer;
use lease_core::leader::{LeaderWatch, Observation, Observing};
use tokio::sync::watch;
use tokio::time::Instant;

/// What the cache can say about a sequencer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    /// It is the current holder, as confirmed within the freshness bound.
    Current,
    /// An older acquisition of the key than one already seen: stale for good.
    Stale,
    /// The cache cannot tell (nothing known, nothing fresh, or a newer acquisition than seen);
    /// ask the backend.
    Unknown,
}

pub(super) struct LeaderCache {
    watch: LeaderWatch,
    observation: watch::Receiver<Observation>,
    /// Keeps the watch running once a request has needed it.
    observing: OnceLock<Observing>,
    /// The holder the last successful consistent read confirmed, and when that read was sent.
    confirmed: RwLock<Option<(Sequencer, Instant)>>,
}

impl fmt::Debug for LeaderCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaderCache")
            .field("watch", &self.watch)
            .field("confirmed", &self.confirmed)
            .finish()
    }
}

impl LeaderCache {
    pub(super) fn new(watch: LeaderWatch) -> Self {
        LeaderCache {
            observation: watch.subscribe(),
            watch,
            observing: OnceLock::new(),
            confirmed: RwLock::new(None),
        }
    }

    pub(super) fn watch(&self) -> &LeaderWatch {
        &self.watch
    }

    /// Starts following the key, once, if a Tokio runtime is available (without one, every
    /// check is a consistent read).
    pub(super) fn ensure_observing(&self) {
        if self.observing.get().is_none() && tokio::runtime::Handle::try_current().is_ok() {
            self.observing.get_or_init(|| self.watch.start());
        }
    }

    pub(super) fn verdict(&self, sequencer: &Sequencer, max_staleness: Duration) -> Verdict {
        let observation = self.observation.borrow();
        let observed = match &*observation {
            Observation::Known { leader, received } => {
                Some((leader.as_ref().map(|leader| &leader.sequencer), *received))
            }
            _ => None,
        };
        let confirmed = self
            .confirmed
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        let confirmed = confirmed.as_ref().map(|(holder, at)| (Some(holder), *at));
        let newer_seen = |(holder, _): (Option<&Sequencer>, Instant)| {
            holder.is_some_and(|holder| holder.order() > sequencer.order())
        };
        if observed.is_some_and(newer_seen) || confirmed.is_some_and(newer_seen) {
            return Verdict::Stale;
        }
        // The latest answer decides, and passes the sequencer only while it is fresh.
        let latest = match (observed, confirmed) {
            (Some(observed), Some(confirmed)) if confirmed.1 > observed.1 => confirmed,
            (Some(observed), _) => observed,
            (None, Some(confirmed)) => confirmed,
            (None, None) => return Verdict::Unknown,
        };
        match latest {
            (Some(holder), at) if holder == sequencer && at.elapsed() <= max_staleness => {
                Verdict::Current
            }
            _ => Verdict::Unknown,
        }
    }

    /// Records that a consistent read sent at `sent` found `sequencer` current.
    pub(super) fn confirm(&self, sequencer: &Sequencer, sent: Instant) {
        let mut confirmed = self
            .confirmed
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        if confirmed.as_ref().is_none_or(|(_, at)| *at < sent) {
            *confirmed = Some((sequencer.clone(), sent));
        }
    }
}
