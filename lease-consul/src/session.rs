//! Consul sessions: created per lease, kept alive while it lives, destroyed when it ends.
//!
//! A session is kept alive by the process's heartbeat check (`keepalive`, the default) or by
//! renewing its own TTL (`KeepAlive::SessionTtl`). Either way, the loop that keeps it alive is
//! where this crate self-fences. For renewals: Consul promises
//! not to invalidate a session before its TTL has passed since the last renewal the servers
//! processed. A renewal we *sent* at time T and saw succeed was processed after T, so the session
//! is safe until at least T + TTL. If no renewal succeeds, the loop gives the session up at
//! T + TTL − margin on our own clock, whatever the network does, so the work is cancelled before
//! Consul could hand the lease to someone else.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::client::Client;
use super::keepalive::Heartbeat;
use super::kind::LEADER_FLAGS;
use super::retry::{retry_transient, within};
use super::watch::{Interest, Listing};
use super::wire::{Behavior, ConsulHttp, SessionLife, TxnOp};
use lease_core::backend::{Fence, Hold, RELEASE_BOUND};
use lease_core::{Backend, BackendKind, BoxFuture, Error, Lease, LeaseSpec, LostReason, Sequencer};

/// How a session's life ended, as seen by its renew loop.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum SessionEnd {
    /// Consul no longer knows the session (destroyed, expired, checks failed).
    Invalidated,
    /// No renewal succeeded for TTL − margin: the session must be treated as lost, for
    /// `reason` (self-fenced, or this process was paused: see [`SessionEnd::fenced`]).
    Fenced {
        reason: LostReason,
        last_error: Option<String>,
    },
}

impl SessionEnd {
    /// The session's `fence` passed (or a renewal ran into its deadline): the loss the fence
    /// declares ([`Fence::expired`]), which names a pause of this process rather than Consul when
    /// the fence's timer ran late; `SelfFenced` if the deadline is, just, not behind us.
    pub(crate) fn fenced(fence: &Fence, last_error: Option<String>) -> SessionEnd {
        let reason = fence.expired().unwrap_or_else(|| LostReason::SelfFenced {
            unconfirmed_for: fence.confirmed_at().map_or(Duration::ZERO, |c| c.elapsed()),
        });
        SessionEnd::Fenced { reason, last_error }
    }

    /// The error for an `acquire` whose waiting session could not be kept alive: Consul's
    /// failure, or (this process was paused, and Consul was not even asked) the loss.
    pub(crate) fn into_wait_error(self, key: &str) -> Error {
        let message = match self {
            SessionEnd::Invalidated => "the session was invalidated".into(),
            SessionEnd::Fenced {
                reason: reason @ LostReason::ProcessPaused { .. },
                ..
            } => return Error::Lost(reason),
            SessionEnd::Fenced { last_error, .. } => {
                last_error.unwrap_or_else(|| "renewals did not succeed".into())
            }
        };
        Error::Backend {
            backend: "Consul",
            operation: format!("keep a session alive while waiting for {key:?}"),
            message,
            transient: true,
        }
    }
}

impl From<SessionEnd> for LostReason {
    fn from(end: SessionEnd) -> Self {
        match end {
            SessionEnd::Invalidated => LostReason::SessionInvalidated,
            SessionEnd::Fenced { reason, .. } => reason,
        }
    }
}

/// What keeps a session alive (its renew loop, or its share of the heartbeat), boxed so acquire
/// can poll it while waiting and then hand it to the holder task. It ends when the session must
/// be considered gone.
pub(crate) type Renewals = Pin<Box<dyn Future<Output = SessionEnd> + Send>>;

/// A session this process created. Dropping it gives it back in the background (releasing the
/// leader key it may hold first, so the next holder does not wait out the lock-delay).
#[derive(Debug)]
pub(crate) struct Session {
    client: Arc<Client>,
    id: String,
    fence: Fence,
    /// A leader key this session may hold: released before the session is destroyed.
    key: Option<String>,
    ended: bool,
    /// The heartbeat the session is tied to (kept registered while the session lives).
    _heartbeat: Option<Arc<Heartbeat>>,
}

