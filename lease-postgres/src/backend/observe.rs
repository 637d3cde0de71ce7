//! Who holds a leader key: its live row, read again at every notification of the key and when
//! the row expires.
//!
//! One task per observation follows the key and publishes the holder (its sequencer and value);
//! it stops when the last [`LeaderObserver`] clone is dropped. A read that fails ends the
//! observation ([`Error::ObserverClosed`](lease_core::Error::ObserverClosed) for its observers),
//! so a stale leader is never reported as current through an outage.

use std::sync::Arc;
use std::time::Duration;

use lease_core::leader::{Leader, LeaderObserver};
use lease_core::{BackendKind, Error, Sequencer};
use tokio::sync::watch;
use tokio::time::Instant;

use super::acquire::check_key;
use super::client::Shared;
use super::listen::Subscription;
use super::wire::{PgError, Wire};

/// Starts observing `key`; the first read happens here, so its errors are reported here.
pub(crate) async fn observe(shared: &Arc<Shared>, key: &str) -> Result<LeaderObserver, Error> {
    check_key(key)?;
    let notes = shared.subscribe(key);
    let (leader, expiry) = leader_of(&shared.wire, key).await.map_err(|e| {
        e.into_error(
            &shared.wire.address,
            format_args!("read the leader of {key:?}"),
        )
    })?;
    let (tx, rx) = watch::channel(leader);
    lease_core::runtime::spawn(follow(
        Arc::clone(shared),
        key.to_owned(),
        notes,
        expiry,
        tx,
    ));
    Ok(LeaderObserver::new(key, rx))
}

/// The time a row has left, as the database counted it in seconds: at most a day (read again
/// then), and none for what is not a number of seconds (NaN), which `Duration` cannot hold.
fn time_left(seconds: f64) -> Duration {
    Duration::try_from_secs_f64(seconds.clamp(0.0, 86_400.0)).unwrap_or_default()
}

/// The live leader row of `key`, and when it expires.
async fn leader_of(wire: &Wire, key: &str) -> Result<(Option<Leader>, Option<Instant>), PgError> {
    let sql = wire.sql(
        "SELECT holder, lease_index, value, extract(epoch FROM expires_at - clock_timestamp())::float8 \
         FROM lease.leases WHERE lease_key = $1 AND NOT semaphore AND expires_at > now() \
         ORDER BY lease_index DESC LIMIT 1",
    );
    let row = wire
        .request(false, |client| {
            let sql = &sql;
            async move { client.query_opt(sql, &[&key]).await }
        })
        .await?;
    let Some(row) = row else {
        return Ok((None, None));
    };
    let holder: String = row.try_get(0).map_err(PgError::Query)?;
    let index: i64 = row.try_get(1).map_err(PgError::Query)?;
    let value: Vec<u8> = row.try_get(2).map_err(PgError::Query)?;
    let left: f64 = row.try_get(3).map_err(PgError::Query)?;
    let expiry = Instant::now() + time_left(left);
    let index = u64::try_from(index).unwrap_or_default();
    let sequencer = Sequencer::new(BackendKind::Postgres, key, index, holder);
    Ok((Some(Leader::new(sequencer, value)), Some(expiry)))
}

async fn follow(
    shared: Arc<Shared>,
    key: String,
    mut notes: Subscription,
    mut expiry: Option<Instant>,
    tx: watch::Sender<Option<Leader>>,
) {
    loop {
        let expired = async {
            match expiry {
                // Renewed rows push this back: read again, no harm.
                Some(at) => tokio::time::sleep_until(at + Duration::from_millis(5)).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            () = tx.closed() => return,
            _ = notes.next() => {}
            () = expired => {}
        }
        match leader_of(&shared.wire, &key).await {
            Ok((leader, until)) => {
                expiry = until;
                tx.send_if_modified(|current| {
                    let changed = *current != leader;
                    *current = leader;
                    changed
                });
            }
            Err(error) => {
                tracing::debug!(%error, key = %key, "observing the leader failed; ending the observation");
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_float_the_database_answers_is_a_time_left() {
        assert_eq!(time_left(1.5), Duration::from_millis(1500));
        assert_eq!(time_left(-3.0), Duration::ZERO);
        assert_eq!(time_left(f64::INFINITY), Duration::from_secs(86_400));
        assert_eq!(time_left(f64::NAN), Duration::ZERO);
    }
}
