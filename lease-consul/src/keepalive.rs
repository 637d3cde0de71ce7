//! Keeping every session of a process alive with one heartbeat ([`KeepAlive::AgentCheck`]).
//!
//! Consul renews sessions one at a time: with a TTL per session, 10,000 leases of TTL 15 s cost
//! 1,333 renewals a second, idle. Sessions can instead be tied to health checks: Consul
//! invalidates a session the moment one of its checks turns critical. So the process registers
//! one TTL check on its agent (as the check of a service `lease`, so that Consul deregisters it
//! a minute after the process dies), ties every session it creates to it, and passes it every
//! TTL/2: one request per TTL/2 keeps any number of sessions alive, and each lease still has its
//! own session, so destroying one session loses exactly one lease.
//!
//! Self-fencing works as with renewals: the agent turns the check critical no
//! earlier than TTL after the last pass it received, so a pass *sent* at T that succeeded keeps
//! every session tied to the check valid until at least T + TTL. Each session's fence is confirmed
//! by the heartbeat's passes, and a session is given up at the fence deadline if none succeeds.
//! Sessions are created only after a pass (or the registration) succeeded, and their fence
//! starts at that pass, not at their creation.
//!
//! If the agent forgets the check (it was restarted, or someone deregistered it), Consul has
//! invalidated every session tied to it: the heartbeat ends, its sessions end as invalidated,
//! and the next session registers a new check.

use std::collections::BTreeMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::AbortHandle;
use tokio::time::Instant;

use super::session::SessionEnd;
use super::wire::ConsulHttp;
use lease_core::Error;
use lease_core::backend::{Fence, Keepers};

/// How a client keeps its sessions alive (see [`ConsulBuilder::keep_alive`](crate::ConsulBuilder::keep_alive)).
///
/// # Examples
///
/// A client for a token without `service:write`, with a larger connection budget:
///
/// ```
/// use lease_consul::{Consul, KeepAlive};
///
/// let consul = Consul::builder()
///     .max_connections(16)
///     .keep_alive(KeepAlive::SessionTtl)
///     .build()
///     .unwrap();
/// # let _ = consul;
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeepAlive {
    /// One TTL check per process (per session TTL), registered on the agent as the service
    /// `lease` and passed every TTL/2; every session of the process is tied to it. Idle traffic
    /// does not grow with the number of leases, and a process that dies loses its leases one
    /// TTL after its last pass (a session TTL takes up to twice that: Consul doubles it).
    /// This needs `service:write` on `lease` beside `session:write` and `key:write`; with a
    /// token that lacks it, the client warns once and falls back to [`KeepAlive::SessionTtl`].
    #[default]
    AgentCheck,
    /// Each session has its own TTL and is renewed every TTL/2, as `consul lock` does: one
    /// request per lease per TTL/2, and no service registration (for tokens without
    /// `service:write`).
    SessionTtl,
}

/// The service name under which heartbeat checks are registered.
const SERVICE_NAME: &str = "lease";
/// How long after turning critical Consul deregisters a dead process's check (its minimum).
const REAP_AFTER: Duration = Duration::from_secs(60);

/// The heartbeats of one client, one per session TTL in use.
#[derive(Debug)]
pub(crate) struct KeepAlives {
    mode: KeepAlive,
    /// The wire client each heartbeat is handed when it starts.
    wire: Arc<ConsulHttp>,
    /// Where a heartbeat's clean-up runs once its last session is gone.
    keepers: Keepers,
    beats: tokio::sync::Mutex<Beats>,
}

#[derive(Debug, Default)]
struct Beats {
    by_ttl: BTreeMap<Duration, Weak<Heartbeat>>,
    /// The token may not register a check: sessions renew their own TTL instead.
    denied: bool,
}

/// What the heartbeat last achieved.
#[derive(Clone, Debug, Default)]
struct Beat {
    /// When the last successful pass (or the registration) was sent.
    confirmed: Option<Instant>,
    /// Why the last pass failed, if it did.
    last_error: Option<Arc<str>>,
    /// The agent no longer knows the check: every session tied to it is invalid.
    gone: bool,
    /// No pass was confirmed in time: the check may have turned critical meanwhile, and a later
    /// pass would revive the check but not the sessions it invalidated. Never confirmed again.
    expired: bool,
}

