//! The fence with [`sqlx`] (0.8, PostgreSQL): [`install`] it, then [`fence`] each transaction.
//!
//! ```no_run
//! # async fn example(pool: &sqlx::PgPool, lease: &lease_core::Lease)
//! # -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! use lease_postgres::fence;
//!
//! fence::sqlx::install(&mut *pool.acquire().await?).await?; // once per database
//! let mut tx = pool.begin().await?;
//! // A holder whose lease was taken over, by a holder that has written since, fails here with
//! // `fence::Error::Stale`; `?` drops `tx`, which rolls it back.
//! fence::sqlx::fence(&mut tx, lease.sequencer()).await?;
//! sqlx::query("INSERT INTO reports (day) VALUES (current_date)")
//!     .execute(&mut *tx)
//!     .await?;
//! tx.commit().await?;
//! # Ok(()) }
//! ```
//!
//! The helpers use sqlx's `postgres` feature only; the application enables a runtime feature
//! (`runtime-tokio`, …) and TLS as it does for its own queries.

use ::sqlx::postgres::{PgConnection, PgPool, PgTransaction};
use lease_core::{Backend, Sequencer};

use super::{ADVANCE_CALL, AdvanceOnAcquire, Error, FENCE_CALL, FENCE_HELD_CALL, FENCE_SQL, Token};

/// Installs the fence: runs [`FENCE_SQL`] on `conn`.
///
/// Outside a transaction the script runs as one implicit transaction (one simple-query message),
/// so it is atomic and serialised with concurrent installs; in a transaction (a
/// [`PgTransaction`] derefs to a [`PgConnection`]) it becomes part of it. Running it again is
/// harmless.
///
/// # Errors
///
/// [`Error::Install`], with sqlx's error as its source (most often: the role may not create the
/// schema).
pub async fn install(conn: &mut PgConnection) -> Result<(), Error> {
    ::sqlx::raw_sql(FENCE_SQL)
        .execute(conn)
        .await
        .map(drop)
        .map_err(|e| {
            let sqlstate = sqlstate(&e);
            Error::from_install(sqlstate.as_deref(), Box::new(e))
        })
}

/// Fences `tx` with `sequencer`: records its index for its key, or fails if a newer holder of the
/// key has committed a fenced transaction. Call it first in the transaction that writes the data
/// the lease protects (see the [module](super) for why, and for what it guarantees).
///
/// The statement is prepared once per connection and cached, as sqlx does for every query. The
/// call may wait for the row lock while an earlier holder's fenced transaction on the key is
/// open.
///
/// # Errors
///
/// - [`Error::Unsupported`] for a sequencer that cannot fence ([`Token::new`]); nothing is sent.
/// - [`Error::Stale`] or [`Error::IndexReused`] when the fence refuses this holder; the
///   transaction is aborted: drop it or roll it back, and stop the work.
/// - [`Error::NotInstalled`] when the database has no fence: [`install`] it.
/// - [`Error::Database`] for anything else (a serialization failure to retry, the connection).
pub async fn fence(tx: &mut PgTransaction<'_>, sequencer: &Sequencer) -> Result<(), Error> {
    call(tx, FENCE_CALL, sequencer).await
}

/// Registers `sequencer`, just acquired, with the fence: from the moment this returns, every
/// fenced transaction of an older holder of the key is refused, whether or not this holder has
/// written. Call it on a connection outside a transaction (the statement is its own) right
/// after acquiring; [`advance_on_acquire`] does it for every acquisition of a backend.
///
/// It waits for an older holder's fenced transaction that is open on the key.
///
/// # Errors
///
/// As [`fence`]: [`Error::Stale`] if a newer holder has already advanced or written,
/// [`Error::IndexReused`], [`Error::NotInstalled`], [`Error::Database`].
pub async fn advance(conn: &mut PgConnection, sequencer: &Sequencer) -> Result<(), Error> {
    call(conn, ADVANCE_CALL, sequencer).await
}

/// `backend`, registering every leader acquisition with the fence through a connection of
/// `pool` before `acquire` returns (see [`AdvanceOnAcquire`]).
///
/// ```no_run
/// # async fn example(pool: sqlx::PgPool) {
/// use lease_core::LeaseSpec;
/// use lease_core::leader::Campaign;
/// use lease_postgres::fence;
///
/// let backend = fence::sqlx::advance_on_acquire(lease_core::memory::Memory::new(), pool);
/// let campaign = Campaign::new(backend, LeaseSpec::leader("jobs/billing"));
/// # drop(campaign); }
/// ```
pub fn advance_on_acquire(backend: impl Backend, pool: PgPool) -> AdvanceOnAcquire {
    AdvanceOnAcquire::new(backend, move |sequencer| {
        let pool = pool.clone();
        async move {
            let token = Token::new(&sequencer)?;
            let mut conn = pool.acquire().await.map_err(|e| fence_error(token, e))?;
            advance(&mut conn, &sequencer).await
        }
    })
}

/// Fences `tx` with the lease row of `sequencer`, a PostgreSQL lease of the backend `Postgres`
/// (feature `backend`, schema `lease`) in the same database: passes only if the holder's row is
/// live now, by the database's clock, and keeps it from being removed until `tx` ends (see
/// `fence::tokio_postgres::fence_held`, the same for tokio-postgres).
///
/// # Errors
///
/// [`Error::Stale`] if the row is not live; [`Error::Unsupported`] for a sequencer of another
/// backend; [`Error::NotInstalled`]; [`Error::Database`].
pub async fn fence_held(tx: &mut PgTransaction<'_>, sequencer: &Sequencer) -> Result<(), Error> {
    let token = Token::held(sequencer)?;
    ::sqlx::query(FENCE_HELD_CALL)
        .bind(token.holder())
        .bind(token.index())
        .execute(&mut **tx)
        .await
        .map(drop)
        .map_err(|e| fence_error(token, e))
}

async fn call(
    conn: &mut PgConnection,
    statement: &str,
    sequencer: &Sequencer,
) -> Result<(), Error> {
    let token = Token::new(sequencer)?;
    ::sqlx::query(statement)
        .bind(token.key())
        .bind(token.generation())
        .bind(token.index())
        .bind(token.holder())
        .execute(conn)
        .await
        .map(drop)
        .map_err(|e| fence_error(token, e))
}

fn fence_error(token: Token<'_>, e: ::sqlx::Error) -> Error {
    let sqlstate = sqlstate(&e);
    let detail = e
        .as_database_error()
        .and_then(|db| db.try_downcast_ref::<::sqlx::postgres::PgDatabaseError>())
        .and_then(|pg| pg.detail().map(str::to_owned));
    Error::from_fence_call(token, sqlstate.as_deref(), detail.as_deref(), Box::new(e))
}

fn sqlstate(error: &::sqlx::Error) -> Option<String> {
    error
        .as_database_error()
        .and_then(|db| db.code())
        .map(|code| code.into_owned())
}
