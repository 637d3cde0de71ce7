//! What one group knows and whom it wakes: the interests ([`Interest`]), the group's latest
//! [`Listing`], and its watchers, each woken only when what it watches changed.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::wire::{ApiError, KvEntry};
use lease_core::backend::Fence;

/// What a watcher is interested in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Interest {
    /// One key.
    Key(String),
    /// Every key under a prefix (a semaphore's `<prefix>/`).
    Prefix(String),
}

impl Interest {
    pub(super) fn path(&self) -> &str {
        match self {
            Interest::Key(path) | Interest::Prefix(path) => path,
        }
    }
}

/// A sorted listing of everything under a group's prefix, as of `index`.
#[derive(Debug, Default)]
pub(crate) struct Listing {
    pub(crate) index: u64,
    entries: Vec<KvEntry>,
}

impl Listing {
    pub(super) fn new(mut entries: Vec<KvEntry>, index: u64) -> Listing {
        // Consul answers in key order already; sorting sorted input is linear.
        entries.sort_by(|a, b| a.key.cmp(&b.key));
        Listing { index, entries }
    }

    /// The entry of `key`, if it exists (and the group covers it).
    pub(crate) fn get(&self, key: &str) -> Option<&KvEntry> {
        let at = self
            .entries
            .binary_search_by(|e| e.key.as_str().cmp(key))
            .ok()?;
        self.entries.get(at)
    }

    /// Every entry whose key starts with `prefix`.
    pub(crate) fn under(&self, prefix: &str) -> &[KvEntry] {
        let start = self.entries.partition_point(|e| e.key.as_str() < prefix);
        let len = self.entries[start..]
            .iter()
            .take_while(|e| e.key.starts_with(prefix))
            .count();
        &self.entries[start..start + len]
    }
}

/// What a watcher sees.
#[derive(Clone, Debug)]
pub(super) enum View {
    /// Nothing read yet.
    Pending,
    /// The latest listing of the group that covers the interest.
    Read(Arc<Listing>),
    /// The group's last read failed (sent only to watchers that asked for failures); the group
    /// retries with backoff.
    Trouble(ApiError),
}

/// What a group's task and its registry share.
#[derive(Debug)]
pub(super) struct Shared {
    pub(super) watchers: Mutex<Watchers>,
    /// Absorbed by a wider group: the task ends after its current read.
    pub(super) retired: AtomicBool,
    /// A group that needs the slot of this retired one: the task ends at once, abandoning its
    /// read.
    pub(super) abandon: CancellationToken,
}

impl Shared {
    /// A group about to start: nothing read yet.
    pub(super) fn new() -> Self {
        Shared {
            watchers: Mutex::new(Watchers {
                unread_since: Some(Instant::now()),
                ..Watchers::default()
            }),
            retired: AtomicBool::new(false),
            abandon: CancellationToken::new(),
        }
    }
}

#[derive(Debug, Default)]
pub(super) struct Watchers {
    /// Watchers of one key, by key.
    keys: BTreeMap<String, Vec<Watcher>>,
    /// Watchers of a prefix, by prefix (every slot holder of a semaphore watches its
    /// directory, so thousands of watchers may share a hundred prefixes).
    prefixes: BTreeMap<String, Vec<Watcher>>,
    /// The group's latest listing.
    latest: Option<Arc<Listing>>,
    /// Since when no blocking read covers the group (it has not read yet, or its reads fail):
    /// the fences of its watchers are suspended from then on. `None` while a read is in flight.
    pub(super) unread_since: Option<Instant>,
}

#[derive(Debug)]
pub(super) struct Watcher {
    pub(super) id: u64,
    pub(super) troubles: bool,
    pub(super) sender: watch::Sender<View>,
    /// The index the watcher waits for (see [`Watched::next`]): the first listing at or past it
    /// wakes the watcher even if its key looks unchanged since the previous listing. (A key
    /// created and deleted between two listings looks unchanged, yet a holder that acquired it
    /// waits for exactly that news.)
    pub(super) wants: Arc<AtomicU64>,
    /// The fence of the lease this watch keeps: suspended while nothing reads the key.
    pub(super) fence: Option<Fence>,
}

impl Watchers {
    pub(super) fn is_empty(&self) -> bool {
        self.keys.is_empty() && self.prefixes.is_empty()
    }

    pub(super) fn insert(&mut self, interest: Interest, watcher: Watcher) {
        if let Some(latest) = &self.latest {
            watcher.sender.send_replace(View::Read(Arc::clone(latest)));
        }
        if let (Some(fence), Some(_)) = (&watcher.fence, self.unread_since) {
            // Unread from now on (a fence suspended earlier keeps its earlier instant).
            fence.suspend(Instant::now());
        }
        match interest {
            Interest::Key(key) => self.keys.entry(key).or_default().push(watcher),
            Interest::Prefix(prefix) => self.prefixes.entry(prefix).or_default().push(watcher),
        }
    }

    pub(super) fn remove(&mut self, interest: &Interest, id: u64) {
        let (by_path, path) = match interest {
            Interest::Key(key) => (&mut self.keys, key),
            Interest::Prefix(prefix) => (&mut self.prefixes, prefix),
        };
        if let Some(watchers) = by_path.get_mut(path) {
            watchers.retain(|w| {
                if w.id != id {
                    return true;
                }
                // The lease is over; its session (and fence) may serve another one.
                if let Some(fence) = &w.fence {
                    fence.resume();
                }
                false
            });
            if watchers.is_empty() {
                by_path.remove(path);
            }
        }
    }

