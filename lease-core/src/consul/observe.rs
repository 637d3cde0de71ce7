//! Who leads: followers (and nodes that never campaign) watch a leader key.
//!
//! One task per observation runs consistent blocking queries on the key and publishes the holder
//! and its advertised value; it stops when the last [`LeaderObserver`] clone is dropped.
//!
//! An observation that cannot confirm the key ends: the first failed read closes it, and its
//! observers get [`Error::ObserverClosed`] and observe again, so a stale leader is never
//! reported as current through an outage. Each blocking read waits at most [`CONFIRM_EVERY`],
//! so even a silent network (no error, no answer) ends the observation within one request
//! timeout.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::http::{Blocking, ConsulHttp, KvEntry};
use crate::leader::{Leader, LeaderObserver};
use crate::{BackendKind, Error, Sequencer};

/// How long one blocking read of an observed key waits. An observation is at most this (plus
/// the request timeout) old before a silent network ends it.
const CONFIRM_EVERY: Duration = Duration::from_secs(15);

/// Starts observing `key`; the first read happens before this returns, so errors (a bad token, an
/// unreachable agent) are reported here rather than swallowed by the task.
pub(crate) async fn observe(http: &Arc<ConsulHttp>, key: &str) -> Result<LeaderObserver, Error> {
    crate::spec::validate_key(key)?;
    let (entry, index) = http
        .kv_get(key, None)
        .await
        .map_err(|e| e.into_error(http, format_args!("read {key:?}")))?;
    let (tx, rx) = watch::channel(leader_of(key, entry.as_ref()));
    tokio::spawn(follow(Arc::clone(http), key.to_owned(), index, tx));
    Ok(LeaderObserver::new(key, rx))
}

fn leader_of(key: &str, entry: Option<&KvEntry>) -> Option<Leader> {
    let entry = entry?;
    let holder = entry.holder()?;
    Some(Leader::new(
        Sequencer::new(BackendKind::Consul, key, entry.lock_index, holder),
        entry.decoded_value().unwrap_or_default(),
    ))
}

async fn follow(
    http: Arc<ConsulHttp>,
    key: String,
    mut index: u64,
    tx: watch::Sender<Option<Leader>>,
) {
    loop {
        let blocking = Blocking {
            index,
            wait: CONFIRM_EVERY,
        };
        let answer = tokio::select! {
            () = tx.closed() => return,
            answer = http.kv_get(&key, Some(blocking)) => answer,
        };
        match answer {
            Ok((entry, new_index)) => {
                index = if new_index < index { 0 } else { new_index };
                let leader = leader_of(&key, entry.as_ref());
                tx.send_if_modified(|current| {
                    let changed = *current != leader;
                    *current = leader;
                    changed
                });
            }
            Err(error) => {
                // Returning drops the sender, which closes the observation: observers must not
                // keep acting on a leader this task can no longer confirm.
                tracing::debug!(%error, key = %key, "observing the leader failed; ending the observation");
                return;
            }
        }
    }
}
