//! One acquisition's place on a pooled etcd lease: attached, watched, given back.
//!
//! An acquisition attaches its contender key to a pooled etcd lease of its TTL (see `pool`),
//! which the client keeps alive for all the keys on it; each answered keep-alive confirms the
//! shared [`Fence`] with its send time, so the holder self-fences when no keep-alive has been
//! answered for TTL − max(TTL/10, 1 s) ([`LeaseSpec::fence_after`]), before etcd could expire the
//! lease and let another contender in: while etcd still holds the lease, as
//! `etcd::partition_self_fences_while_etcd_still_keeps_the_lease` checks against its
//! `timetolive`.
//!
//! The holder watches its own key (on the client's one watch stream): its deletion (an
//! operator's `etcdctl del`, the lease revoked) is loss. Giving the place back deletes the own
//! key (a release touches it first) and leaves the pooled lease, which is revoked once nothing
//! is left on it. A broken watch is opened again by the stream; only the fence decides that
//! trouble has lasted too long: brief server trouble is not loss. A watch whose revision etcd
//! compacted meanwhile is replaced by one read of the key: a vanished key is loss.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::client::EtcdClient;
use super::pool::{self, LeaseEnd};
use super::slot::{Slot, holder_of};
use super::watch::WatchStream;
use super::wire::proto::{Compare, PutRequest, RangeRequest, RequestOp, TxnRequest};
use super::wire::{ApiError, Wire};
use lease_core::backend::{Fence, Hold, RELEASE_BOUND};
use lease_core::{Backend, BoxFuture, Error, Lease, LeaseSpec, LostReason, Sequencer};
use lease_http::{backoff, retry_transient, within};

impl From<LeaseEnd> for LostReason {
    fn from(end: LeaseEnd) -> Self {
        match end {
            LeaseEnd::Revoked => LostReason::SessionInvalidated,
            LeaseEnd::Fenced(reason) => reason,
        }
    }
}

/// What tells that the pooled lease under an acquisition is gone, boxed so acquire can poll it
/// while waiting and then hand it to the holder task.
pub(crate) type KeepAlive = Pin<Box<dyn Future<Output = LeaseEnd> + Send>>;

/// An acquisition's place on a pooled etcd lease, under the contender key `<name>/<holder>`
/// (the holder is the lease in hex, or `<lease hex>_<n>`: see [`Slot`]). Dropping it gives the
/// place back in the background.
#[derive(Debug)]
pub(crate) struct Session {
    client: Arc<EtcdClient>,
    slot: Slot,
    /// The name contended for (a leader key, a semaphore's prefix).
    name: String,
    /// The contender key.
    own: String,
    fence: Fence,
    given_back: bool,
}

impl Session {
    /// A place for a contender of `spec` on a pooled lease, and what tells that the lease is gone
    /// (returned, to be polled).
    pub(crate) async fn attach(
        client: &Arc<EtcdClient>,
        spec: &LeaseSpec,
    ) -> Result<(Session, KeepAlive), Error> {
        let attached = client.attach(spec).await.map_err(|e| {
            e.into_error(
                client.wire(),
                format_args!("grant a lease for {:?}", spec.key()),
            )
        })?;
        let keep_alive = Box::pin(ended(attached.end, attached.fence.clone()));
        let session = Session {
            client: Arc::clone(client),
            slot: attached.slot,
            name: spec.key().to_owned(),
            own: format!("{}/{}", spec.key(), attached.slot),
            fence: attached.fence,
            given_back: false,
        };
        Ok((session, keep_alive))
    }

    /// The pooled etcd lease.
    pub(crate) fn id(&self) -> i64 {
        self.slot.lease
    }

    /// The holder a sequencer names: the part of the contender key after `<name>/`.
    pub(crate) fn holder(&self) -> String {
        self.slot.to_string()
    }

    /// The contender key, `<name>/<holder>`.
    pub(crate) fn own(&self) -> &str {
        &self.own
    }

    /// The fence of the pooled lease under this place, as the keep-alives confirm it.
    pub(crate) fn fence(&self) -> &Fence {
        &self.fence
    }

    pub(crate) fn client(&self) -> &Arc<EtcdClient> {
        &self.client
    }

    /// Deletes the own key (only the one created at `created`, if given) and leaves the pooled
    /// lease, revoking it if nothing else is on it; retries brief trouble within
    /// [`RELEASE_BOUND`]. If the key cannot be deleted, the pooled lease is retired (its other
    /// acquisitions lose it) and revoked, or left to expire, so no contender key outlives its
    /// holder.
    pub(crate) async fn give_back(&mut self, created: Option<i64>) -> Result<(), Error> {
        self.given_back = true;
        give_back(&self.client, self.slot, &self.name, &self.own, created).await
    }

