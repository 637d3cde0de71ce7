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

use ::tokio_postgres::types::Type;
use ::tokio_postgres::{GenericClient, Transaction};
use lease_core::Sequencer;

use super::{Error, FENCE_CALL, FENCE_SQL, Token};

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
    let token = Token::new(sequencer)?;
    let index = token.index();
    tx.query_typed(
        FENCE_CALL,
        &[
            (&token.key(), Type::TEXT),
            (&index, Type::INT8),
            (&token.holder(), Type::TEXT),
        ],
    )
    .await
    .map(drop)
    .map_err(|e| {
        let db = e.as_db_error();
        let sqlstate = db.map(|db| db.code().code().to_owned());
        let detail = db.and_then(|db| db.detail().map(str::to_owned));
        Error::from_fence_call(token, sqlstate.as_deref(), detail.as_deref(), Box::new(e))
    })
}
