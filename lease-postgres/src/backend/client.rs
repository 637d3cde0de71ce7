//! What every clone of a [`Postgres`](super::Postgres) shares: the work connections (a fixed
//! budget, connected on first use and again after a loss), the installation of the tables, the
//! one place requests are sent (reachability, metrics, timeouts), and errors in lease terms.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use lease_core::backend::Fence;
use lease_core::backend::{Keepers, Reachability, ReachabilityTracker};
use lease_core::backoff::Backoff;
use lease_core::metrics::RequestError;
use lease_core::{BackendKind, Error, LostReason};
use lease_http::Task;
use tokio::sync::{Mutex, OnceCell, oneshot};
use tokio::time::Instant;
use tokio_postgres::Client;

use super::attempt::{Answer, Attempt, Attempts};
use super::listen::{Listener, Subscription};
use super::release::Releaser;
use super::renew::Renewer;
use super::sqlstate::{Stage, Verdict, judge};
use super::tls::{self, Connector};

/// The longest a request may go unanswered before it counts as failed (and is retried, within
/// the caller's bound). Far above a healthy answer, below the shortest TTL's renewal period.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);

/// The least time a request is retried for, whatever the caller's deadline, so that
/// `Wait::Never` still gets one real answer through brief trouble.
const RETRY_GRACE: Duration = Duration::from_secs(5);

/// The wire side every clone of one backend shares: the connections and what they are made
/// with, and where requests are sent. It knows nothing of leases.
pub(crate) struct Wire {
    pub(crate) config: tokio_postgres::Config,
    /// Run on every new connection, best effort: the server's side of the TCP settings.
    pub(crate) session_sql: Option<String>,
    /// TLS, as the URL's `sslmode` asks.
    pub(crate) tls: Connector,
    pub(crate) address: String,
    pub(crate) schema: String,
    install: bool,
    installed: OnceCell<()>,
    slots: Vec<Mutex<Option<Arc<Client>>>>,
    next: AtomicUsize,
    pub(crate) reachability: ReachabilityTracker,
    /// Probes the server while it is unreachable (see [`Wire::probed_reachability`]).
    probe: lease_http::Probe,
}

impl fmt::Debug for Wire {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Wire")
            .field("address", &self.address)
            .field("schema", &self.schema)
            .finish_non_exhaustive()
    }
}

/// The state every clone of one backend shares: the wire side, and the machinery that runs on
/// it (the holder tasks, the listener, the renewer, the releaser and the attempt batcher). Each
/// background task is handed what it needs when it starts (the wire, weakly, and its own
/// state), never this.
pub(crate) struct Shared {
    pub(crate) wire: Arc<Wire>,
    pub(crate) keepers: Keepers,
    listener: Listener,
    renewer: Renewer,
    releaser: Arc<Releaser>,
    attempts: Attempts,
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shared")
            .field("address", &self.wire.address)
            .field("schema", &self.wire.schema)
            .finish_non_exhaustive()
    }
}

impl Shared {
    pub(crate) fn new(wire: Wire) -> Shared {
        Shared {
            wire: Arc::new(wire),
            keepers: Keepers::new(),
            listener: Listener::default(),
            renewer: Renewer::default(),
            releaser: Arc::default(),
            attempts: Attempts::default(),
        }
    }

    /// Sends `attempt` with the attempts queued beside it; one try, no retry.
    pub(crate) async fn attempt(&self, attempt: Attempt) -> Result<Answer, PgError> {
        super::attempt::attempt(&self.attempts, &self.wire, &self.releaser, attempt).await
    }

    /// Gives `holder`'s row of `key` back, with the releases queued beside it.
    pub(crate) async fn release(&self, key: &str, holder: &str) -> Result<(), Error> {
        super::release::release(&self.releaser, &self.wire, key, holder).await
    }

    /// Subscribes to `key`'s notifications, starting the listening task on first use.
    pub(crate) fn subscribe(&self, key: &str) -> Subscription {
        self.listener.subscribe(&self.wire, key)
    }

    /// Renews `holder`'s row from now on; the receiver completes if a renewal finds it gone.
    pub(crate) fn renew(
        &self,
        holder: &str,
        ttl: Duration,
        fence: Fence,
    ) -> oneshot::Receiver<LostReason> {
        self.renewer.register(&self.wire, holder, ttl, fence)
    }

