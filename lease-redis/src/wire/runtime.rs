//! Where the crate's tasks run: every task is spawned through [`spawn`], the one place, which is
//! lease-core's `runtime::spawn` (a tokio task, or, under the deterministic simulation's
//! `runtime::local`, a task of the simulated process's `LocalSet`).

use std::future::Future;

/// Spawns a task of this crate.
pub(crate) fn spawn<F>(task: F) -> tokio::task::JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    lease_core::runtime::spawn(task)
}
