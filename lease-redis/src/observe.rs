//! Who holds a leader key: its holder key, read again at every invalidation of it (client-side
//! tracking follows it, as it does the holders'), when the command connection is back, and when
//! the key expires.
//!
//! One task per observation follows the key and publishes the holder (its sequencer and value);
//! it stops when the last [`LeaderObserver`] clone is dropped. A read that fails ends the
//! observation ([`Error::ObserverClosed`](lease_core::Error::ObserverClosed) for its observers),
//! so a stale leader is never reported as current through an outage.

use std::sync::Arc;
use std::time::Duration;

use lease_core::leader::{Leader, LeaderObserver};
use lease_core::{BackendKind, Error, Sequencer};
use redis::Value;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::client::Shared;
use crate::wire::{Interested, LEADER, Note, RedisFailure, Wire, check_name, spawn};

/// Starts observing `key`; the first read happens here, so its errors are reported here.
pub(crate) async fn observe(shared: &Arc<Shared>, key: &str) -> Result<LeaderObserver, Error> {
    check_name(key)?;
    let wire = &shared.wire;
    let base = wire.keys(key).base;
    let notes = wire.track(&base);
    let (leader, expiry) = leader_of(wire, key, &base)
        .await
        .map_err(|e| e.into_error(&wire.address, format_args!("read the leader of {key:?}")))?;
    let (tx, rx) = watch::channel(leader);
    spawn(follow(
        Arc::clone(shared),
        key.to_owned(),
        base,
        notes,
        expiry,
        tx,
    ));
    Ok(LeaderObserver::new(key, rx))
}

fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

/// The leader of `key`, and when its key expires.
async fn leader_of(
    wire: &Wire,
    key: &str,
    base: &str,
) -> Result<(Option<Leader>, Option<Instant>), RedisFailure> {
    let (value, _, _) = wire.script(&LEADER, &[base], &[], false).await?;
    let Value::Array(parts) = &value else {
        return Err(RedisFailure::Malformed(format!(
            "the leader script answered {value:?}"
        )));
    };
    if parts.is_empty() {
        return Ok((None, None));
    }
    let holder = parts.first().and_then(text).unwrap_or_default();
    let token = parts
        .get(1)
        .and_then(text)
        .and_then(|t| t.parse::<u64>().ok())
        .unwrap_or_default();
    let value = match parts.get(2) {
        Some(Value::BulkString(bytes)) => bytes.clone(),
        _ => Vec::new(),
    };
    let expiry = match parts.get(3) {
        Some(Value::Int(ms)) if *ms > 0 => {
            let ms = u64::try_from(*ms).unwrap_or_default().min(86_400_000);
            Some(Instant::now() + Duration::from_millis(ms))
        }
        _ => None,
    };
    let sequencer = Sequencer::new(BackendKind::Redis, key, token, holder);
    Ok((Some(Leader::new(sequencer, value)), expiry))
}

async fn follow(
    shared: Arc<Shared>,
    key: String,
    base: String,
    mut notes: Interested,
    mut expiry: Option<Instant>,
    tx: watch::Sender<Option<Leader>>,
) {
    loop {
        let expired = async {
            match expiry {
                // Renewals push this back: read again, no harm.
                Some(at) => tokio::time::sleep_until(at + Duration::from_millis(5)).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            () = tx.closed() => return,
            note = notes.next() => if let Note::Blind(_) = note { continue },
            () = expired => {}
        }
        match leader_of(&shared.wire, &key, &base).await {
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