    /// Leaves the pooled lease once the own key is deleted, revoking it if nothing else is on
    /// it.
    async fn leave(&mut self) -> Result<(), Error> {
        self.given_back = true;
        leave(&self.client, self.slot, &self.name).await
    }

    /// [`give_back`](Session::give_back) on a detached runtime, for a process that is ending.
    pub(crate) fn abandon(mut self) -> Option<BoxFuture<'static, ()>> {
        self.given_back = true;
        detached_give_back(&self.client, self.slot, &self.name, &self.own)
    }

    /// Moves the own key (the one created at `created`) onto an etcd lease of its own that
    /// ends `left` from now (rounded up to whole seconds), then leaves the pooled lease: the key
    /// stays held until then, whatever happens to this process, and etcd deletes it when that
    /// lease expires. A key that is no longer ours is given back as usual.
    pub(crate) async fn keep(&mut self, created: i64, left: Duration) -> Result<(), Error> {
        match keep_key(self.client.wire(), &self.own, created, left).await {
            Ok(true) => self.leave().await,
            Ok(false) => self.give_back(Some(created)).await,
            Err(error) => {
                let _ = self.give_back(Some(created)).await;
                Err(error.into_error(self.client.wire(), format_args!("keep {:?}", self.own)))
            }
        }
    }

    /// [`keep`](Session::keep) on a detached runtime, for a process that is ending.
    pub(crate) fn abandon_kept(
        mut self,
        created: i64,
        until: Instant,
    ) -> Option<BoxFuture<'static, ()>> {
        self.given_back = true;
        let last = self.client.pool().detach(self.slot, &self.name);
        let client = self.client.detached()?;
        let (own, lease) = (self.own.clone(), self.slot.lease);
        Some(Box::pin(async move {
            let left = until.saturating_duration_since(Instant::now());
            if !matches!(keep_key(&client, &own, created, left).await, Ok(true)) {
                let delete = delete_own(&own, Some(created));
                let _ = retry_transient(within(RELEASE_BOUND), || client.txn(&delete)).await;
            }
            if last {
                let _ = pool::revoke(&client, lease).await;
            }
        }))
    }
}

/// Puts `own` (if it is still the key created at `created`) onto a new etcd lease granted for
/// `left`, rounded up to whole seconds, keeping its value and create revision: `etcdctl lock`
/// and `elect` waiters, ours included, go on waiting for its deletion, which etcd makes when
/// that lease expires. The put raises the key's version, so our waiters take that deletion for
/// a release and do not settle: the work under it has ended. `Ok(false)` if the key is no
/// longer ours (the new lease is revoked again).
async fn keep_key(
    client: &Wire,
    own: &str,
    created: i64,
    left: Duration,
) -> Result<bool, ApiError> {
    let whole_seconds = left.as_secs() + u64::from(left.subsec_nanos() > 0);
    let ttl = Duration::from_secs(whole_seconds.max(1));
    let lease = retry_transient(within(RELEASE_BOUND), || client.lease_grant(ttl)).await?;
    let put = TxnRequest {
        compare: vec![Compare::created(own, created)],
        success: vec![RequestOp::put(PutRequest {
            key: own.as_bytes().to_vec(),
            lease,
            ignore_value: true,
            ..PutRequest::default()
        })],
        ..TxnRequest::default()
    };
    let moved = retry_transient(within(RELEASE_BOUND), || client.txn(&put)).await;
    if !matches!(moved, Ok(ref answer) if answer.succeeded) {
        let _ = client.lease_revoke(lease).await;
    }
    moved.map(|answer| answer.succeeded)
}

impl Drop for Session {
    fn drop(&mut self) {
        if self.given_back {
            return;
        }
        // A cancelled acquire: give the place back in the background, or from a detached
        // runtime if this runtime is ending.
        let (client, id, name, own) = (
            Arc::clone(&self.client),
            self.slot,
            self.name.clone(),
            self.own.clone(),
        );
        let abandoned = Arc::clone(&client);
        let (abandoned_name, abandoned_own) = (name.clone(), own.clone());
        client.keepers().clone().spawn_clean_up(
            async move {
                if let Err(error) = give_back(&client, id, &name, &own, None).await {
                    tracing::warn!(key = %own, %error, "could not delete a contender key; its etcd lease expires with its TTL");
                }
            },
            move || detached_give_back(&abandoned, id, &abandoned_name, &abandoned_own),
        );
    }
}

