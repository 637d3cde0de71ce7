//! Who leads: the [`Leader`] of a key, one backend observation of it ([`LeaderObserver`]), and
//! [`LeaderWatch`], the one loop that keeps observing through the backend's outages.
//!
//! A [`LeaderObserver`] comes from [`Backend::observe_leader`](crate::Backend::observe_leader) and ends the moment its backend
//! can no longer confirm the key, so it never reports a stale leader as current. [`LeaderWatch`]
//! turns that into something a long-lived process can hold on to: it observes again with the
//! crate's jittered backoff whenever an observation ends, and says [`Observation::Unknown`]
//! meanwhile. Campaigns, leader-only routes and sequencer checks all follow a key through it.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::Backend;
use crate::backoff::Backoff;
use crate::observer::{Leader, Observation};

/// Follows who holds a leader key for as long as it is needed, through the backend's outages.
///
/// It runs [`Backend::observe_leader`](crate::Backend::observe_leader) in a loop: each observation's answers are published as
/// [`Observation::Known`]; when an observation ends or cannot start for a reason that may pass,
/// the watch publishes [`Observation::Unknown`] and observes again after a jittered backoff
/// (100 ms doubling up to 5 s). An error retrying cannot fix ends it with
/// [`Observation::Failed`].
///
/// Creating a watch does nothing; [`start`](Self::start) runs the loop, which lives as long as
/// one of the [`Observing`] guards it returns. Clones share one loop and one observation.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), lease_core::Error> {
/// use lease_core::leader::{LeaderWatch, Observation};
/// use lease_core::memory::Memory;
/// use lease_core::{Backend, LeaseSpec};
///
/// let memory = Memory::new();
/// let watch = LeaderWatch::new(memory.clone(), "service/api/leader");
/// let _observing = watch.start();
/// let lease = memory.acquire(&LeaseSpec::leader("service/api/leader")).await?;
///
/// let mut updates = watch.subscribe();
/// let seen = updates
///     .wait_for(|o| o.leader().is_some_and(|l| l.sequencer == *lease.sequencer()))
///     .await;
/// assert!(seen.is_ok());
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct LeaderWatch {
    inner: Arc<WatchInner>,
}

struct WatchInner {
    backend: Arc<dyn Backend>,
    key: String,
    observation: watch::Sender<Observation>,
    /// The running loop, if some [`Observing`] guard still keeps it.
    running: Mutex<Weak<Running>>,
}

impl fmt::Debug for LeaderWatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaderWatch")
            .field("key", &self.inner.key)
            .field("observation", &*self.inner.observation.borrow())
            .field("running", &self.is_running())
            .finish()
    }
}

impl LeaderWatch {
    /// A watch of the leader key `key` on `backend` (any backend: by value, in an `Arc`, or an
    /// `Arc<dyn Backend>`); nothing runs until [`start`](Self::start).
    pub fn new(backend: impl Backend, key: impl Into<String>) -> Self {
        LeaderWatch {
            inner: Arc::new(WatchInner {
                backend: crate::backend::into_shared(backend),
                key: key.into(),
                observation: watch::channel(Observation::Unknown).0,
                running: Mutex::new(Weak::new()),
            }),
        }
    }

    /// The watched key.
    pub fn key(&self) -> &str {
        &self.inner.key
    }

    /// The backend the key is watched on.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.inner.backend
    }

    /// Runs the observe loop if it is not running yet, and returns a guard that keeps it
    /// running: the loop stops (and the observation turns [`Observation::Unknown`]) when the last
    /// guard is dropped.
    ///
    /// # Panics
    ///
    /// Outside a Tokio runtime, as [`tokio::spawn`] does.
    pub fn start(&self) -> Observing {
        let mut running = self
            .inner
            .running
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(observing) = running.upgrade() {
            return Observing {
                _running: observing,
            };
        }
        let task = crate::runtime::spawn(observe_loop(Arc::clone(&self.inner)));
        let observing = Arc::new(Running {
            task,
            inner: Arc::clone(&self.inner),
        });
        *running = Arc::downgrade(&observing);
        Observing {
            _running: observing,
        }
    }

    /// Whether the loop is running (some [`Observing`] guard is alive).
    pub fn is_running(&self) -> bool {
        self.inner
            .running
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .strong_count()
            > 0
    }

    /// What the watch knows now (no I/O).
    pub fn observation(&self) -> Observation {
        self.inner.observation.borrow().clone()
    }

    /// The leader the watch has confirmed, `None` while nobody leads or nothing is known.
    pub fn leader(&self) -> Option<Leader> {
        self.inner.observation.borrow().leader().cloned()
    }

    /// A receiver of every change of the observation.
    pub fn subscribe(&self) -> watch::Receiver<Observation> {
        self.inner.observation.subscribe()
    }
}

/// Keeps a [`LeaderWatch`]'s loop running; the loop stops when the last guard is dropped.
#[must_use = "the watch stops when this guard is dropped"]
#[derive(Clone, Debug)]
pub struct Observing {
    _running: Arc<Running>,
}

struct Running {
    task: JoinHandle<()>,
    inner: Arc<WatchInner>,
}

impl fmt::Debug for Running {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Running")
            .field("key", &self.inner.key)
            .finish_non_exhaustive()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.task.abort();
        // What the stopped loop saw may go stale; a later start observes afresh.
        self.inner.observation.send_if_modified(|o| {
            let known = matches!(o, Observation::Known { .. });
            if known {
                *o = Observation::Unknown;
            }
            known
        });
    }
}

/// The one observe-with-backoff loop of the crate.
async fn observe_loop(inner: Arc<WatchInner>) {
    let WatchInner {
        backend,
        key,
        observation,
        ..
    } = &*inner;
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
    loop {
        match backend.observe_leader(key).await {
            Ok(mut observer) => {
                backoff.reset();
                let mut leader = observer.leader();
                loop {
                    observation.send_replace(Observation::Known {
                        leader,
                        received: Instant::now(),
                    });
                    match observer.changed().await {
                        Ok(next) => leader = next,
                        Err(_) => break,
                    }
                }
                tracing::debug!(key, "leader watch: the observation ended; observing again");
            }
            Err(error) if error.is_transient() => {
                tracing::event!(super::RETRY_LEVEL, key, %error, "leader watch: cannot observe yet; retrying");
            }
            Err(error) => {
                tracing::debug!(key, %error, "leader watch: cannot observe this key; stopping");
                observation.send_replace(Observation::Failed(Arc::new(error)));
                return;
            }
        }
        // Whatever was seen may be outdated now: nobody is reported until it is confirmed again.
        observation.send_replace(Observation::Unknown);
        backoff.wait().await;
    }
}
