//! The public backend type, [`Postgres`], and its `impl Backend`: it calls down into the
//! recipes (the `acquire` and `observe` modules) and the owner (`Shared`); nothing below imports
//! it. [`PostgresBuilder`](crate::PostgresBuilder) builds it (the `config` module).

use std::fmt;
use std::sync::Arc;

use super::acquire;
use super::client::Shared;
use super::observe;
use lease_core::backend::Reachability;
use lease_core::leader::LeaderObserver;
use lease_core::{Backend, BackendKind, BoxFuture, Error, Lease, LeaseSpec, Sequencer};

/// Leases in a PostgreSQL database. Cloning is cheap, and clones share the connections.
///
/// - **A lease is a row** of `lease.leases`, live while its `expires_at` is ahead of the
///   database's clock (`now()`); an expired row is free. An acquisition attempt is one
///   statement (`lease.try_acquire`, serialised per key by an advisory lock for its
///   transaction; the attempts pending at one moment go together, in one commit): a leader key
///   admits one live row, a semaphore `limit` of them.
/// - **Renewal is batched**: every TTL/3, one `UPDATE … WHERE holder = ANY($1)` per TTL renews
///   every lease of this handle with that TTL; each answered renewal confirms the leases'
///   fences with its send time, and a lease missing from its `RETURNING` is lost.
/// - **Loss and hand-over without polling**: a trigger on the table `NOTIFY`s every insert and
///   delete, and one connection per handle listens: a holder whose row is deleted (an
///   operator's `DELETE`) loses its lease at once, a waiter retries at once when a holder
///   releases, and otherwise sleeps until the holder's row expires.
/// - **Self-fence**: no answered renewal for [`LeaseSpec::fence_after`] (the TTL less a tenth,
///   at least a second) and the lease is lost, before the database could let anyone else in.
/// - **Settle**: a row deleted under its holder (anything but a release or an expiry) bars its
///   key, or its semaphore slot, for the holder's [`LeaseSpec::settle_after_removal`], so the
///   old holder stops before the next one starts.
/// - **Sequencer**: `postgres:<index>:<holder>:<key>`, the index drawn from the sequence
///   `lease.lease_index` for every acquisition (it rises across every key), the holder a random
///   ID per acquisition; the key is the leader key, or `<prefix>/<holder>` for a semaphore.
///   [`fence::Token`](crate::fence::Token) accepts leader sequencers.
/// - **Connections**: [`PostgresBuilder::max_connections`] (default 2) carry every acquisition,
///   renewal, release and check of the handle, plus one that listens: 3 connections for 1,000
///   leases, and waiters cost none of their own. They close once the last clone of the handle
///   and every lease and observer of it are gone: the background tasks do not keep it.
///
/// The tables are installed on first use ([`LEASE_SQL`](crate::LEASE_SQL), idempotent) unless
/// [`PostgresBuilder::install`] says not to. TLS follows the URL's `sslmode` (feature
/// `rustls`, on by default): `prefer`, the default, encrypts when the server offers TLS;
/// `require` also verifies the certificate ([`PostgresBuilder::ca_cert`]).
///
/// [`PostgresBuilder::max_connections`]: crate::PostgresBuilder::max_connections
/// [`PostgresBuilder::install`]: crate::PostgresBuilder::install
/// [`PostgresBuilder::ca_cert`]: crate::PostgresBuilder::ca_cert
///
/// # Examples
///
/// ```no_run
/// # async fn example() -> Result<(), lease_core::Error> {
/// use lease_core::{Backend, LeaseSpec};
/// use lease_postgres::Postgres;
///
/// // LEASE_POSTGRES_URL, else DATABASE_URL: postgres://user:password@host:5432/database
/// let postgres = Postgres::from_env()?;
/// let lease = postgres.acquire(&LeaseSpec::leader("jobs/billing").value("10.0.0.7")).await?;
/// // postgres:<index>:<holder>:jobs/billing — the index rises with every acquisition.
/// println!("leading as {}", lease.sequencer());
/// lease.run(async { /* only the leader gets here; dropped if the lease is lost */ }).await?;
/// lease.release().await?;
/// postgres.shutdown().await;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Postgres {
    pub(super) shared: Arc<Shared>,
}