impl Session {
    /// Creates a session for `spec`, and what keeps it alive (returned, to be polled), which
    /// confirms the session's [`Fence`].
    pub(crate) async fn create(
        client: &Arc<Client>,
        spec: &LeaseSpec,
        behavior: Behavior,
    ) -> Result<(Session, Renewals), Error> {
        let http = client.wire();
        let ttl = spec.session_ttl();
        let heartbeat = client
            .keep_alives()
            .heartbeat(ttl, spec.fence_after())
            .await?;
        let life = match &heartbeat {
            Some(heartbeat) => SessionLife::Check(heartbeat.check()),
            None => SessionLife::Ttl(ttl),
        };
        let sent = Instant::now();
        let id = http
            .session_create(
                &spec.session_name_or_default(),
                life,
                spec.session_lock_delay(),
                behavior,
            )
            .await
            .map_err(|e| {
                e.into_error(http, format_args!("create a session for {:?}", spec.key()))
            })?;
        tracing::debug!(session = %id, ?ttl, "session created");
        let (fence, renewals): (Fence, Renewals) = match &heartbeat {
            Some(heartbeat) => {
                // Valid as long as the check: from its last pass, not from now.
                let fence =
                    Fence::new(spec.fence_after(), heartbeat.confirmed_at().unwrap_or(sent));
                let keep = Arc::clone(heartbeat).keep(fence.clone());
                (fence, Box::pin(keep))
            }
            None => {
                let fence = Fence::new(spec.fence_after(), sent);
                let renew = renew_until_ended(Arc::clone(http), id.clone(), ttl, fence.clone());
                (fence, Box::pin(renew))
            }
        };
        Ok((
            Session {
                client: Arc::clone(client),
                id,
                fence,
                key: None,
                ended: false,
                _heartbeat: heartbeat,
            },
            renewals,
        ))
    }

    pub(crate) fn id(&self) -> &str {
        &self.id
    }

    /// The client the session was created by.
    pub(crate) fn client(&self) -> &Arc<Client> {
        &self.client
    }

    /// Its client's wire client.
    pub(crate) fn wire(&self) -> &Arc<ConsulHttp> {
        self.client.wire()
    }

    /// The self-fencing deadline of whatever this session holds.
    pub(crate) fn fence(&self) -> &Fence {
        &self.fence
    }

    /// Marks `key` (a leader key) as possibly held by this session, before trying to take it.
    pub(crate) fn may_hold(&mut self, key: &str) {
        self.key = Some(key.to_owned());
    }

    /// Gives everything back cleanly: releases the leader key (no lock-delay for the next
    /// holder), then destroys the session.
    pub(crate) async fn give_back(&mut self) -> Result<(), Error> {
        self.ended = true;
        let released = Some(self.client.released());
        give_back(self.wire(), released, &self.id, self.key.as_deref()).await
    }

    /// Destroys the session without releasing first: after a loss, whatever it still holds stays
    /// under lock-delay while the work stops.
    pub(crate) async fn destroy(&mut self) -> Result<(), Error> {
        self.ended = true;
        destroy(self.wire(), &self.id).await
    }

    /// [`give_back`](Session::give_back) on a detached runtime, for a process that is ending.
    pub(crate) fn abandon(mut self) -> Option<BoxFuture<'static, ()>> {
        self.ended = true;
        let give_back = detached_give_back(self.wire(), &self.id, self.key.as_deref())?;
        // Deregistering the heartbeat check first would invalidate the session under its
        // lock-delay instead of releasing it: keep the check until the give-back is done.
        let heartbeat = self._heartbeat.take();
        Some(Box::pin(async move {
            give_back.await;
            drop(heartbeat);
        }))
    }
}