    /// Stops renewing `holder` (released, or lost).
    pub(crate) fn stop_renewing(&self, holder: &str) {
        self.renewer.unregister(holder);
    }
}

/// A failed request, before it is judged in lease terms.
#[derive(Debug)]
pub(crate) enum PgError {
    /// Connecting failed.
    Connect(tokio_postgres::Error),
    /// TLS failed while connecting: refused by the server, or a certificate not accepted.
    Tls(tokio_postgres::Error),
    /// A statement failed (the server's error, or the connection under it).
    Query(tokio_postgres::Error),
    /// No answer within [`REQUEST_TIMEOUT`].
    TimedOut,
    /// An answer this client cannot read.
    Malformed(String),
    /// The failure of a statement several requests shared (a batch of attempts).
    Batch(Arc<PgError>),
}

impl fmt::Display for PgError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PgError::Connect(e) | PgError::Tls(e) | PgError::Query(e) => {
                write!(f, "{}", with_sources(e))
            }
            PgError::TimedOut => write!(f, "no answer within {REQUEST_TIMEOUT:?}"),
            PgError::Malformed(what) => write!(f, "unexpected answer: {what}"),
            PgError::Batch(shared) => shared.fmt(f),
        }
    }
}

fn with_sources(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

impl PgError {
    /// A failure to connect: TLS's own, or any other.
    pub(crate) fn connecting(error: tokio_postgres::Error) -> PgError {
        if tls::is_tls_failure(&error) {
            PgError::Tls(error)
        } else {
            PgError::Connect(error)
        }
    }

    fn sqlstate(&self) -> Option<&str> {
        match self {
            PgError::Connect(e) | PgError::Query(e) => e.code().map(|c| c.code()),
            PgError::Batch(shared) => shared.sqlstate(),
            _ => None,
        }
    }

    /// The verdict on the server's code ([`judge`]), if it answered one.
    fn verdict(&self) -> Option<Verdict> {
        match self {
            PgError::Connect(e) => e.code().map(|c| judge(c.code(), Stage::Connecting)),
            PgError::Query(e) => e.code().map(|c| judge(c.code(), Stage::Statement)),
            PgError::Batch(shared) => shared.verdict(),
            _ => None,
        }
    }

    /// Whether another attempt may succeed: the server did not answer (or the connection
    /// broke), or answered a code a retry can cure ([`judge`]).
    pub(crate) fn is_transient(&self) -> bool {
        match (self, self.verdict()) {
            (PgError::Batch(shared), _) => shared.is_transient(),
            (_, Some(verdict)) => verdict != Verdict::Permanent,
            (_, None) => !matches!(self, PgError::Malformed(_) | PgError::Tls(_)),
        }
    }

    /// Whether the statement may have reached the server: anything but a failure to connect.
    pub(crate) fn maybe_sent(&self) -> bool {
        match self {
            PgError::Batch(shared) => shared.maybe_sent(),
            PgError::Connect(_) | PgError::Tls(_) => false,
            _ => true,
        }
    }

    /// Whether the server answered, for reachability: a code that says the database cannot be
    /// used now ([`Verdict::Unusable`]) is no answer.
    pub(crate) fn answered(&self) -> bool {
        match (self, self.verdict()) {
            (PgError::Batch(shared), _) => shared.answered(),
            (_, Some(verdict)) => verdict != Verdict::Unusable,
            (_, None) => matches!(self, PgError::Malformed(_) | PgError::Tls(_)),
        }
    }

    fn metric(&self) -> RequestError {
        match (self, self.verdict()) {
            (PgError::TimedOut, _) => RequestError::TimedOut,
            (PgError::Malformed(_), _) => RequestError::Malformed,
            (PgError::Batch(shared), _) => shared.metric(),
            (_, Some(Verdict::Unusable) | None) => RequestError::Unreachable,
            (_, Some(_)) => RequestError::Status,
        }
    }

    /// The error in lease terms, for `operation` (what was attempted, naming the key).
    pub(crate) fn into_error(self, address: &str, operation: impl fmt::Display) -> Error {
        let operation = operation.to_string();
        match self {
            PgError::Batch(error) => match Arc::try_unwrap(error) {
                Ok(error) => error.into_error(address, operation),
                Err(error) => error.describe(address, operation),
            },
            PgError::Connect(e) | PgError::Query(e) if e.code().is_none() => Error::Unreachable {
                backend: "PostgreSQL",
                address: address.to_owned(),
                hint: UNREACHABLE_HINT,
                source: Box::new(e),
            },
            other => other.describe(address, operation),
        }
    }

    /// [`into_error`](PgError::into_error) without taking the database's error along as the
    /// source (its text is in the message).
    fn describe(&self, address: &str, operation: String) -> Error {
        let code = self.sqlstate();
        let text = self.to_string();
        match (self, code) {
            (PgError::Batch(error), _) => error.describe(address, operation),
            (PgError::Tls(_), _) => tls::tls_failure(address, &text),
            (_, Some(code)) if code.starts_with("28") || code == "42501" => {
                Error::PermissionDenied {
                    operation,
                    message: text,
                    hint: "check the user and password of the PostgreSQL URL; the role needs \
                           USAGE on the lease schema and SELECT, INSERT, UPDATE, DELETE on its \
                           tables (lease-postgres's sql/lease.sql says which)",
                }
            }
            (_, Some(code)) if self.verdict() == Some(Verdict::Unusable) => Error::Unreachable {
                backend: "PostgreSQL",
                address: address.to_owned(),
                hint: UNUSABLE_HINT,
                source: format!("SQLSTATE {code}: {text}").into(),
            },
            (PgError::Connect(_), Some("3D000")) => Error::config(format!(
                "the database of the PostgreSQL URL does not exist ({}: {text}): create it or \
                 fix the URL",
                address
            )),
            (_, Some(code)) => Error::Backend {
                backend: "PostgreSQL",
                operation,
                message: format!("SQLSTATE {code}: {text}"),
                transient: self.verdict() == Some(Verdict::Transient),
            },
            (PgError::Connect(_) | PgError::Query(_), None) => Error::Unreachable {
                backend: "PostgreSQL",
                address: address.to_owned(),
                hint: UNREACHABLE_HINT,
                source: text.into(),
            },
            (PgError::TimedOut, None) => Error::Backend {
                backend: "PostgreSQL",
                operation,
                message: format!("no answer within {REQUEST_TIMEOUT:?}"),
                transient: true,
            },
            (PgError::Malformed(what), None) => Error::Backend {
                backend: "PostgreSQL",
                operation,
                message: format!("unexpected answer: {what}"),
                transient: false,
            },
        }
    }
}

/// What to do when the server answers that the database cannot be used now.
const UNUSABLE_HINT: &str = "the server is up but does not take connections to this database \
                             now (starting up, shutting down or in recovery; closed with \
                             ALTER DATABASE ... ALLOW_CONNECTIONS false; or out of connection \
                             slots): requests are retried until it does; if this lasts, see the \
                             server's log";

/// What to do when the server does not answer.
const UNREACHABLE_HINT: &str = "start PostgreSQL, or fix the host and port of the URL \
                                (Postgres::from_env reads LEASE_POSTGRES_URL, else DATABASE_URL)";

impl Wire {
    pub(crate) fn new(
        config: tokio_postgres::Config,
        session_sql: Option<String>,
        tls: Connector,
        address: String,
        schema: String,
        max_connections: usize,
        install: bool,
    ) -> Wire {
        Wire {
            config,
            session_sql,
            tls,
            address,
            schema,
            install,
            installed: OnceCell::new(),
            slots: (0..max_connections).map(|_| Mutex::new(None)).collect(),
            next: AtomicUsize::new(0),
            reachability: ReachabilityTracker::default(),
            probe: lease_http::Probe::default(),
        }
    }

    /// `sql` with the schema's name in place of `lease.`: every statement is written for the
    /// default schema.
    pub(crate) fn sql(&self, sql: &str) -> String {
        in_schema(sql, &self.schema)
    }

    /// The channel the trigger notifies.
    pub(crate) fn channel(&self) -> String {
        format!("{}_leases", self.schema)
    }

    /// Connects one new connection, driven on a task of its own, and runs `session_sql` on it.
    pub(crate) async fn connect(
        config: &tokio_postgres::Config,
        session_sql: Option<&str>,
        tls: &Connector,
    ) -> Result<Client, PgError> {
        let (client, connection) = config
            .connect(tls.clone())
            .await
            .map_err(PgError::connecting)?;
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(error = %with_sources(&error), "a PostgreSQL connection ended");
            }
        });
        set_session(&client, session_sql).await;
        Ok(client)
    }

    /// A work connection: the next of the budget in turn, connected (again) if it is not.
    async fn client(&self) -> Result<Arc<Client>, PgError> {
        let at = self.next.fetch_add(1, Ordering::Relaxed) % self.slots.len();
        let mut slot = self.slots[at].lock().await;
        if let Some(client) = slot.as_ref().filter(|c| !c.is_closed()) {
            return Ok(Arc::clone(client));
        }
        let client =
            Arc::new(Self::connect(&self.config, self.session_sql.as_deref(), &self.tls).await?);
        if self.install {
            self.installed
                .get_or_try_init(|| async {
                    client
                        .batch_execute(&self.sql(crate::LEASE_SQL))
                        .await
                        .map_err(PgError::Query)
                })
                .await?;
        }
        *slot = Some(Arc::clone(&client));
        Ok(client)
    }

    /// Sends one request on a work connection: tracked for reachability, counted in the metrics
    /// (`write` if it changes the table), bounded by [`REQUEST_TIMEOUT`].
    pub(crate) async fn request<T, F, Fut>(&self, write: bool, op: F) -> Result<T, PgError>
    where
        F: FnOnce(Arc<Client>) -> Fut,
        Fut: Future<Output = Result<T, tokio_postgres::Error>>,
    {
        lease_core::metrics::backend_request(BackendKind::Postgres, write);
        let in_flight = self.reachability.sending();
        let result = tokio::time::timeout(REQUEST_TIMEOUT, async {
            let client = self.client().await?;
            op(client).await.map_err(PgError::Query)
        })
        .await
        .unwrap_or(Err(PgError::TimedOut));
        match &result {
            Ok(_) => self.reachability.answered(true),
            Err(error) => {
                self.reachability.answered(error.answered());
                lease_core::metrics::backend_error(BackendKind::Postgres, error.metric());
            }
        }
        drop(in_flight);
        result
    }

    /// [`request`](Wire::request), retried through transient trouble until `deadline` (at
    /// least [`RETRY_GRACE`] from now).
    pub(crate) async fn retrying<T, F, Fut>(
        &self,
        deadline: Option<Instant>,
        write: bool,
        mut op: F,
    ) -> Result<T, PgError>
    where
        F: FnMut(Arc<Client>) -> Fut,
        Fut: Future<Output = Result<T, tokio_postgres::Error>>,
    {
        let mut retry = Retry::until(deadline);
        loop {
            match self.request(write, &mut op).await {
                Err(error) if retry.again(&error).await => {}
                other => return other,
            }
        }
    }
}

