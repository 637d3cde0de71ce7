//! Metrics through the [`metrics`](https://docs.rs/metrics) facade: every name and label this
//! crate records, and the small functions the rest of the crate records them with.
//!
//! Recording needs the `metrics` feature (off by default). The crate depends on the facade only:
//! the application installs the exporter it wants (Prometheus, OpenTelemetry through its bridge,
//! statsd...) and every metric below shows up there. Without the feature, or without an installed
//! recorder, recording costs nothing worth measuring, and the names below are still here to build
//! dashboards against.
//!
//! | Name | Type | Labels | What it counts |
//! |---|---|---|---|
//! | `lease_held` | gauge | `backend`, `kind`, `key` | leases this process holds now |
//! | `lease_is_leader` | gauge | `key` | 1 while this process's campaign for `key` holds its term, else 0 |
//! | `lease_acquisitions_total` | counter | `backend`, `kind`, `key` | successful acquisitions |
//! | `lease_losses_total` | counter | `backend`, `kind`, `key`, `reason` | leases taken away, by [`LostReason`] |
//! | `lease_releases_total` | counter | `backend`, `kind`, `key` | leases given back by their holder (release, drop, shutdown) |
//! | `lease_acquire_wait_seconds` | histogram | `backend`, `kind`, `key` | from the call to `acquire` to the lease, for successful acquisitions |
//! | `lease_loss_to_cancel_seconds` | histogram | `backend`, `kind`, `key` | from the loss being declared to the guarded work being dropped ([`Lease::run`](crate::Lease::run)) |
//! | `lease_backend_requests_total` | counter | `backend` | requests sent to the server (Consul, etcd: HTTP requests; AMQP: broker operations) |
//! | `lease_backend_writes_total` | counter | `backend` | of those, the ones that change state on the server |
//! | `lease_backend_errors_total` | counter | `backend`, `error` | requests that failed, by `error` kind |
//! | `lease_semaphore_slots_in_use` | gauge | `backend`, `key` | holders of the semaphore `key` as this process last saw them |
//!
//! Label values:
//!
//! - `backend`: `consul`, `etcd`, `amqp`, `postgres`, `redis`, `memory` or a custom kind's name ([`BackendKind::as_str`]);
//! - `kind`: `leader` or `semaphore`;
//! - `key`: the leader key or the semaphore's prefix (name), exactly as in the [`LeaseSpec`];
//! - `reason`: `session_invalidated`, `key_deleted`, `key_released`, `key_taken`,
//!   `holder_pruned`, `slot_removed`, `connection_closed`, `self_fenced`, `process_paused`;
//! - `error`: `unreachable` (no answer: refused, reset, DNS, TLS), `timeout`, `status` (an error
//!   answer), `malformed` (an answer this crate could not read), `other`.
//!
//! # Cardinality
//!
//! Every label takes its values from a small fixed set, except `key`, which is the application's
//! own leader keys and semaphore names: a bounded set as long as the application does not build
//! keys from unbounded data (one key per tenant is one time series per tenant). Session IDs,
//! sequencers, lock indexes and holder queues are never labels.
//!
//! `lease_semaphore_slots_in_use` is recorded by the backends that read the holder set itself
//! (Consul, memory); etcd and AMQP know only their own slots, which `lease_held` counts.
//!
//! # Example
//!
//! With any exporter installed as the global recorder (here, none), the metrics need no other
//! set-up:
//!
//! ```
//! # #[cfg(feature = "memory")]
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), lease_core::Error> {
//! use lease_core::memory::Memory;
//! use lease_core::{Backend, LeaseSpec};
//!
//! // e.g. metrics_exporter_prometheus::PrometheusBuilder::new().install()?;
//! let backend = Memory::new();
//! let lease = backend.acquire(&LeaseSpec::leader("jobs/compact")).await?;
//! // lease_held{backend="memory",kind="leader",key="jobs/compact"} is 1 now,
//! // lease_acquisitions_total{...} counted one acquisition.
//! lease.release().await?;
//! // lease_held is 0, lease_releases_total counted one release.
//! assert_eq!(lease_core::metrics::LEASES_HELD, "lease_held");
//! # Ok(())
//! # }
//! # #[cfg(not(feature = "memory"))]
//! # fn main() {}
//! ```

use std::future::Future;

#[allow(unused_imports)]
// Linked from the docs; used by the recording functions with the feature.
use crate::{BackendKind, Error, LeaseSpec, LostReason, Target};

/// Gauge: leases this process holds now.
pub const LEASES_HELD: &str = "lease_held";
/// Gauge: 1 while this process's campaign for the key holds its term, else 0.
pub const IS_LEADER: &str = "lease_is_leader";
/// Counter: successful acquisitions.
pub const ACQUISITIONS: &str = "lease_acquisitions_total";
/// Counter: leases taken away, by reason.
pub const LOSSES: &str = "lease_losses_total";
/// Counter: leases given back by their holder.
pub const RELEASES: &str = "lease_releases_total";
/// Histogram, in seconds: how long successful acquisitions took.
pub const ACQUIRE_WAIT: &str = "lease_acquire_wait_seconds";
/// Histogram, in seconds: from a loss being declared to the guarded work being dropped.
pub const LOSS_TO_CANCEL: &str = "lease_loss_to_cancel_seconds";
/// Counter: requests sent to the backend's server.
pub const BACKEND_REQUESTS: &str = "lease_backend_requests_total";
/// Counter: requests that change state on the server.
pub const BACKEND_WRITES: &str = "lease_backend_writes_total";
/// Counter: requests that failed, by error kind.
pub const BACKEND_ERRORS: &str = "lease_backend_errors_total";
/// Gauge: holders of a semaphore, as this process last saw them.
pub const SEMAPHORE_SLOTS_IN_USE: &str = "lease_semaphore_slots_in_use";

/// The label names.
pub mod labels {
    /// The backend: `consul`, `etcd`, `amqp`, `memory`, or a custom kind's name.
    pub const BACKEND: &str = "backend";
    /// `leader` or `semaphore`.
    pub const KIND: &str = "kind";
    /// The leader key or semaphore prefix, as in the `LeaseSpec`.
    pub const KEY: &str = "key";
    /// Why a lease was lost (`lease_losses_total`).
    pub const REASON: &str = "reason";
    /// What kind of failure a backend request met (`lease_backend_errors_total`).
    pub const ERROR: &str = "error";
}

/// How a backend request failed: the `error` label of `lease_backend_errors_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RequestError {
    /// No answer: connection refused, reset or not established (`unreachable`).
    Unreachable,
    /// No answer in time (`timeout`).
    TimedOut,
    /// An answer with an error status (`status`).
    Status,
    /// An answer that could not be read (`malformed`).
    Malformed,
    /// Anything else (`other`).
    Other,
}

