//! The wire side of the backend: the two connections of a handle (the `link` module), opened as
//! the `connect` module says (a server or the sentinels' master, TCP, TLS, RESP3); the one place
//! requests are sent ([`Wire::request`], [`Wire::script`]: reachability, metrics, timeouts, a
//! connection found broken replaced); the Lua scripts and the keys of a name (`scripts`); who
//! listens for which key's invalidations and which channel's messages (`interest`); and errors
//! in lease terms (`error`).
//!
//! The bottom of the crate: it imports nothing of the modules above it. What the clones of a
//! [`Redis`](crate::Redis) share above it (the holder tasks, the renewer) is the owner's, in the
//! `client` module. Every task of the crate is spawned through [`spawn`] (`runtime`).

mod connect;
mod error;
mod interest;
mod link;
mod runtime;
mod scripts;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use lease_core::BackendKind;
use lease_core::backend::{Reachability, ReachabilityTracker};
use redis::aio::MultiplexedConnection;
use redis::{RedisResult, Value};
use tokio::time::Instant;

pub(crate) use connect::{Connector, Endpoint};
pub(crate) use error::RedisFailure;
pub(crate) use interest::{Interested, Note};
use link::{Link, Role};
pub(crate) use runtime::spawn;
pub use scripts::DEFAULT_PREFIX;
pub(crate) use scripts::{
    ACQUIRE, CHECK, KEEP, Keys, LEADER, LEAVE, RELEASE, RENEW, Script, check_name,
};

/// The wire side of one handle: how to connect, its two connections, who listens for what, and
/// what its requests found about the server.
#[derive(Debug)]
pub(crate) struct Wire {
    /// `host:port` (or the sentinels' master's name), never the password.
    pub(crate) address: String,
    /// The prefix of every key and channel.
    pub(crate) prefix: String,
    pub(crate) connector: Connector,
    /// `WAIT` for the server's replicas after an acquisition, up to this long; `None`: not.
    pub(crate) replica_wait: Option<Duration>,
    pub(crate) reachability: Arc<ReachabilityTracker>,
    probe: lease_http::Probe,
    /// The command connection: scripts, and the tracking invalidations of the keys they read.
    commands: Link,
    /// The subscriber connection: the waiters' wake-up channels.
    subscriber: Link,
}

impl Wire {
    pub(crate) fn new(
        address: String,
        prefix: String,
        connector: Connector,
        replica_wait: Option<Duration>,
    ) -> Wire {
        let reachability = Arc::new(ReachabilityTracker::default());
        Wire {
            address,
            prefix,
            connector,
            replica_wait,
            commands: Link::new(Role::Commands, Arc::clone(&reachability)),
            subscriber: Link::new(Role::Subscriber, Arc::clone(&reachability)),
            reachability,
            probe: lease_http::Probe::default(),
        }
    }

    /// The keys of `name`.
    pub(crate) fn keys(&self, name: &str) -> Keys {
        Keys::of(&self.prefix, name)
    }

    /// Connections this handle has open now (a detached release's too).
    pub(crate) fn open_connections(&self) -> usize {
        self.connector.open.load(Ordering::Relaxed)
    }

    /// What the requests found, probing the server in the background while it is unreachable.
    pub(crate) fn probed_reachability(self: &Arc<Self>) -> Reachability {
        self.probe.watch(
            self,
            |wire| wire.reachability.get(),
            |wire: Arc<Wire>| async move {
                let _ = wire
                    .request(false, |mut conn| async move {
                        redis::cmd("PING").query_async::<()>(&mut conn).await
                    })
                    .await;
            },
        )
    }

    /// Follows `key`'s invalidations (a script of the command connection must read it for the
    /// server to track it), starting the command connection's task on first use.
    pub(crate) fn track(&self, key: &str) -> Interested {
        self.commands.ensure(&self.connector);
        self.commands.interest().subscribe(key).0
    }

    /// Tells this handle's own followers of `key` that a script of this handle changed it: the
    /// server does not (`NOLOOP`), so an observer on the same handle as the holder hears of it.
    pub(crate) fn changed_here(&self, key: &str) {
        self.commands
            .interest()
            .tell(key, &Note::Changed(String::new()));
    }

    /// Subscribes to `channel` on the subscriber connection (see [`Link::subscribe`]).
    pub(crate) async fn subscribe(&self, channel: &str) -> Interested {
        self.subscriber.subscribe(&self.connector, channel).await
    }