impl Wire {
    /// Whether the server answered the last request, probing it in the background while it did
    /// not (a connect if need be, and `SELECT 1`, about every second, until one is answered), so
    /// that the answer turns current again without other traffic.
    pub(crate) fn probed_reachability(self: &Arc<Self>) -> Reachability {
        self.probe.watch(
            self,
            |wire| wire.reachability.get(),
            |wire| async move {
                // Any answer, an error too, is the server answering.
                let _ = wire
                    .request(false, |client| async move {
                        client.simple_query("SELECT 1").await
                    })
                    .await;
            },
        )
    }
}

/// How a failed request is retried: through transient trouble, paused by [`retry_backoff`],
/// until a deadline (at least [`RETRY_GRACE`] from the start; none: for ever).
pub(crate) struct Retry {
    give_up: Option<Instant>,
    pause: Backoff,
}

impl Retry {
    pub(crate) fn until(deadline: Option<Instant>) -> Retry {
        Retry {
            give_up: deadline.map(|d| d.max(Instant::now() + RETRY_GRACE)),
            pause: retry_backoff(),
        }
    }

    /// After `error`: pauses and answers true if the request is worth sending again.
    pub(crate) async fn again(&mut self, error: &PgError) -> bool {
        if !error.is_transient() {
            return false;
        }
        let wait = self.pause.next_pause();
        if self.give_up.is_some_and(|g| Instant::now() + wait >= g) {
            return false;
        }
        tracing::debug!(%error, "PostgreSQL request failed; retrying");
        tokio::time::sleep(wait).await;
        true
    }
}

