//! The client's etcd leases, shared by its acquisitions, and the one keep-alive stream that
//! keeps them.
//!
//! An acquisition does not grant an etcd lease of its own: it attaches its key to a pooled etcd
//! lease of its TTL (granting one only when none fits), as many Consul locks share one session.
//! So keep-alive traffic grows with the number of pooled etcd leases, not with the number of
//! leases held: one process holding 10,000 leader keys keeps one etcd lease alive. A contender's
//! key is `<name>/<etcd lease in hex>` (etcd's election recipe), so two contenders of this
//! process on one name never share an etcd lease: each name appears at most once per pooled
//! lease. An etcd lease with nothing left on it is revoked at once.
//!
//! Every pooled lease is kept alive every TTL/3 on the client's one `LeaseKeepAlive` stream.
//! Its [`Fence`] is shared by every acquisition on it: an answered keep-alive confirms them all
//! with its send time, and a lease that goes unanswered for the fence's time is retired (every
//! acquisition on it self-fences, before etcd could expire it). An etcd lease that etcd says is
//! gone (revoked, expired) ends, and with it exactly the acquisitions on it. A broken stream is
//! opened again (on the next endpoint after a transport failure) and every lease is kept alive at
//! once on the new one; the fences cover the gap.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use http::uri::PathAndQuery;
use tokio::sync::{Notify, mpsc, watch};
use tokio::time::Instant;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::client::Grpc;
use tonic_prost::ProstCodec;

use super::grpc::{ApiError, EtcdClient, REQUEST_TIMEOUT, Use, status_error};
use super::proto::{LeaseId, LeaseKeepAliveResponse, path};
use lease_core::LeaseSpec;
use lease_core::backend::{Fence, RELEASE_BOUND};
use lease_http::{retry_transient, within};

/// Why a pooled etcd lease ended, for every acquisition on it.
#[derive(Clone, Debug)]
pub(crate) enum LeaseEnd {
    /// etcd says the lease no longer exists (revoked, or expired).
    Revoked,
    /// No keep-alive was answered for the fence's time.
    Fenced { unconfirmed_for: Duration },
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
    leases: HashMap<i64, Pooled>,
    /// Where the current keep-alive stream takes requests, while it is open (or opening).
    stream: Option<mpsc::UnboundedSender<LeaseId>>,
    /// Closed when the keep-alive task is gone (its runtime ended): the next grant starts
    /// another.
    task: Option<mpsc::Sender<()>>,
    /// The earliest keep-alive due of the leases granted since the task last looked.
    joined_due: Option<Instant>,
    /// Since when the watches are down (see [`Pool::suspend`]).
    suspended: Option<Instant>,
    /// The grants in flight, by token.
    granting: HashMap<u64, Grant>,
    last_grant: u64,
}

struct Pooled {
    class: Class,
    fence: Fence,
    /// The names (leader keys, semaphore prefixes) with a contender key on this lease.
    names: HashSet<String>,
    /// When the next keep-alive is due.
    due: Instant,
    /// The send times of the keep-alives not answered yet, oldest first.
    sent: VecDeque<Instant>,
    end: watch::Sender<Option<LeaseEnd>>,
}

/// An acquisition's place on a pooled etcd lease.
#[derive(Debug)]
pub(crate) struct Attached {
    pub(crate) id: i64,
    pub(crate) fence: Fence,
    pub(crate) end: watch::Receiver<Option<LeaseEnd>>,
}

impl Pool {
    fn lock(&self) -> std::sync::MutexGuard<'_, PoolState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A place for a contender of `spec`'s name on a pooled etcd lease of its TTL: one that
    /// carries no other contender of that name. If none does, it waits for a grant in flight
    /// that can take the name too, or grants one itself; grants for contenders of one name run
    /// side by side.
    ///
    /// Cancel safe: a place reserved on a grant in flight is given back.
    pub(crate) async fn attach(
        client: &Arc<EtcdClient>,
        spec: &LeaseSpec,
    ) -> Result<Attached, ApiError> {
        let pool = client.pool();
        let class = (spec.session_ttl(), spec.fence_after());
        let name = spec.key();
        loop {
            let reserved = {
                let mut state = pool.lock();
                if let Some(attached) = try_attach(&mut state, class, name) {
                    return Ok(attached);
                }
                let joinable = state
                    .granting
                    .iter_mut()
                    .find(|(_, g)| g.class == class && !g.names.contains(name));
                match joinable {
                    Some((token, grant)) => {
                        grant.names.insert(name.to_owned());
                        Ok(Reservation {
                            client,
                            token: *token,
                            name,
                            granted: grant.granted.subscribe(),
                            waiting: true,
                        })
                    }
                    None => {
                        state.last_grant += 1;
                        let token = state.last_grant;
                        let (granted, _) = watch::channel(None);
                        state.granting.insert(
                            token,
                            Grant {
                                class,
                                names: HashSet::from([name.to_owned()]),
                                granted,
                            },
                        );
                        Err(GrantGuard { pool, token })
                    }
                }
            };
            match reserved {
                Ok(mut reservation) => {
                    let granted = reservation
                        .granted
                        .wait_for(Option::is_some)
                        .await
                        .map(|g| g.clone());
                    reservation.waiting = false;
                    match granted {
                        Ok(Some(Ok(id))) => {
                            let state = pool.lock();
                            if let Some(attached) = attached(&state, id) {
                                return Ok(attached);
                            }
                            // Ended already: look again.
                        }
                        Ok(Some(Err(error))) => return Err(error),
                        // The contender that granted was cancelled: look again.
                        Ok(None) | Err(_) => {}
                    }
                }
                Err(guard) => return grant(client, class, guard).await,
            }
        }
    }

