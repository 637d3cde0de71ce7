//! etcd's gRPC errors, with the codes and messages of etcd 3.4's `rpctypes` (lease-etcd reads
//! some of the messages: "authentication is not enabled", "invalid auth token"), and grpc-go's
//! for a method nobody serves.

use tonic::{Code, Status};

fn status(code: Code, message: &str) -> Status {
    Status::new(code, message)
}

pub(crate) fn empty_key() -> Status {
    status(Code::InvalidArgument, "etcdserver: key is not provided")
}

pub(crate) fn key_not_found() -> Status {
    status(Code::InvalidArgument, "etcdserver: key not found")
}

pub(crate) fn value_provided() -> Status {
    status(Code::InvalidArgument, "etcdserver: value is provided")
}

pub(crate) fn lease_provided() -> Status {
    status(Code::InvalidArgument, "etcdserver: lease is provided")
}

pub(crate) fn too_many_ops() -> Status {
    status(
        Code::InvalidArgument,
        "etcdserver: too many operations in txn request",
    )
}

pub(crate) fn duplicate_key() -> Status {
    status(
        Code::InvalidArgument,
        "etcdserver: duplicate key given in txn request",
    )
}

pub(crate) fn compacted() -> Status {
    status(
        Code::OutOfRange,
        "etcdserver: mvcc: required revision has been compacted",
    )
}

pub(crate) fn future_rev() -> Status {
    status(
        Code::OutOfRange,
        "etcdserver: mvcc: required revision is a future revision",
    )
}

pub(crate) fn lease_not_found() -> Status {
    status(Code::NotFound, "etcdserver: requested lease not found")
}

pub(crate) fn lease_exists() -> Status {
    status(Code::FailedPrecondition, "etcdserver: lease already exists")
}

pub(crate) fn lease_ttl_too_large() -> Status {
    status(Code::OutOfRange, "etcdserver: too large lease TTL")
}

pub(crate) fn auth_not_enabled() -> Status {
    status(
        Code::FailedPrecondition,
        "etcdserver: authentication is not enabled",
    )
}

pub(crate) fn auth_failed() -> Status {
    status(
        Code::InvalidArgument,
        "etcdserver: authentication failed, invalid user ID or password",
    )
}

pub(crate) fn invalid_auth_token() -> Status {
    status(Code::Unauthenticated, "etcdserver: invalid auth token")
}

pub(crate) fn user_empty() -> Status {
    status(Code::InvalidArgument, "etcdserver: user name is empty")
}

/// A status as grpc-go's `status.Err().Error()` writes it: what etcd puts in a watch's
/// `cancel_reason`.
pub(crate) fn as_reason(status: &Status) -> String {
    format!(
        "rpc error: code = {} desc = {}",
        go_code_name(status.code()),
        status.message()
    )
}

/// grpc-go's names of the codes (`codes.Code.String()`).
fn go_code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "Canceled",
        Code::Unknown => "Unknown",
        Code::InvalidArgument => "InvalidArgument",
        Code::DeadlineExceeded => "DeadlineExceeded",
        Code::NotFound => "NotFound",
        Code::AlreadyExists => "AlreadyExists",
        Code::PermissionDenied => "PermissionDenied",
        Code::ResourceExhausted => "ResourceExhausted",
        Code::FailedPrecondition => "FailedPrecondition",
        Code::Aborted => "Aborted",
        Code::OutOfRange => "OutOfRange",
        Code::Unimplemented => "Unimplemented",
        Code::Internal => "Internal",
        Code::Unavailable => "Unavailable",
        Code::DataLoss => "DataLoss",
        Code::Unauthenticated => "Unauthenticated",
    }
}

/// mvcc's refusal of a watch on an empty range (`key >= range_end`).
pub(crate) const EMPTY_WATCHER_RANGE: &str = "mvcc: watcher range is empty";

/// mvcc's refusal of a watch ID already in use on the stream.
pub(crate) const DUPLICATE_WATCH_ID: &str = "mvcc: duplicate watch ID provided on the WatchStream";

/// grpc-go's answer to a path no service serves (`unknown service …` or `unknown method … for
/// service …`).
pub(crate) fn unknown_path(path: &str) -> Status {
    let mut parts = path.trim_start_matches('/').splitn(2, '/');
    let service = parts.next().unwrap_or_default();
    let message = match (service, parts.next()) {
        (
            "etcdserverpb.KV" | "etcdserverpb.Watch" | "etcdserverpb.Lease" | "etcdserverpb.Auth",
            Some(method),
        ) => {
            format!("unknown method {method} for service {service}")
        }
        _ => format!("unknown service {service}"),
    };
    Status::new(Code::Unimplemented, message)
}
