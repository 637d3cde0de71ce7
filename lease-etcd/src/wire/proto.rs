//! etcd's v3 gRPC messages, written by hand as prost structs for the calls this crate makes, so a
//! build needs no protobuf compiler and no build script.
//!
//! Field numbers and types are those of etcd's `etcdserverpb/rpc.proto` and `mvccpb/kv.proto`
//! (etcd 3.4 and later); a message carries only the fields this crate reads or writes, which
//! protobuf allows (unknown fields are skipped when read, absent ones are zero). Beside each
//! message are the constructors the queue and the sessions use.
//!
//! Public, but hidden from the docs (`lease_etcd::proto`), for lease-sim alone: its model of etcd
//! serves the client with these very messages, and its differential test sends them to a real
//! etcd, so the model sees exactly the fields this crate sends and answers exactly the fields it
//! reads. Not part of this crate's API: it changes whenever the calls do. The fields are etcd's
//! and documented in `rpc.proto`; only what this crate makes of them is documented here.

#![allow(clippy::doc_markdown, missing_docs)]

/// The path of each method this crate calls, as gRPC names it.
pub mod path {
    pub const RANGE: &str = "/etcdserverpb.KV/Range";
    pub const DELETE_RANGE: &str = "/etcdserverpb.KV/DeleteRange";
    pub const TXN: &str = "/etcdserverpb.KV/Txn";
    pub const WATCH: &str = "/etcdserverpb.Watch/Watch";
    pub const LEASE_GRANT: &str = "/etcdserverpb.Lease/LeaseGrant";
    pub const LEASE_REVOKE: &str = "/etcdserverpb.Lease/LeaseRevoke";
    pub const LEASE_KEEP_ALIVE: &str = "/etcdserverpb.Lease/LeaseKeepAlive";
    pub const LEASE_TIME_TO_LIVE: &str = "/etcdserverpb.Lease/LeaseTimeToLive";
    pub const AUTHENTICATE: &str = "/etcdserverpb.Auth/Authenticate";
}

/// The header of every answer: the store's revision when it was served.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ResponseHeader {
    #[prost(int64, tag = "3")]
    pub revision: i64,
}

/// One key and its metadata (`mvccpb.KeyValue`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct KeyValue {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    #[prost(int64, tag = "2")]
    pub create_revision: i64,
    #[prost(int64, tag = "3")]
    pub mod_revision: i64,
    /// How many times the key was written since it was created (1 for a key written once).
    #[prost(int64, tag = "4")]
    pub version: i64,
    #[prost(bytes = "vec", tag = "5")]
    pub value: Vec<u8>,
    /// The etcd lease the key is attached to; 0 for none.
    #[prost(int64, tag = "6")]
    pub lease: i64,
}

impl KeyValue {
    /// The key as text (keys this crate writes are UTF-8; others are read lossily).
    pub fn key_str(&self) -> String {
        String::from_utf8_lossy(&self.key).into_owned()
    }
}

/// `RangeRequest.SortOrder`.
const ASCEND: i32 = 1;
const DESCEND: i32 = 2;
/// `RangeRequest.SortTarget.CREATE`.
const BY_CREATE: i32 = 2;

#[derive(Clone, PartialEq, prost::Message)]
pub struct RangeRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub range_end: Vec<u8>,
    #[prost(int64, tag = "3")]
    pub limit: i64,
    /// Read the keys as they were at this revision (0: now).
    #[prost(int64, tag = "4")]
    pub revision: i64,
    #[prost(int32, tag = "5")]
    pub sort_order: i32,
    #[prost(int32, tag = "6")]
    pub sort_target: i32,
    #[prost(bool, tag = "8")]
    pub keys_only: bool,
    #[prost(int64, tag = "13")]
    pub max_create_revision: i64,
}

impl RangeRequest {
    /// One key.
    pub fn key(key: &str) -> Self {
        RangeRequest {
            key: key.as_bytes().to_vec(),
            ..RangeRequest::default()
        }
    }

