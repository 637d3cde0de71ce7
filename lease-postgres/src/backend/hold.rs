//! Holding a row: the [`Hold`] lease-core's holder task drives for each lease. It watches for
//! the row's loss (a renewal that finds it gone, the key's notification of its removal, one
//! read after the listener missed notifications), releases it, or keeps it until its
//! `min_hold` ends; and when the runtime that holds it ends, a [`Detached`] copy of what the
//! wire connects with gives the row back on a connection of its own, from lease-core's
//! detached runtime (`postgres_lease::a_runtime_that_ends_holding_a_lease_gives_it_back`); a
//! handle used on a new runtime starts its tasks and connections again.
//!
//! PostgreSQL has no session an operator destroys: a connection ended by `pg_terminate_backend`
//! or a network fault is replaced, and the leases live on if a renewal gets through before their
//! fences run out (`postgres_lease::terminated_connections_are_replaced_and_the_lease_lives_on`).

use std::sync::Arc;
use std::time::Duration;

use lease_core::backend::{Hold, RELEASE_BOUND};
use lease_core::{BoxFuture, Error, LostReason};
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::client::Shared;
use super::listen::{Note, Removal, Subscription};
use super::wire::{Connector, PgError, Wire, in_schema};

/// The [`Hold`] of one row.
pub(crate) struct RowHold {
    pub(crate) shared: Arc<Shared>,
    pub(crate) key: String,
    pub(crate) holder: String,
    /// Completes when a renewal finds the row gone.
    pub(crate) lost: oneshot::Receiver<LostReason>,
    pub(crate) notes: Subscription,
    /// Set by [`Hold::keep_until`]: a release before it leaves the row to expire then.
    pub(crate) keep_until: Option<Instant>,
}

impl RowHold {
    /// How long the row must still be kept, if a release now must keep it.
    fn to_keep(&self) -> Option<Duration> {
        self.keep_until
            .map(|until| until.saturating_duration_since(Instant::now()))
            .filter(|left| !left.is_zero())
    }
}

impl Hold for RowHold {
    async fn watch(&mut self) -> LostReason {
        loop {
            tokio::select! {
                biased;
                reason = &mut self.lost => {
                    return reason.unwrap_or(LostReason::KeyDeleted);
                }
                note = self.notes.next() => match note {
                    Note::Removed { holder, how } if holder == self.holder => {
                        return match how {
                            Removal::Released => LostReason::KeyReleased,
                            Removal::Expired => LostReason::SessionInvalidated,
                            Removal::Deleted => LostReason::KeyDeleted,
                        };
                    }
                    Note::Resync => {
                        let exists = row_exists(&self.shared.wire, &self.key, &self.holder).await;
                        if let Ok(false) = exists {
                            return LostReason::KeyDeleted;
                        }
                    }
                    _ => {}
                },
            }
        }
    }

    fn keep_until(&mut self, until: Instant) -> bool {
        self.keep_until = Some(until);
        true
    }

    async fn release(&mut self) -> Result<(), Error> {
        self.shared.stop_renewing(&self.holder);
        if let Some(left) = self.to_keep() {
            return keep_row(&self.shared.wire, &self.key, &self.holder, left).await;
        }
        self.shared.release(&self.key, &self.holder).await
    }

    async fn clean_up(&mut self, _reason: &LostReason) {
        // The row is gone, or (self-fenced) it is left to expire: giving it back now would hand
        // the lease on before the database's own deadline, while this holder may be stopping.
        self.shared.stop_renewing(&self.holder);
    }

    fn abandon(self) -> Option<BoxFuture<'static, ()>> {
        self.shared.stop_renewing(&self.holder);
        let detached = Detached::of(&self.shared.wire);
        Some(match self.to_keep() {
            Some(left) => detached.keep(self.key, self.holder, left),
            None => detached.release(self.key, self.holder),
        })
    }
}

/// Sets the expiry of `holder`'s row of `key` to `left` from now, by the database's clock,
/// instead of deleting it: the row then expires as an unrenewed one does, and the next
/// contender takes the key then. Its TTL becomes `left` too, so a renewal that was already on
/// its way keeps the same end.
const KEEP_SQL: &str = "UPDATE lease.leases SET ttl = make_interval(secs => $3), \
                        expires_at = now() + make_interval(secs => $3) \
                        WHERE lease_key = $1 AND holder = $2 AND expires_at > now()";

/// Leaves `holder`'s row of `key` held for `left` more ([`Hold::keep_until`]).
async fn keep_row(wire: &Wire, key: &str, holder: &str, left: Duration) -> Result<(), Error> {
    let sql = wire.sql(KEEP_SQL);
    let seconds = left.as_secs_f64();
    wire.retrying(Some(Instant::now() + RELEASE_BOUND), true, |client| {
        let sql = &sql;
        async move { client.execute(sql, &[&key, &holder, &seconds]).await }
    })
    .await
    .map_err(|e| e.into_error(&wire.address, format_args!("keep {key:?} for its min_hold")))?;
    tracing::debug!(
        key,
        holder,
        ?left,
        "lease row left to expire at the end of its min_hold"
    );
    Ok(())
}

/// Whether `holder`'s row of `key` is there and live.
async fn row_exists(wire: &Wire, key: &str, holder: &str) -> Result<bool, PgError> {
    let sql = wire.sql(
        "SELECT 1 FROM lease.leases WHERE lease_key = $1 AND holder = $2 AND expires_at > now()",
    );
    wire.request(false, |client| async move {
        client.query_opt(&sql, &[&key, &holder]).await
    })
    .await
    .map(|row| row.is_some())
}

const RELEASE_SQL: &str = "SELECT lease.release($1, $2)";

/// What a release needs without the handle's connections: for a runtime that is ending (they
/// belong to it).
pub(crate) struct Detached {
    config: tokio_postgres::Config,
    session_sql: Option<String>,
    tls: Connector,
    schema: String,
}

impl Detached {
    pub(crate) fn of(wire: &Wire) -> Detached {
        Detached {
            config: wire.config.clone(),
            session_sql: wire.session_sql.clone(),
            tls: wire.tls.clone(),
            schema: wire.schema.clone(),
        }
    }

    /// A connection of its own, or `None` if the server cannot be reached (the row then
    /// expires with its TTL).
    async fn connect(&self) -> Option<tokio_postgres::Client> {
        Wire::connect(&self.config, self.session_sql.as_deref(), &self.tls)
            .await
            .ok()
    }

    /// [`keep_row`] on a connection of its own.
    fn keep(self, key: String, holder: String, left: Duration) -> BoxFuture<'static, ()> {
        let end = Instant::now() + left;
        Box::pin(async move {
            let Some(client) = self.connect().await else {
                return;
            };
            let sql = in_schema(KEEP_SQL, &self.schema);
            let seconds = end.saturating_duration_since(Instant::now()).as_secs_f64();
            let _ = client.execute(&sql, &[&key, &holder, &seconds]).await;
        })
    }

    /// A release on a connection of its own.
    pub(crate) fn release(self, key: String, holder: String) -> BoxFuture<'static, ()> {
        Box::pin(async move {
            let Some(client) = self.connect().await else {
                return;
            };
            let sql = in_schema(RELEASE_SQL, &self.schema);
            let _ = client.query_one(&sql, &[&key, &holder]).await;
        })
    }
}
