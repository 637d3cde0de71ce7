//! Batched release: every release of a handle that is pending at one moment goes in one
//! statement, `lease.release_many(holders)`, and so in one commit.
//!
//! A commit waits for its WAL flush, which bounds a connection to a few hundred commits a second
//! on an ordinary disk: a process giving back 1,000 leases at once (`Backend::shutdown`) would
//! take seconds, one release after another. One task per handle takes whatever releases are
//! queued when it wakes, sends them together, and answers each.

use std::sync::{Arc, Mutex, PoisonError, Weak};

use lease_core::Error;
use lease_core::backend::RELEASE_BOUND;
use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;

use super::client::{Shared, Task};

/// The most holders one statement gives back.
const BATCH: usize = 5_000;

type Reply = oneshot::Sender<Result<(), String>>;

/// The pending releases of one backend handle.
#[derive(Debug, Default)]
pub(crate) struct Releaser {
    queue: Mutex<Vec<(String, Reply)>>,
    wake: Notify,
    task: Task,
}

impl Releaser {
    /// Gives `holder`'s row back (announced as a release), with the releases queued beside it;
    /// retried through brief trouble within [`RELEASE_BOUND`].
    pub(crate) async fn release(
        &self,
        shared: &Arc<Shared>,
        key: &str,
        holder: &str,
    ) -> Result<(), Error> {
        let (reply, answer) = oneshot::channel();
        self.queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((holder.to_owned(), reply));
        self.task.ensure(|| release_all(Arc::downgrade(shared)));
        self.wake.notify_one();
        let failed = |message: String| Error::Backend {
            backend: "PostgreSQL",
            operation: format!("release {key:?}"),
            message,
            transient: true,
        };
        match answer.await {
            Ok(Ok(())) => {
                tracing::debug!(key, holder, "lease row released");
                Ok(())
            }
            Ok(Err(message)) => Err(failed(message)),
            Err(_) => Err(failed("the backend handle is gone".into())),
        }
    }

    fn take(&self) -> Vec<(String, Reply)> {
        let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        let at = queue.len().min(BATCH);
        let rest = queue.split_off(at);
        std::mem::replace(&mut *queue, rest)
    }
}

async fn release_all(shared: Weak<Shared>) {
    loop {
        let Some(strong) = shared.upgrade() else {
            return;
        };
        let batch = strong.releaser.take();
        if batch.is_empty() {
            tokio::select! {
                () = strong.releaser.wake.notified() => {}
                // Now and then, to end with the handle (this task alone keeps it meanwhile).
                () = tokio::time::sleep(std::time::Duration::from_secs(30)) => {}
            }
            continue;
        }
        let holders: Vec<String> = batch.iter().map(|(h, _)| h.clone()).collect();
        let sql = strong.sql("SELECT lease.release_many($1)");
        let answer = strong
            .retrying(Some(Instant::now() + RELEASE_BOUND), true, |client| {
                let (sql, holders) = (&sql, &holders);
                async move { client.query(sql, &[holders]).await }
            })
            .await;
        let answer = answer.map(|_| ()).map_err(|error| error.to_string());
        for (_, reply) in batch {
            let _ = reply.send(answer.clone());
        }
    }
}
