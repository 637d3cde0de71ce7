//! The public conformance suite, run against the file-lock backend: one test per scenario.
//!
//! The backend has no sessions and no lock-delay, and its operator can delete a lock file but
//! not release it for someone: the harness declares those, and the scenarios that need them check
//! the refusal instead.
//!
//! Run: `cargo test -p lease-file-lock --test conformance`.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use lease_conformance::{Capability, Harness, Operator, OperatorError};
use lease_core::{BoxFuture, Sequencer};
use lease_file_lock::FileLock;

/// An administrator of the lock directory: deleting a lock file is all there is to do.
struct FileOperator(FileLock);

impl Operator for FileOperator {
    fn delete_key<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), OperatorError>> {
        let answer = match self.0.delete_key(key) {
            Ok(true) => Ok(()),
            Ok(false) => Err(OperatorError::NotFound {
                what: "lock file for",
                name: key.to_owned(),
            }),
            Err(error) => Err(error.into()),
        };
        Box::pin(std::future::ready(answer))
    }

    fn revoke<'a>(&'a self, lease: &'a Sequencer) -> BoxFuture<'a, Result<(), OperatorError>> {
        self.delete_key(lease.key())
    }
}

/// A fresh directory per scenario under cargo's scratch space, removed afterwards.
async fn harness() -> Harness {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "file-lock-conformance-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let files = FileLock::new(&dir).poll_every(Duration::from_millis(10));
    Harness::new(files.clone(), FileOperator(files))
        .lacks(Capability::DestroySession)
        .lacks(Capability::ReleaseKey)
        .lacks(Capability::LockDelay)
        .lacks(Capability::KeepsPastHolder)
        .clean_up_with(|_keys| async move {
            let _ = std::fs::remove_dir_all(dir);
        })
}

lease_conformance::suite!(file_lock, harness);