impl RequestError {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            RequestError::Unreachable => "unreachable",
            RequestError::TimedOut => "timeout",
            RequestError::Status => "status",
            RequestError::Malformed => "malformed",
            RequestError::Other => "other",
        }
    }
}

/// The `reason` label of a loss.
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
fn reason_label(reason: &LostReason) -> &'static str {
    match reason {
        LostReason::SessionInvalidated => "session_invalidated",
        LostReason::KeyDeleted => "key_deleted",
        LostReason::KeyReleased => "key_released",
        LostReason::KeyTaken { .. } => "key_taken",
        LostReason::HolderPruned => "holder_pruned",
        LostReason::SlotRemoved => "slot_removed",
        LostReason::ConnectionClosed => "connection_closed",
        LostReason::SelfFenced { .. } => "self_fenced",
        LostReason::ProcessPaused { .. } => "process_paused",
        LostReason::Released => "released",
    }
}

/// What carries a [`Tally`]: a lease (implemented where the lease is, so that this module does not
/// depend on it).
pub(crate) trait Tallied {
    /// The record of this lease.
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    fn tally(&self) -> &Tally;
}

/// Runs a backend's `acquire` and records its outcome: the wait, the acquisition, and (through
/// the lease's [`Tally`]) the lease held until it is released or lost.
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) async fn acquire<T: Tallied>(
    backend: BackendKind,
    spec: &LeaseSpec,
    acquire: impl Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    #[cfg(feature = "metrics")]
    {
        let started = tokio::time::Instant::now();
        let acquired = acquire.await;
        if let Ok(lease) = &acquired {
            let labels = imp::LeaseLabels::new(backend, spec);
            ::metrics::histogram!(ACQUIRE_WAIT, labels.to_vec()).record(started.elapsed());
            lease.tally().acquired(labels);
        }
        acquired
    }
    #[cfg(not(feature = "metrics"))]
    acquire.await
}

/// Records one request to the backend's server; `write` if it changes state there.
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub fn backend_request(backend: BackendKind, write: bool) {
    #[cfg(feature = "metrics")]
    {
        ::metrics::counter!(BACKEND_REQUESTS, labels::BACKEND => backend.as_str()).increment(1);
        if write {
            ::metrics::counter!(BACKEND_WRITES, labels::BACKEND => backend.as_str()).increment(1);
        }
    }
}

/// Records that a request already counted by [`backend_request`] changes state on the server, for
/// a backend that learns it only after counting the request.
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub fn backend_request_is_write(backend: BackendKind) {
    #[cfg(feature = "metrics")]
    ::metrics::counter!(BACKEND_WRITES, labels::BACKEND => backend.as_str()).increment(1);
}

/// Records a failed request to the backend's server (the in-process store has none).
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub fn backend_error(backend: BackendKind, error: RequestError) {
    #[cfg(feature = "metrics")]
    ::metrics::counter!(
        BACKEND_ERRORS,
        labels::BACKEND => backend.as_str(),
        labels::ERROR => error.as_str(),
    )
    .increment(1);
}