    /// Sends one request on the command connection: waits up to the request timeout for the
    /// connection, bounds the request by it, records it (reachability, metrics), and replaces a
    /// connection the failure shows broken. `write`: it changes state on the server.
    pub(crate) async fn request<T, F, Fut>(&self, write: bool, op: F) -> Result<T, RedisFailure>
    where
        F: FnOnce(MultiplexedConnection) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        self.request_on(write, |live| op(live.conn.clone()))
            .await
            .map(|(answer, _)| answer)
    }

    /// [`request`](Wire::request), handing `op` the connection and its generation, and
    /// answering with the connection it went on.
    async fn request_on<T, F, Fut>(
        &self,
        write: bool,
        op: F,
    ) -> Result<(T, link::Live), RedisFailure>
    where
        F: FnOnce(&link::Live) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        let timeout = self.connector.request_timeout;
        let until = Instant::now() + timeout;
        self.commands.ensure(&self.connector);
        let live = match self.commands.wait(until).await {
            Ok(live) => live,
            Err(error) => {
                lease_core::metrics::backend_error(BackendKind::Redis, error.metric());
                return Err(error);
            }
        };
        lease_core::metrics::backend_request(BackendKind::Redis, write);
        let in_flight = self.reachability.sending();
        let answer = match tokio::time::timeout(timeout, op(&live)).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(error)) => Err(RedisFailure::Redis(error)),
            Err(_) => Err(RedisFailure::TimedOut),
        };
        match &answer {
            Ok(_) => self.reachability.answered(true),
            Err(error) => {
                self.reachability.answered(error.answered());
                lease_core::metrics::backend_error(BackendKind::Redis, error.metric());
                if error.breaks_connection() {
                    self.commands.broke(live.generation);
                }
            }
        }
        drop(in_flight);
        answer.map(|answer| (answer, live))
    }

    /// Runs `script` with `keys` and `args` on the command connection (`EVALSHA`, and `EVAL`
    /// once if the server has not cached it). Answers with the send time, and the connection
    /// it ran on.
    pub(crate) async fn script(
        &self,
        script: &Script,
        keys: &[&str],
        args: &[&[u8]],
        write: bool,
    ) -> Result<(Value, Instant, Ran), RedisFailure> {
        let sent = Instant::now();
        let (value, live) = self
            .request_on(write, |live| {
                let mut conn = live.conn.clone();
                async move {
                    let evalsha = redis::cmd("EVALSHA")
                        .arg(script.hash())
                        .arg(keys.len())
                        .arg(keys)
                        .arg(args)
                        .query_async::<Value>(&mut conn)
                        .await;
                    match evalsha {
                        Err(error) if error.code() == Some("NOSCRIPT") => {
                            redis::cmd("EVAL")
                                .arg(script.source)
                                .arg(keys.len())
                                .arg(keys)
                                .arg(args)
                                .query_async::<Value>(&mut conn)
                                .await
                        }
                        other => other,
                    }
                }
            })
            .await
            .inspect_err(|error| tracing::debug!(%error, script = script.name, "script failed"))?;
        let ran = Ran {
            generation: live.generation,
            replicas: live.replicas,
        };
        Ok((value, sent, ran))
    }

    /// Runs `script` with `args` (and no keys) and then `EXISTS` of `track`, in one `MULTI`, so
    /// that client-side tracking follows every key of `track` from the moment the script's own
    /// writes to them (which the server forgets them for, NOLOOP) are done: the renewal's way to
    /// arm tracking for a whole batch at once. Answers the script's value, how many of `track`
    /// exist, and the send time.
    pub(crate) async fn script_then_track(
        &self,
        script: &Script,
        args: &[&[u8]],
        track: &[&str],
    ) -> Result<(Value, usize, Instant, Ran), RedisFailure> {
        let sent = Instant::now();
        let (answer, live) = self
            .request_on(true, |live| {
                let mut conn = live.conn.clone();
                async move {
                    let run = |load: bool| {
                        let mut pipe = redis::pipe();
                        if load {
                            pipe.cmd("SCRIPT").arg("LOAD").arg(script.source).ignore();
                        }
                        pipe.atomic()
                            .cmd("EVALSHA")
                            .arg(script.hash())
                            .arg(0)
                            .arg(args)
                            .cmd("EXISTS")
                            .arg(track);
                        pipe
                    };
                    let answer = run(false).query_async::<(Value, usize)>(&mut conn).await;
                    match answer {
                        Err(error) if error.code() == Some("NOSCRIPT") => {
                            run(true).query_async::<(Value, usize)>(&mut conn).await
                        }
                        other => other,
                    }
                }
            })
            .await
            .inspect_err(|error| tracing::debug!(%error, script = script.name, "script failed"))?;
        let ran = Ran {
            generation: live.generation,
            replicas: live.replicas,
        };
        Ok((answer.0, answer.1, sent, ran))
    }

    /// Waits until the server's replicas have every write the connection `ran` carried so far,
    /// up to [`replica_wait`](Wire::replica_wait): `WAIT`. Nothing to wait for without replicas
    /// (or without the setting).
    pub(crate) async fn sync_replicas(&self, ran: &Ran) -> Result<(), RedisFailure> {
        let Some(wait) = self.replica_wait.filter(|_| ran.replicas > 0) else {
            return Ok(());
        };
        let wanted = ran.replicas;
        let millis = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
        let generation = ran.generation;
        let acknowledged = self
            .request_on(false, |live| {
                let mut conn = live.conn.clone();
                let same = live.generation == generation;
                async move {
                    if !same {
                        // Another connection: WAIT would not count the acquisition's write.
                        return Ok(0);
                    }
                    redis::cmd("WAIT")
                        .arg(wanted)
                        .arg(millis)
                        .query_async::<usize>(&mut conn)
                        .await
                }
            })
            .await?
            .0;
        if acknowledged < wanted {
            return Err(RedisFailure::Replicas {
                acknowledged,
                wanted,
            });
        }
        Ok(())
    }
}

/// Which connection a script ran on, for [`Wire::sync_replicas`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ran {
    generation: u64,
    replicas: usize,
}

impl Wire {
    /// Whether `ran` is the command connection in use now.
    pub(crate) fn is_current(&self, ran: &Ran) -> bool {
        self.commands
            .now()
            .is_some_and(|live| live.generation == ran.generation)
    }
}
