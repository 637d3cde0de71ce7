//! One kind of lock per name: a leader lock and a semaphore never share a name.
//!
//! A leader lock on `k` is the key `k` with [`Error::LEADER_FLAGS`]; a semaphore on `k` is
//! `k/.lock` and `k/<session>` with [`Error::SEMAPHORE_FLAGS`]. The two never touch each other's
//! keys, so the flags alone cannot keep them apart (they do when both use one key, as
//! `consul lock K` and `consul lock -n K` both use `K/.lock`). Each therefore checks the key where
//! the other kind would be recorded: a leader the semaphore's `k/.lock`, a semaphore the leader
//! key `k`.
//!
//! The check rides on a transaction the acquisition makes anyway, as one more operation: the
//! leader's `?acquire=` of its key, and the semaphore coordinator's transaction that creates
//! `.lock`. It asserts that the other kind's key does not exist ([`OtherKind::Absent`]), or, once
//! it was read and found to be no lock of the other kind (a key of other data, another tool's
//! lock), that it has not changed since ([`OtherKind::Unchanged`]). So it costs no request while
//! the name is unshared; when the check fails, one read of that key tells the other kind (refused
//! with [`Error::FlagsConflict`]) from anything else (checked as read from then on). An ACL token
//! that may not read the key cannot have it checked either: it acquires unchecked, as before
//! ([`OtherKind::Unreadable`]), after one failed transaction and one denied read (per leader
//! acquisition; per semaphore coordinator, which lives while its prefix is in use).
//!
//! Consul applies a transaction atomically, so a leader's acquire and a semaphore's creation of
//! `.lock` on the same name cannot both pass: whichever commits first makes the other's check
//! fail. Keys outlive their holders, and so does the kind: a released leader key still refuses
//! semaphores until it is deleted, and a semaphore's `.lock` refuses leaders until the semaphore
//! is destroyed. A semaphore checks only when it creates `.lock`: one whose `.lock` exists
//! already (made by `consul lock -n`, or by a version of this library without the check) is not
//! held back by a leader key at its prefix, while leader contenders there are refused.

use reqwest::StatusCode;

use super::wire::{ApiError, KvEntry, TxnOp};
use lease_core::Error;

/// The flags `consul lock` (and Consul's Go `api.Lock`) put on a leader lock key.
pub(crate) const LEADER_FLAGS: u64 = Error::LEADER_FLAGS;

/// What an acquisition's transaction asserts about the key where the other kind of lock would be
/// recorded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum OtherKind {
    /// The key does not exist (what is assumed until a check fails).
    #[default]
    Absent,
    /// The key was read at this ModifyIndex and is no lock of the other kind.
    Unchanged(u64),
    /// The client's ACL token may not read the key, so Consul refuses to check it too ("Permission
    /// denied" on the check): nothing is asserted, and the acquisition goes on as it did before
    /// this check existed. Such a token cannot see a lock of the other kind there either.
    Unreadable,
}

/// What one read of the other kind's key, after a check of it failed, says to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// It is a lock of the other kind: refuse the acquisition.
    Refuse,
    /// Assert this from now on, and try again.
    Assert(OtherKind),
}

impl OtherKind {
    /// The transaction operation that asserts this of `key`, if any.
    pub(crate) fn check(self, key: &str) -> Option<TxnOp<'_>> {
        match self {
            OtherKind::Absent => Some(TxnOp::CheckNotExists { key }),
            OtherKind::Unchanged(index) => Some(TxnOp::CheckIndex { key, index }),
            OtherKind::Unreadable => None,
        }
    }

    /// Judges `read`, a read of the key after a check of it failed; `other` is the other kind's
    /// flags. Errors other than a denied read are the caller's to handle.
    pub(crate) fn after_failed_check(
        read: Result<Option<KvEntry>, ApiError>,
        other: u64,
    ) -> Result<Verdict, ApiError> {
        Ok(match read {
            Ok(None) => Verdict::Assert(OtherKind::Absent),
            Ok(Some(entry)) if entry.flags == other => Verdict::Refuse,
            Ok(Some(entry)) => Verdict::Assert(OtherKind::Unchanged(entry.modify_index)),
            Err(ApiError::Status {
                status: StatusCode::FORBIDDEN,
                ..
            }) => Verdict::Assert(OtherKind::Unreadable),
            Err(error) => return Err(error),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lease_core::semaphore::SEMAPHORE_FLAGS;

    fn entry(flags: u64, modify_index: u64) -> KvEntry {
        KvEntry {
            key: "k".to_owned(),
            flags,
            value: None,
            session: None,
            lock_index: 0,
            modify_index,
            create_index: 1,
        }
    }

    #[test]
    fn the_checks_are_consuls_transaction_verbs() {
        let absent = OtherKind::Absent.check("k/.lock").map(TxnOp::to_json);
        assert_eq!(
            absent,
            Some(serde_json::json!({"KV": {"Verb": "check-not-exists", "Key": "k/.lock"}}))
        );
        let unchanged = OtherKind::Unchanged(42).check("k").map(TxnOp::to_json);
        assert_eq!(
            unchanged,
            Some(serde_json::json!({"KV": {"Verb": "check-index", "Key": "k", "Index": 42}}))
        );
        assert!(OtherKind::Unreadable.check("k").is_none());
    }

    #[test]
    fn only_the_other_kinds_flags_refuse_and_anything_else_is_checked_as_read() {
        let judge = |read, other| OtherKind::after_failed_check(read, other).ok();
        // A leader contender reading `k/.lock`.
        assert_eq!(
            judge(Ok(None), SEMAPHORE_FLAGS),
            Some(Verdict::Assert(OtherKind::Absent))
        );
        let semaphore = Ok(Some(entry(SEMAPHORE_FLAGS, 7)));
        assert_eq!(judge(semaphore, SEMAPHORE_FLAGS), Some(Verdict::Refuse));
        // `lease lock k` (`consul lock`'s layout): a leader on `k/.lock` is not a semaphore.
        assert_eq!(
            judge(Ok(Some(entry(LEADER_FLAGS, 7))), SEMAPHORE_FLAGS),
            Some(Verdict::Assert(OtherKind::Unchanged(7)))
        );
        // A semaphore's coordinator reading `k`: a leader key, released or not, or plain data.
        let leader = Ok(Some(entry(LEADER_FLAGS, 9)));
        assert_eq!(judge(leader, LEADER_FLAGS), Some(Verdict::Refuse));
        assert_eq!(
            judge(Ok(Some(entry(0, 9))), LEADER_FLAGS),
            Some(Verdict::Assert(OtherKind::Unchanged(9)))
        );
        // A token that may not read the key: no check from now on. Other failures are errors.
        let denied = ApiError::Status {
            status: StatusCode::FORBIDDEN,
            grpc_code: None,
            message: "Permission denied".into(),
        };
        assert_eq!(
            judge(Err(denied), LEADER_FLAGS),
            Some(Verdict::Assert(OtherKind::Unreadable))
        );
        let trouble = ApiError::Status {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            grpc_code: None,
            message: "no leader".into(),
        };
        assert!(judge(Err(trouble), LEADER_FLAGS).is_none());
    }
}
