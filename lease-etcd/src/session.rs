//! An etcd lease as the session of one acquisition: granted, kept alive, watched, revoked.
//!
//! Every acquisition grants its own etcd lease with the spec's TTL and attaches its key to it, so
//! revoking the lease (a release, an operator's `etcdctl lease revoke`, expiry) deletes the key in
//! the same step. While the lease lives, one keep-alive is sent every TTL/3 (as etcd's own client
//! does); each answered one confirms the lease's [`Fence`] with its send time, so the holder
//! self-fences when no keep-alive has been answered for TTL − margin
//! ([`LeaseSpec::fence_after`]), before etcd could expire the lease and let another contender in.
//!
//! The holder watches its own key: its deletion (an operator's `etcdctl del`, the lease revoked)
//! is loss. A failed keep-alive or a broken watch is retried; only the fence decides that trouble
//! has lasted too long: brief server trouble is not loss.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::http::{ApiError, EtcdHttp};
use super::wire::{Compare, PutRequest, RangeRequest, RequestOp, TxnRequest};
use lease_core::backend::{Fence, Hold, RELEASE_BOUND};
use lease_core::{Backend, BoxFuture, Error, Lease, LeaseSpec, LostReason, Sequencer};
use lease_http::{backoff, retry_pause, retry_transient, within};

/// Why a lease's keep-alive stopped.
#[derive(Debug)]
pub(crate) enum LeaseEnd {
    /// etcd says the lease no longer exists (revoked, or expired).
    Revoked,
    /// No keep-alive was answered for the fence's time.
    Fenced { unconfirmed_for: Duration },
}

impl From<LeaseEnd> for LostReason {
    fn from(end: LeaseEnd) -> Self {
        match end {
            LeaseEnd::Revoked => LostReason::SessionInvalidated,
            LeaseEnd::Fenced { unconfirmed_for } => LostReason::SelfFenced { unconfirmed_for },
        }
    }
}

/// What keeps a lease alive, boxed so acquire can poll it while waiting and then hand it to the
/// holder task. It ends when the lease must be considered gone.
pub(crate) type KeepAlive = Pin<Box<dyn Future<Output = LeaseEnd> + Send>>;

/// An etcd lease this process granted. Dropping it revokes it in the background.
#[derive(Debug)]
pub(crate) struct Session {
    http: Arc<EtcdHttp>,
    id: i64,
    fence: Fence,
    ended: bool,
}

/// The lease ID as `etcdctl` writes it in key names: lowercase hex.
pub(crate) fn holder_of(id: i64) -> String {
    format!("{id:x}")
}

/// The lease ID a sequencer's holder names, if it is one.
pub(crate) fn lease_of(holder: &str) -> Option<i64> {
    i64::from_str_radix(holder, 16).ok().filter(|id| *id > 0)
}

impl Session {
    /// Grants a lease with `spec`'s TTL, and what keeps it alive (returned, to be polled).
    pub(crate) async fn grant(
        http: &Arc<EtcdHttp>,
        spec: &LeaseSpec,
    ) -> Result<(Session, KeepAlive), Error> {
        let ttl = spec.session_ttl();
        let sent = Instant::now();
        let id = http
            .lease_grant(ttl)
            .await
            .map_err(|e| e.into_error(http, format_args!("grant a lease for {:?}", spec.key())))?;
        tracing::debug!(lease = %holder_of(id), ?ttl, "etcd lease granted");
        let fence = Fence::new(spec.fence_after(), sent);
        let keep_alive = Box::pin(keep_alive(Arc::clone(http), id, ttl, fence.clone()));
        Ok((
            Session {
                http: Arc::clone(http),
                id,
                fence,
                ended: false,
            },
            keep_alive,
        ))
    }

    pub(crate) fn id(&self) -> i64 {
        self.id
    }

    pub(crate) fn holder(&self) -> String {
        holder_of(self.id)
    }

    pub(crate) fn http(&self) -> &Arc<EtcdHttp> {
        &self.http
    }

    /// Revokes the lease, deleting its key with it; retries brief trouble within
    /// [`RELEASE_BOUND`].
    pub(crate) async fn revoke(&mut self) -> Result<(), Error> {
        self.ended = true;
        revoke(&self.http, self.id).await
    }