    /// Takes `name` off lease `id`; returns whether the lease has nothing left on it and left
    /// the pool, to be revoked by the caller.
    pub(crate) fn detach(&self, id: i64, name: &str) -> bool {
        let mut state = self.lock();
        let Some(pooled) = state.leases.get_mut(&id) else {
            return false;
        };
        pooled.names.remove(name);
        if pooled.names.is_empty() {
            state.leases.remove(&id);
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
    fn tick(
        &self,
        client: &EtcdClient,
        stream: &mpsc::UnboundedSender<LeaseId>,
    ) -> (Instant, bool) {
        let now = Instant::now();
        let mut next = now + Duration::from_secs(3600);
        let mut stalled = false;
        let mut fenced = Vec::new();
        let mut sent = 0;
        {
            let mut state = self.lock();
            state.joined_due = None;
            for (id, pooled) in &mut state.leases {
                if let Some(unconfirmed_for) = pooled.fence.overdue() {
                    fenced.push((*id, unconfirmed_for));
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
            for (id, unconfirmed_for) in &fenced {
                if let Some(pooled) = state.leases.remove(id) {
                    let unconfirmed_for = *unconfirmed_for;
                    pooled
                        .end
                        .send_replace(Some(LeaseEnd::Fenced { unconfirmed_for }));
                }
            }
        }
        for _ in 0..sent {
            client.count_request(true);
        }
        for (id, _) in fenced {
            tracing::debug!(lease = %format_args!("{id:x}"), "no keep-alive answered in time; the etcd lease is retired");
            spawn_revoke(client, id);
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
        for (_, pooled) in state.leases.drain() {
            pooled.end.send_replace(Some(LeaseEnd::Revoked));
        }
        ids
    }
}

/// A place on a live pooled lease of `class` that carries no contender of `name` yet.
fn try_attach(state: &mut PoolState, class: Class, name: &str) -> Option<Attached> {
    let (id, pooled) = state.leases.iter_mut().find(|(_, p)| {
        p.class == class
            && !p.names.contains(name)
            && p.end.borrow().is_none()
            && !p.fence.is_past()
    })?;
    pooled.names.insert(name.to_owned());
    Some(Attached {
        id: *id,
        fence: pooled.fence.clone(),
        end: pooled.end.subscribe(),
    })
}

/// The place a grant reserved on lease `id`, if the lease is still live.
fn attached(state: &PoolState, id: i64) -> Option<Attached> {
    let pooled = state.leases.get(&id)?;
    if pooled.end.borrow().is_some() {
        return None;
    }
    Some(Attached {
        id,
        fence: pooled.fence.clone(),
        end: pooled.end.subscribe(),
    })
}

/// Grants the lease of the grant in flight `guard` names, and pools it with every name reserved
/// on it meanwhile.
async fn grant(
    client: &Arc<EtcdClient>,
    class: Class,
    guard: GrantGuard<'_>,
) -> Result<Attached, ApiError> {
    let pool = client.pool();
    let sent = Instant::now();
    let granted = client.lease_grant(class.0).await;
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
    tracing::debug!(lease = %format_args!("{id:x}"), ttl = ?class.0, names = grant.names.len(), "etcd lease granted for the pool");
    let fence = Fence::new(class.1, sent);
    let (end_tx, end) = watch::channel(None);
    let due = sent + class.0 / 3;
    if state.task.as_ref().is_none_or(mpsc::Sender::is_closed) {
        let (alive, task_guard) = mpsc::channel(1);
        state.task = Some(alive);
        state.stream = None;
        tokio::spawn(run(
            Arc::downgrade(client),
            client.closed().clone(),
            task_guard,
        ));
    }
    if let Some(since) = state.suspended {
        fence.suspend(since);
    }
    state.joined_due = Some(state.joined_due.map_or(due, |d| d.min(due)));
    state.leases.insert(
        id,
        Pooled {
            class,
            fence: fence.clone(),
            names: grant.names,
            due,
            sent: VecDeque::new(),
            end: end_tx,
        },
    );
    drop(state);
    grant.granted.send_replace(Some(Ok(id)));
    pool.joined.notify_one();
    Ok(Attached { id, fence, end })
}

/// A grant in flight: the names reserved on the lease it will pool.
struct Grant {
    class: Class,
    names: HashSet<String>,
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

/// A place reserved on a grant in flight; given back if its contender is cancelled while it
/// waits.
struct Reservation<'a> {
    client: &'a Arc<EtcdClient>,
    token: u64,
    name: &'a str,
    granted: watch::Receiver<Option<Result<i64, ApiError>>>,
    waiting: bool,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if !self.waiting {
            return;
        }
        let pool = self.client.pool();
        let mut state = pool.lock();
        if let Some(grant) = state.granting.get_mut(&self.token) {
            grant.names.remove(self.name);
            return;
        }
        let granted = self.granted.borrow().clone();
        drop(state);
        if let Some(Ok(id)) = granted {
            if pool.detach(id, self.name) {
                spawn_revoke(self.client, id);
            }
        }
    }
}

/// Revokes `id` in the background (a retired lease: its acquisitions are already lost).
fn spawn_revoke(client: &EtcdClient, id: i64) {
    let Some(me) = client.me() else {
        return;
    };
    tokio::spawn(async move {
        let _ = revoke(&me, id).await;
    });
}

/// Revokes the pooled lease `id`, retrying brief trouble within [`RELEASE_BOUND`].
pub(crate) async fn revoke(client: &EtcdClient, id: i64) -> Result<bool, ApiError> {
    let revoked = retry_transient(within(RELEASE_BOUND), || client.lease_revoke(id)).await;
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

/// Runs the keep-alive stream until the client is gone, opening it again when it breaks.
async fn run(client: Weak<EtcdClient>, closed: CancellationToken, _alive: mpsc::Receiver<()>) {
    let mut pause = lease_http::backoff();
    let mut first = true;
    loop {
        let Some(strong) = client.upgrade() else {
            return;
        };
        let broke = tokio::select! {
            () = closed.cancelled() => return,
            broke = serve(&strong, first, &mut pause) => broke,
        };
        first = false;
        strong.pool().lock().stream = None;
        tracing::debug!(error = %broke, "the etcd keep-alive stream broke; opening it again");
        drop(strong);
        tokio::select! {
            () = closed.cancelled() => return,
            () = pause.wait() => {}
        }
    }
}

/// One keep-alive stream, from its opening to its end; returns why it ended.
async fn serve(
    client: &Arc<EtcdClient>,
    first: bool,
    pause: &mut lease_core::backoff::Backoff,
) -> ApiError {
    let pool = client.pool();
    let token = match client.token().await {
        Ok(token) => token,
        Err(error) => return error,
    };
    let (i, channel) = match client.channel(Use::Streams) {
        Ok(channel) => channel,
        Err(error) => return error,
    };
    let (requests, outgoing) = mpsc::unbounded_channel();
    pool.reopened(requests.clone(), first);
    let mut grpc = Grpc::new(channel);
    let request = client.request(UnboundedReceiverStream::new(outgoing), token.as_deref());
    let mut opening = Box::pin(async move {
        grpc.ready()
            .await
            .map_err(|e| tonic::Status::from_error(e.into()))?;
        grpc.streaming(
            request,
            PathAndQuery::from_static(path::LEASE_KEEP_ALIVE),
            ProstCodec::<LeaseId, LeaseKeepAliveResponse>::default(),
        )
        .await
    });
    let mut responses = None;
    let (mut next_tick, _) = pool.tick(client, &requests);
    let error = loop {
        tokio::select! {
            opened = &mut opening, if responses.is_none() => match opened {
                Ok(response) => responses = Some(response.into_inner()),
                Err(status) => break status_error(status),
            },
            answer = next_answer(&mut responses) => match answer {
                Ok(Some(answer)) => {
                    pause.reset();
                    client.reachability_tracker().answered(true);
                    pool.answered(&answer);
                }
                Ok(None) => break ApiError::Malformed("the keep-alive stream ended".into()),
                Err(status) => break status_error(status),
            },
            () = tokio::time::sleep_until(next_tick) => {
                let (next, stalled) = pool.tick(client, &requests);
                next_tick = next;
                if stalled {
                    break ApiError::TimedOut;
                }
            }
            () = client.moved_from(i) => break super::watch::moved(),
            () = pool.joined.notified() => {
                if let Some(due) = pool.lock().joined_due.take() {
                    next_tick = next_tick.min(due);
                }
            }
        }
    };
    if matches!(error, ApiError::Transport(_) | ApiError::TimedOut) {
        client.move_on(i, Use::Streams);
        client.reachability_tracker().answered(false);
    }
    error
}