/// Runs `session_sql` on a new connection; a server (or pooler) that refuses it keeps its
/// defaults, which is no reason to fail.
pub(crate) async fn set_session(client: &Client, session_sql: Option<&str>) {
    if let Some(sql) = session_sql {
        if let Err(error) = client.batch_execute(sql).await {
            tracing::debug!(error = %with_sources(&error), "the server refused the TCP settings; keeping its own");
        }
    }
}

/// Requests of one kind queued to go together, in one statement and one commit, and the task of
/// a handle that sends them (the `attempt` and `release` modules).
pub(crate) struct Batched<T, R> {
    queue: Arc<Queue<T, R>>,
    /// Wakes the task: an item queued, or the handle gone (this dropped with it).
    wake: Arc<tokio::sync::Notify>,
    task: Task,
}

/// The queued items, each with where its answer goes.
type Queue<T, R> = std::sync::Mutex<Vec<(T, tokio::sync::oneshot::Sender<R>)>>;

/// What the sending task of a [`Batched`] is handed when it starts: the queue, held weakly so
/// that the task does not keep it, and the wake-up.
pub(crate) struct Drain<T, R> {
    queue: Weak<Queue<T, R>>,
    wake: Arc<tokio::sync::Notify>,
}

impl<T, R> Default for Batched<T, R> {
    fn default() -> Self {
        Batched {
            queue: Arc::default(),
            wake: Arc::default(),
            task: Task::default(),
        }
    }
}

