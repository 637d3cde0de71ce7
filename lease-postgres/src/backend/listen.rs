//! The one LISTEN connection of a backend handle: the table's notifications, handed to the
//! holders, waiters and observers of each key.
//!
//! The trigger on the leases table notifies `<schema>_leases` with `<op>:<holder>:<key>` on every
//! insert and delete: `a` acquired, `r` released by its holder, `x` expired (removed by a
//! contender), `d` deleted by anyone else. One task per handle keeps a connection that listens on
//! it and hands each notification to the subscriptions of its key only, so a hand-over wakes the
//! waiters of that key and a deleted row its holder, at no request of theirs. When the connection
//! ends, notifications may have been missed: every subscription gets [`Note::Resync`] once the task
//! listens again, and judges afresh with one read (a holder: is my row there; a waiter: one
//! attempt). A holder whose row is deleted thus loses its lease at once (`KeyDeleted`, not at the
//! next renewal). A release on a key wakes all its waiters and one wins; semaphores are not FIFO.
//! The listening connection's connection attempts count for reachability too, so a follower that
//! only waits reports an outage as well.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use tokio::sync::{Notify, mpsc};
use tokio_postgres::AsyncMessage;

use super::wire::{PgError, Wire, retry_backoff, set_session};
use lease_http::Task;

/// What happened to a row of a subscribed key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Note {
    /// A row was inserted: `holder` acquired.
    Acquired { holder: String },
    /// A row was deleted: by its holder (a release), by a contender (it had expired), or by
    /// anyone else (an operator: its holder lost it).
    Removed { holder: String, how: Removal },
    /// The listening connection was (re)established: notifications may have been missed.
    Resync,
}

/// How a row went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Removal {
    Released,
    Expired,
    Deleted,
}

impl Note {
    /// A notification's payload, `<op>:<holder>:<key>`, as (key, note).
    fn parse(payload: &str) -> Option<(&str, Note)> {
        let (op, rest) = payload.split_once(':')?;
        let (holder, key) = rest.split_once(':')?;
        let holder = holder.to_owned();
        let note = match op {
            "a" => Note::Acquired { holder },
            "r" => Note::Removed {
                holder,
                how: Removal::Released,
            },
            "x" => Note::Removed {
                holder,
                how: Removal::Expired,
            },
            "d" => Note::Removed {
                holder,
                how: Removal::Deleted,
            },
            _ => return None,
        };
        Some((key, note))
    }
}

type Subscribers = HashMap<String, Vec<(u64, mpsc::UnboundedSender<Note>)>>;

/// The subscriptions of one backend handle, and whether its listening task runs.
#[derive(Debug, Default)]
pub(crate) struct Listener {
    subscribers: Arc<Mutex<Subscribers>>,
    task: Task,
    next_id: AtomicU64,
    /// Notified when this is dropped (the handle's last clone gone): the task then closes its
    /// connection at once.
    gone: Arc<Notify>,
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.gone.notify_one();
    }
}

/// The notifications of one key, until dropped.
#[derive(Debug)]
pub(crate) struct Subscription {
    rx: mpsc::UnboundedReceiver<Note>,
    key: String,
    id: u64,
    subscribers: Weak<Mutex<Subscribers>>,
}

