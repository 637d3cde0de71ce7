//! Who listens for what: the keys client-side tracking follows and the pub/sub channels, each
//! mapped to the subscriptions of this handle that want its news.
//!
//! The connection tasks (the `link` module) hand every server push to the subscriptions of its
//! key or channel only, and tell every subscription when the connection under it went
//! ([`Note::Blind`]) and came back ([`Note::Resync`]): whatever happened meanwhile, each judges
//! afresh with one read.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use tokio::sync::{Notify, mpsc};
use tokio::time::Instant;

/// News for one subscription.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Note {
    /// The key changed (a tracking invalidation), or a message came on the channel (its
    /// payload).
    Changed(String),
    /// The connection that carries this news went at the instant given: until the next
    /// [`Note::Resync`], nothing is heard.
    Blind(Instant),
    /// The connection is (again) up: news may have been missed before it.
    Resync,
}

type Subscribers = BTreeMap<String, Vec<(u64, mpsc::UnboundedSender<Note>)>>;

/// The subscriptions of one handle to keys (or channels).
#[derive(Debug, Default)]
pub(crate) struct Interest {
    subscribers: Arc<Mutex<Subscribers>>,
    next_id: AtomicU64,
    /// Notified when a name loses its last subscription (the subscriber connection then
    /// unsubscribes its channel).
    emptied: Arc<Notify>,
}

/// The news of one key or channel, until dropped.
#[derive(Debug)]
pub(crate) struct Interested {
    rx: mpsc::UnboundedReceiver<Note>,
    name: String,
    id: u64,
    subscribers: Weak<Mutex<Subscribers>>,
    emptied: Weak<Notify>,
}

impl Interested {
    /// The next note; pending forever once the handle is gone.
    pub(crate) async fn next(&mut self) -> Note {
        match self.rx.recv().await {
            Some(note) => note,
            None => std::future::pending().await,
        }
    }

    /// A note already there, without waiting.
    #[cfg(test)]
    pub(crate) fn try_next(&mut self) -> Option<Note> {
        self.rx.try_recv().ok()
    }
}

impl Drop for Interested {
    fn drop(&mut self) {
        let Some(subscribers) = self.subscribers.upgrade() else {
            return;
        };
        let mut subscribers = subscribers.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(list) = subscribers.get_mut(&self.name) {
            list.retain(|(id, _)| *id != self.id);
            if list.is_empty() {
                subscribers.remove(&self.name);
                drop(subscribers);
                if let Some(emptied) = self.emptied.upgrade() {
                    emptied.notify_one();
                }
            }
        }
    }
}

impl Interest {
    fn lock(&self) -> std::sync::MutexGuard<'_, Subscribers> {
        self.subscribers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Subscribes to `name`; `true` beside it if nobody here was subscribed before.
    pub(crate) fn subscribe(&self, name: &str) -> (Interested, bool) {
        let (tx, rx) = mpsc::unbounded_channel();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut subscribers = self.lock();
        let list = subscribers.entry(name.to_owned()).or_default();
        let first = list.is_empty();
        list.push((id, tx));
        drop(subscribers);
        let interested = Interested {
            rx,
            name: name.to_owned(),
            id,
            subscribers: Arc::downgrade(&self.subscribers),
            emptied: Arc::downgrade(&self.emptied),
        };
        (interested, first)
    }

    /// Hands `note` to the subscriptions of `name`.
    pub(crate) fn tell(&self, name: &str, note: &Note) {
        for (_, tx) in self.lock().get(name).into_iter().flatten() {
            let _ = tx.send(note.clone());
        }
    }

    /// Hands `note` to every subscription.
    pub(crate) fn tell_all(&self, note: &Note) {
        for (_, tx) in self.lock().values().flatten() {
            let _ = tx.send(note.clone());
        }
    }

    /// The names someone here is subscribed to.
    pub(crate) fn names(&self) -> Vec<String> {
        self.lock().keys().cloned().collect()
    }

    /// Whether anyone here is subscribed to `name`.
    pub(crate) fn wants(&self, name: &str) -> bool {
        self.lock().contains_key(name)
    }

    /// Notified when a name loses its last subscription.
    pub(crate) fn emptied(&self) -> Arc<Notify> {
        Arc::clone(&self.emptied)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn news_reaches_only_the_subscriptions_of_its_name_until_they_drop() {
        let interest = Interest::default();
        let (mut a, first) = interest.subscribe("k");
        assert!(first);
        let (mut b, first) = interest.subscribe("k");
        assert!(!first);
        let (mut other, _) = interest.subscribe("j");
        interest.tell("k", &Note::Changed("x".into()));
        assert_eq!(a.next().await, Note::Changed("x".into()));
        assert_eq!(b.next().await, Note::Changed("x".into()));
        assert_eq!(other.try_next(), None);
        interest.tell_all(&Note::Resync);
        assert_eq!(other.next().await, Note::Resync);
        drop(a);
        assert!(interest.wants("k"));
        drop(b);
        assert!(!interest.wants("k"));
        assert_eq!(interest.names(), ["j"]);
    }
}