/// Records whether this process's campaign for `key` holds its term.
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn is_leader(key: &str, leader: bool) {
    #[cfg(feature = "metrics")]
    ::metrics::gauge!(IS_LEADER, labels::KEY => key.to_owned()).set(if leader { 1.0 } else { 0.0 });
}

/// Records how many holders the semaphore `key` has, as this process just read them.
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub fn semaphore_slots_in_use(backend: BackendKind, key: &str, holders: usize) {
    #[cfg(feature = "metrics")]
    ::metrics::gauge!(
        SEMAPHORE_SLOTS_IN_USE,
        labels::BACKEND => backend.as_str(),
        labels::KEY => key.to_owned(),
    )
    .set(holders as f64);
}

/// What one lease has recorded, so that its gauge goes up and down exactly once whichever of
/// its acquisition (in the backend's `acquire`) and its end (in the holder task) is seen first.
/// Empty without the `metrics` feature.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    #[cfg(feature = "metrics")]
    inner: std::sync::Mutex<imp::TallyInner>,
}

impl Tally {
    #[cfg(feature = "metrics")]
    fn lock(&self) -> std::sync::MutexGuard<'_, imp::TallyInner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The loss was declared now (called once, when the lease stops being held).
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn declared(&self, reason: &LostReason) {
        #[cfg(feature = "metrics")]
        if *reason != LostReason::Released {
            self.lock().lost_at = Some(tokio::time::Instant::now());
        }
    }

    /// The holder task is done with the lease: released, or lost for `reason` (refined).
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn ended(&self, reason: &LostReason) {
        #[cfg(feature = "metrics")]
        {
            let mut inner = self.lock();
            inner.ended = Some(reason.clone());
            inner.record_end();
        }
    }

    /// Guarded work was dropped because the lease was lost.
    pub(crate) fn cancelled(&self) {
        #[cfg(feature = "metrics")]
        {
            let inner = self.lock();
            if let (Some(labels), Some(lost_at)) = (&inner.labels, inner.lost_at) {
                ::metrics::histogram!(LOSS_TO_CANCEL, labels.to_vec()).record(lost_at.elapsed());
            }
        }
    }
}

#[cfg(feature = "metrics")]
mod imp {
    use ::metrics::Label;
    use tokio::time::Instant;

    use super::{ACQUISITIONS, LEASES_HELD, LOSSES, RELEASES, Tally, labels, reason_label};
    use crate::{BackendKind, LeaseSpec, LostReason, Target};

    /// The labels of one lease.
    #[derive(Clone, Debug)]
    pub(super) struct LeaseLabels {
        backend: &'static str,
        kind: &'static str,
        key: String,
    }

    impl LeaseLabels {
        pub(super) fn new(backend: BackendKind, spec: &LeaseSpec) -> Self {
            let kind = match spec.target() {
                Target::Leader { .. } => "leader",
                Target::Semaphore { .. } => "semaphore",
            };
            LeaseLabels {
                backend: backend.as_str(),
                kind,
                key: spec.key().to_owned(),
            }
        }

        pub(super) fn to_vec(&self) -> Vec<Label> {
            vec![
                Label::new(labels::BACKEND, self.backend),
                Label::new(labels::KIND, self.kind),
                Label::new(labels::KEY, self.key.clone()),
            ]
        }
    }

    #[derive(Debug, Default)]
    pub(super) struct TallyInner {
        pub(super) labels: Option<LeaseLabels>,
        pub(super) ended: Option<LostReason>,
        pub(super) lost_at: Option<Instant>,
        recorded_end: bool,
    }

    impl TallyInner {
        /// Records the end once both the labels and the end are known.
        pub(super) fn record_end(&mut self) {
            let (Some(labels), Some(reason)) = (&self.labels, &self.ended) else {
                return;
            };
            if std::mem::replace(&mut self.recorded_end, true) {
                return;
            }
            ::metrics::gauge!(LEASES_HELD, labels.to_vec()).decrement(1.0);
            if *reason == LostReason::Released {
                ::metrics::counter!(RELEASES, labels.to_vec()).increment(1);
            } else {
                let mut with_reason = labels.to_vec();
                with_reason.push(Label::new(labels::REASON, reason_label(reason)));
                ::metrics::counter!(LOSSES, with_reason).increment(1);
            }
        }
    }

    impl Tally {
        /// The backend's `acquire` returned this lease.
        pub(super) fn acquired(&self, labels: LeaseLabels) {
            ::metrics::counter!(ACQUISITIONS, labels.to_vec()).increment(1);
            ::metrics::gauge!(LEASES_HELD, labels.to_vec()).increment(1.0);
            let mut inner = self.lock();
            inner.labels = Some(labels);
            inner.record_end();
        }
    }
}
