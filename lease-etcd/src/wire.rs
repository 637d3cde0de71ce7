//! The JSON of etcd's v3 gateway, as this crate reads and writes it.
//!
//! The gateway is grpc-gateway over etcd's protobuf API: 64-bit integers travel as decimal
//! strings, fields at their zero value are left out (a PUT event has no `type`, a revoked lease's
//! keep-alive answer no `TTL`), and keys and values are base64. Everything here parses without
//! panicking; what cannot be read is the caller's `ApiError::Malformed`.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A 64-bit integer as the gateway writes it: a decimal string (or, leniently, a number).
fn int<'de, D: Deserializer<'de>>(deserializer: D) -> Result<i64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Int {
        Text(String),
        Number(i64),
    }
    match Int::deserialize(deserializer)? {
        Int::Number(n) => Ok(n),
        Int::Text(text) => text.parse().map_err(serde::de::Error::custom),
    }
}

fn bytes<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u8>, D::Error> {
    let text = String::deserialize(deserializer)?;
    BASE64.decode(text).map_err(serde::de::Error::custom)
}

/// Bytes written as base64, as the gateway reads `bytes` fields.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct B64(pub(crate) Vec<u8>);

impl Serialize for B64 {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&BASE64.encode(&self.0))
    }
}

impl From<&str> for B64 {
    fn from(s: &str) -> Self {
        B64(s.as_bytes().to_vec())
    }
}

/// An integer written as the gateway writes it.
fn int_text<S: Serializer>(n: &i64, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&n.to_string())
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}

/// The header of every answer: the store's revision when it was served.
#[derive(Clone, Debug, Default, Deserialize)]
pub(crate) struct Header {
    #[serde(default, deserialize_with = "int")]
    pub(crate) revision: i64,
}

/// One key and its metadata.
#[derive(Clone, Debug, Default, Deserialize)]
pub(crate) struct KeyValue {
    #[serde(default, deserialize_with = "bytes")]
    pub(crate) key: Vec<u8>,
    #[serde(default, deserialize_with = "int")]
    pub(crate) create_revision: i64,
    #[serde(default, deserialize_with = "bytes")]
    pub(crate) value: Vec<u8>,
    /// The etcd lease the key is attached to; 0 for none.
    #[serde(default, deserialize_with = "int")]
    pub(crate) lease: i64,
    /// How many times the key was written since it was created (1 for a key written once).
    #[serde(default, deserialize_with = "int")]
    pub(crate) version: i64,
}

impl KeyValue {
    /// The key as text (keys this crate writes are UTF-8; others are read lossily).
    pub(crate) fn key_str(&self) -> String {
        String::from_utf8_lossy(&self.key).into_owned()
    }
}

/// `RangeRequest`, with the fields this crate uses.
#[derive(Clone, Debug, Default, Serialize)]
pub(crate) struct RangeRequest {
    pub(crate) key: B64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) range_end: Option<B64>,
    #[serde(serialize_with = "int_text", skip_serializing_if = "is_zero")]
    pub(crate) limit: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) sort_order: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) sort_target: Option<&'static str>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub(crate) keys_only: bool,
    #[serde(serialize_with = "int_text", skip_serializing_if = "is_zero")]
    pub(crate) max_create_revision: i64,
    /// Read the keys as they were at this revision (0: now).
    #[serde(serialize_with = "int_text", skip_serializing_if = "is_zero")]
    pub(crate) revision: i64,
}

impl RangeRequest {
    /// One key.
    pub(crate) fn key(key: &str) -> Self {
        RangeRequest {
            key: key.into(),
            ..RangeRequest::default()
        }
    }

    /// Every key under `dir/` (the keys of an election or a semaphore).
    pub(crate) fn under(dir: &str) -> Self {
        let (start, end) = dir_range(dir);
        RangeRequest {
            key: start,
            range_end: Some(end),
            ..RangeRequest::default()
        }
    }

    /// Ordered by create revision, oldest first (`true`) or newest first.
    pub(crate) fn by_creation(mut self, oldest_first: bool) -> Self {
        self.sort_target = Some("CREATE");
        self.sort_order = Some(if oldest_first { "ASCEND" } else { "DESCEND" });
        self
    }

    pub(crate) fn limit(mut self, limit: i64) -> Self {
        self.limit = limit;
        self
    }

