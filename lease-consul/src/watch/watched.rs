//! What the client and the recipes hold: [`Watches`] (a client's watches) and a [`Watched`]
//! interest, the stream of its listings.

use std::sync::Arc;
use std::sync::PoisonError;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::watch;

use super::group::{Interest, Listing, View, Watcher, lock};
use super::registry::{Registration, Registry};
use crate::wire::{ApiError, ConsulHttp};
use lease_core::backend::Fence;

/// The watches of one client: its wire client, handed to each group's task as it starts, and
/// the registry of its groups. Cloning shares both.
#[derive(Clone, Debug)]
pub(crate) struct Watches {
    wire: Arc<ConsulHttp>,
    pub(super) registry: Arc<Registry>,
}

/// A watch of one interest; stops watching when dropped.
#[derive(Debug)]
pub(crate) struct Watched {
    view: watch::Receiver<View>,
    /// Whether the current view was returned already.
    seen: bool,
    /// The index this watch waits for, shared with its [`Watcher`].
    wants: Arc<AtomicU64>,
    _registration: Registration,
}

impl Watched {
    /// The next listing of index `min_index` or later in which this interest differs from the
    /// last one returned (the first call returns the current listing, once read). A failed read
    /// is returned only to a watch started with `troubles`.
    pub(crate) async fn next(&mut self, min_index: u64) -> Result<Arc<Listing>, ApiError> {
        self.wants.store(min_index, Ordering::Release);
        loop {
            // The sender lives in the registry while we are registered: it never goes away.
            if self.seen && self.view.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
            self.seen = true;
            let view = self.view.borrow_and_update().clone();
            match view {
                View::Read(listing) if listing.index >= min_index => return Ok(listing),
                View::Trouble(error) => return Err(error),
                View::Read(_) | View::Pending => {}
            }
        }
    }
}

impl Watches {
    /// The watches of `wire`'s client: at most as many groups as its budget has watch slots.
    pub(crate) fn new(wire: Arc<ConsulHttp>) -> Self {
        let registry = Registry::new(wire.budget().max_watches());
        Watches {
            wire,
            registry: Arc::new(registry),
        }
    }

    /// How many prefix watches are running, for measuring.
    pub(crate) fn groups(&self) -> usize {
        self.registry
            .groups
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Starts watching `interest`; with `troubles`, failed reads are reported too. The
    /// `fence` of a held lease is suspended whenever no read covers `interest` (see the module
    /// docs).
    pub(crate) fn watch(
        &self,
        interest: Interest,
        troubles: bool,
        fence: Option<&Fence>,
    ) -> Watched {
        let registry = &self.registry;
        let id = registry.next_id.fetch_add(1, Ordering::Relaxed);
        let (sender, view) = watch::channel(View::Pending);
        let wants = Arc::new(AtomicU64::new(0));
        let watcher = Watcher {
            id,
            troubles,
            sender,
            wants: Arc::clone(&wants),
            fence: fence.cloned(),
        };
        let mut groups = registry
            .groups
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let prefix = registry.group_for(&self.wire, &mut groups, interest.path());
        if let Some(group) = groups.get(&prefix) {
            lock(&group.shared).insert(interest.clone(), watcher);
        }
        drop(groups);
        Watched {
            view,
            seen: false,
            wants,
            _registration: Registration {
                registry: Arc::clone(registry),
                interest,
                id,
            },
        }
    }
}