    /// [`revoke`](Session::revoke) on a detached runtime, for a process that is ending.
    pub(crate) fn abandon(mut self) -> Option<BoxFuture<'static, ()>> {
        self.ended = true;
        detached_revoke(&self.http, self.id)
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        // A cancelled acquire: revoke in the background, or from a detached runtime if this
        // runtime is ending.
        let (http, id) = (Arc::clone(&self.http), self.id);
        let abandoned = Arc::clone(&http);
        http.keepers().clone().spawn_clean_up(
            async move {
                if let Err(error) = revoke(&http, id).await {
                    tracing::warn!(lease = %holder_of(id), %error, "could not revoke an etcd lease; it expires with its TTL");
                }
            },
            move || detached_revoke(&abandoned, id),
        );
    }
}

fn detached_revoke(http: &EtcdHttp, id: i64) -> Option<BoxFuture<'static, ()>> {
    let http = http.detached()?;
    Some(Box::pin(async move {
        let _ = revoke(&http, id).await;
    }))
}

async fn revoke(http: &EtcdHttp, id: i64) -> Result<(), Error> {
    retry_transient(within(RELEASE_BOUND), || http.lease_revoke(id))
        .await
        .map_err(|e| e.into_error(http, format_args!("revoke lease {}", holder_of(id))))?;
    tracing::debug!(lease = %holder_of(id), "etcd lease revoked");
    Ok(())
}

/// Sends a keep-alive every TTL/3, confirming `fence` with each answered one's send time, until
/// etcd says the lease is gone or the fence's deadline passes (then it returns `Fenced`, at that
/// deadline, not later).
async fn keep_alive(http: Arc<EtcdHttp>, id: i64, ttl: Duration, fence: Fence) -> LeaseEnd {
    let every = ttl / 3;
    let retry_every = retry_pause(ttl);
    let mut next = fence.confirmed_at().unwrap_or_else(Instant::now) + every;
    loop {
        let Some(deadline) = fence.deadline() else {
            return std::future::pending().await;
        };
        tokio::time::sleep_until(next.min(deadline)).await;
        if let Some(unconfirmed_for) = fence.overdue() {
            return LeaseEnd::Fenced { unconfirmed_for };
        }
        let sent = Instant::now();
        match tokio::time::timeout_at(deadline, http.lease_keep_alive(id)).await {
            Ok(Ok(left)) if left > 0 => {
                fence.confirm(sent);
                next = sent + every;
            }
            Ok(Ok(_)) => return LeaseEnd::Revoked,
            Ok(Err(error)) => {
                tracing::debug!(lease = %holder_of(id), %error, "etcd keep-alive failed; retrying");
                next = Instant::now() + retry_every;
            }
            Err(_) => {
                return LeaseEnd::Fenced {
                    unconfirmed_for: fence.confirmed_at().map_or(Duration::ZERO, |c| c.elapsed()),
                };
            }
        }
    }
}

/// The [`Hold`] of every etcd lease: the etcd lease, its keep-alive, and the own key it wrote.
pub(crate) struct KeyHold {
    session: Session,
    keep_alive: KeepAlive,
    /// The holder's own key: `<name>/<lease>` (a leader) or `<prefix>/<lease>` (a semaphore).
    key: String,
    created: i64,
    /// The revision the acquisition was judged at: later changes are watched.
    judged_at: i64,
}

/// What an acquisition won, for [`start_lease`].
#[derive(Debug)]
pub(crate) struct Won {
    /// The create revision of the own key.
    pub(crate) created: i64,
    /// The revision of the read that found it holding.
    pub(crate) judged_at: i64,
}

/// Starts the holder task of an acquisition: `sequencer`, won with the own key `key`.
pub(crate) fn start_lease(
    sequencer: Sequencer,
    key: String,
    won: Won,
    session: Session,
    keep_alive: KeepAlive,
    backend: Arc<dyn Backend>,
) -> Lease {
    tracing::info!(%sequencer, "lease acquired");
    let (keepers, fence) = (session.http().keepers().clone(), session.fence.clone());
    let hold = KeyHold {
        session,
        keep_alive,
        key,
        created: won.created,
        judged_at: won.judged_at,
    };
    keepers.start(sequencer, fence, backend, hold)
}

impl Hold for KeyHold {
    async fn watch(&mut self) -> LostReason {
        let http = Arc::clone(self.session.http());
        let own_key = watch_own_key(&http, &self.key, self.created, self.judged_at);
        tokio::select! {
            biased;
            end = &mut self.keep_alive => end.into(),
            reason = own_key => reason,
        }
    }

