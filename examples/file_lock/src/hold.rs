//! What the holder task drives for one held lock file: the backend's [`Hold`].
//!
//! `lease_core` runs the task; this only says how to watch the file, how to give it back, and
//! what to do when the process ends first.

use std::path::PathBuf;
use std::time::Duration;

use lease_core::backend::Hold;
use lease_core::{BoxFuture, Error, LostReason};

use crate::lock_file::{self, Lock, io_error};

/// One held lock file and the record that makes it ours.
pub(crate) struct FileHold {
    pub(crate) path: PathBuf,
    /// Our record, as written: the file is ours exactly while it holds these bytes.
    pub(crate) record: Vec<u8>,
    pub(crate) poll_every: Duration,
}

impl Hold for FileHold {
    /// Reads the file every `poll_every`: gone is `KeyDeleted`, another holder's record is
    /// `KeyTaken`. There is no session to renew and no server to lose touch with, so the lease's
    /// [`Fence`](lease_core::backend::Fence) is unbounded and never confirmed.
    async fn watch(&mut self) -> LostReason {
        loop {
            tokio::time::sleep(self.poll_every).await;
            match lock_file::look(&self.path) {
                Ok(Lock::Held(record)) if record.encode() == self.record => {}
                Ok(Lock::Held(record)) => {
                    return LostReason::KeyTaken {
                        lock_index: record.index,
                        session: record.holder,
                    };
                }
                // Ours was deleted, and perhaps another contender is writing its own.
                Ok(Lock::Free | Lock::BeingWritten) => return LostReason::KeyDeleted,
                // A read that failed says nothing about the lock: look again.
                Err(_) => {}
            }
        }
    }

    async fn release(&mut self) -> Result<(), Error> {
        lock_file::remove_if_held_by(&self.path, &self.record)
            .map(drop)
            .map_err(|error| io_error("delete", &self.path, &error))
    }

    /// After a loss the file is gone or another holder's: nothing of ours is left to give back.
    async fn clean_up(&mut self, _reason: &LostReason) {}

    /// Deleting a file needs no runtime, so the lease is given back here and now.
    fn abandon(self) -> Option<BoxFuture<'static, ()>> {
        let _ = lock_file::remove_if_held_by(&self.path, &self.record);
        None
    }
}