impl Session {
    /// Whether [`keep`](Session::keep) can leave what this session holds held past it: a leader
    /// key (a semaphore slot cannot be handed to another session without rewriting the holders
    /// every contender agrees on).
    pub(crate) fn can_keep(&self) -> bool {
        self.key.is_some()
    }

    /// Leaves the leader key held for `left` more, by a session of its own that nothing renews,
    /// then destroys this one; gives everything back as usual if that fails.
    pub(crate) async fn keep(&mut self, left: Duration) -> Result<(), Error> {
        let Some(key) = self.key.clone() else {
            return self.give_back().await;
        };
        match keep_key(self.wire(), &key, &self.id, left).await {
            Ok(()) => {
                self.ended = true;
                destroy(self.wire(), &self.id).await
            }
            Err(error) => {
                tracing::debug!(%error, key, "could not keep the key for its min_hold; releasing it");
                self.give_back().await
            }
        }
    }

    /// [`keep`](Session::keep) on a detached runtime, for a process that is ending.
    pub(crate) fn abandon_kept(mut self, until: Instant) -> Option<BoxFuture<'static, ()>> {
        let Some(key) = self.key.clone() else {
            return self.abandon();
        };
        self.ended = true;
        let http = self.wire().detached()?;
        let id = self.id.clone();
        let heartbeat = self._heartbeat.take();
        Some(Box::pin(async move {
            let left = until.saturating_duration_since(Instant::now());
            if keep_key(&http, &key, &id, left).await.is_ok() {
                let _ = destroy(&http, &id).await;
            } else {
                let _ = give_back(&http, None, &id, Some(&key)).await;
            }
            drop(heartbeat);
        }))
    }
}

/// Hands the leader `key`, held by `session`, to a new session that nothing renews, in one
/// transaction (unlock, then lock by the new session, value and flags kept as `consul lock`
/// reads them): the key stays held whatever becomes of this process, and Consul releases it
/// when that session's TTL runs out. Its TTL is `left` rounded up to whole seconds, and at
/// least Consul's minimum of 10 s; Consul invalidates a session between one and two TTLs after
/// its last renewal (1.8 waits two), so the key is free again between `left` (or 10 s) and
/// twice that from now. Its lock-delay is zero: the work under the key has ended, there is
/// nothing left to protect. The key's LockIndex rises with the new session, as with any new
/// holder.
async fn keep_key(
    http: &ConsulHttp,
    key: &str,
    session: &str,
    left: Duration,
) -> Result<(), Error> {
    /// Consul's shortest session TTL, and its longest.
    const TTL_RANGE: (Duration, Duration) = (Duration::from_secs(10), Duration::from_secs(86_400));
    let whole_seconds = left.as_secs() + u64::from(left.subsec_nanos() > 0);
    let ttl = Duration::from_secs(whole_seconds).clamp(TTL_RANGE.0, TTL_RANGE.1);
    let fail = |e: super::wire::ApiError| e.into_error(http, format_args!("keep {key:?}"));
    let (entry, _) = http.kv_get(key).await.map_err(fail)?;
    let entry = entry
        .filter(|entry| entry.holder() == Some(session))
        .ok_or(Error::Lost(LostReason::KeyReleased))?;
    let value = entry.decoded_value().map_err(Error::config)?;
    let keeper = http
        .session_create(
            &format!("{key} (min_hold)"),
            SessionLife::Ttl(ttl),
            Duration::ZERO,
            Behavior::Release,
        )
        .await
        .map_err(fail)?;
    let handed = http
        .txn(&[
            TxnOp::CheckIndex {
                key,
                index: entry.modify_index,
            },
            TxnOp::Unlock {
                key,
                session,
                flags: LEADER_FLAGS,
            },
            TxnOp::Lock {
                key,
                session: &keeper,
                value: &value,
                flags: LEADER_FLAGS,
            },
        ])
        .await;
    match handed {
        Ok(Ok(_)) => {
            tracing::debug!(key, session = %keeper, ?ttl, "leader key kept for its min_hold by a session nothing renews");
            Ok(())
        }
        other => {
            let _ = http.session_destroy(&keeper).await;
            match other {
                Err(error) => Err(fail(error)),
                _ => Err(Error::Lost(LostReason::KeyReleased)),
            }
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        // An acquire that was cancelled, or a session dropped with its runtime: give it back in
        // the background, or from a detached runtime if this one is ending.
        let (client, id, key) = (
            Arc::clone(&self.client),
            std::mem::take(&mut self.id),
            self.key.take(),
        );
        let abandoned = (Arc::clone(client.wire()), id.clone(), key.clone());
        // The heartbeat check stays registered until the session is given back.
        let heartbeat = self._heartbeat.take();
        client.keepers().clone().spawn_clean_up(
            async move {
                let released = Some(client.released());
                if let Err(error) = give_back(client.wire(), released, &id, key.as_deref()).await {
                    tracing::warn!(session = %id, %error, "could not destroy session; it expires with its TTL or heartbeat check");
                }
                drop(heartbeat);
            },
            move || {
                let (http, id, key) = abandoned;
                detached_give_back(&http, &id, key.as_deref())
            },
        );
    }
}

fn detached_give_back(
    http: &ConsulHttp,
    id: &str,
    key: Option<&str>,
) -> Option<BoxFuture<'static, ()>> {
    let http = http.detached()?;
    let (id, key) = (id.to_owned(), key.map(str::to_owned));
    Some(Box::pin(async move {
        let _ = give_back(&http, None, &id, key.as_deref()).await;
    }))
}

