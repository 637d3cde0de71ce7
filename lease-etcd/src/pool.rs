//! The client's etcd leases, shared by its acquisitions, and the one keep-alive stream that
//! keeps them.
//!
//! An acquisition does not grant an etcd lease of its own: it attaches its key to a pooled etcd
//! lease of its TTL (granting one only when none fits), as many Consul locks share one session:
//! the process keeps one live etcd lease per TTL (and fence), and contenders that arrive while
//! one is being granted wait for that grant rather than grant their own.
//! So keep-alive traffic grows with the number of pooled etcd leases, not with the number of
//! leases held: one process holding 10,000 leader keys, or waiting with 10,000 contenders on one
//! name, keeps one etcd lease alive. A contender's key is `<name>/<holder>`: the holder is the
//! etcd lease in hex (etcd's election recipe) for the first contender of the lease under that
//! name, and `<lease hex>_<n>` for more (see [`Slot`]), so contenders of one name share a lease
//! too. An etcd lease with nothing left on it is revoked at once.
//!
//! Every pooled lease is kept alive every TTL/3 on the client's one `LeaseKeepAlive` stream.
//! Its [`Fence`] is shared by every acquisition on it: an answered keep-alive confirms them all
//! with its send time, and a lease that goes unanswered for the fence's time is retired (every
//! acquisition on it self-fences, before etcd could expire it). An etcd lease that etcd says is
//! gone (revoked, expired) ends, and with it exactly the acquisitions on it: `Etcd::revoke_lease`
//! or `etcdctl lease revoke` of a holder's lease takes every lease of this process on it, its
//! waiters on the same name included (those join again at the back of the queue and settle once:
//! see the `queue` module). A broken stream is opened again (on the next endpoint after a
//! transport failure; a keep-alive unanswered for 5 s, `REQUEST_TIMEOUT`, counts as a dead
//! connection) and every lease is kept alive at once on the new one; the fences cover the gap.
//! A shutdown (`Backend::shutdown`) ends every lease, then revokes the pooled leases left.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{Notify, mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::slot::Slot;
use super::wire::proto::{LeaseId, LeaseKeepAliveResponse};
use super::wire::{self, ApiError, REQUEST_TIMEOUT, Use, Wire, status_error};
use lease_core::backend::{Fence, RELEASE_BOUND};
use lease_core::{LeaseSpec, LostReason};
use lease_http::{Reopen, retry_transient, within};

/// Why a pooled etcd lease ended, for every acquisition on it.
#[derive(Clone, Debug)]
pub(crate) enum LeaseEnd {
    /// etcd says the lease no longer exists (revoked, or expired).
    Revoked,
    /// No keep-alive was answered for the fence's time: the loss the fence declares
    /// ([`Fence::expired`]: self-fenced, or this process was paused).
    Fenced(LostReason),
}

/// Pooled leases are shared by acquisitions with the same TTL and fence.
type Class = (Duration, Duration);

/// Keep-alives due within this of the earliest are sent with it, so leases granted close
/// together share a wake-up.
const COALESCE: Duration = Duration::from_millis(50);

/// The pooled etcd leases of one client.
#[derive(Default)]
pub(crate) struct Pool {
    state: Mutex<PoolState>,
    /// Wakes the keep-alive task when a lease joins.
    joined: Notify,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("leases", &self.lock().leases.len())
            .finish()
    }
}

#[derive(Default)]
struct PoolState {
    leases: BTreeMap<i64, Pooled>,
    /// Where the current keep-alive stream takes requests, while it is open (or opening).
    stream: Option<mpsc::UnboundedSender<LeaseId>>,
    /// The keep-alive task: started by a grant if it is not running (its runtime ended).
    task: lease_http::Task,
    /// The earliest keep-alive due of the leases granted since the task last looked.
    joined_due: Option<Instant>,
    /// Since when the watches are down (see [`Pool::suspend`]).
    suspended: Option<Instant>,
    /// The grants in flight, by token.
    granting: BTreeMap<u64, Grant>,
    last_grant: u64,
}

struct Pooled {
    class: Class,
    fence: Fence,
    /// The names (leader keys, semaphore prefixes) with contender keys on this lease, and the
    /// slots their contenders hold.
    names: BTreeMap<String, BTreeSet<u64>>,
    /// The last extra slot given out on this lease: extra slots are never given twice, so a
    /// late deletion of a gone contender's key cannot hit a newer contender's.
    last_extra: u64,
    /// When the next keep-alive is due.
    due: Instant,
    /// The send times of the keep-alives not answered yet, oldest first.
    sent: VecDeque<Instant>,
    end: watch::Sender<Option<LeaseEnd>>,
}