impl Subscription {
    /// The next note; pending forever if the handle is gone.
    pub(crate) async fn next(&mut self) -> Note {
        match self.rx.recv().await {
            Some(note) => note,
            None => std::future::pending().await,
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let Some(subscribers) = self.subscribers.upgrade() else {
            return;
        };
        let mut subscribers = subscribers.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(list) = subscribers.get_mut(&self.key) {
            list.retain(|(id, _)| *id != self.id);
            if list.is_empty() {
                subscribers.remove(&self.key);
            }
        }
    }
}

impl Listener {
    /// Subscribes to `key`'s notifications, starting the listening task on first use: the task
    /// is handed the wire and the subscriptions, weakly, and the handle's going.
    pub(crate) fn subscribe(&self, wire: &Arc<Wire>, key: &str) -> Subscription {
        let (tx, rx) = mpsc::unbounded_channel();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.subscribers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(key.to_owned())
            .or_default()
            .push((id, tx));
        self.task.ensure(|| {
            listen(
                Arc::downgrade(wire),
                Arc::downgrade(&self.subscribers),
                Arc::clone(&self.gone),
            )
        });
        Subscription {
            rx,
            key: key.to_owned(),
            id,
            subscribers: Arc::downgrade(&self.subscribers),
        }
    }
}

/// Hands the notification `payload` to the subscriptions of its key.
fn dispatch(subscribers: &Mutex<Subscribers>, payload: &str) {
    let Some((key, note)) = Note::parse(payload) else {
        tracing::debug!(
            payload,
            "a notification that is not the lease table's; ignored"
        );
        return;
    };
    let subscribers = subscribers.lock().unwrap_or_else(PoisonError::into_inner);
    for (_, tx) in subscribers.get(key).into_iter().flatten() {
        let _ = tx.send(note.clone());
    }
}

/// Tells every subscription that notifications may have been missed.
fn resync(subscribers: &Mutex<Subscribers>) {
    let subscribers = subscribers.lock().unwrap_or_else(PoisonError::into_inner);
    for (_, tx) in subscribers.values().flatten() {
        let _ = tx.send(Note::Resync);
    }
}

/// Keeps a connection listening on the table's channel for as long as the handle lives (its
/// subscriptions, which only the [`Listener`] keeps).
async fn listen(wire: Weak<Wire>, subscribers: Weak<Mutex<Subscribers>>, gone: Arc<Notify>) {
    let mut pause = retry_backoff();
    loop {
        if subscribers.strong_count() == 0 {
            return;
        }
        let Some(strong) = wire.upgrade() else {
            return;
        };
        let config = strong.config.clone();
        let session_sql = strong.session_sql.clone();
        let tls = strong.tls.clone();
        let listen = format!("LISTEN {}", strong.channel());
        drop(strong);
        let connected = config.connect(tls).await;
        let (client, mut connection) = match connected {
            Ok(connected) => connected,
            Err(error) => {
                let error = PgError::connecting(error);
                // News for readiness too: a waiter or an observer sends nothing else meanwhile.
                if let Some(strong) = wire.upgrade() {
                    strong.reachability.answered(error.answered());
                }
                tracing::debug!(%error, "cannot connect to listen for lease notifications; retrying");
                pause.wait().await;
                continue;
            }
        };
        let (tx, mut rx) = mpsc::unbounded_channel();
        let driver = lease_core::runtime::spawn(async move {
            while let Some(message) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                match message {
                    Ok(AsyncMessage::Notification(n)) => {
                        if tx.send(n.payload().to_owned()).is_err() {
                            return;
                        }
                    }
                    Ok(_) => {}
                    Err(error) => {
                        tracing::debug!(%error, "the listening connection failed");
                        return;
                    }
                }
            }
        });
        set_session(&client, session_sql.as_deref()).await;
        if let Err(error) = client.batch_execute(&listen).await {
            tracing::debug!(%error, "LISTEN failed; retrying");
            driver.abort();
            pause.wait().await;
            continue;
        }
        pause.reset();
        match (wire.upgrade(), subscribers.upgrade()) {
            (Some(strong), Some(subscribers)) => {
                strong.reachability.answered(true);
                resync(&subscribers);
            }
            _ => return,
        }
        // Until the connection ends, or the handle goes.
        loop {
            let payload = tokio::select! {
                biased;
                payload = rx.recv() => payload,
                () = gone.notified() => {
                    driver.abort();
                    return;
                }
            };
            let Some(payload) = payload else { break };
            match subscribers.upgrade() {
                Some(subscribers) => dispatch(&subscribers, &payload),
                None => {
                    driver.abort();
                    return;
                }
            }
        }
        drop(client);
        tracing::debug!("the connection listening for lease notifications ended; listening again");
        // Whatever was missed meanwhile, every subscription judges afresh once listening again.
        pause.wait().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_parse_with_colons_in_keys() {
        assert_eq!(
            Note::parse("d:ab12:jobs/a:b"),
            Some((
                "jobs/a:b",
                Note::Removed {
                    holder: "ab12".into(),
                    how: Removal::Deleted
                }
            ))
        );
        assert_eq!(
            Note::parse("a:ab12:k"),
            Some((
                "k",
                Note::Acquired {
                    holder: "ab12".into()
                }
            ))
        );
        assert_eq!(Note::parse("z:ab12:k"), None);
        assert_eq!(Note::parse("nothing"), None);
    }
}
