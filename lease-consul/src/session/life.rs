//! A session's life: created for a lease, kept alive (its own renewals, or its share of the
//! heartbeat), given back or destroyed when the lease ends, handed to a session nothing renews
//! for a `min_hold`.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::end::{Renewals, SessionEnd};
use super::released::{Holding, ReleasedSessions};
use crate::client::Client;
use crate::keepalive::Heartbeat;
use crate::kind::LEADER_FLAGS;
use crate::wire::{ApiError, Behavior, ConsulHttp, SessionLife, TxnOp};
use lease_core::backend::{Fence, RELEASE_BOUND};
use lease_core::{BoxFuture, Error, LeaseSpec, LostReason};
use lease_http::{retry_transient, within};

/// A session this process created. Dropping it gives it back in the background (releasing the
/// leader key it may hold first, so the next holder does not wait out the lock-delay).
#[derive(Debug)]
pub(crate) struct Session {
    client: Arc<Client>,
    id: String,
    fence: Fence,
    /// A leader key this session may hold: released before the session is destroyed.
    key: Option<String>,
    /// The CreateIndex and LockIndex it holds that key at, once the acquire's answer said.
    held_at: Option<(u64, u64)>,
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
                held_at: None,
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

    /// Marks the key [`Session::may_hold`] named as held, created at `create_index`, at
    /// LockIndex `lock_index`: its give-back is then recognised by this client's contenders.
    pub(crate) fn holds(&mut self, create_index: u64, lock_index: u64) {
        self.held_at = Some((create_index, lock_index));
    }

    /// What this session holds, as far as it knows.
    fn holding(&self) -> Option<Holding> {
        let (key, (create_index, lock_index)) = (self.key.clone()?, self.held_at?);
        Some(Holding {
            key,
            create_index,
            lock_index,
        })
    }

    /// Gives everything back cleanly: releases the leader key (no lock-delay for the next
    /// holder), then destroys the session.
    pub(crate) async fn give_back(&mut self) -> Result<(), Error> {
        self.ended = true;
        let holding = self.holding();
        let released = Some((self.client.released(), holding.as_ref()));
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
    let fail = |e: ApiError| e.into_error(http, format_args!("keep {key:?}"));
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
        let holding = self.holding();
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
                let released = Some((client.released(), holding.as_ref()));
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

/// Releases `key` (if any) and destroys session `id`. The give-back, and the `holding` given
/// back, are recorded first in `released` (the client's; none on the detached runtime, where
/// nobody contends any more): see [`ReleasedSessions`].
async fn give_back(
    http: &ConsulHttp,
    released: Option<(&ReleasedSessions, Option<&Holding>)>,
    id: &str,
    key: Option<&str>,
) -> Result<(), Error> {
    if let Some((sessions, holding)) = released.filter(|_| key.is_some()) {
        sessions.record(id, holding);
    }
    // Destroying the session also releases the key if the release fails (subject to lock-delay
    // then), so do it in every case.
    let released = match key {
        Some(key) => release_key(http, key, id).await,
        None => Ok(()),
    };
    released.and(destroy(http, id).await)
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