/// Releases `key` (if any) and destroys session `id`; a clean release is recorded in
/// `released` (the client's; none on the detached runtime, where nobody contends any more).
async fn give_back(
    http: &ConsulHttp,
    released_sessions: Option<&ReleasedSessions>,
    id: &str,
    key: Option<&str>,
) -> Result<(), Error> {
    // Destroying the session also releases the key if the release fails (subject to lock-delay
    // then), so do it in every case.
    let released = match key {
        Some(key) => release_key(http, key, id).await,
        None => Ok(()),
    };
    if let Some(sessions) = released_sessions.filter(|_| key.is_some() && released.is_ok()) {
        sessions.record(id);
    }
    released.and(destroy(http, id).await)
}

/// The sessions a client gave back with a clean release (the key released, then the session
/// destroyed), the most recent [`ReleasedSessions::KEPT`] of them.
///
/// A contender that sees a key released under a lock-delay shorter than its settle time asks
/// Consul whether the last holder's session still exists: gone, it was invalidated, and its
/// holder may still be stopping. But a clean release destroys the session right after, and the
/// contender's question often came after the destroy: every hand-off between the tasks of one
/// process settled (104 ms against 4 ms). A session this client released itself is known to have
/// gone cleanly, whatever Consul answers by then. (Between processes the question stays, and
/// its answer errs on the side of settling.)
#[derive(Debug, Default)]
pub(crate) struct ReleasedSessions(std::sync::Mutex<std::collections::VecDeque<String>>);

impl ReleasedSessions {
    /// How many are remembered: far more than a process hands over within one settle time.
    const KEPT: usize = 1024;

    fn record(&self, session: &str) {
        let mut sessions = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if sessions.len() == Self::KEPT {
            sessions.pop_front();
        }
        sessions.push_back(session.to_owned());
    }

    /// Whether this client released `session`'s key cleanly.
    pub(crate) fn contains(&self, session: &str) -> bool {
        let sessions = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        sessions.iter().rev().any(|s| s == session)
    }
}

/// `PUT ?release=`, retrying brief trouble. A `false` answer means the key was no longer ours:
/// nothing to give back.
async fn release_key(http: &ConsulHttp, key: &str, session: &str) -> Result<(), Error> {
    retry_transient(within(RELEASE_BOUND), || {
        http.kv_release(key, session, LEADER_FLAGS)
    })
    .await
    .map(drop)
    .map_err(|e| e.into_error(http, format_args!("release {key:?}")))
}