impl fmt::Debug for Postgres {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Postgres")
            .field("address", &self.shared.wire.address)
            .field("schema", &self.shared.wire.schema)
            .finish_non_exhaustive()
    }
}

impl Postgres {
    pub(super) fn from_shared(shared: Shared) -> Postgres {
        Postgres {
            shared: Arc::new(shared),
        }
    }

    /// `host:port/database` (never the password).
    pub fn address(&self) -> &str {
        &self.shared.wire.address
    }

    /// The schema of the backend's tables.
    pub fn schema(&self) -> &str {
        &self.shared.wire.schema
    }

    /// Whether `sequencer` still names a current holder: one read of the table. `Ok(())` while
    /// its row is live, `Err(Error::Lost(_))` once it was released, deleted, expired or the key
    /// taken by another acquisition.
    pub async fn check_sequencer(&self, sequencer: &Sequencer) -> Result<(), Error> {
        acquire::check_sequencer(&self.shared.wire, sequencer).await
    }

    /// Operator action: deletes the rows of `key`, as an administrator's `DELETE` would: every
    /// holder of the leader key or semaphore prefix `key`, or the one semaphore holder whose
    /// sequencer's key is `key` (`<prefix>/<holder>`). Their holders lose their leases with
    /// [`LostReason::KeyDeleted`](lease_core::LostReason::KeyDeleted) at once, and the key (or
    /// slot) stays barred for each holder's settle time. Returns how many rows went.
    pub async fn delete_key(&self, key: &str) -> Result<u64, Error> {
        acquire::check_key(key)?;
        let sql = self.shared.wire.sql(
            "DELETE FROM lease.leases WHERE lease_key = $1 OR lease_key || '/' || holder = $1",
        );
        self.shared
            .wire
            .request(true, |client| {
                let sql = &sql;
                async move { client.execute(sql, &[&key]).await }
            })
            .await
            .map_err(|e| e.into_error(&self.shared.wire.address, format_args!("delete {key:?}")))
    }

    /// Operator action: deletes the row of the acquisition `holder` names (a
    /// [`Sequencer::holder`]), as [`delete_key`](Postgres::delete_key) does for a key.
    /// `Ok(false)` if it was not there.
    pub async fn delete_holder(&self, holder: &str) -> Result<bool, Error> {
        let sql = self
            .shared
            .wire
            .sql("DELETE FROM lease.leases WHERE holder = $1");
        self.shared
            .wire
            .request(true, |client| {
                let sql = &sql;
                async move { client.execute(sql, &[&holder]).await }
            })
            .await
            .map(|deleted| deleted > 0)
            .map_err(|e| {
                e.into_error(
                    &self.shared.wire.address,
                    format_args!("delete holder {holder:?}"),
                )
            })
    }
}

impl Backend for Postgres {
    fn acquire<'a>(&'a self, spec: &'a LeaseSpec) -> BoxFuture<'a, Result<Lease, Error>> {
        lease_core::backend::instrument_acquire(BackendKind::Postgres, spec, async move {
            spec.validate()?;
            let backend: Arc<dyn Backend> = Arc::new(self.clone());
            acquire::acquire(&self.shared, spec, backend).await
        })
    }

    fn observe_leader<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<LeaderObserver, Error>> {
        Box::pin(observe::observe(&self.shared, key))
    }

    fn check_sequencer<'a>(&'a self, sequencer: &'a Sequencer) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(Postgres::check_sequencer(self, sequencer))
    }

    fn reachability(&self) -> Reachability {
        self.shared.wire.probed_reachability()
    }

    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(self.shared.keepers.shutdown())
    }
}
