//! A client's background task, kept running while the client is used.

use std::future::Future;
use std::sync::{Mutex, PoisonError};

use tokio::task::JoinHandle;

/// A background task of a client (a stream it keeps open, a batch it sends): started on first
/// use, and again if the one before has ended, as it does with the runtime it ran on (a client
/// kept across runtimes, as tests and `#[tokio::main]` functions called twice do).
///
/// The task should hold its client only weakly, so that it ends with it.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let task = lease_http::Task::default();
/// assert!(task.ensure(std::future::pending::<()>), "started");
/// assert!(!task.ensure(std::future::pending::<()>), "runs once at a time");
/// # }
/// ```
#[derive(Debug, Default)]
pub struct Task(Mutex<Option<JoinHandle<()>>>);

impl Task {
    /// Spawns `start()` unless the task runs; true if it spawned it.
    pub fn ensure<F>(&self, start: impl FnOnce() -> F) -> bool
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let mut task = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if task.as_ref().is_some_and(|task| !task.is_finished()) {
            return false;
        }
        *task = Some(tokio::spawn(start()));
        true
    }
}