/// One registered TTL check, passed every TTL/2 while any session is tied to it.
#[derive(Debug)]
pub(crate) struct Heartbeat {
    /// The wire client, to deregister the check when the last session goes (the wire owns
    /// nothing above it, so holding it closes no cycle).
    http: Arc<ConsulHttp>,
    keepers: Keepers,
    check: String,
    /// Confirmed by the passes: past its deadline, the check may have turned critical.
    fence: Fence,
    beat: watch::Receiver<Beat>,
    task: AbortHandle,
}

impl KeepAlives {
    pub(crate) fn new(mode: KeepAlive, wire: Arc<ConsulHttp>, keepers: Keepers) -> Self {
        KeepAlives {
            mode,
            wire,
            keepers,
            beats: tokio::sync::Mutex::default(),
        }
    }

    /// The heartbeat sessions of `ttl` are tied to, registered if none is alive; `None` when
    /// sessions renew their own TTL. `fence_after` is how long a pass keeps them valid
    /// (`LeaseSpec::fence_after`).
    pub(crate) async fn heartbeat(
        &self,
        ttl: Duration,
        fence_after: Duration,
    ) -> Result<Option<Arc<Heartbeat>>, Error> {
        if self.mode == KeepAlive::SessionTtl {
            return Ok(None);
        }
        let mut beats = self.beats.lock().await;
        if beats.denied {
            return Ok(None);
        }
        if let Some(beat) = beats.by_ttl.get(&ttl).and_then(Weak::upgrade) {
            let current = beat.beat.borrow().clone();
            if !current.gone && !current.expired && !beat.fence.is_past() {
                return Ok(Some(beat));
            }
        }
        let beat = match Heartbeat::register(&self.wire, &self.keepers, ttl, fence_after).await {
            Ok(beat) => Arc::new(beat),
            Err(Error::PermissionDenied { message, .. }) => {
                tracing::warn!(
                    %message,
                    "the ACL token may not register a heartbeat check (service:write on {SERVICE_NAME:?}); \
                     sessions renew their own TTL instead, one request per lease per TTL/2. Grant it, \
                     or choose KeepAlive::SessionTtl to silence this"
                );
                beats.denied = true;
                return Ok(None);
            }
            Err(error) => return Err(error),
        };
        beats.by_ttl.retain(|_, beat| beat.strong_count() > 0);
        beats.by_ttl.insert(ttl, Arc::downgrade(&beat));
        Ok(Some(beat))
    }
}

impl Heartbeat {
    async fn register(
        http: &Arc<ConsulHttp>,
        keepers: &Keepers,
        ttl: Duration,
        fence_after: Duration,
    ) -> Result<Heartbeat, Error> {
        let check = format!(
            "{SERVICE_NAME}-{:016x}{:016x}-{}s",
            lease_core::backoff::random_below(u64::MAX),
            lease_core::backoff::random_below(u64::MAX),
            ttl.as_secs()
        );
        let sent = Instant::now();
        http.agent_register_ttl_check(&check, SERVICE_NAME, ttl, REAP_AFTER)
            .await
            .map_err(|e| {
                e.into_error(
                    http,
                    format_args!(
                        "register the heartbeat check {check:?} (the token needs service:write on \
                         {SERVICE_NAME:?}; or use KeepAlive::SessionTtl)"
                    ),
                )
            })?;
        tracing::debug!(%check, ?ttl, "heartbeat check registered");
        let (tx, beat) = watch::channel(Beat {
            confirmed: Some(sent),
            ..Beat::default()
        });
        let fence = Fence::new(fence_after, sent);
        let task = lease_core::runtime::spawn(beat_until_gone(
            Arc::clone(http),
            check.clone(),
            ttl,
            fence.clone(),
            tx,
        ));
        Ok(Heartbeat {
            http: Arc::clone(http),
            keepers: keepers.clone(),
            check,
            fence,
            beat,
            task: task.abort_handle(),
        })
    }