fn delete_own(own: &str, created: Option<i64>) -> TxnRequest {
    TxnRequest {
        compare: created
            .map(|created| vec![Compare::created(own, created)])
            .unwrap_or_default(),
        success: vec![RequestOp::delete(own)],
        ..TxnRequest::default()
    }
}

async fn give_back(
    client: &EtcdClient,
    slot: Slot,
    name: &str,
    own: &str,
    created: Option<i64>,
) -> Result<(), Error> {
    let delete = delete_own(own, created);
    let wire = client.wire();
    match retry_transient(within(RELEASE_BOUND), || wire.txn(&delete)).await {
        Ok(_) => leave(client, slot, name).await,
        Err(error) => {
            // Revoking deletes the key with the lease (one attempt: if etcd cannot be reached,
            // the lease, no longer kept alive, expires with its TTL).
            client.pool().retire(slot.lease);
            let _ = wire.lease_revoke(slot.lease).await;
            Err(error.into_error(wire, format_args!("delete {own:?}")))
        }
    }
}

/// Leaves `slot` of the pooled lease (its key of `name` deleted), revoking the lease if nothing is
/// left on it.
async fn leave(client: &EtcdClient, slot: Slot, name: &str) -> Result<(), Error> {
    if client.pool().detach(slot, name) {
        pool::revoke(client.wire(), slot.lease).await.map_err(|e| {
            e.into_error(
                client.wire(),
                format_args!("revoke lease {}", holder_of(slot.lease)),
            )
        })?;
    }
    Ok(())
}

fn detached_give_back(
    client: &EtcdClient,
    slot: Slot,
    name: &str,
    own: &str,
) -> Option<BoxFuture<'static, ()>> {
    let last = client.pool().detach(slot, name);
    let client = client.detached()?;
    let delete = delete_own(own, None);
    Some(Box::pin(async move {
        let _ = retry_transient(within(RELEASE_BOUND), || client.txn(&delete)).await;
        if last {
            let _ = pool::revoke(&client, slot.lease).await;
        }
    }))
}

/// Completes when the pooled lease ends (etcd says it is gone) or its fence's deadline passes
/// (then it returns `Fenced`, at that deadline, not later).
async fn ended(mut end: watch::Receiver<Option<LeaseEnd>>, fence: Fence) -> LeaseEnd {
    loop {
        let deadline = fence.deadline();
        let expiry = async move {
            match deadline {
                Some(deadline) => tokio::time::sleep_until(deadline).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            ended = end.wait_for(Option::is_some) => {
                return match ended {
                    Ok(ended) => ended.clone().unwrap_or(LeaseEnd::Revoked),
                    Err(_) => LeaseEnd::Revoked,
                };
            }
            () = expiry => {
                if let Some(reason) = fence.expired() {
                    return LeaseEnd::Fenced(reason);
                }
            }
        }
    }
}

/// The [`Hold`] of every etcd lease: its place on a pooled etcd lease, and the own key it wrote.
pub(crate) struct KeyHold {
    session: Session,
    keep_alive: KeepAlive,
    /// The holder's own key: `<name>/<holder>` (a leader) or `<prefix>/<holder>` (a semaphore).
    key: String,
    created: i64,
    /// The revision the acquisition was judged at: later changes are watched.
    judged_at: i64,
    /// Set by [`Hold::keep_until`]: a release before it leaves the key on a lease that ends then.
    keep_until: Option<Instant>,
}

/// What an acquisition won, for [`start_lease`].
#[derive(Debug)]
pub(crate) struct Won {
    /// The create revision of the own key.
    pub(crate) created: i64,
    /// A revision at which it held: of the read that found it holding, or of the deletion a
    /// semaphore waiter counted down to its turn with (see the `semaphore` module).
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
    let (keepers, fence) = (session.client().keepers().clone(), session.fence.clone());
    let hold = KeyHold {
        session,
        keep_alive,
        key,
        created: won.created,
        judged_at: won.judged_at,
        keep_until: None,
    };
    keepers.start(sequencer, fence, backend, hold)
}

impl Hold for KeyHold {
    async fn watch(&mut self) -> LostReason {
        let client = Arc::clone(self.session.client());
        let own_key = watch_own_key(&client, &self.key, self.created, self.judged_at);
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
            .client()
            .wire()
            .lease_time_to_live(self.session.id())
            .await
        {
            Ok(left) if left < 0 => {
                // So no other acquisition attaches to it before the keep-alive says so.
                self.session.client().pool().retire(self.session.id());
                Some(LostReason::SessionInvalidated)
            }
            _ => None,
        }
    }

    fn keep_until(&mut self, until: Instant) -> bool {
        self.keep_until = Some(until);
        true
    }

    async fn release(&mut self) -> Result<(), Error> {
        let left = self
            .keep_until
            .map(|until| until.saturating_duration_since(Instant::now()));
        if let Some(left) = left.filter(|left| !left.is_zero()) {
            return self.session.keep(self.created, left).await;
        }
        // The touch and the delete go out together, one round trip instead of two: the delete
        // takes only a touched key, so it cannot overtake the touch; if etcd took it first
        // after all, the key is deleted again after the touch's answer.
        let client = self.session.client().wire();
        let mut delete = delete_own(&self.key, Some(self.created));
        delete.compare.push(Compare::touched(&self.key));
        let announced = announce_release(client, &self.key, self.created);
        let (_, deleted) = tokio::join!(announced, client.txn(&delete));
        if deleted.is_ok_and(|answer| answer.succeeded) {
            return self.session.leave().await;
        }
        self.session.give_back(Some(self.created)).await
    }

    async fn clean_up(&mut self, _reason: &LostReason) {
        // etcd has no lock-delay to keep: the next holder's higher revision fences this one.
        if let Err(error) = self.session.give_back(Some(self.created)).await {
            tracing::warn!(%error, "could not delete the key of a lost lease; its etcd lease is retired and expires with its TTL");
        }
    }

    fn abandon(self) -> Option<BoxFuture<'static, ()>> {
        match self.keep_until.filter(|until| *until > Instant::now()) {
            Some(until) => self.session.abandon_kept(self.created, until),
            None => self.session.abandon(),
        }
    }
}