impl<T, R> Drop for Batched<T, R> {
    /// The last clone of the handle is gone: the task, which waits without keeping the queue,
    /// wakes to find it gone and ends.
    fn drop(&mut self) {
        self.wake.notify_one();
    }
}

impl<T, R> fmt::Debug for Batched<T, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Batched")
            .field("queued", &lock(&self.queue).len())
            .finish_non_exhaustive()
    }
}

fn lock<T, R>(
    queue: &Queue<T, R>,
) -> std::sync::MutexGuard<'_, Vec<(T, tokio::sync::oneshot::Sender<R>)>> {
    queue
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl<T, R> Batched<T, R> {
    /// Queues `item`, starting the sending task (`start(drain)`) unless it runs; the receiver
    /// gets its answer.
    pub(crate) fn push<F>(
        &self,
        item: T,
        start: impl FnOnce(Drain<T, R>) -> F,
    ) -> tokio::sync::oneshot::Receiver<R>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let (reply, answer) = tokio::sync::oneshot::channel();
        lock(&self.queue).push((item, reply));
        self.task.ensure(|| {
            start(Drain {
                queue: Arc::downgrade(&self.queue),
                wake: Arc::clone(&self.wake),
            })
        });
        self.wake.notify_one();
        answer
    }
}

impl<T, R> Drain<T, R> {
    /// Up to `most` queued items, oldest first; waits for one without keeping the queue, and is
    /// `None` once the handle is gone (its drop wakes the wait), so the sending task ends with
    /// it.
    pub(crate) async fn next(
        &self,
        most: usize,
    ) -> Option<Vec<(T, tokio::sync::oneshot::Sender<R>)>> {
        loop {
            let queue = self.queue.upgrade()?;
            let batch = {
                let mut queue = lock(&queue);
                let at = queue.len().min(most);
                let rest = queue.split_off(at);
                std::mem::replace(&mut *queue, rest)
            };
            if !batch.is_empty() {
                return Some(batch);
            }
            drop(queue);
            self.wake.notified().await;
        }
    }
}

/// The pause between retries of a failed request.
pub(crate) fn retry_backoff() -> Backoff {
    Backoff::new(Duration::from_millis(50), Duration::from_secs(1))
}

/// `sql`, written for the schema `lease`, for `schema`.
pub(crate) fn in_schema(sql: &str, schema: &str) -> String {
    if schema == super::config::DEFAULT_SCHEMA {
        return sql.to_owned();
    }
    sql.replace(
        "SCHEMA IF NOT EXISTS lease;",
        &format!("SCHEMA IF NOT EXISTS {schema};"),
    )
    .replace("lease.", &format!("{schema}."))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The migration names its schema only as `lease.` prefixes and in its `CREATE SCHEMA`, so
    /// another schema's text names nothing of `lease`.
    #[test]
    fn another_schema_is_renamed_everywhere() {
        let sql = in_schema(crate::LEASE_SQL, "app_leases");
        assert!(sql.contains("CREATE SCHEMA IF NOT EXISTS app_leases;"));
        assert!(sql.contains("app_leases.try_acquire("));
        let code: String = sql
            .lines()
            .filter(|line| !line.trim_start().starts_with("--"))
            .collect();
        assert!(!code.contains(" lease."), "{code}");
        assert!(!code.contains("(lease."), "{code}");
        assert!(!code.contains("'lease."), "{code}");
    }
}
