//! The fence with [`tokio_postgres`]: [`install`] it, then [`fence`] each transaction.
//!
//! ```no_run
//! # async fn example(client: &mut tokio_postgres::Client, lease: &lease_core::Lease)
//! # -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! use lease_postgres::fence;
//!
//! fence::tokio_postgres::install(&*client).await?; // once per database
//! let tx = client.transaction().await?;
//! // A holder whose lease was taken over, by a holder that has written since, fails here with
//! // `fence::Error::Stale`; `?` drops `tx`, which rolls it back.
//! fence::tokio_postgres::fence(&tx, lease.sequencer()).await?;
//! tx.execute("INSERT INTO reports (day) VALUES (current_date)", &[]).await?;
//! tx.commit().await?;
//! # Ok(()) }
//! ```
//!
//! The helpers take the client the application connected (tokio-postgres's `runtime` feature is
//! not needed here). A pooled connection (deadpool-postgres, bb8-postgres) works through its
//! `Deref`s: pass the [`tokio_postgres::Client`] or [`Transaction`] it dereferences to.

use std::sync::Arc;

use ::tokio_postgres::types::Type;
use ::tokio_postgres::{Client, GenericClient, Transaction};
use lease_core::{Backend, Sequencer};

use super::{ADVANCE_CALL, AdvanceOnAcquire, Error, FENCE_CALL, FENCE_HELD_CALL, FENCE_SQL, Token};

/// Installs the fence: runs [`FENCE_SQL`] on `client`.
///
/// On a [`tokio_postgres::Client`] the script runs as one implicit transaction (one
/// simple-query message), so it is atomic and serialised with concurrent installs; in a
/// [`Transaction`] it becomes part of it. Running it again is harmless.
///
/// # Errors
///
/// [`Error::Install`], with the database's error as its source (most often: the role may not
/// create the schema).
pub async fn install<C: GenericClient>(client: &C) -> Result<(), Error> {
    client.batch_execute(FENCE_SQL).await.map_err(|e| {
        let sqlstate = e.code().map(|c| c.code().to_owned());
        Error::from_install(sqlstate.as_deref(), Box::new(e))
    })
}

/// Fences `tx` with `sequencer`: records its index for its key, or fails if a newer holder of the
/// key has committed a fenced transaction. Call it first in the transaction that writes the data
/// the lease protects (see the [module](super) for why, and for what it guarantees).
///
/// One round trip (the statement is sent with its parameter types, unprepared). The call may wait
/// for the row lock while an earlier holder's fenced transaction on the key is open.
///
/// # Errors
///
/// - [`Error::Unsupported`] for a sequencer that cannot fence ([`Token::new`]); nothing is sent.
/// - [`Error::Stale`] or [`Error::IndexReused`] when the fence refuses this holder; the
///   transaction is aborted: drop it or roll it back, and stop the work.
/// - [`Error::NotInstalled`] when the database has no fence: [`install`] it.
/// - [`Error::Database`] for anything else (a serialization failure to retry, the connection).
pub async fn fence(tx: &Transaction<'_>, sequencer: &Sequencer) -> Result<(), Error> {
    call(tx, FENCE_CALL, sequencer).await
}

/// Registers `sequencer`, just acquired, with the fence: from the moment this returns, every
/// fenced transaction of an older holder of the key is refused, whether or not this holder has
/// written. Call it on a [`Client`] (the statement is its own transaction) right after acquiring,
/// before the work starts; [`advance_on_acquire`] does it for every acquisition of a backend.
///
/// It waits for an older holder's fenced transaction that is open on the key.
///
/// # Errors
///
/// As [`fence`]: [`Error::Stale`] if a newer holder has already advanced or written (this
/// acquisition is already stale), [`Error::IndexReused`], [`Error::NotInstalled`],
/// [`Error::Database`].
pub async fn advance<C: GenericClient>(client: &C, sequencer: &Sequencer) -> Result<(), Error> {
    call(client, ADVANCE_CALL, sequencer).await
}

/// `backend`, registering every leader acquisition with the fence through `client` before
/// `acquire` returns (see [`AdvanceOnAcquire`]).
///
/// `client` runs one statement per acquisition, concurrently with whatever else uses it; a
/// client whose connection has closed fails every advance (and so every acquisition) until the
/// application replaces the wrapper: give it a client of its own, or use
/// [`AdvanceOnAcquire::new`] with a pool.
///
/// ```no_run
/// # async fn example(client: tokio_postgres::Client) -> Result<(), lease_core::Error> {
/// use std::sync::Arc;
/// use lease_core::LeaseSpec;
/// use lease_core::leader::Campaign;
/// use lease_postgres::fence;
///
/// let backend = fence::tokio_postgres::advance_on_acquire(
///     lease_core::memory::Memory::new(), // Consul::from_env()?, Etcd::from_env()?
///     Arc::new(client),
/// );
/// let campaign = Campaign::new(backend, LeaseSpec::leader("jobs/billing"));
/// # drop(campaign); Ok(()) }
/// ```
pub fn advance_on_acquire(backend: impl Backend, client: Arc<Client>) -> AdvanceOnAcquire {
    AdvanceOnAcquire::new(backend, move |sequencer| {
        let client = Arc::clone(&client);
        async move { advance(&*client, &sequencer).await }
    })
}

/// Fences `tx` with the lease row of `sequencer`, a PostgreSQL lease of the backend `Postgres`
/// (feature `backend`, schema `lease`) in the same database: passes only if the holder's row is
/// live now, by the database's clock, and keeps it from being removed (a contender's take-over,
/// a release, an operator's delete) until `tx` ends. So a holder whose lease has expired is
/// refused even if no one has acquired the lease since, and while `tx` is open no one can.
///
/// A lease expiring while `tx` is open stays the holder's until `tx` ends: keep transactions
/// short, and set `idle_in_transaction_session_timeout` below the TTL.
///
/// # Errors
///
/// [`Error::Stale`] if the row is not live (expired, released, deleted, taken over);
/// [`Error::Unsupported`] for a sequencer of another backend; [`Error::NotInstalled`] if the
/// database has no lease tables; [`Error::Database`] for anything else.
pub async fn fence_held(tx: &Transaction<'_>, sequencer: &Sequencer) -> Result<(), Error> {
    let token = Token::held(sequencer)?;
    let index = token.index();
    tx.query_typed(
        FENCE_HELD_CALL,
        &[(&token.holder(), Type::TEXT), (&index, Type::INT8)],
    )
    .await
    .map(drop)
    .map_err(|e| fence_error(token, e))
}

async fn call<C: GenericClient>(
    client: &C,
    statement: &str,
    sequencer: &Sequencer,
) -> Result<(), Error> {
    let token = Token::new(sequencer)?;
    let (generation, index) = (token.generation(), token.index());
    client
        .query_typed(
            statement,
            &[
                (&token.key(), Type::TEXT),
                (&generation, Type::INT8),
                (&index, Type::INT8),
                (&token.holder(), Type::TEXT),
            ],
        )
        .await
        .map(drop)
        .map_err(|e| fence_error(token, e))
}

fn fence_error(token: Token<'_>, e: ::tokio_postgres::Error) -> Error {
    let db = e.as_db_error();
    let sqlstate = db.map(|db| db.code().code().to_owned());
    let detail = db.and_then(|db| db.detail().map(str::to_owned));
    Error::from_fence_call(token, sqlstate.as_deref(), detail.as_deref(), Box::new(e))
}