    pub(super) fn drain(&mut self) -> impl Iterator<Item = (Interest, Watcher)> + '_ {
        let keys = std::mem::take(&mut self.keys)
            .into_iter()
            .flat_map(|(key, ws)| ws.into_iter().map(move |w| (Interest::Key(key.clone()), w)));
        let prefixes = std::mem::take(&mut self.prefixes)
            .into_iter()
            .flat_map(|(prefix, ws)| {
                ws.into_iter()
                    .map(move |w| (Interest::Prefix(prefix.clone()), w))
            });
        keys.chain(prefixes)
    }

    /// Takes in a new listing and wakes the watchers whose keys changed since the last one;
    /// returns how many keys changed (every key, for the first listing).
    ///
    /// Linear in the listing, plus a binary search of the changed keys per watched prefix: a
    /// listing that changed everywhere (thousands of slots taken at once) is not compared with
    /// every prefix watcher key by key.
    pub(super) fn publish(&mut self, listing: Listing) -> usize {
        let listing = Arc::new(listing);
        let previous = self.latest.replace(Arc::clone(&listing));
        let view = || View::Read(Arc::clone(&listing));
        let Some(previous) = previous else {
            for (_, watcher) in self.all() {
                watcher.sender.send_replace(view());
            }
            return listing.entries.len();
        };
        // In key order, as both listings are.
        let changed = changed_keys(&previous.entries, &listing.entries);
        for key in &changed {
            for watcher in self.keys.get(*key).into_iter().flatten() {
                watcher.sender.send_replace(view());
            }
        }
        for (prefix, watchers) in &self.prefixes {
            if any_under(&changed, prefix) {
                for watcher in watchers {
                    watcher.sender.send_replace(view());
                }
            }
        }
        // The first listing at or past the index a watcher waits for wakes it, changed or not.
        // Every other watcher's view moves on to this listing without a wake-up, so none pins an
        // older one: watchers last woken at different times once kept hundreds of listings of
        // a 10,000-key directory alive.
        for (_, watcher) in self.all() {
            let wants = watcher.wants.load(Ordering::Acquire);
            if previous.index < wants && wants <= listing.index {
                watcher.sender.send_replace(view());
            } else {
                watcher.sender.send_if_modified(|current| {
                    if let View::Read(_) = current {
                        *current = view();
                    }
                    false
                });
            }
        }
        changed.len()
    }

    pub(super) fn all(&self) -> impl Iterator<Item = (&str, &Watcher)> {
        let keys = (self.keys.iter()).flat_map(|(k, ws)| ws.iter().map(move |w| (k.as_str(), w)));
        let prefixes =
            (self.prefixes.iter()).flat_map(|(p, ws)| ws.iter().map(move |w| (p.as_str(), w)));
        keys.chain(prefixes)
    }

    /// A blocking read covers the group again (its listing just came, and the next read
    /// follows at once): the suspended fences count their confirmations again.
    pub(super) fn read(&mut self) {
        if self.unread_since.take().is_some() {
            for (_, watcher) in self.all() {
                if let Some(fence) = &watcher.fence {
                    fence.resume();
                }
            }
        }
    }

    /// Nothing has read the group since `since` (a read failed): its watchers' fences are
    /// suspended from then.
    pub(super) fn unread(&mut self, since: Instant) {
        let since = self
            .unread_since
            .map_or(since, |earlier| earlier.min(since));
        self.unread_since = Some(since);
        for (_, watcher) in self.all() {
            if let Some(fence) = &watcher.fence {
                fence.suspend(since);
            }
        }
    }

    pub(super) fn trouble(&self, error: &ApiError) {
        for (_, watcher) in self.all() {
            if watcher.troubles {
                watcher.sender.send_replace(View::Trouble(error.clone()));
            }
        }
    }
}

/// Whether a key of `sorted` starts with `prefix`: the first key at or after `prefix` is the
/// only candidate.
fn any_under(sorted: &[&str], prefix: &str) -> bool {
    let at = sorted.partition_point(|key| *key < prefix);
    sorted.get(at).is_some_and(|key| key.starts_with(prefix))
}

/// The keys that differ between two sorted listings (added, removed or modified).
fn changed_keys<'a>(old: &'a [KvEntry], new: &'a [KvEntry]) -> Vec<&'a str> {
    let (mut i, mut j) = (0, 0);
    let mut changed = Vec::new();
    while i < old.len() || j < new.len() {
        match (old.get(i), new.get(j)) {
            (Some(a), Some(b)) if a.key == b.key => {
                if a.modify_index != b.modify_index || a != b {
                    changed.push(b.key.as_str());
                }
                i += 1;
                j += 1;
            }
            (Some(a), Some(b)) if a.key < b.key => {
                changed.push(a.key.as_str());
                i += 1;
            }
            (Some(_), Some(b)) => {
                changed.push(b.key.as_str());
                j += 1;
            }
            (Some(a), None) => {
                changed.push(a.key.as_str());
                i += 1;
            }
            (None, Some(b)) => {
                changed.push(b.key.as_str());
                j += 1;
            }
            (None, None) => break,
        }
    }
    changed
}

pub(super) fn lock(shared: &Shared) -> std::sync::MutexGuard<'_, Watchers> {
    shared
        .watchers
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests;
