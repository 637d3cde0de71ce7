//! Requests of one kind queued to go together, in one statement and one commit: the attempts
//! (the `attempt` module) and the releases (the `release` module) of a handle. The handle holds
//! a [`Batched`] queue; its sending task is handed a [`Drain`] of it when it starts (the queue,
//! weakly, and its wake-up), takes whatever is queued when it wakes, and ends with the handle.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Weak};

use lease_http::Task;

/// Requests of one kind queued to go together, in one statement and one commit, and the task of
/// a handle that sends them (the `attempt` and `release` modules).
pub(crate) struct Batched<T, R> {
    queue: Arc<Queue<T, R>>,
    /// Wakes the task: an item queued, or the handle gone (this dropped with it).
    wake: Arc<tokio::sync::Notify>,
    task: Task,
}

/// The queued items, each with where its answer goes.
type Queue<T, R> = std::sync::Mutex<Vec<(T, tokio::sync::oneshot::Sender<R>)>>;

/// What the sending task of a [`Batched`] is handed when it starts: the queue, held weakly so
/// that the task does not keep it, and the wake-up.
pub(crate) struct Drain<T, R> {
    queue: Weak<Queue<T, R>>,
    wake: Arc<tokio::sync::Notify>,
}

impl<T, R> Default for Batched<T, R> {
    fn default() -> Self {
        Batched {
            queue: Arc::default(),
            wake: Arc::default(),
            task: Task::default(),
        }
    }
}

impl<T, R> Drop for Batched<T, R> {
    /// The last clone of the handle is gone: the task, which waits without keeping the queue,
    /// wakes to find it gone and ends.
    fn drop(&mut self) {
        self.wake.notify_one();
    }
}

impl<T, R> fmt::Debug for Batched<T, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Batched")
            .field("queued", &lock(&self.queue).len())
            .finish_non_exhaustive()
    }
}

fn lock<T, R>(
    queue: &Queue<T, R>,
) -> std::sync::MutexGuard<'_, Vec<(T, tokio::sync::oneshot::Sender<R>)>> {
    queue
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl<T, R> Batched<T, R> {
    /// Queues `item`, starting the sending task (`start(drain)`) unless it runs; the receiver
    /// gets its answer.
    pub(crate) fn push<F>(
        &self,
        item: T,
        start: impl FnOnce(Drain<T, R>) -> F,
    ) -> tokio::sync::oneshot::Receiver<R>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let (reply, answer) = tokio::sync::oneshot::channel();
        lock(&self.queue).push((item, reply));
        self.task.ensure(|| {
            start(Drain {
                queue: Arc::downgrade(&self.queue),
                wake: Arc::clone(&self.wake),
            })
        });
        self.wake.notify_one();
        answer
    }
}

impl<T, R> Drain<T, R> {
    /// Up to `most` queued items, oldest first; waits for one without keeping the queue, and is
    /// `None` once the handle is gone (its drop wakes the wait), so the sending task ends with
    /// it.
    pub(crate) async fn next(
        &self,
        most: usize,
    ) -> Option<Vec<(T, tokio::sync::oneshot::Sender<R>)>> {
        loop {
            let queue = self.queue.upgrade()?;
            let batch = {
                let mut queue = lock(&queue);
                let at = queue.len().min(most);
                let rest = queue.split_off(at);
                std::mem::replace(&mut *queue, rest)
            };
            if !batch.is_empty() {
                return Some(batch);
            }
            drop(queue);
            self.wake.notified().await;
        }
    }
}
