//! Batched release: every release of a handle that is pending at one moment goes in one
//! statement, `lease.release_many(holders)`, and so in one commit.
//!
//! A commit waits for its WAL flush, which bounds a connection to a few hundred commits a second
//! on an ordinary disk: a process giving back 1,000 leases at once (`Backend::shutdown`) would
//! take seconds, one release after another. One task per handle takes whatever releases are
//! queued when it wakes, sends them together, and answers each. A single release is
//! `lease.release(key, holder)`, which deletes the row and announces it as a release (op `r`),
//! so it bars nothing.

use std::sync::{Arc, Weak};

use lease_core::Error;
use lease_core::backend::RELEASE_BOUND;
use tokio::time::Instant;

use super::batch::{Batched, Drain};
use super::wire::{PgError, Wire};

/// The most holders one statement gives back.
const BATCH: usize = 5_000;

/// The pending releases of one backend handle: holders, answered with how their batch went.
pub(crate) type Releaser = Batched<String, Result<(), PgError>>;

/// Gives `holder`'s row of `key` back (announced as a release), with the releases queued beside
/// it; retried through brief trouble within [`RELEASE_BOUND`]. The task that sends them is
/// handed the wire, weakly.
pub(crate) async fn release(
    releaser: &Releaser,
    wire: &Arc<Wire>,
    key: &str,
    holder: &str,
) -> Result<(), Error> {
    let answer = releaser.push(holder.to_owned(), |drain| {
        release_all(drain, Arc::downgrade(wire))
    });
    answer
        .await
        .unwrap_or_else(|_| Err(PgError::Malformed("the backend handle is gone".into())))
        .map_err(|e| e.into_error(&wire.address, format_args!("release {key:?}")))?;
    tracing::debug!(key, holder, "lease row released");
    Ok(())
}

async fn release_all(drain: Drain<String, Result<(), PgError>>, wire: Weak<Wire>) {
    while let Some(batch) = drain.next(BATCH).await {
        let Some(strong) = wire.upgrade() else {
            return;
        };
        let holders: Vec<&str> = batch.iter().map(|(h, _)| h.as_str()).collect();
        let sql = strong.sql("SELECT lease.release_many($1)");
        let answer = strong
            .retrying(Some(Instant::now() + RELEASE_BOUND), true, |client| {
                let (sql, holders) = (&sql, &holders);
                async move { client.query(sql, &[holders]).await }
            })
            .await
            .map(|_| ())
            .map_err(Arc::new);
        for (_, reply) in batch {
            let _ = reply.send(answer.clone().map_err(PgError::Batch));
        }
    }
}