    pub(crate) fn keys_only(mut self) -> Self {
        self.keys_only = true;
        self
    }

    /// Only keys created at or before `revision`.
    pub(crate) fn created_by(mut self, revision: i64) -> Self {
        self.max_create_revision = revision;
        self
    }

    /// The keys as they were at `revision` (etcd keeps history until it is compacted).
    pub(crate) fn at_revision(mut self, revision: i64) -> Self {
        self.revision = revision;
        self
    }
}

/// The start and end of the keys under `dir/`: `dir/` up to `dir0` (`'0'` follows `'/'`).
pub(crate) fn dir_range(dir: &str) -> (B64, B64) {
    (
        B64(format!("{dir}/").into_bytes()),
        B64(format!("{dir}0").into_bytes()),
    )
}

#[derive(Clone, Debug, Default, Deserialize)]
pub(crate) struct RangeResponse {
    #[serde(default)]
    pub(crate) header: Header,
    #[serde(default)]
    pub(crate) kvs: Vec<KeyValue>,
}

/// A compare of a transaction on a key's create revision.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Compare {
    pub(crate) key: B64,
    pub(crate) result: &'static str,
    pub(crate) target: &'static str,
    #[serde(serialize_with = "int_text")]
    pub(crate) create_revision: i64,
}

impl Compare {
    /// `key` not yet created (create revision 0).
    pub(crate) fn absent(key: &str) -> Self {
        Compare::created(key, 0)
    }

    /// `key` created at `revision`: the same key, not one deleted and written again since.
    pub(crate) fn created(key: &str, revision: i64) -> Self {
        Compare {
            key: key.into(),
            result: "EQUAL",
            target: "CREATE",
            create_revision: revision,
        }
    }
}

#[derive(Clone, Debug, Default, Serialize)]
pub(crate) struct PutRequest {
    pub(crate) key: B64,
    pub(crate) value: B64,
    #[serde(serialize_with = "int_text")]
    pub(crate) lease: i64,
    /// Keep the value the key has.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub(crate) ignore_value: bool,
    /// Keep the lease the key is attached to.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub(crate) ignore_lease: bool,
}

impl PutRequest {
    /// A write that changes nothing but the key's version and mod revision.
    pub(crate) fn touch(key: &str) -> Self {
        PutRequest {
            key: key.into(),
            ignore_value: true,
            ignore_lease: true,
            ..PutRequest::default()
        }
    }
}

/// One operation of a transaction.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum RequestOp {
    RequestRange(RangeRequest),
    RequestPut(PutRequest),
}

