//! The two connections of a handle, each kept open by a task of its own that opens it again
//! when it breaks: the command connection (every script, and the client-side tracking
//! invalidations it receives as RESP3 pushes) and the subscriber connection (the waiters'
//! wake-up channels).
//!
//! **Tracking.** Once connected, the command connection turns on `CLIENT TRACKING ON NOLOOP`:
//! the server remembers the keys a script of this connection declared (its `KEYS`) and read after
//! its last write to them, and pushes an invalidation when anyone else changes, deletes, evicts
//! or expires one (NOLOOP: not for our own writes, which make the server forget the key: hence
//! the acquire and renew scripts declare the holder key and read it last). A key a script
//! derives from its `KEYS` is not tracked (Redis 7.0, as measured). An invalidation goes to the
//! subscriptions of its key only ([`Interest`]); a flush (an invalidation naming no key) to all.
//!
//! **Pub/sub.** The subscriber connection subscribes to the channel of every name some waiter of
//! this handle waits for, at once when the first waiter comes, and unsubscribes when the last
//! leaves; a message goes to the subscriptions of its channel.
//!
//! **Breaks.** A connection that ends, or that a request found broken or hung
//! ([`Link::broke`]), is replaced: every subscription hears [`Note::Blind`] when it goes and
//! [`Note::Resync`] when its successor is up (tracking on again, channels subscribed again), and
//! judges afresh. Openings that fail are paused by lease-http's backoff (50 ms to 1 s); each
//! counts for reachability, so a handle whose only traffic is waiting reports an outage too.

use std::collections::BTreeSet;
use std::sync::{Arc, Weak};
use std::time::Duration;

use lease_core::CancellationToken;
use lease_core::backend::ReachabilityTracker;
use redis::aio::MultiplexedConnection;
use redis::{PushInfo, PushKind, Value};
use tokio::sync::{Notify, mpsc, watch};
use tokio::time::Instant;

use super::connect::Connector;
use super::error::RedisFailure;
use super::interest::{Interest, Interested, Note};
use lease_http::Task;

/// A connection in use, and which of the link's connections it is.
#[derive(Clone)]
pub(crate) struct Live {
    pub(crate) conn: MultiplexedConnection,
    pub(crate) generation: u64,
    /// How many replicas the server said it has when this connection opened.
    pub(crate) replicas: usize,
}

impl std::fmt::Debug for Live {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Live")
            .field("generation", &self.generation)
            .finish_non_exhaustive()
    }
}

/// Which of the two connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    Commands,
    Subscriber,
}

/// One kept-open connection of a handle.
#[derive(Debug)]
pub(crate) struct Link {
    role: Role,
    state: Arc<State>,
    broken: Arc<Notify>,
    task: Task,
    closed: CancellationToken,
}

/// What the connection's task is handed (weakly): the connection in use, who listens for its
/// news, and where its openings count for reachability.
#[derive(Debug)]
struct State {
    current: watch::Sender<Option<Live>>,
    /// Why the last opening failed; `None` once one succeeded.
    failed: watch::Sender<Option<RedisFailure>>,
    interest: Interest,
    /// The channels subscribed on this connection now (the subscriber's); held while one is
    /// subscribed or unsubscribed, so the two never cross on the connection.
    on_server: tokio::sync::Mutex<BTreeSet<String>>,
    reachability: Arc<ReachabilityTracker>,
}

impl Drop for Link {
    fn drop(&mut self) {
        self.closed.cancel();
    }
}

impl Link {
    pub(crate) fn new(role: Role, reachability: Arc<ReachabilityTracker>) -> Link {
        Link {
            role,
            state: Arc::new(State {
                current: watch::channel(None).0,
                failed: watch::channel(None).0,
                interest: Interest::default(),
                on_server: tokio::sync::Mutex::default(),
                reachability,
            }),
            broken: Arc::default(),
            task: Task::default(),
            closed: CancellationToken::new(),
        }
    }

    /// Who listens for this connection's news.
    pub(crate) fn interest(&self) -> &Interest {
        &self.state.interest
    }

