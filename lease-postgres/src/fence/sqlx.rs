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

use ::sqlx::postgres::{PgConnection, PgTransaction};
use lease_core::Sequencer;

use super::{Error, FENCE_CALL, FENCE_SQL, Token};

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
    let token = Token::new(sequencer)?;
    ::sqlx::query(FENCE_CALL)
        .bind(token.key())
        .bind(token.index())
        .bind(token.holder())
        .execute(&mut **tx)
        .await
        .map(drop)
        .map_err(|e| {
            let sqlstate = sqlstate(&e);
            let detail = e
                .as_database_error()
                .and_then(|db| db.try_downcast_ref::<::sqlx::postgres::PgDatabaseError>())
                .and_then(|pg| pg.detail().map(str::to_owned));
            Error::from_fence_call(token, sqlstate.as_deref(), detail.as_deref(), Box::new(e))
        })
}

fn sqlstate(error: &::sqlx::Error) -> Option<String> {
    error
        .as_database_error()
        .and_then(|db| db.code())
        .map(|code| code.into_owned())
}
