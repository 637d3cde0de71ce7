//! The watch-backed cache of a leader key's current sequencer, shared by one layer's services.
//!
//! A background task observes the key through the backend and publishes what it sees; it stops
//! when the last layer or service is dropped. Until the first observation, or when the backend
//! cannot observe, the cache says "unknown" and every check falls back to a consistent read.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use lease_core::{Backend, Error, Sequencer};
use tokio_util::sync::{CancellationToken, DropGuard};

/// What the cache can say about a sequencer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    /// It is the current holder, as the watch last saw it.
    Current,
    /// An older acquisition of the key than the one the watch has seen.
    Stale,
    /// The cache cannot tell; ask the backend.
    Unknown,
}

#[derive(Default)]
struct Seen {
    /// `None` until the watch has answered; then the holder it saw (`None` if nobody).
    holder: Option<Option<Sequencer>>,
}

pub(super) struct LeaderCache {
    seen: Arc<RwLock<Seen>>,
    started: AtomicBool,
    stop: CancellationToken,
    _stop_on_drop: DropGuard,
}

impl fmt::Debug for LeaderCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let seen = self.seen.read().unwrap_or_else(PoisonError::into_inner);
        f.debug_struct("LeaderCache")
            .field("holder", &seen.holder)
            .field("started", &self.started.load(Ordering::Relaxed))
            .finish()
    }
}

impl LeaderCache {
    pub(super) fn new() -> Self {
        let stop = CancellationToken::new();
        LeaderCache {
            seen: Arc::default(),
            started: AtomicBool::new(false),
            _stop_on_drop: stop.clone().drop_guard(),
            stop,
        }
    }

    pub(super) fn verdict(&self, sequencer: &Sequencer) -> Verdict {
        let seen = self.seen.read().unwrap_or_else(PoisonError::into_inner);
        match &seen.holder {
            Some(Some(current)) if current == sequencer => Verdict::Current,
            Some(Some(current)) if current.index() > sequencer.index() => Verdict::Stale,
            _ => Verdict::Unknown,
        }
    }

    /// Starts the watch of `key` once, if a Tokio runtime is available.
    pub(super) fn ensure_started(&self, backend: &Arc<dyn Backend>, key: &str) {
        if self.started.load(Ordering::Acquire) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.started.swap(true, Ordering::AcqRel) {
            return;
        }
        let seen = Arc::clone(&self.seen);
        let backend = Arc::clone(backend);
        let key = key.to_owned();
        let stop = self.stop.clone();
        runtime.spawn(async move {
            tokio::select! {
                () = stop.cancelled() => {}
                () = watch_key(&*backend, &key, &seen) => {}
            }
        });
    }
}

async fn watch_key(backend: &dyn Backend, key: &str, seen: &RwLock<Seen>) {
    let mut backoff = Duration::from_millis(100);
    loop {
        match backend.observe_leader(key).await {
            Ok(mut observer) => {
                backoff = Duration::from_millis(100);
                let mut leader = observer.leader();
                loop {
                    seen.write().unwrap_or_else(PoisonError::into_inner).holder =
                        Some(leader.map(|leader| leader.sequencer));
                    match observer.changed().await {
                        Ok(next) => leader = next,
                        Err(_) => break,
                    }
                }
            }
            Err(Error::Unsupported { .. }) => {
                tracing::debug!(
                    key,
                    "sequencer check: the backend cannot observe leader keys; every check is a consistent read"
                );
                return;
            }
            Err(error) => {
                tracing::debug!(key, %error, "sequencer check: observing the key failed; retrying")
            }
        }
        // Whatever the watch saw may be outdated now: fall back to consistent reads until it is back.
        seen.write().unwrap_or_else(PoisonError::into_inner).holder = None;
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}