    async fn refine(&mut self, reason: &LostReason) -> Option<LostReason> {
        if *reason != LostReason::KeyDeleted {
            return None;
        }
        // The key went with the lease (revoked, or expired) if the lease is gone too.
        match self
            .session
            .http()
            .lease_time_to_live(self.session.id())
            .await
        {
            Ok(left) if left < 0 => Some(LostReason::SessionInvalidated),
            _ => None,
        }
    }

    async fn release(&mut self) -> Result<(), Error> {
        announce_release(self.session.http(), &self.key, self.created).await;
        self.session.revoke().await
    }

    async fn clean_up(&mut self, _reason: &LostReason) {
        // etcd has no lock-delay to keep: the next holder's higher revision fences this one.
        if let Err(error) = self.session.revoke().await {
            tracing::warn!(%error, "could not revoke the etcd lease of a lost lease; it expires with its TTL");
        }
    }

    fn abandon(self) -> Option<BoxFuture<'static, ()>> {
        self.session.abandon()
    }
}

/// Touches the own `key` (if it is still the one created at `created`) before the lease that
/// deletes it is revoked, so that waiters, which see the deletion with the key's version, know it
/// was released and need not settle (see the `queue` module). One attempt: if it fails, waiters
/// settle, which is slower but as safe.
async fn announce_release(http: &EtcdHttp, key: &str, created: i64) {
    let touch = TxnRequest {
        compare: vec![Compare::created(key, created)],
        success: vec![RequestOp::RequestPut(PutRequest::touch(key))],
        ..TxnRequest::default()
    };
    if let Err(error) = http.txn(&touch).await {
        tracing::debug!(%error, key, "could not announce the release; waiters will settle");
    }
}

/// Completes when the own `key` (created at `created`) is deleted or replaced after revision
/// `from`. A watch that breaks is opened again from the last revision seen; one that cannot be
/// (its revision compacted) is replaced by one read of the key.
async fn watch_own_key(http: &EtcdHttp, key: &str, created: i64, from: i64) -> LostReason {
    let mut seen = from;
    let mut backoff = backoff();
    loop {
        match watch_from(http, key, created, &mut seen).await {
            Some(reason) => return reason,
            None => {
                // The watch broke; whatever happened meanwhile, one read tells.
                if let Ok(read) = http.range(&RangeRequest::key(key)).await {
                    match read.kvs.first() {
                        Some(kv) if kv.create_revision == created => {
                            seen = seen.max(read.header.revision);
                        }
                        Some(kv) => return taken(kv.create_revision, kv.lease),
                        None => return LostReason::KeyDeleted,
                    }
                }
                backoff.wait().await;
            }
        }
    }
}

/// Watches `key` after revision `seen`, advancing it; `None` when the watch broke.
async fn watch_from(
    http: &EtcdHttp,
    key: &str,
    created: i64,
    seen: &mut i64,
) -> Option<LostReason> {
    let mut stream = http.watch(&RangeRequest::key(key), *seen + 1).await.ok()?;
    loop {
        let batch = match stream.next().await {
            Ok(batch) => batch,
            Err(error) => {
                tracing::debug!(%error, key, "watch of the own key broke; opening it again");
                return None;
            }
        };
        for event in &batch.events {
            if event.is_delete() {
                return Some(LostReason::KeyDeleted);
            }
            if event.kv.create_revision != created {
                return Some(taken(event.kv.create_revision, event.kv.lease));
            }
        }
        *seen = (*seen).max(batch.header.revision);
    }
}

fn taken(create_revision: i64, lease: i64) -> LostReason {
    LostReason::KeyTaken {
        lock_index: u64::try_from(create_revision).unwrap_or_default(),
        session: holder_of(lease),
    }
}

/// A read that retries brief trouble until `deadline` (at least [`READ_GRACE`] from now), so a
/// caller that asked not to wait still gets one real answer.
pub(crate) async fn retrying<T, F, Fut>(deadline: Option<Instant>, op: F) -> Result<T, ApiError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, ApiError>>,
{
    let give_up = deadline.map(|d| d.max(Instant::now() + READ_GRACE));
    retry_transient(give_up, op).await
}

/// The least time a read gets, whatever the acquire's deadline.
const READ_GRACE: Duration = Duration::from_secs(5);
