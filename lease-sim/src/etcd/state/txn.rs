//! `KV/Txn`: etcd's validation of a transaction (`checkTxnRequest`, `checkIntervals`), its
//! compares, and its apply, with etcd's revision rule (a transaction that changes nothing keeps
//! the revision).

use tokio::time::Instant;
use tonic::Status;

use lease_etcd::proto::{
    Compare, CompareTarget, DeleteRangeRequest, KeyValue, Request, RequestOp, Response,
    ResponseHeader, ResponseOp, TxnRequest, TxnResponse,
};

use super::State;
use crate::etcd::error;
use crate::etcd::mvcc::Span;

/// etcd's default `--max-txn-ops`.
const MAX_TXN_OPS: usize = 128;

/// `Compare.CompareResult` and `Compare.CompareTarget`.
const EQUAL: i32 = 0;
const GREATER: i32 = 1;
const LESS: i32 = 2;
const NOT_EQUAL: i32 = 3;
const COMPARE_VERSION: i32 = 0;
const COMPARE_CREATE: i32 = 1;
const COMPARE_MOD: i32 = 2;
const COMPARE_VALUE: i32 = 3;
const COMPARE_LEASE: i32 = 4;

impl State {
    /// `KV/Txn`.
    pub(crate) fn txn(
        &mut self,
        request: &TxnRequest,
        token: Option<&str>,
        now: Instant,
    ) -> Result<TxnResponse, Status> {
        check_txn(request)?;
        check_intervals(&request.success)?;
        check_intervals(&request.failure)?;
        self.access(token, now)?.key_ops()?;
        let succeeded = request.compare.iter().all(|c| self.compare(c));
        let ops = if succeeded {
            &request.success
        } else {
            &request.failure
        };
        let writes = request
            .success
            .iter()
            .chain(&request.failure)
            .any(|op| matches!(op.request, Some(Request::Put(_) | Request::DeleteRange(_))));
        let rev = self.store.rev();
        if writes {
            for op in ops {
                let Some(Request::Put(put)) = &op.request else {
                    continue;
                };
                if (put.ignore_value || put.ignore_lease)
                    && self.store.kv_at(&put.key, rev).is_none()
                {
                    return Err(error::key_not_found());
                }
                if put.lease != 0 && self.lessor.get(put.lease).is_none() {
                    return Err(error::lease_not_found());
                }
            }
        }
        for op in ops {
            let Some(Request::Range(range)) = &op.request else {
                continue;
            };
            if range.revision != 0 {
                if range.revision > rev {
                    return Err(error::future_rev());
                }
                if range.revision < self.store.compacted() {
                    return Err(error::compacted());
                }
            }
        }
        let mut write = self.store.begin();
        let mut responses = Vec::with_capacity(ops.len());
        for op in ops {
            let response = match &op.request {
                Some(Request::Range(range)) => {
                    let current = self.store.read_rev(&write);
                    // Checked above: the read cannot fail (etcd panics if it does).
                    self.read(range, current).ok().map(Response::Range)
                }
                Some(Request::Put(put)) => {
                    let current = self.store.read_rev(&write);
                    let previous = self
                        .store
                        .kv_at(&put.key, current)
                        .cloned()
                        .unwrap_or_default();
                    let value = if put.ignore_value {
                        previous.value
                    } else {
                        put.value.clone()
                    };
                    let lease = if put.ignore_lease {
                        previous.lease
                    } else {
                        put.lease
                    };
                    self.store.put(&mut write, &put.key, value, lease);
                    None
                }
                Some(Request::DeleteRange(delete)) => {
                    self.store
                        .delete(&mut write, &Span::of(&delete.key, &delete.range_end));
                    None
                }
                None => None,
            };
            responses.push(ResponseOp { response });
        }
        let revision = self.commit(write);
        Ok(TxnResponse {
            header: Some(ResponseHeader { revision }),
            succeeded,
            responses,
        })
    }

