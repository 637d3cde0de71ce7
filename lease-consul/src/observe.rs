//! Who leads: followers (and nodes that never campaign) watch a leader key.
//!
//! One task per observation follows the key through the client's shared prefix watches
//! (`watch`) and publishes the holder and its advertised value; it stops when the last
//! [`LeaderObserver`] clone is dropped.
//!
//! An observation that cannot confirm the key ends: the first failed read of its watch closes
//! it, and its observers get [`Error::ObserverClosed`] and observe again, so a stale leader is
//! never reported as current through an outage. (The watch's blocking reads wait at most five
//! minutes, and a silent network ends them within that plus a request timeout.)

use tokio::sync::watch;

use super::client::Client;
use super::watch::{Interest, Watched};
use super::wire::KvEntry;
use lease_core::leader::{Leader, LeaderObserver};
use lease_core::{BackendKind, Error, Sequencer};

/// Starts observing `key`; the first read happens before this returns, so errors (a bad token, an
/// unreachable agent) are reported here rather than swallowed by the task.
pub(crate) async fn observe(client: &Client, key: &str) -> Result<LeaderObserver, Error> {
    let http = client.wire();
    lease_core::validate_key(key)?;
    let watched = client
        .watches()
        .watch(Interest::Key(key.to_owned()), true, None);
    let (entry, index) = http
        .kv_get(key)
        .await
        .map_err(|e| e.into_error(http, format_args!("read {key:?}")))?;
    let (tx, rx) = watch::channel(leader_of(key, entry.as_ref()));
    lease_core::runtime::spawn(follow(watched, key.to_owned(), index, tx));
    Ok(LeaderObserver::new(key, rx))
}

fn leader_of(key: &str, entry: Option<&KvEntry>) -> Option<Leader> {
    let entry = entry?;
    let holder = entry.holder()?;
    Some(Leader::new(
        Sequencer::new(BackendKind::Consul, key, entry.lock_index, holder)
            .with_generation(entry.create_index),
        entry.decoded_value().unwrap_or_default(),
    ))
}

async fn follow(mut watched: Watched, key: String, index: u64, tx: watch::Sender<Option<Leader>>) {
    loop {
        let view = tokio::select! {
            biased;
            () = tx.closed() => return,
            view = watched.next(index) => view,
        };
        match view {
            Ok(listing) => {
                let leader = leader_of(&key, listing.get(&key));
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