/// An acquisition's place on a pooled etcd lease.
#[derive(Debug)]
pub(crate) struct Attached {
    pub(crate) slot: Slot,
    pub(crate) fence: Fence,
    pub(crate) end: watch::Receiver<Option<LeaseEnd>>,
}

impl Pool {
    fn lock(&self) -> std::sync::MutexGuard<'_, PoolState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A place for a contender of `spec`'s name on a pooled etcd lease of its TTL: the first
    /// live one, in a slot of that name not taken on it (see [`Slot`]). If there is none, it
    /// waits for the grant in flight of that TTL, or grants one itself: contenders that arrive
    /// together share one grant.
    ///
    /// Cancel safe: a contender cancelled while it waits for a grant holds no place yet, and a
    /// cancelled granter lets the waiting contenders look again.
    ///
    /// The keep-alive task, if it is not running, starts with `wire` and ends when `closed` is
    /// cancelled.
    pub(crate) async fn attach(
        pool: &Arc<Pool>,
        wire: &Arc<Wire>,
        closed: &CancellationToken,
        spec: &LeaseSpec,
    ) -> Result<Attached, ApiError> {
        let class = (spec.session_ttl(), spec.fence_after());
        let name = spec.key();
        loop {
            let waiting = {
                let mut state = pool.lock();
                if let Some(attached) = try_attach(&mut state, class, name) {
                    return Ok(attached);
                }
                let joinable = state.granting.values().find(|g| g.class == class);
                match joinable {
                    Some(grant) => Ok(grant.granted.subscribe()),
                    None => {
                        state.last_grant += 1;
                        let token = state.last_grant;
                        let (granted, _) = watch::channel(None);
                        state.granting.insert(token, Grant { class, granted });
                        Err(GrantGuard { pool, token })
                    }
                }
            };
            match waiting {
                Ok(mut granted) => {
                    let granted = granted.wait_for(Option::is_some).await.map(|g| g.clone());
                    match granted {
                        // The lease was pooled (and may be live still): look again.
                        Ok(Some(Ok(_))) | Ok(None) | Err(_) => {}
                        Ok(Some(Err(error))) => return Err(error),
                    }
                }
                Err(guard) => return grant(pool, wire, closed, class, name, guard).await,
            }
        }
    }

    /// Takes `slot` of `name` off its lease; returns whether the lease has nothing left on it
    /// and left the pool, to be revoked by the caller.
    pub(crate) fn detach(&self, slot: Slot, name: &str) -> bool {
        let mut state = self.lock();
        let Some(pooled) = state.leases.get_mut(&slot.lease) else {
            return false;
        };
        if let Some(slots) = pooled.names.get_mut(name) {
            slots.remove(&slot.n);
            if slots.is_empty() {
                pooled.names.remove(name);
            }
        }
        if pooled.names.is_empty() {
            state.leases.remove(&slot.lease);
            return true;
        }
        false
    }

    /// Takes lease `id` out of the pool: its acquisitions lose it (as if revoked), and it is no
    /// longer kept alive, so it expires with its TTL if it cannot be revoked.
    pub(crate) fn retire(&self, id: i64) {
        if let Some(pooled) = self.lock().leases.remove(&id) {
            pooled.end.send_replace(Some(LeaseEnd::Revoked));
        }
    }

    /// The watches stopped at `since` (their stream broke): until [`resume`](Pool::resume),
    /// keep-alives do not extend any fence past `since`.
    pub(crate) fn suspend(&self, since: Instant) {
        let mut state = self.lock();
        state.suspended.get_or_insert(since);
        for pooled in state.leases.values() {
            pooled.fence.suspend(since);
        }
    }

    /// Every watch is back: keep-alives count again.
    pub(crate) fn resume(&self) {
        let mut state = self.lock();
        state.suspended = None;
        for pooled in state.leases.values() {
            pooled.fence.resume();
        }
    }

    /// Sends the keep-alives due, retires the leases whose fence passed; returns when to look
    /// again, and whether a keep-alive went unanswered for [`REQUEST_TIMEOUT`] (the connection
    /// is likely dead: the stream should move on).
    fn tick(&self, wire: &Arc<Wire>, stream: &mpsc::UnboundedSender<LeaseId>) -> (Instant, bool) {
        let now = Instant::now();
        let mut next = now + Duration::from_secs(3600);
        let mut stalled = false;
        let mut fenced = Vec::new();
        let mut sent = 0;
        {
            let mut state = self.lock();
            state.joined_due = None;
            for (id, pooled) in &mut state.leases {
                if let Some(reason) = pooled.fence.expired() {
                    fenced.push((*id, reason));
                    continue;
                }
                if pooled.due <= now + COALESCE {
                    if stream.send(LeaseId { id: *id }).is_ok() {
                        sent += 1;
                    }
                    pooled.sent.push_back(now);
                    pooled.due = now + pooled.class.0 / 3;
                }
                next = next.min(pooled.due);
                if let Some(oldest) = pooled.sent.front() {
                    stalled |= now.duration_since(*oldest) >= REQUEST_TIMEOUT;
                    next = next.min(*oldest + REQUEST_TIMEOUT);
                }
                if let Some(deadline) = pooled.fence.deadline() {
                    next = next.min(deadline);
                }
            }
            for (id, reason) in &fenced {
                if let Some(pooled) = state.leases.remove(id) {
                    pooled
                        .end
                        .send_replace(Some(LeaseEnd::Fenced(reason.clone())));
                }
            }
        }
        for _ in 0..sent {
            wire.count_request(true);
        }
        for (id, _) in fenced {
            tracing::debug!(lease = %format_args!("{id:x}"), "no keep-alive answered in time; the etcd lease is retired");
            spawn_revoke(wire, id);
        }
        (next, stalled)
    }