    /// Starts the task that keeps this connection open, unless it runs.
    pub(crate) fn ensure(&self, connector: &Connector) {
        let (state, closed, broken, role, connector) = (
            Arc::downgrade(&self.state),
            self.closed.clone(),
            Arc::clone(&self.broken),
            self.role,
            connector.clone(),
        );
        self.task
            .ensure(move || keep_open(state, connector, role, broken, closed));
    }

    /// The connection in use now, if one is up.
    pub(crate) fn now(&self) -> Option<Live> {
        self.state.current.borrow().clone()
    }

    /// The connection, waiting until `until` for one to come up; at once the reason an opening
    /// failed if no retry can cure it (TLS refused, a password refused), else, at `until`, the
    /// last opening's failure.
    pub(crate) async fn wait(&self, until: Instant) -> Result<Live, RedisFailure> {
        let mut current = self.state.current.subscribe();
        let mut failed = self.state.failed.subscribe();
        loop {
            if let Some(live) = current.borrow_and_update().clone() {
                return Ok(live);
            }
            let last = failed.borrow_and_update().clone();
            if let Some(error) = last.as_ref().filter(|e| !e.is_transient()) {
                return Err(error.clone());
            }
            tokio::select! {
                biased;
                changed = current.changed() => if changed.is_err() {
                    return Err(RedisFailure::NotConnected);
                },
                changed = failed.changed() => if changed.is_err() {
                    return Err(RedisFailure::NotConnected);
                },
                () = tokio::time::sleep_until(until) => {
                    return Err(last.unwrap_or(RedisFailure::NotConnected));
                }
            }
        }
    }

    /// A request found the connection `generation` broken or hung: replace it.
    pub(crate) fn broke(&self, generation: u64) {
        if self.now().is_some_and(|live| live.generation == generation) {
            self.broken.notify_one();
        }
    }

    /// Subscribes to `channel` (the subscriber connection), and waits (a second at most) until
    /// the server confirms it, so that no message sent after this returns is missed. If the
    /// connection is down, the channel is subscribed when it is up again, and the subscription
    /// then hears [`Note::Resync`].
    pub(crate) async fn subscribe(&self, connector: &Connector, channel: &str) -> Interested {
        self.ensure(connector);
        let (interested, _) = self.state.interest.subscribe(channel);
        let until = Instant::now() + Duration::from_secs(1);
        if let Ok(mut live) = self.wait(until).await {
            let mut on_server = self.state.on_server.lock().await;
            if !on_server.contains(channel) {
                let subscribed = tokio::time::timeout_at(until, live.conn.subscribe(channel)).await;
                match subscribed {
                    Ok(Ok(())) => {
                        on_server.insert(channel.to_owned());
                    }
                    _ => self.broke(live.generation),
                }
            }
        }
        interested
    }
}

/// Keeps `role`'s connection open until the handle goes (`closed`), holding its state only
/// weakly between steps.
async fn keep_open(
    state: Weak<State>,
    connector: Connector,
    role: Role,
    broken: Arc<Notify>,
    closed: CancellationToken,
) {
    let mut pause = lease_http::backoff();
    let mut generation = 0;
    loop {
        let (tx, mut pushes) = mpsc::unbounded_channel();
        let Some(opened) = closed.run_until_cancelled(connector.open(Some(tx))).await else {
            return;
        };
        let Some(strong) = state.upgrade() else {
            return;
        };
        let ready = match opened {
            Ok(opened) => {
                let mut conn = opened.conn.clone();
                match closed
                    .run_until_cancelled(set_up(&strong, role, &mut conn))
                    .await
                {
                    None => return,
                    Some(Ok(())) => Ok((opened, conn)),
                    Some(Err(error)) => Err(error),
                }
            }
            Err(error) => Err(error),
        };
        let (opened, conn) = match ready {
            Ok(ready) => ready,
            Err(error) => {
                strong.reachability.answered(error.answered());
                strong.failed.send_replace(Some(error.clone()));
                drop(strong);
                tracing::debug!(%error, ?role, "cannot open the Redis connection; retrying");
                if closed.run_until_cancelled(pause.wait()).await.is_none() {
                    return;
                }
                continue;
            }
        };
        strong.reachability.answered(true);
        strong.failed.send_replace(None);
        pause.reset();
        generation += 1;
        tracing::debug!(?role, generation, server = %opened.server, replicas = opened.replicas, "Redis connection up");
        strong.current.send_replace(Some(Live {
            conn,
            generation,
            replicas: opened.replicas,
        }));
        strong.interest.tell_all(&Note::Resync);
        let emptied = strong.interest.emptied();
        drop(strong);
        let why = serve(&state, role, &mut pushes, &broken, &emptied, &closed).await;
        opened.driver.abort();
        let Some(why) = why else {
            return;
        };
        let Some(strong) = state.upgrade() else {
            return;
        };
        strong.current.send_replace(None);
        strong.interest.tell_all(&Note::Blind(Instant::now()));
        drop(strong);
        tracing::debug!(?role, why, "the Redis connection went; opening another");
        if closed.run_until_cancelled(pause.wait()).await.is_none() {
            return;
        }
    }
}