#[derive(Clone, Debug, Default, Serialize)]
pub(crate) struct TxnRequest {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) compare: Vec<Compare>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) success: Vec<RequestOp>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) failure: Vec<RequestOp>,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub(crate) struct ResponseOp {
    pub(crate) response_range: Option<RangeResponse>,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub(crate) struct TxnResponse {
    #[serde(default)]
    pub(crate) header: Header,
    #[serde(default)]
    pub(crate) succeeded: bool,
    #[serde(default)]
    pub(crate) responses: Vec<ResponseOp>,
}

impl TxnResponse {
    /// The answer of the `i`th range of the branch that ran (empty if it is missing).
    pub(crate) fn range(&self, i: usize) -> RangeResponse {
        self.responses
            .get(i)
            .and_then(|op| op.response_range.clone())
            .unwrap_or_default()
    }
}

#[derive(Clone, Debug, Default, Deserialize)]
pub(crate) struct LeaseGrantResponse {
    #[serde(rename = "ID", default, deserialize_with = "int")]
    pub(crate) id: i64,
    #[serde(rename = "TTL", default, deserialize_with = "int")]
    pub(crate) ttl: i64,
    #[serde(default)]
    pub(crate) error: String,
}

/// A keep-alive answer: a remaining `TTL` of 0 (left out) means the lease no longer exists.
#[derive(Clone, Debug, Default, Deserialize)]
pub(crate) struct LeaseKeepAliveResponse {
    #[serde(rename = "TTL", default, deserialize_with = "int")]
    pub(crate) ttl: i64,
}

/// The keep-alive endpoint streams: each message is wrapped in `result` (or `error`).
#[derive(Clone, Debug, Default, Deserialize)]
pub(crate) struct Streamed<T> {
    pub(crate) result: Option<T>,
    pub(crate) error: Option<serde_json::Value>,
}

/// `TTL` is -1 once the lease is gone.
#[derive(Clone, Debug, Default, Deserialize)]
pub(crate) struct LeaseTimeToLiveResponse {
    #[serde(rename = "TTL", default, deserialize_with = "int")]
    pub(crate) ttl: i64,
}

/// One message of a watch stream.
#[derive(Clone, Debug, Default, Deserialize)]
pub(crate) struct WatchResponse {
    #[serde(default)]
    pub(crate) header: Header,
    #[serde(default)]
    pub(crate) canceled: bool,
    #[serde(default)]
    pub(crate) cancel_reason: String,
    #[serde(default, deserialize_with = "int")]
    pub(crate) compact_revision: i64,
    #[serde(default)]
    pub(crate) events: Vec<Event>,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub(crate) struct Event {
    /// `DELETE`, or left out for a PUT.
    #[serde(rename = "type", default)]
    pub(crate) kind: String,
    #[serde(default)]
    pub(crate) kv: KeyValue,
    /// The key as it was before this event, on a watch created with `prev_kv`.
    #[serde(default)]
    pub(crate) prev_kv: Option<KeyValue>,
}

impl Event {
    pub(crate) fn is_delete(&self) -> bool {
        self.kind == "DELETE"
    }
}

/// The body of an error answer: the gRPC status code and message.
#[derive(Clone, Debug, Default, Deserialize)]
pub(crate) struct Status {
    #[serde(default)]
    pub(crate) code: i32,
    #[serde(default)]
    pub(crate) message: String,
    #[serde(default)]
    pub(crate) error: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_gateways_answers() {
        let txn: TxnResponse = serde_json::from_str(
            r#"{"header":{"revision":"5"},"succeeded":true,"responses":[{"response_range":{"header":{"revision":"5"},"kvs":[{"key":"YS8x","create_revision":"2","mod_revision":"2","version":"1","value":"eA==","lease":"4111120178840847111"}],"count":"1"}}]}"#,
        )
        .unwrap();
        assert_eq!(txn.header.revision, 5);
        let kv = &txn.range(0).kvs[0];
        assert_eq!((kv.key_str().as_str(), kv.create_revision), ("a/1", 2));
        assert_eq!(
            (kv.value.as_slice(), kv.lease),
            (&b"x"[..], 4111120178840847111)
        );
        // A revoked lease's keep-alive answer leaves TTL out.
        let gone: Streamed<LeaseKeepAliveResponse> =
            serde_json::from_str(r#"{"result":{"header":{"revision":"3"},"ID":"7"}}"#).unwrap();
        assert_eq!(gone.result.unwrap().ttl, 0);
        let watch: Streamed<WatchResponse> = serde_json::from_str(
            r#"{"result":{"header":{"revision":"5"},"events":[{"kv":{"key":"YS8x"}},{"type":"DELETE","kv":{"key":"YS8x","mod_revision":"3"},"prev_kv":{"key":"YS8x","version":"2"}}]}}"#,
        )
        .unwrap();
        let events = watch.result.unwrap().events;
        assert!(!events[0].is_delete() && events[1].is_delete());
        assert!(events[0].prev_kv.is_none());
        assert_eq!(events[1].prev_kv.as_ref().map(|kv| kv.version), Some(2));
    }

    #[test]
    fn writes_what_the_gateway_reads() {
        let range = RangeRequest::under("e")
            .by_creation(false)
            .limit(1)
            .created_by(9);
        let json = serde_json::to_value(&range).unwrap();
        assert_eq!(json["key"], "ZS8="); // "e/"
        assert_eq!(json["range_end"], "ZTA="); // "e0"
        assert_eq!(json["max_create_revision"], "9");
        assert_eq!(json["sort_order"], "DESCEND");
        assert!(json.get("keys_only").is_none());
        // A touch keeps the value and the lease: etcd refuses either one given beside it.
        let touch = serde_json::to_value(PutRequest::touch("e")).unwrap();
        assert_eq!(
            (touch["ignore_value"].clone(), touch["ignore_lease"].clone()),
            (true.into(), true.into())
        );
        assert_eq!(
            (touch["value"].clone(), touch["lease"].clone()),
            ("".into(), "0".into())
        );
        let put = serde_json::to_value(PutRequest::default()).unwrap();
        assert!(put.get("ignore_value").is_none() && put.get("ignore_lease").is_none());
    }
}