    /// A keep-alive answered: confirms the lease's fence with the send time of the keep-alive
    /// it answers, or ends the lease if etcd no longer has it.
    fn answered(&self, answer: &LeaseKeepAliveResponse) {
        let mut state = self.lock();
        let Some(pooled) = state.leases.get_mut(&answer.id) else {
            return;
        };
        let sent = pooled.sent.pop_front();
        if answer.ttl > 0 {
            if let Some(sent) = sent {
                pooled.fence.confirm(sent);
            }
            return;
        }
        if let Some(pooled) = state.leases.remove(&answer.id) {
            tracing::debug!(lease = %format_args!("{:x}", answer.id), "etcd says the lease is gone");
            pooled.end.send_replace(Some(LeaseEnd::Revoked));
        }
    }

    /// The stream (re)opened: what was sent on the old one will not be answered, so every
    /// lease is kept alive at once on the new one.
    fn reopened(&self, stream: mpsc::UnboundedSender<LeaseId>, first: bool) {
        let mut state = self.lock();
        let now = Instant::now();
        for pooled in state.leases.values_mut() {
            pooled.sent.clear();
            if !first {
                pooled.due = now;
            }
        }
        state.stream = Some(stream);
    }

    /// The leases still in the pool (none once every lease was released), for a shutdown.
    pub(crate) fn drain(&self) -> Vec<i64> {
        let mut state = self.lock();
        let ids = state.leases.keys().copied().collect();
        for (_, pooled) in std::mem::take(&mut state.leases) {
            pooled.end.send_replace(Some(LeaseEnd::Revoked));
        }
        ids
    }
}

/// A place for a contender of `name` on a live pooled lease of `class`.
fn try_attach(state: &mut PoolState, class: Class, name: &str) -> Option<Attached> {
    let (id, pooled) = state
        .leases
        .iter_mut()
        .find(|(_, p)| p.class == class && p.end.borrow().is_none() && !p.fence.is_past())?;
    Some(pooled.take_slot(*id, name))
}

impl Pooled {
    /// Slot 0 of `name` if it is free, else an extra slot never given out on this lease.
    fn take_slot(&mut self, id: i64, name: &str) -> Attached {
        let slots = self.names.entry(name.to_owned()).or_default();
        let n = if slots.contains(&0) {
            self.last_extra += 1;
            self.last_extra
        } else {
            0
        };
        slots.insert(n);
        Attached {
            slot: Slot { lease: id, n },
            fence: self.fence.clone(),
            end: self.end.subscribe(),
        }
    }
}

/// Grants the lease of the grant in flight `guard` names, pools it with a place for `name` on
/// it, and lets the contenders waiting on the grant look again.
async fn grant(
    pool: &Arc<Pool>,
    wire: &Arc<Wire>,
    closed: &CancellationToken,
    class: Class,
    name: &str,
    guard: GrantGuard<'_>,
) -> Result<Attached, ApiError> {
    let sent = Instant::now();
    let granted = wire.lease_grant(class.0).await;
    let mut state = pool.lock();
    let Some(grant) = state.granting.remove(&guard.token) else {
        return Err(ApiError::Malformed("a grant in flight went missing".into()));
    };
    // Its entry is taken already (and the state lock held): nothing left for its drop to do.
    std::mem::forget(guard);
    let id = match granted {
        Ok(id) => id,
        Err(error) => {
            grant.granted.send_replace(Some(Err(error.clone())));
            return Err(error);
        }
    };
    tracing::debug!(lease = %format_args!("{id:x}"), ttl = ?class.0, "etcd lease granted for the pool");
    let fence = Fence::new(class.1, sent);
    let (end_tx, _) = watch::channel(None);
    let due = sent + class.0 / 3;
    let start = || {
        let keep_alives = KeepAlives {
            wire: Arc::clone(wire),
            pool: Arc::clone(pool),
        };
        lease_http::reopen(keep_alives, "etcd keep-alive", closed.clone())
    };
    if state.task.ensure(start) {
        state.stream = None;
    }
    if let Some(since) = state.suspended {
        fence.suspend(since);
    }
    state.joined_due = Some(state.joined_due.map_or(due, |d| d.min(due)));
    let mut pooled = Pooled {
        class,
        fence,
        names: BTreeMap::new(),
        last_extra: 0,
        due,
        sent: VecDeque::new(),
        end: end_tx,
    };
    let attached = pooled.take_slot(id, name);
    state.leases.insert(id, pooled);
    drop(state);
    grant.granted.send_replace(Some(Ok(id)));
    pool.joined.notify_one();
    Ok(attached)
}