    /// One compare of a transaction, on the key alone (lease-etcd compares no ranges): etcd's
    /// `applyCompare`. A target whose value the message does not carry compares with zero (or
    /// the empty value), as etcd does with a missing `target_union`.
    fn compare(&self, compare: &Compare) -> bool {
        let kv = self.store.kv_at(&compare.key, self.store.rev());
        if kv.is_none() && compare.target == COMPARE_VALUE {
            return false;
        }
        let absent = KeyValue::default();
        let kv = kv.unwrap_or(&absent);
        let wanted = |target| match (&compare.target_union, target) {
            (Some(CompareTarget::Version(v)), COMPARE_VERSION)
            | (Some(CompareTarget::CreateRevision(v)), COMPARE_CREATE) => *v,
            _ => 0,
        };
        let ordering = match compare.target {
            COMPARE_VERSION => kv.version.cmp(&wanted(COMPARE_VERSION)),
            COMPARE_CREATE => kv.create_revision.cmp(&wanted(COMPARE_CREATE)),
            COMPARE_MOD => kv.mod_revision.cmp(&0),
            COMPARE_VALUE => kv.value.as_slice().cmp(&[][..]),
            COMPARE_LEASE => kv.lease.cmp(&0),
            _ => std::cmp::Ordering::Equal,
        };
        match compare.result {
            EQUAL => ordering.is_eq(),
            NOT_EQUAL => ordering.is_ne(),
            GREATER => ordering.is_gt(),
            LESS => ordering.is_lt(),
            _ => true,
        }
    }
}

/// `checkTxnRequest`: the size and each operation's own validity.
fn check_txn(request: &TxnRequest) -> Result<(), Status> {
    let ops = request
        .compare
        .len()
        .max(request.success.len())
        .max(request.failure.len());
    if ops > MAX_TXN_OPS {
        return Err(error::too_many_ops());
    }
    if request.compare.iter().any(|c| c.key.is_empty()) {
        return Err(error::empty_key());
    }
    for op in request.success.iter().chain(&request.failure) {
        check_op(op)?;
    }
    Ok(())
}

/// `checkRequestOp`.
fn check_op(op: &RequestOp) -> Result<(), Status> {
    match &op.request {
        Some(Request::Range(range)) if range.key.is_empty() => Err(error::empty_key()),
        Some(Request::Put(put)) if put.key.is_empty() => Err(error::empty_key()),
        Some(Request::Put(put)) if put.ignore_value && !put.value.is_empty() => {
            Err(error::value_provided())
        }
        Some(Request::Put(put)) if put.ignore_lease && put.lease != 0 => {
            Err(error::lease_provided())
        }
        Some(Request::DeleteRange(delete)) if delete.key.is_empty() => Err(error::empty_key()),
        Some(_) => Ok(()),
        // An empty operation.
        None => Err(error::key_not_found()),
    }
}

/// `checkIntervals` of one branch: no key put twice, nor put and deleted.
fn check_intervals(ops: &[RequestOp]) -> Result<(), Status> {
    let deletes: Vec<&DeleteRangeRequest> = ops
        .iter()
        .filter_map(|op| match &op.request {
            Some(Request::DeleteRange(delete)) => Some(delete),
            _ => None,
        })
        .collect();
    let deleted = |key: &[u8]| {
        deletes.iter().any(|d| {
            if d.range_end.is_empty() {
                d.key.as_slice() == key
            } else {
                d.key.as_slice() <= key && key < d.range_end.as_slice()
            }
        })
    };
    let mut puts: Vec<&[u8]> = Vec::new();
    for op in ops {
        let Some(Request::Put(put)) = &op.request else {
            continue;
        };
        if puts.contains(&put.key.as_slice()) || deleted(&put.key) {
            return Err(error::duplicate_key());
        }
        puts.push(&put.key);
    }
    Ok(())
}
