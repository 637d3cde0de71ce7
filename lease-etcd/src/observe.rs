//! Who leads an election: a watch on `<key>/`, the oldest key being the leader.
//!
//! One task per observation follows the prefix and publishes the oldest key's holder (its key's
//! part after `<key>/` if that names its lease, else its lease in hex; its create revision) and
//! value; it stops when the last [`LeaderObserver`] clone is dropped. A
//! watch that breaks ends the observation ([`Error::ObserverClosed`] for its observers), so a
//! stale leader is never reported as current through an outage. Leaders elected with
//! `etcdctl elect` are seen the same way.

use std::sync::Arc;

use tokio::sync::watch;

use super::client::EtcdClient;
use super::slot::holder_in;
use super::wire::proto::RangeRequest;
use super::wire::{ApiError, Wire};
use lease_core::leader::{Leader, LeaderObserver};
use lease_core::{BackendKind, Error, Sequencer};

/// Starts observing `key`; the first read happens before this returns, so errors (bad
/// credentials, an unreachable cluster) are reported here rather than swallowed by the task.
pub(crate) async fn observe(http: &Arc<EtcdClient>, key: &str) -> Result<LeaderObserver, Error> {
    lease_core::validate_key(key)?;
    let (leader, revision) = leader_of(http.wire(), key)
        .await
        .map_err(|e| e.into_error(http.wire(), format_args!("read the election {key:?}")))?;
    let (tx, rx) = watch::channel(leader);
    lease_core::runtime::spawn(follow(Arc::clone(http), key.to_owned(), revision, tx));
    Ok(LeaderObserver::new(key, rx))
}

/// The leader of the election `key` (its oldest key) and the revision it was read at.
async fn leader_of(http: &Wire, key: &str) -> Result<(Option<Leader>, i64), ApiError> {
    let read = http
        .range(&RangeRequest::under(key).by_creation(true).limit(1))
        .await?;
    let leader = read.kvs.first().map(|kv| {
        let index = u64::try_from(kv.create_revision).unwrap_or_default();
        Leader::new(
            Sequencer::new(
                BackendKind::Etcd,
                key,
                index,
                holder_in(key, &kv.key_str(), kv.lease),
            ),
            kv.value.clone(),
        )
    });
    Ok((leader, read.revision()))
}

async fn follow(
    http: Arc<EtcdClient>,
    key: String,
    revision: i64,
    tx: watch::Sender<Option<Leader>>,
) {
    let range = RangeRequest::under(&key);
    let watched = tokio::select! {
        biased;
        () = tx.closed() => return,
        watched = http.watch(&range, revision + 1) => watched,
    };
    let Ok(mut stream) = watched else {
        return;
    };
    loop {
        let changed = tokio::select! {
            biased;
            () = tx.closed() => return,
            changed = stream.next() => changed,
        };
        // Any change under the prefix may change who is oldest: read it again.
        let leader = match changed {
            Ok(_) => leader_of(http.wire(), &key).await.map(|(leader, _)| leader),
            Err(error) => Err(error),
        };
        match leader {
            Ok(leader) => {
                tx.send_if_modified(|current| {
                    let changed = *current != leader;
                    *current = leader;
                    changed
                });
            }
            Err(error) => {
                // Dropping the sender closes the observation.
                tracing::debug!(%error, key = %key, "observing the election failed; ending the observation");
                return;
            }
        }
    }
}