/// Destroys a session, retrying transient failures.
async fn destroy(http: &ConsulHttp, id: &str) -> Result<(), Error> {
    retry_transient(within(RELEASE_BOUND), || http.session_destroy(id))
        .await
        .map_err(|e| e.into_error(http, format_args!("destroy session {id}")))?;
    tracing::debug!(session = %id, "session destroyed");
    Ok(())
}

use lease_http::retry_pause;

/// Renews `id` every TTL/2, confirming `fence` with each renewal's send time, until Consul says
/// the session is gone or the fence's deadline passes (then it returns `Fenced`, at that
/// deadline, not later).
async fn renew_until_ended(
    http: Arc<ConsulHttp>,
    id: String,
    ttl: Duration,
    fence: Fence,
) -> SessionEnd {
    let retry_every = retry_pause(ttl);
    let mut next = fence.confirmed_at().unwrap_or_else(Instant::now) + ttl / 2;
    let mut last_error = None;
    loop {
        let Some(deadline) = fence.deadline() else {
            return std::future::pending().await;
        };
        tokio::time::sleep_until(next.min(deadline)).await;
        if fence.is_past() {
            return SessionEnd::fenced(&fence, last_error);
        }
        let sent = Instant::now();
        match tokio::time::timeout_at(deadline, http.session_renew(&id)).await {
            Ok(Ok(true)) => {
                fence.confirm(sent);
                next = sent + ttl / 2;
                last_error = None;
            }
            Ok(Ok(false)) => return SessionEnd::Invalidated,
            Ok(Err(error)) => {
                tracing::debug!(session = %id, %error, "session renew failed; retrying");
                last_error = Some(error.to_string());
                next = Instant::now() + retry_every;
            }
            Err(_) => {
                return SessionEnd::fenced(
                    &fence,
                    Some("the renew request did not complete".into()),
                );
            }
        }
    }
}

/// What a session-backed lease holds (a leader key, a semaphore slot): what to watch, how to
/// judge it, and how to give it back. Everything else (keeping the session alive, the
/// self-fence, the clean-up after a loss, the last-resort release) is [`SessionHold`]'s, the
/// same for both.
pub(crate) trait SessionLock: Send + Sync + 'static {
    /// The reason a loss that may have gone with the session is first published as (a leader
    /// key released, a contender key deleted); [`went_with_session`] refines it.
    const COARSE: LostReason;

    /// The key or prefix whose changes can mean loss.
    fn interest(&self) -> Interest;

    /// Whether the acquisition by `session` is lost, judged from a listing that covers
    /// [`interest`](SessionLock::interest).
    fn verdict(&self, listing: &Listing, session: &str) -> Option<LostReason>;

    /// Gives the lock back cleanly. `session` may be taken (a semaphore's pool keeps it), and
    /// `renewals` with it.
    fn give_back(
        &mut self,
        session: &mut Option<Session>,
        renewals: &mut Renewals,
    ) -> impl Future<Output = Result<(), Error>> + Send;
}

/// The [`Hold`] of every Consul lease: a session, what keeps it alive, and the lock it holds.
pub(crate) struct SessionHold<L> {
    lock: L,
    /// Taken by a give-back that keeps the session elsewhere.
    session: Option<Session>,
    renewals: Renewals,
    /// The index of our acquisition: older listings do not show it and are not judged.
    acquired_at: u64,
    /// Set by [`Hold::keep_until`]: a release before it leaves the key held until then.
    keep_until: Option<Instant>,
}

/// Turns what `session` acquired (`key`, created at `create_index` (the sequencer's generation,
/// 0 for none), at LockIndex `lock_index`, written at `index`) into a lease held by a
/// [`SessionHold`] of `lock`, and starts its holder task.
pub(crate) fn start_lease<L: SessionLock>(
    (key, create_index, lock_index, index): (&str, u64, u64, u64),
    session: Session,
    renewals: Renewals,
    backend: Arc<dyn Backend>,
    lock: L,
) -> Lease {
    let sequencer = Sequencer::new(BackendKind::Consul, key, lock_index, session.id())
        .with_generation(create_index);
    tracing::info!(%sequencer, "lease acquired");
    let (keepers, fence) = (session.client().keepers().clone(), session.fence().clone());
    let hold = SessionHold {
        lock,
        session: Some(session),
        renewals,
        acquired_at: index,
        keep_until: None,
    };
    keepers.start(sequencer, fence, backend, hold)
}