/// A grant in flight, which the contenders of its class that arrive meanwhile wait for.
struct Grant {
    class: Class,
    granted: watch::Sender<Option<Result<i64, ApiError>>>,
}

/// Held by the contender that grants: if it is cancelled, the grant is dropped and the
/// contenders waiting on it look again.
struct GrantGuard<'a> {
    pool: &'a Pool,
    token: u64,
}

impl Drop for GrantGuard<'_> {
    fn drop(&mut self) {
        self.pool.lock().granting.remove(&self.token);
    }
}

/// Revokes `id` in the background (a retired lease: its acquisitions are already lost).
fn spawn_revoke(wire: &Arc<Wire>, id: i64) {
    let wire = Arc::clone(wire);
    lease_core::runtime::spawn(async move {
        let _ = revoke(&wire, id).await;
    });
}

/// Revokes the pooled lease `id`, retrying brief trouble within [`RELEASE_BOUND`].
pub(crate) async fn revoke(wire: &Wire, id: i64) -> Result<bool, ApiError> {
    let revoked = retry_transient(within(RELEASE_BOUND), || wire.lease_revoke(id)).await;
    if revoked.is_ok() {
        tracing::debug!(lease = %format_args!("{id:x}"), "pooled etcd lease revoked");
    }
    revoked
}

async fn next_answer(
    responses: &mut Option<tonic::Streaming<LeaseKeepAliveResponse>>,
) -> Result<Option<LeaseKeepAliveResponse>, tonic::Status> {
    match responses {
        Some(responses) => responses.message().await,
        None => std::future::pending().await,
    }
}

/// The keep-alive stream's task: the wire client and the pool whose leases it keeps alive, handed
/// to it when it starts; [`lease_http::reopen`] opens the stream again when it breaks, until the
/// client is gone.
struct KeepAlives {
    wire: Arc<Wire>,
    pool: Arc<Pool>,
}

impl Reopen for KeepAlives {
    type Error = ApiError;

    async fn serve(&mut self, first: bool, pause: &mut lease_core::backoff::Backoff) -> ApiError {
        serve(&self.wire, &self.pool, first, pause).await
    }

    fn broke(&mut self, _: &ApiError) {
        self.pool.lock().stream = None;
    }
}

/// One keep-alive stream, from its opening to its end; returns why it ended.
async fn serve(
    wire: &Arc<Wire>,
    pool: &Pool,
    first: bool,
    pause: &mut lease_core::backoff::Backoff,
) -> ApiError {
    let (requests, outgoing) = mpsc::unbounded_channel();
    let (i, mut opening) = match wire.lease_keep_alive(outgoing).await {
        Ok(opening) => opening,
        Err(error) => return error,
    };
    pool.reopened(requests.clone(), first);
    let mut responses = None;
    let (mut next_tick, _) = pool.tick(wire, &requests);
    let error = loop {
        tokio::select! {
            biased;
            opened = &mut opening, if responses.is_none() => match opened {
                Ok(opened) => responses = Some(opened),
                Err(status) => break status_error(status),
            },
            answer = next_answer(&mut responses) => match answer {
                Ok(Some(answer)) => {
                    pause.reset();
                    wire.reachability_tracker().answered(true);
                    pool.answered(&answer);
                }
                Ok(None) => break ApiError::Malformed("the keep-alive stream ended".into()),
                Err(status) => break status_error(status),
            },
            () = tokio::time::sleep_until(next_tick) => {
                let (next, stalled) = pool.tick(wire, &requests);
                next_tick = next;
                if stalled {
                    break ApiError::TimedOut;
                }
            }
            () = wire.channels().moved_from(i) => break wire::moved(),
            () = pool.joined.notified() => {
                if let Some(due) = pool.lock().joined_due.take() {
                    next_tick = next_tick.min(due);
                }
            }
        }
    };
    if matches!(error, ApiError::Transport(_) | ApiError::TimedOut) {
        wire.channels().move_on(i, Use::Streams);
        wire.reachability_tracker().answered(false);
    }
    error
}
