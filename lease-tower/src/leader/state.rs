//! The state one leader-only layer shares with its services and its campaign task.
//!
//! The campaign task writes (who holds the lease now, who leads as seen by the backend's watch);
//! requests read. The task holds the shared state but not the stop guard, so dropping the last
//! layer or service cancels the campaign instead of being kept alive by it.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use http::HeaderValue;
use lease_core::leader::{Campaign, Leader, LeaderEvent};
use lease_core::{Backend, BoxError, LeaseSpec, LeaseWatcher};
use tokio_util::sync::{CancellationToken, DropGuard};

/// One tenure of this node as leader: the lease's view, and a token cancelled when it ends.
#[derive(Clone, Debug)]
pub(super) struct Tenure {
    pub(super) watcher: LeaseWatcher,
    pub(super) ended: CancellationToken,
}

/// The current leader as followers describe it, prepared once per change rather than per request.
#[derive(Clone, Debug)]
pub(super) struct LeaderView {
    pub(super) leader: Leader,
    pub(super) header: Option<HeaderValue>,
    pub(super) base_url: Option<String>,
}

impl LeaderView {
    fn new(leader: Leader) -> Self {
        let header = HeaderValue::from_bytes(&leader.value).ok();
        let base_url = leader.value_str().and_then(base_url);
        LeaderView {
            leader,
            header,
            base_url,
        }
    }
}

/// The advertised value as a base URL for redirects: `http://` is assumed when no scheme is given.
fn base_url(value: &str) -> Option<String> {
    let value = value.trim().trim_end_matches('/');
    if value.is_empty() || value.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return None;
    }
    if value.starts_with("http://") || value.starts_with("https://") {
        Some(value.to_owned())
    } else {
        Some(format!("http://{value}"))
    }
}

#[derive(Default)]
pub(super) struct Shared {
    /// Shared behind one `Arc`, so a request's copy costs one reference-count increment.
    tenure: RwLock<Option<Arc<Tenure>>>,
    leader: RwLock<Option<LeaderView>>,
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shared")
            .field("tenure", &self.tenure())
            .field("leader", &self.leader())
            .finish()
    }
}

impl Shared {
    /// This node's tenure if it holds the lease now.
    pub(super) fn held_tenure(&self) -> Option<Arc<Tenure>> {
        let tenure = self.tenure.read().unwrap_or_else(PoisonError::into_inner);
        tenure
            .as_ref()
            .filter(|tenure| tenure.watcher.is_held())
            .cloned()
    }

    fn tenure(&self) -> Option<Arc<Tenure>> {
        self.tenure
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub(super) fn leader(&self) -> Option<LeaderView> {
        self.leader
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn set_tenure(&self, tenure: Tenure) {
        *self.tenure.write().unwrap_or_else(PoisonError::into_inner) = Some(Arc::new(tenure));
    }

    fn set_leader(&self, leader: Option<Leader>) {
        *self.leader.write().unwrap_or_else(PoisonError::into_inner) = leader.map(LeaderView::new);
    }
}

/// What the layer and its services share: the state, and the campaign that feeds it.
pub(super) struct Handle {
    pub(super) shared: Arc<Shared>,
    start: Mutex<Option<Start>>,
    started: AtomicBool,
    stop: CancellationToken,
    /// Cancelled by the campaign task when it has ended (and released the lease).
    pub(super) finished: CancellationToken,
    _stop_on_drop: DropGuard,
}

impl fmt::Debug for Handle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Handle")
            .field("shared", &self.shared)
            .field("started", &self.started.load(Ordering::Relaxed))
            .field("stopped", &self.stop.is_cancelled())
            .finish()
    }
}

struct Start {
    backend: Arc<dyn Backend>,
    spec: LeaseSpec,
}

impl Handle {
    pub(super) fn new(backend: Arc<dyn Backend>, spec: LeaseSpec, stop: CancellationToken) -> Self {
        Handle {
            shared: Arc::default(),
            start: Mutex::new(Some(Start { backend, spec })),
            started: AtomicBool::new(false),
            _stop_on_drop: stop.clone().drop_guard(),
            stop,
            finished: CancellationToken::new(),
        }
    }

    /// Stops the campaign and waits until it has ended, the lease released.
    pub(super) async fn shutdown(&self) {
        self.stop.cancel();
        if self.started.load(Ordering::Acquire) {
            self.finished.cancelled().await;
        }
    }

    /// Starts the campaign if it is not running yet and a Tokio runtime is available.
    pub(super) fn ensure_started(&self) {
        if self.started.load(Ordering::Acquire) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let mut start = self.start.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(Start { backend, spec }) = start.take() else {
            return;
        };
        let shared = Arc::clone(&self.shared);
        let on_event = Arc::clone(&self.shared);
        let key = spec.key().to_owned();
        let campaign = Campaign::new(backend, spec).on_event(move |event| {
            if let LeaderEvent::LeaderChanged { leader } = event {
                on_event.set_leader(leader);
            }
        });
        let stop = self.stop.clone();
        let finished = self.finished.clone().drop_guard();
        runtime.spawn(async move {
            let _finished = finished;
            let outcome = campaign
                .run_until(stop, move |watcher| {
                    let ended = CancellationToken::new();
                    // Armed before requests can see the tenure: the campaign may drop this
                    // future before its first poll, and that must still cancel them.
                    let end_on_drop = ended.clone().drop_guard();
                    shared.set_tenure(Tenure { watcher, ended });
                    // The campaign drops this future the moment the lease is lost or shutdown
                    // begins; the guard then cancels the in-flight requests of this tenure.
                    async move {
                        let _end_on_drop = end_on_drop;
                        std::future::pending::<Result<(), BoxError>>().await
                    }
                })
                .await;
            match outcome {
                Ok(end) => tracing::debug!(key, ?end, "leader-only layer: campaign stopped"),
                Err(error) => tracing::error!(
                    key,
                    %error,
                    "leader-only layer: the campaign cannot run; every request will get 503"
                ),
            }
        });
        self.started.store(true, Ordering::Release);
    }
}
