//! The work connections of a handle: a fixed budget, connected on first use (installing the
//! tables once) and again after a loss, and the one place requests are sent, tracked for
//! reachability, counted in the metrics and bounded by a timeout. While the server does not
//! answer, a probe asks it about every second, so that reachability turns current again
//! without other traffic.
//!
//! The connections are pipelined (tokio-postgres sends a statement without waiting for the one
//! before), so `max_connections` of them (default 2) carry every acquisition, renewal, release,
//! check and observation read of a handle and its clones
//! (`postgres_lease::a_thousand_leases_on_three_connections`, with the listening connection).

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use lease_core::BackendKind;
use lease_core::backend::{Reachability, ReachabilityTracker};
use tokio::sync::{Mutex, OnceCell};
use tokio::time::Instant;
use tokio_postgres::Client;

use super::error::{PgError, REQUEST_TIMEOUT, with_sources};
use super::retry::Retry;
use super::schema::in_schema;
use super::tls::Connector;

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
        lease_core::runtime::spawn(async move {
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

/// Runs `session_sql` on a new connection; a server (or pooler) that refuses it keeps its
/// defaults, which is no reason to fail.
pub(crate) async fn set_session(client: &Client, session_sql: Option<&str>) {
    if let Some(sql) = session_sql {
        if let Err(error) = client.batch_execute(sql).await {
            tracing::debug!(error = %with_sources(&error), "the server refused the TCP settings; keeping its own");
        }
    }
}