    /// The cheapest linearizable read, for a probe: at most one key's name, of a key nobody
    /// writes.
    pub fn probe() -> Self {
        RangeRequest {
            key: b"\0lease-probe".to_vec(),
            limit: 1,
            keys_only: true,
            ..RangeRequest::default()
        }
    }

    /// Every key under `dir/` (the keys of an election or a semaphore).
    pub fn under(dir: &str) -> Self {
        let (key, range_end) = dir_range(dir);
        RangeRequest {
            key,
            range_end,
            ..RangeRequest::default()
        }
    }

    /// Ordered by create revision, oldest first (`true`) or newest first.
    pub fn by_creation(mut self, oldest_first: bool) -> Self {
        self.sort_target = BY_CREATE;
        self.sort_order = if oldest_first { ASCEND } else { DESCEND };
        self
    }

    pub fn limit(mut self, limit: i64) -> Self {
        self.limit = limit;
        self
    }

    pub fn keys_only(mut self) -> Self {
        self.keys_only = true;
        self
    }

    /// Only keys created at or before `revision`.
    pub fn created_by(mut self, revision: i64) -> Self {
        self.max_create_revision = revision;
        self
    }

    /// The keys as they were at `revision` (etcd keeps history until it is compacted).
    pub fn at_revision(mut self, revision: i64) -> Self {
        self.revision = revision;
        self
    }
}

/// The start and end of the keys under `dir/`: `dir/` up to `dir0` (`'0'` follows `'/'`).
pub fn dir_range(dir: &str) -> (Vec<u8>, Vec<u8>) {
    (
        format!("{dir}/").into_bytes(),
        format!("{dir}0").into_bytes(),
    )
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RangeResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    #[prost(message, repeated, tag = "2")]
    pub kvs: Vec<KeyValue>,
}

impl RangeResponse {
    pub fn revision(&self) -> i64 {
        self.header.as_ref().map_or(0, |h| h.revision)
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PutRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub value: Vec<u8>,
    #[prost(int64, tag = "3")]
    pub lease: i64,
    /// Keep the value the key has.
    #[prost(bool, tag = "5")]
    pub ignore_value: bool,
    /// Keep the lease the key is attached to.
    #[prost(bool, tag = "6")]
    pub ignore_lease: bool,
}

impl PutRequest {
    /// A write that changes nothing but the key's version and mod revision.
    pub fn touch(key: &str) -> Self {
        PutRequest {
            key: key.as_bytes().to_vec(),
            ignore_value: true,
            ignore_lease: true,
            ..PutRequest::default()
        }
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct DeleteRangeRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub range_end: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct DeleteRangeResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    #[prost(int64, tag = "2")]
    pub deleted: i64,
}

/// `Compare.CompareResult.EQUAL`/`GREATER` and `Compare.CompareTarget.VERSION`/`CREATE`.
const EQUAL: i32 = 0;
const GREATER: i32 = 1;
const TARGET_VERSION: i32 = 0;
const TARGET_CREATE: i32 = 1;

/// A compare of a transaction on a key's create revision or version.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Compare {
    #[prost(int32, tag = "1")]
    pub result: i32,
    #[prost(int32, tag = "2")]
    pub target: i32,
    #[prost(bytes = "vec", tag = "3")]
    pub key: Vec<u8>,
    /// The `target_union` member for the target: written even when 0 (a oneof member is).
    #[prost(oneof = "CompareTarget", tags = "4, 5")]
    pub target_union: Option<CompareTarget>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
pub enum CompareTarget {
    #[prost(int64, tag = "4")]
    Version(i64),
    #[prost(int64, tag = "5")]
    CreateRevision(i64),
}

impl Compare {
    /// `key` not yet created (create revision 0).
    pub fn absent(key: &str) -> Self {
        Compare::created(key, 0)
    }

    /// `key` created at `revision`: the same key, not one deleted and written again since.
    pub fn created(key: &str, revision: i64) -> Self {
        Compare {
            result: EQUAL,
            target: TARGET_CREATE,
            key: key.as_bytes().to_vec(),
            target_union: Some(CompareTarget::CreateRevision(revision)),
        }
    }