/// Touches the own `key` (if it is still the one created at `created`) before it is deleted, so
/// that waiters, which see the deletion with the key's version, know it
/// was released and need not settle (see the `queue` module). One attempt: if it fails, waiters
/// settle, which is slower but as safe.
async fn announce_release(http: &Wire, key: &str, created: i64) {
    let touch = TxnRequest {
        compare: vec![Compare::created(key, created)],
        success: vec![RequestOp::put(PutRequest::touch(key))],
        ..TxnRequest::default()
    };
    if let Err(error) = http.txn(&touch).await {
        tracing::debug!(%error, key, "could not announce the release; waiters will settle");
    }
}

/// Completes when the own `key` (created at `created`) is deleted or replaced after revision
/// `from`.
///
/// It watches the key from now, then reads it: etcd sends a watch of the current revision each
/// change as it commits, but one created at a past revision only from its next sync, up to
/// 100 ms later, as long as a waiter settles (lease-sim's seeds 13766 and 983 of etcd: a
/// deletion between the judgment and the watch, and one just after a read that preceded a watch
/// from its revision). The read, sent once the watch exists, tells what happened before it.
/// Without that read (it failed), the key is watched from the last revision seen instead. A
/// watch that breaks is opened again from the last revision it delivered; one that cannot be
/// (its revision compacted) is replaced by this again.
async fn watch_own_key(http: &EtcdClient, key: &str, created: i64, from: i64) -> LostReason {
    let mut seen = from;
    let mut backoff = backoff();
    loop {
        let now = match http.watch(&RangeRequest::key(key), 0).await {
            Ok(stream) => Some(stream),
            Err(error) => {
                tracing::debug!(%error, key, "could not watch the own key; reading it");
                None
            }
        };
        let read = match http.wire().range(&RangeRequest::key(key)).await {
            Ok(read) => match read.kvs.first() {
                Some(kv) if kv.create_revision == created => {
                    seen = seen.max(read.revision());
                    true
                }
                Some(kv) => return taken(kv.create_revision, kv.lease),
                None => return LostReason::KeyDeleted,
            },
            Err(error) => {
                tracing::debug!(%error, key, "could not read the own key; watching it");
                false
            }
        };
        let lost = match now {
            Some(stream) if read => watch_events(stream, key, created, &mut seen).await,
            // What came before the watch, a watch from the last revision seen tells.
            _ => match http.watch(&RangeRequest::key(key), seen + 1).await {
                Ok(stream) => watch_events(stream, key, created, &mut seen).await,
                Err(_) => None,
            },
        };
        match lost {
            Some(reason) => return reason,
            // The watch broke; whatever happened meanwhile, the read tells.
            None => backoff.wait().await,
        }
    }
}

/// Follows `stream`, a watch of `key`, advancing `seen`; `None` when it broke.
async fn watch_events(
    mut stream: WatchStream,
    key: &str,
    created: i64,
    seen: &mut i64,
) -> Option<LostReason> {
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
            let kv = event.kv();
            if kv.create_revision != created {
                return Some(taken(kv.create_revision, kv.lease));
            }
        }
        *seen = (*seen).max(batch.revision());
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
