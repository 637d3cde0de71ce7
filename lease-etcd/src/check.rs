//! Whether a sequencer still names a holder, of an election or of a semaphore: one linearizable
//! read of both, as [`Etcd::check_sequencer`](crate::Etcd::check_sequencer) documents.

use super::client::EtcdClient;
use super::leader::Leader;
use super::queue::Recipe;
use super::semaphore::SemaphoreValue;
use super::slot::{holder_in, lease_of};
use super::wire::proto::{KeyValue, RangeRequest, RequestOp, TxnRequest};
use lease_core::{Error, LostReason, Sequencer};

/// Whether `sequencer` (of this backend) still names a holder: one linearizable transaction reads
/// the own key of a leader or a semaphore holder, and the keys ahead of it.
pub(crate) async fn check_sequencer(http: &EtcdClient, sequencer: &Sequencer) -> Result<(), Error> {
    let Some(lease) = lease_of(sequencer.holder()) else {
        return Err(Error::Lost(LostReason::KeyDeleted));
    };
    let index = i64::try_from(sequencer.index()).unwrap_or(i64::MAX);
    let key = sequencer.key();
    // A leader's sequencer names the election; a semaphore holder's, its own key.
    let leader_own = format!("{key}/{}", sequencer.holder());
    let mut ops = vec![
        RequestOp::range(RangeRequest::key(&leader_own)),
        RequestOp::range(Leader.ahead(key, index)),
        RequestOp::range(RangeRequest::key(key)),
    ];
    let prefix = key.rsplit_once('/').map(|(prefix, _)| prefix);
    if let Some(prefix) = prefix {
        ops.push(RequestOp::range(
            RangeRequest::under(prefix)
                .keys_only()
                .created_by(index - 1),
        ));
    }
    let read = http
        .wire()
        .txn(&TxnRequest {
            success: ops,
            ..TxnRequest::default()
        })
        .await
        .map_err(|e| e.into_error(http.wire(), format_args!("check {sequencer}")))?;
    let lost = |reason| Err(Error::Lost(reason));
    let taken = |kv: &KeyValue| {
        lost(LostReason::KeyTaken {
            lock_index: u64::try_from(kv.create_revision).unwrap_or_default(),
            session: holder_in(key, &kv.key_str(), kv.lease),
        })
    };
    if let Some(own) = read.range(0).kvs.first() {
        if own.create_revision != index || own.lease != lease {
            return taken(own);
        }
        return match read.range(1).kvs.first() {
            Some(older) => taken(older),
            None => Ok(()),
        };
    }
    match (read.range(2).kvs.first(), prefix) {
        (Some(own), Some(prefix)) if own.lease == lease && own.create_revision == index => {
            let limit = SemaphoreValue::limit_of(prefix, own)?;
            let older = read.range(3).kvs.len();
            if older >= usize::try_from(limit).unwrap_or(usize::MAX) {
                // Still waiting behind `limit` older contenders: not a holder.
                return lost(LostReason::HolderPruned);
            }
            Ok(())
        }
        (Some(other), _) => taken(other),
        (None, _) => lost(LostReason::KeyDeleted),
    }
}