    /// The check sessions are tied to.
    pub(crate) fn check(&self) -> &str {
        &self.check
    }

    /// When the last successful pass was sent: where a new session's fence starts.
    pub(crate) fn confirmed_at(&self) -> Option<Instant> {
        self.beat.borrow().confirmed
    }

    /// Confirms `fence` with every successful pass, until the check is gone (the session was
    /// invalidated with it) or the fence's deadline passes.
    pub(crate) async fn keep(self: Arc<Self>, fence: Fence) -> SessionEnd {
        let mut beat = self.beat.clone();
        loop {
            let (gone, expired, last_error) = {
                let current = beat.borrow_and_update();
                if let Some(sent) = current.confirmed.filter(|_| !current.expired) {
                    fence.confirm(sent);
                }
                (current.gone, current.expired, current.last_error.clone())
            };
            if gone {
                return SessionEnd::Invalidated;
            }
            if expired {
                return SessionEnd::fenced(&fence, last_error.map(|e| e.to_string()));
            }
            let Some(deadline) = fence.deadline() else {
                return std::future::pending().await;
            };
            tokio::select! {
                biased;
                changed = beat.changed() => {
                    if changed.is_err() {
                        // The task ended: aborted with the last session, which is not this one.
                        return std::future::pending().await;
                    }
                }
                () = tokio::time::sleep_until(deadline) => {
                    if fence.is_past() {
                        return SessionEnd::fenced(&fence, last_error.map(|e| e.to_string()));
                    }
                }
            }
        }
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.task.abort();
        // The last session is gone: deregister the check, so the agent keeps nothing behind.
        let http = Arc::clone(&self.http);
        let check = std::mem::take(&mut self.check);
        let abandoned = (Arc::clone(&http), check.clone());
        self.keepers.clone().spawn_clean_up(
            async move {
                if let Err(error) = http.agent_deregister(&check).await {
                    tracing::debug!(%check, %error, "could not deregister the heartbeat check; Consul reaps it a minute after it turns critical");
                }
            },
            move || {
                let (http, check) = abandoned;
                let http = http.detached()?;
                Some(Box::pin(async move {
                    let _ = http.agent_deregister(&check).await;
                }))
            },
        );
    }
}

/// Passes `check` every TTL/2 (retrying sooner after a failure) and publishes each outcome,
/// until the agent forgets the check or no pass is confirmed before `fence`'s deadline.
///
/// A pass counts only if its answer arrives before that deadline: a later one may have found
/// the check critical (its sessions invalidated) and revived it.
async fn beat_until_gone(
    http: Arc<ConsulHttp>,
    check: String,
    ttl: Duration,
    fence: Fence,
    tx: watch::Sender<Beat>,
) {
    let retry_every = lease_http::retry_pause(ttl);
    let mut next = fence.confirmed_at().unwrap_or_else(Instant::now) + ttl / 2;
    loop {
        let Some(deadline) = fence.deadline() else {
            return;
        };
        tokio::time::sleep_until(next.min(deadline)).await;
        let sent = Instant::now();
        let passed = match tokio::time::timeout_at(deadline, http.agent_check_pass(&check)).await {
            Ok(passed) if !fence.is_past() => passed,
            _ => {
                tracing::warn!(%check, "no heartbeat pass was confirmed in time; its sessions are given up");
                tx.send_modify(|beat| beat.expired = true);
                return;
            }
        };
        match passed {
            Ok(true) => {
                fence.confirm(sent);
                tx.send_modify(|beat| {
                    beat.confirmed = Some(sent);
                    beat.last_error = None;
                });
                next = sent + ttl / 2;
            }
            Ok(false) => {
                tracing::warn!(%check, "the agent no longer knows the heartbeat check; its sessions are invalidated");
                tx.send_modify(|beat| beat.gone = true);
                return;
            }
            Err(error) => {
                tracing::debug!(%check, %error, "heartbeat pass failed; retrying");
                let text: Arc<str> = Arc::from(error.to_string());
                tx.send_modify(|beat| beat.last_error = Some(text));
                next = Instant::now() + retry_every;
            }
        }
    }
}
