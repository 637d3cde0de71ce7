//! Where the crate's tasks run: every task is spawned through [`spawn`], the one place, so that
//! the runtime they go to is chosen once (lease-core's, for the deterministic simulation).

use std::future::Future;

/// Spawns a task of this crate.
pub(crate) fn spawn<F>(task: F) -> tokio::task::JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    tokio::spawn(task)
}