    /// `key` written more than once: a holder's key touched for its release.
    pub fn touched(key: &str) -> Self {
        Compare {
            result: GREATER,
            target: TARGET_VERSION,
            key: key.as_bytes().to_vec(),
            target_union: Some(CompareTarget::Version(1)),
        }
    }
}

/// One operation of a transaction.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RequestOp {
    #[prost(oneof = "Request", tags = "1, 2, 3")]
    pub request: Option<Request>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Request {
    #[prost(message, tag = "1")]
    Range(RangeRequest),
    #[prost(message, tag = "2")]
    Put(PutRequest),
    #[prost(message, tag = "3")]
    DeleteRange(DeleteRangeRequest),
}

impl RequestOp {
    pub fn range(range: RangeRequest) -> Self {
        RequestOp {
            request: Some(Request::Range(range)),
        }
    }

    pub fn put(put: PutRequest) -> Self {
        RequestOp {
            request: Some(Request::Put(put)),
        }
    }

    /// Deletes `key` alone.
    pub fn delete(key: &str) -> Self {
        RequestOp {
            request: Some(Request::DeleteRange(DeleteRangeRequest {
                key: key.as_bytes().to_vec(),
                range_end: Vec::new(),
            })),
        }
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct TxnRequest {
    #[prost(message, repeated, tag = "1")]
    pub compare: Vec<Compare>,
    #[prost(message, repeated, tag = "2")]
    pub success: Vec<RequestOp>,
    #[prost(message, repeated, tag = "3")]
    pub failure: Vec<RequestOp>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ResponseOp {
    #[prost(oneof = "Response", tags = "1")]
    pub response: Option<Response>,
}

/// The answers this crate reads; a put's or a delete's is skipped (an unknown field).
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Response {
    #[prost(message, tag = "1")]
    Range(RangeResponse),
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct TxnResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    #[prost(bool, tag = "2")]
    pub succeeded: bool,
    #[prost(message, repeated, tag = "3")]
    pub responses: Vec<ResponseOp>,
}

impl TxnResponse {
    pub fn revision(&self) -> i64 {
        self.header.as_ref().map_or(0, |h| h.revision)
    }

    /// The answer of the `i`th operation of the branch that ran, if it is a range (else empty).
    pub fn range(&self, i: usize) -> RangeResponse {
        match self.responses.get(i).and_then(|op| op.response.as_ref()) {
            Some(Response::Range(range)) => range.clone(),
            None => RangeResponse::default(),
        }
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LeaseGrantRequest {
    #[prost(int64, tag = "1")]
    pub ttl: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LeaseGrantResponse {
    #[prost(int64, tag = "2")]
    pub id: i64,
    #[prost(int64, tag = "3")]
    pub ttl: i64,
    #[prost(string, tag = "4")]
    pub error: String,
}

/// The request of `LeaseRevoke`, `LeaseKeepAlive` and `LeaseTimeToLive`: a lease's ID.
#[derive(Clone, PartialEq, prost::Message)]
pub struct LeaseId {
    #[prost(int64, tag = "1")]
    pub id: i64,
}

/// An answer this crate reads nothing of but its success.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Empty {}

/// A keep-alive answer: a remaining TTL of 0 means the lease no longer exists.
#[derive(Clone, PartialEq, prost::Message)]
pub struct LeaseKeepAliveResponse {
    #[prost(int64, tag = "2")]
    pub id: i64,
    #[prost(int64, tag = "3")]
    pub ttl: i64,
}

/// The seconds a lease has left: -1 once it is gone.
#[derive(Clone, PartialEq, prost::Message)]
pub struct LeaseTimeToLiveResponse {
    #[prost(int64, tag = "3")]
    pub ttl: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct AuthenticateRequest {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub password: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct AuthenticateResponse {
    #[prost(string, tag = "2")]
    pub token: String,
}

/// A message of the client's side of the watch stream.
#[derive(Clone, PartialEq, prost::Message)]
pub struct WatchRequest {
    #[prost(oneof = "WatchRequestUnion", tags = "1, 2")]
    pub request_union: Option<WatchRequestUnion>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
pub enum WatchRequestUnion {
    #[prost(message, tag = "1")]
    Create(WatchCreateRequest),
    #[prost(message, tag = "2")]
    Cancel(WatchCancelRequest),
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct WatchCreateRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub range_end: Vec<u8>,
    #[prost(int64, tag = "3")]
    pub start_revision: i64,
    /// Have etcd send an empty answer now and then (every ten minutes by default) to a watch
    /// that sees no change, carrying the revision it has seen up to.
    #[prost(bool, tag = "4")]
    pub progress_notify: bool,
    /// Each event carries the key as it was before it.
    #[prost(bool, tag = "6")]
    pub prev_kv: bool,
    /// The client's own ID for the watch (etcd 3.4+), so creations need not wait for each other.
    #[prost(int64, tag = "7")]
    pub watch_id: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct WatchCancelRequest {
    #[prost(int64, tag = "1")]
    pub watch_id: i64,
}

/// One message of the watch stream.
#[derive(Clone, PartialEq, prost::Message)]
pub struct WatchResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    #[prost(int64, tag = "2")]
    pub watch_id: i64,
    #[prost(bool, tag = "3")]
    pub created: bool,
    #[prost(bool, tag = "4")]
    pub canceled: bool,
    #[prost(int64, tag = "5")]
    pub compact_revision: i64,
    #[prost(string, tag = "6")]
    pub cancel_reason: String,
    #[prost(message, repeated, tag = "11")]
    pub events: Vec<Event>,
}

impl WatchResponse {
    pub fn revision(&self) -> i64 {
        self.header.as_ref().map_or(0, |h| h.revision)
    }
}

/// `mvccpb.Event.EventType.DELETE` (a PUT is 0).
const DELETE: i32 = 1;

#[derive(Clone, PartialEq, prost::Message)]
pub struct Event {
    #[prost(int32, tag = "1")]
    pub kind: i32,
    #[prost(message, optional, tag = "2")]
    pub kv: Option<KeyValue>,
    /// The key as it was before this event, on a watch created with `prev_kv`.
    #[prost(message, optional, tag = "3")]
    pub prev_kv: Option<KeyValue>,
}

impl Event {
    pub fn is_delete(&self) -> bool {
        self.kind == DELETE
    }

    /// The key as the event left it (for a deletion: its key and the deletion's revision).
    pub fn kv(&self) -> KeyValue {
        self.kv.clone().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message as _;

    /// A compare on a key's absence still writes its create revision (0), as etcd needs to
    /// tell it from a compare on nothing.
    #[test]
    fn an_absence_compare_carries_its_zero() {
        let bytes = Compare::absent("k").encode_to_vec();
        // target CREATE (field 2 = 1), key (field 3), create_revision (field 5 = 0).
        assert_eq!(bytes, [0x10, 0x01, 0x1a, 0x01, b'k', 0x28, 0x00]);
    }

    #[test]
    fn reads_what_it_writes() {
        let range = RangeRequest::under("e")
            .by_creation(false)
            .limit(1)
            .created_by(9);
        let decoded = RangeRequest::decode(range.encode_to_vec().as_slice()).unwrap();
        assert_eq!(decoded, range);
        assert_eq!(
            (decoded.key, decoded.range_end),
            (b"e/".to_vec(), b"e0".to_vec())
        );
        let txn = TxnResponse {
            header: Some(ResponseHeader { revision: 5 }),
            succeeded: true,
            responses: vec![ResponseOp {
                response: Some(Response::Range(RangeResponse {
                    header: None,
                    kvs: vec![KeyValue {
                        key: b"a/1".to_vec(),
                        create_revision: 2,
                        ..KeyValue::default()
                    }],
                })),
            }],
        };
        let decoded = TxnResponse::decode(txn.encode_to_vec().as_slice()).unwrap();
        assert_eq!(decoded.revision(), 5);
        assert_eq!(decoded.range(0).kvs[0].key_str(), "a/1");
        assert!(decoded.range(1).kvs.is_empty());
    }
}