/// What a new connection needs before use: tracking on (commands), or every wanted channel
/// subscribed (subscriber).
async fn set_up(
    state: &State,
    role: Role,
    conn: &mut MultiplexedConnection,
) -> Result<(), RedisFailure> {
    match role {
        Role::Commands => {
            redis::cmd("CLIENT")
                .arg("TRACKING")
                .arg("ON")
                .arg("NOLOOP")
                .query_async::<()>(conn)
                .await?;
        }
        Role::Subscriber => {
            let mut on_server = state.on_server.lock().await;
            on_server.clear();
            let wanted = state.interest.names();
            for chunk in wanted.chunks(1_000) {
                conn.subscribe(chunk).await?;
            }
            on_server.extend(wanted);
        }
    }
    Ok(())
}

/// Hands the connection's pushes to their subscriptions until it ends (`Some(why)`) or the
/// handle goes (`None`).
async fn serve(
    state: &Weak<State>,
    role: Role,
    pushes: &mut mpsc::UnboundedReceiver<PushInfo>,
    broken: &Notify,
    emptied: &Notify,
    closed: &CancellationToken,
) -> Option<&'static str> {
    loop {
        tokio::select! {
            biased;
            () = closed.cancelled() => return None,
            () = broken.notified() => return Some("a request found it broken or hung"),
            push = pushes.recv() => {
                let push = match push {
                    None => return Some("closed"),
                    Some(push) if push.kind == PushKind::Disconnection => return Some("closed"),
                    Some(push) => push,
                };
                let strong = state.upgrade()?;
                dispatch(&strong.interest, push);
            }
            () = emptied.notified(), if role == Role::Subscriber => {
                let strong = state.upgrade()?;
                unsubscribe_unwanted(&strong, broken).await;
            }
        }
    }
}

/// Hands one push to the subscriptions it concerns.
fn dispatch(interest: &Interest, push: PushInfo) {
    match push.kind {
        PushKind::Invalidate => match push.data.first() {
            Some(Value::Array(keys)) => {
                for key in keys {
                    if let Some(key) = text(key) {
                        interest.tell(&key, &Note::Changed(String::new()));
                    }
                }
            }
            // No key: the server flushed, or dropped its tracking table.
            _ => interest.tell_all(&Note::Changed(String::new())),
        },
        PushKind::Message => {
            if let (Some(channel), Some(payload)) = (
                push.data.first().and_then(text),
                push.data.get(1).and_then(text),
            ) {
                interest.tell(&channel, &Note::Changed(payload));
            }
        }
        _ => {}
    }
}

fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

/// Unsubscribes the channels nobody here waits on any more.
async fn unsubscribe_unwanted(state: &State, broken: &Notify) {
    let Some(mut live) = state.current.borrow().clone() else {
        return;
    };
    let mut on_server = state.on_server.lock().await;
    let unwanted: Vec<String> = on_server
        .iter()
        .filter(|channel| !state.interest.wants(channel))
        .cloned()
        .collect();
    for channel in &unwanted {
        on_server.remove(channel);
    }
    for chunk in unwanted.chunks(1_000) {
        if let Err(error) = live.conn.unsubscribe(chunk).await {
            tracing::debug!(%error, "unsubscribing failed; the connection is replaced");
            broken.notify_one();
            return;
        }
    }
}