impl<L: SessionLock> Hold for SessionHold<L> {
    async fn watch(&mut self) -> LostReason {
        let Some(session) = &self.session else {
            return LostReason::Released;
        };
        let (lock, id, acquired_at) = (&self.lock, session.id(), self.acquired_at);
        // Suspends the session's fence whenever nothing reads the lock's key: a lease the
        // process cannot see is not kept alive by its session alone.
        let mut watched =
            session
                .client()
                .watches()
                .watch(lock.interest(), false, Some(session.fence()));
        let lock_watch = async {
            loop {
                // Failures are not reported to this watch: keeping the session alive is what
                // self-fences when they last.
                if let Ok(listing) = watched.next(acquired_at).await {
                    if let Some(reason) = lock.verdict(&listing, id) {
                        return reason;
                    }
                }
            }
        };
        tokio::select! {
            biased;
            end = &mut self.renewals => end.into(),
            reason = lock_watch => reason,
        }
    }

    async fn refine(&mut self, reason: &LostReason) -> Option<LostReason> {
        let session = self.session.as_ref()?;
        if *reason != L::COARSE {
            return None;
        }
        went_with_session(session.wire(), session.id()).await
    }

    fn keep_until(&mut self, until: Instant) -> bool {
        let can = self.session.as_ref().is_some_and(Session::can_keep);
        if can {
            self.keep_until = Some(until);
        }
        can
    }

    async fn release(&mut self) -> Result<(), Error> {
        let left = self
            .keep_until
            .map(|until| until.saturating_duration_since(Instant::now()))
            .filter(|left| !left.is_zero());
        if let (Some(left), Some(session)) = (left, &mut self.session) {
            return session.keep(left).await;
        }
        self.lock
            .give_back(&mut self.session, &mut self.renewals)
            .await
    }

    async fn clean_up(&mut self, _reason: &LostReason) {
        // After a loss the work may still be stopping: destroy the session without releasing
        // first, so whatever it still holds stays under lock-delay (or is pruned after the
        // settle time) while the work stops.
        if let Some(session) = &mut self.session {
            if let Err(error) = session.destroy().await {
                tracing::warn!(%error, "could not destroy the session of a lost lease; it expires with its TTL or heartbeat check");
            }
        }
    }

    fn abandon(self) -> Option<BoxFuture<'static, ()>> {
        match self.keep_until.filter(|until| *until > Instant::now()) {
            Some(until) => self.session?.abandon_kept(until),
            None => self.session?.abandon(),
        }
    }
}

/// The answer of a one-off check (`check_sequencer`) from its verdict: the loss, refined as the
/// holder task of an `L` refines it.
pub(crate) async fn judged<L: SessionLock>(
    http: &ConsulHttp,
    session: &str,
    lost: Option<LostReason>,
) -> Result<(), Error> {
    match lost {
        None => Ok(()),
        Some(reason) if reason == L::COARSE => {
            let refined = went_with_session(http, session).await;
            Err(Error::Lost(refined.unwrap_or(reason)))
        }
        Some(reason) => Err(Error::Lost(reason)),
    }
}

/// Whether a lock that went away under `session` (a leader key released, a contender key
/// deleted) went with the session itself: one read of the session. `None` if the session still
/// exists or the read failed: the reason seen stands.
pub(crate) async fn went_with_session(http: &ConsulHttp, session: &str) -> Option<LostReason> {
    match http.session_exists(session).await {
        Ok(false) => Some(LostReason::SessionInvalidated),
        Ok(true) | Err(_) => None,
    }
}
