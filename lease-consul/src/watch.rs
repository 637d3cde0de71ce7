//! Every blocking query of a client, multiplexed onto a few prefix watches.
//!
//! A held lease must notice at once when its key changes, and a waiting one when the key frees
//! up. One blocking query per lease would need one connection per lease (HTTP/1.1 carries one
//! request at a time), and Consul allows each client IP 200. Instead, a client watches **groups**:
//! prefixes that together cover every key and prefix some lease, waiter, observer or
//! semaphore coordinator is interested in. Each group is one recursive blocking query
//! (`GET /v1/kv/<group>?recurse&index=`); when it answers, the group compares the listing with
//! the previous one and wakes only the watchers whose keys changed.
//!
//! There are at most [`Budget::max_watches`](super::wire::Budget::max_watches) groups (all the
//! connections but two, or three with a client of your own), and no group's prefix is a prefix of
//! another's, so every key is covered by at most one group. A watcher whose key no group covers
//! gets a new group (of that key alone, so a process with a few leases watches each key on its own)
//! while there is room; otherwise the group sharing the longest prefix with it is widened to that
//! common prefix, absorbing any groups the wider prefix covers. A group nobody watches any more
//! stops after its current read (so a watcher that comes back meanwhile finds it still running).
//!
//! ## Every interest is read within one listing's time
//! Each group holds a watch slot of the client's budget for as long as it runs, so its reads
//! never queue behind other requests, and at most `max_watches` groups are registered. An
//! absorbed group's last read runs on until Consul answers it (abandoning it would close its
//! connection on our side, but Consul's agent counts the connection until the read's wait
//! ends), and keeps its slot meanwhile. A group that then finds no slot free does not wait for
//! it: it abandons the oldest such read and takes its slot. (Waiting left the wider group
//! without a read for up to one [`WATCH_WAIT`], 30 s, during which a lease whose key only it
//! covered went unwatched.) So the agent may count up to one connection more than the budget
//! per group started that way, for at most 30 s; our side never has more open than the budget.
//!
//! So a key, prefix or directory someone is interested in is always covered by a blocking read
//! in flight, except while its group reads a plain listing: when the group starts (or widens),
//! and after a read failed. That takes one listing: milliseconds, tens of them for a directory of
//! 10,000 keys, and never more than the request timeout. During such a gap, and for as long as a
//! group's reads fail, the [`Fence`]s of the leases it watches are suspended from the moment the
//! gap began: a lease whose key nobody reads self-fences one fence interval later at the latest,
//! however well its session is kept, and a listing that succeeds lifts the suspension. Idle, a
//! group costs one request per [`WATCH_WAIT`], whatever the number of leases.
//!
//! One more gap, bounded and deliberate: a directory that changes faster than it can be listed
//! (thousands of leases acquired at once: each answer brings 16 keys changed or more, at once)
//! would be listed back to back, and on a 2-core machine the agent's listings then slow the very
//! writes they report (10,000 acquisitions took 6.3 s, against 4.7 s with the pause). After such
//! an answer the group waits twice as long as the read took, at most 150 ms, before reading on.
//! Nothing is missed (the next read starts from the last index, so it answers at once with
//! whatever changed meanwhile), only seen up to 150 ms later, and only while the directory is
//! that busy: an answer that brings a change or two (a loss, a hand-off) is never followed by a
//! pause.
//!
//! Groups are not split further, because with prefixes that may not nest they cannot be: a
//! directory's watched keys can be split only into prefixes that together cover them all, and
//! keys named `<dir>/0` … `<dir>/4999` begin with ten different digits, so any split of them
//! takes ten groups or more, past the budget; hex or UUID names take sixteen. Nested groups
//! would not read less: the outer one would still re-read the whole directory on every change
//! inside it.
//!
//! The cost of this multiplexing is that an answer carries every key under its group: a loss
//! among 5,000 keys under one directory is read as a listing of 5,000 entries (1.4 MB). Consul
//! 1.8 spends 3–5 µs an entry on it (12–25 ms, with the machine's load; its `?keys` listing of
//! the same keys takes 4 ms), the client about 1 µs an entry parsing it and well under 1 ms
//! comparing and waking: 18–37 ms from destroy to cancel at the median, against about 1 ms for
//! a one-key blocking query. Consul 1.8 has no cheaper way to learn which of many keys changed:
//! its KV listing has no filter and no paging, and a separator-folded `?keys` listing, though
//! tiny, says only *that* something under a directory changed.
//!
//! Answers are read in Consul's default consistency mode. A watcher never acts on a listing
//! older than what it already knows: each listing carries its index, and a watcher that wrote
//! at index `i` waits for a listing of index `i` or later.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::retry::backoff;
use super::wire::{ApiError, Blocking, ConsulHttp, KvEntry, WatchSlot};
use lease_core::backend::Fence;

/// How long one blocking query waits before Consul answers unchanged.
///
/// An answer that does not come within this (plus Consul's jitter and a request timeout) ends
/// the read as failed, so a silent network is noticed by observers within about 45 s; idle, the
/// watches of a client send a few requests a minute whatever the number of leases.
pub(crate) const WATCH_WAIT: Duration = Duration::from_secs(30);

/// A blocking read answered within this did not block: its directory may be busy (see the
/// module docs).
const BUSY_ANSWER: Duration = Duration::from_millis(250);

/// How many keys a listing must bring changed for its directory to count as busy.
const BUSY_CHANGES: usize = 16;

/// The longest pause between two reads of a busy directory.
const BUSY_PAUSE: Duration = Duration::from_millis(150);

/// What a watcher is interested in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Interest {
    /// One key.
    Key(String),
    /// Every key under a prefix (a semaphore's `<prefix>/`).
    Prefix(String),
}

impl Interest {
    fn path(&self) -> &str {
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
    fn new(mut entries: Vec<KvEntry>, index: u64) -> Listing {
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
enum View {
    /// Nothing read yet.
    Pending,
    /// The latest listing of the group that covers the interest.
    Read(Arc<Listing>),
    /// The group's last read failed (sent only to watchers that asked for failures); the group
    /// retries with backoff.
    Trouble(ApiError),
}

/// The watches of one client: its wire client, handed to each group's task as it starts, and
/// the registry of its groups. Cloning shares both.
#[derive(Clone, Debug)]
pub(crate) struct Watches {
    wire: Arc<ConsulHttp>,
    registry: Arc<Registry>,
}

/// Which groups run, and who watches what in each.
#[derive(Debug)]
struct Registry {
    max_groups: usize,
    groups: Mutex<BTreeMap<String, Group>>,
    /// Absorbed groups whose last read is still in flight, oldest first: a group that finds no
    /// watch slot free abandons one of them.
    retired: Mutex<Vec<Arc<Shared>>>,
    next_id: AtomicU64,
}

#[derive(Debug)]
struct Group {
    shared: Arc<Shared>,
}

/// What a group's task and its registry share.
#[derive(Debug)]
struct Shared {
    watchers: Mutex<Watchers>,
    /// Absorbed by a wider group: the task ends after its current read.
    retired: AtomicBool,
    /// A group that needs the slot of this retired one: the task ends at once, abandoning its
    /// read.
    abandon: CancellationToken,
}

impl Shared {
    /// A group about to start: nothing read yet.
    fn new() -> Self {
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
struct Watchers {
    /// Watchers of one key, by key.
    keys: HashMap<String, Vec<Watcher>>,
    /// Watchers of a prefix, by prefix (every slot holder of a semaphore watches its
    /// directory, so thousands of watchers may share a hundred prefixes).
    prefixes: HashMap<String, Vec<Watcher>>,
    /// The group's latest listing.
    latest: Option<Arc<Listing>>,
    /// Since when no blocking read covers the group (it has not read yet, or its reads fail):
    /// the fences of its watchers are suspended from then on. `None` while a read is in flight.
    unread_since: Option<Instant>,
}

#[derive(Debug)]
struct Watcher {
    id: u64,
    troubles: bool,
    sender: watch::Sender<View>,
    /// The index the watcher waits for (see [`Watched::next`]): the first listing at or past it
    /// wakes the watcher even if its key looks unchanged since the previous listing. (A key
    /// created and deleted between two listings looks unchanged, yet a holder that acquired it
    /// waits for exactly that news.)
    wants: Arc<AtomicU64>,
    /// The fence of the lease this watch keeps: suspended while nothing reads the key.
    fence: Option<Fence>,
}

impl Watchers {
    fn is_empty(&self) -> bool {
        self.keys.is_empty() && self.prefixes.is_empty()
    }

    fn insert(&mut self, interest: Interest, watcher: Watcher) {
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

    fn remove(&mut self, interest: &Interest, id: u64) {
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

    fn drain(&mut self) -> impl Iterator<Item = (Interest, Watcher)> + '_ {
        let keys = self
            .keys
            .drain()
            .flat_map(|(key, ws)| ws.into_iter().map(move |w| (Interest::Key(key.clone()), w)));
        let prefixes = self.prefixes.drain().flat_map(|(prefix, ws)| {
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
    fn publish(&mut self, listing: Listing) -> usize {
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

    fn all(&self) -> impl Iterator<Item = (&str, &Watcher)> {
        let keys = (self.keys.iter()).flat_map(|(k, ws)| ws.iter().map(move |w| (k.as_str(), w)));
        let prefixes =
            (self.prefixes.iter()).flat_map(|(p, ws)| ws.iter().map(move |w| (p.as_str(), w)));
        keys.chain(prefixes)
    }

    /// A blocking read covers the group again (its listing just came, and the next read
    /// follows at once): the suspended fences count their confirmations again.
    fn read(&mut self) {
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
    fn unread(&mut self, since: Instant) {
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

    fn trouble(&self, error: &ApiError) {
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

#[derive(Debug)]
struct Registration {
    registry: Arc<Registry>,
    interest: Interest,
    id: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.registry.remove(&self.interest, self.id);
    }
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

impl Registry {
    fn new(max_groups: usize) -> Self {
        Registry {
            max_groups: max_groups.max(1),
            groups: Mutex::default(),
            retired: Mutex::default(),
            next_id: AtomicU64::new(0),
        }
    }

    /// The prefix of the group that covers `path`, started (or widened) if none does; a new
    /// group's task is handed `wire`.
    fn group_for(
        self: &Arc<Self>,
        wire: &Arc<ConsulHttp>,
        groups: &mut BTreeMap<String, Group>,
        path: &str,
    ) -> String {
        if let Some(prefix) = covering(groups, path) {
            return prefix;
        }
        let wanted = new_group(groups.keys().map(String::as_str), self.max_groups, path);
        // Absorb the groups the new prefix covers: their watchers move over, and are sent the
        // new group's first listing.
        let absorbed: Vec<String> = groups
            .keys()
            .filter(|g| g.starts_with(wanted.as_str()))
            .cloned()
            .collect();
        let shared = Arc::new(Shared::new());
        {
            let mut retired = self.retired.lock().unwrap_or_else(PoisonError::into_inner);
            let mut moved = lock(&shared);
            for prefix in absorbed {
                if let Some(old) = groups.remove(&prefix) {
                    old.shared.retired.store(true, Ordering::Release);
                    retired.push(Arc::clone(&old.shared));
                    for (interest, watcher) in lock(&old.shared).drain() {
                        moved.insert(interest, watcher);
                    }
                }
            }
        }
        tracing::debug!(prefix = %wanted, groups = groups.len() + 1, "watching a Consul prefix");
        tokio::spawn(run(
            Arc::clone(wire),
            Arc::clone(self),
            wanted.clone(),
            Arc::clone(&shared),
        ));
        groups.insert(wanted.clone(), Group { shared });
        wanted
    }

    /// Waits for a watch slot for a group's task: at once if one is free. Otherwise every slot
    /// is held by a registered group or by an absorbed group's last read (registered groups
    /// never outnumber the slots, and this one is registered): the oldest such read is abandoned
    /// and its slot taken, rather than wait up to [`WATCH_WAIT`] for it to end.
    async fn slot<'a>(&self, wire: &'a ConsulHttp) -> WatchSlot<'a> {
        let waiting = wire.budget().watch_slot();
        tokio::pin!(waiting);
        tokio::select! {
            biased;
            slot = &mut waiting => return slot,
            () = std::future::ready(()) => {}
        }
        let oldest = {
            let mut retired = self.retired.lock().unwrap_or_else(PoisonError::into_inner);
            (!retired.is_empty()).then(|| retired.remove(0))
        };
        if let Some(oldest) = oldest {
            oldest.abandon.cancel();
        }
        waiting.await
    }

    /// A retired group's task has ended: nobody need abandon it any more.
    fn ended(&self, shared: &Arc<Shared>) {
        let mut retired = self.retired.lock().unwrap_or_else(PoisonError::into_inner);
        retired.retain(|r| !Arc::ptr_eq(r, shared));
    }

    fn remove(&self, interest: &Interest, id: u64) {
        let groups = self.groups.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(group) = covering(&groups, interest.path()).and_then(|p| groups.get(&p)) {
            lock(&group.shared).remove(interest, id);
        }
    }

    /// Whether the group task of `prefix` (sharing `shared`) should end: it was absorbed, or
    /// nobody watches it any more (then it leaves the registry).
    fn ends(&self, prefix: &str, shared: &Arc<Shared>) -> bool {
        if shared.retired.load(Ordering::Acquire) {
            return true;
        }
        let mut groups = self.groups.lock().unwrap_or_else(PoisonError::into_inner);
        let ours = groups
            .get(prefix)
            .is_some_and(|g| Arc::ptr_eq(&g.shared, shared));
        if !ours {
            return true;
        }
        if lock(shared).is_empty() {
            groups.remove(prefix);
            return true;
        }
        false
    }
}

fn lock(shared: &Shared) -> std::sync::MutexGuard<'_, Watchers> {
    shared
        .watchers
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
}

/// The group whose prefix covers `path` (there is at most one).
fn covering(groups: &BTreeMap<String, Group>, path: &str) -> Option<String> {
    // A covering prefix sorts at or before `path`; the nearest one before it that is a prefix
    // is the only candidate, since no group's prefix is a prefix of another's.
    groups
        .range::<str, _>((std::ops::Bound::Unbounded, std::ops::Bound::Included(path)))
        .next_back()
        .filter(|(prefix, _)| path.starts_with(prefix.as_str()))
        .map(|(prefix, _)| prefix.clone())
}

/// The prefix of the group to start for `path`, which no group of `existing` covers: `path`
/// itself while there are fewer than `max` groups (a process with a few leases watches each key
/// on its own, whatever else its directory holds), else the longest prefix `path` shares with
/// an existing group (which absorbs every group it covers).
fn new_group<'a>(existing: impl Iterator<Item = &'a str>, max: usize, path: &str) -> String {
    let existing: Vec<&str> = existing.collect();
    if existing.len() < max {
        return path.to_owned();
    }
    let closest = existing
        .iter()
        .max_by_key(|g| common_prefix(g, path).len())
        .copied()
        .unwrap_or_default();
    common_prefix(closest, path).to_owned()
}

fn common_prefix<'a>(a: &'a str, b: &str) -> &'a str {
    let len = a
        .char_indices()
        .zip(b.chars())
        .take_while(|((_, x), y)| x == y)
        .last()
        .map_or(0, |((at, x), _)| at + x.len_utf8());
    &a[..len]
}

/// A group's task: reads until the group ends, or until a group that needs its slot abandons
/// its read (it was absorbed).
async fn run(wire: Arc<ConsulHttp>, registry: Arc<Registry>, prefix: String, shared: Arc<Shared>) {
    tokio::select! {
        biased;
        () = shared.abandon.cancelled() => {}
        () = read(&wire, &registry, &prefix, &shared) => {}
    }
    registry.ended(&shared);
}

/// A group's blocking query loop, under one watch slot: read, publish, repeat; failures are
/// retried with backoff (the outage gate of the client bounds how often).
///
/// The first read, and the first after a failure, is a plain listing: it answers at once, so the
/// group knows when a read covers it again (a blocking read that answers 30 s later could not
/// say it had been covering all along).
async fn read(wire: &ConsulHttp, registry: &Registry, prefix: &str, shared: &Arc<Shared>) {
    let slot = registry.slot(wire).await;
    let mut index = 0;
    let mut blocks = false;
    let mut backoff = backoff();
    while !registry.ends(prefix, shared) {
        let blocking = blocks.then_some(Blocking {
            index,
            wait: WATCH_WAIT,
        });
        let sent = Instant::now();
        match wire.kv_watch(prefix, blocking, &slot).await {
            Ok((entries, new_index)) => {
                backoff.reset();
                // Consul's rule for blocking queries: an index that went backwards means start
                // over; an index of 0 is never blocked on.
                index = if new_index < index {
                    0
                } else {
                    new_index.max(1)
                };
                blocks = index > 0;
                let changed = {
                    let mut watchers = lock(shared);
                    let changed = watchers.publish(Listing::new(entries, new_index));
                    watchers.read();
                    changed
                };
                // A blocking read that answered at once with many keys changed found the
                // directory changing faster than it can be listed (thousands of leases being
                // acquired): listed back to back, it takes the agent's CPU from the writes
                // themselves. The next read waits as long as this one took, at most
                // `BUSY_PAUSE` (see the module docs for the bound). A read that brings a change
                // or two (a loss, a hand-off) is never followed by a pause.
                let took = sent.elapsed();
                if blocking.is_some() && took < BUSY_ANSWER && changed >= BUSY_CHANGES {
                    tokio::time::sleep((took * 2).min(BUSY_PAUSE)).await;
                }
            }
            Err(error) => {
                tracing::debug!(%prefix, %error, "watching a Consul prefix failed; retrying");
                // The read covered the group until its failure was noticed, or until a healthy
                // answer would have come, whichever was first.
                let answer_by = sent + blocking.map_or(Duration::ZERO, |b| b.wait + b.wait / 16);
                {
                    let mut watchers = lock(shared);
                    watchers.unread(Instant::now().min(answer_by));
                    watchers.trouble(&error);
                }
                blocks = false;
                backoff.wait().await;
            }
        }
    }
}

/// What the model test of the bookkeeping inspects.
#[cfg(test)]
impl Registry {
    /// The interests no running read covers now (their group has not read yet, or its reads
    /// fail), and any broken rule of the registry: a watcher outside its group's prefix, nested
    /// groups, more groups than slots.
    fn uncovered(&self) -> Vec<String> {
        let groups = self.groups.lock().unwrap_or_else(PoisonError::into_inner);
        let mut problems = Vec::new();
        if groups.len() > self.max_groups {
            problems.push(format!(
                "{} groups, at most {}",
                groups.len(),
                self.max_groups
            ));
        }
        for (prefix, group) in groups.iter() {
            if let Some(outer) = groups
                .keys()
                .find(|other| *other != prefix && prefix.starts_with(other.as_str()))
            {
                problems.push(format!("group {prefix:?} nested in {outer:?}"));
            }
            if group.shared.retired.load(Ordering::Acquire) {
                problems.push(format!("group {prefix:?} is retired but registered"));
            }
            let watchers = lock(&group.shared);
            for (path, _) in watchers.all() {
                if !path.starts_with(prefix.as_str()) {
                    problems.push(format!("{path:?} watched by group {prefix:?}"));
                }
                if watchers.unread_since.is_some() {
                    problems.push(format!("{path:?} unread (group {prefix:?})"));
                }
            }
        }
        problems
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(key: &str, modify_index: u64) -> KvEntry {
        KvEntry {
            key: key.into(),
            flags: 0,
            value: None,
            session: None,
            lock_index: 0,
            modify_index,
            create_index: modify_index,
        }
    }

    #[test]
    fn only_changed_keys_are_reported() {
        let old = [entry("a", 1), entry("b", 2), entry("c", 3)];
        let new = [entry("a", 1), entry("b", 5), entry("d", 6)];
        assert_eq!(changed_keys(&old, &new), ["b", "c", "d"]);
        assert!(changed_keys(&new, &new).is_empty());
    }

    #[test]
    fn a_prefix_is_found_among_sorted_changed_keys() {
        let changed = ["d/a", "d/b/1", "d/c", "e"];
        assert!(any_under(&changed, "d/b/"));
        assert!(any_under(&changed, "d/"));
        assert!(any_under(&changed, ""));
        assert!(!any_under(&changed, "d/ba"));
        assert!(!any_under(&changed, "c"));
        assert!(!any_under(&changed, "f"));
        assert!(!any_under(&[], "d/"));
    }

    /// Registers a watcher of `interest` and returns what it is sent.
    fn watcher(watchers: &mut Watchers, interest: Interest, id: u64) -> watch::Receiver<View> {
        watcher_wanting(watchers, interest, id, Arc::default())
    }

    fn watcher_wanting(
        watchers: &mut Watchers,
        interest: Interest,
        id: u64,
        wants: Arc<AtomicU64>,
    ) -> watch::Receiver<View> {
        let (sender, view) = watch::channel(View::Pending);
        let troubles = false;
        watchers.insert(
            interest,
            Watcher {
                id,
                troubles,
                sender,
                wants,
                fence: None,
            },
        );
        view
    }

    /// A key created and deleted between two listings looks unchanged; a holder that acquired it
    /// at index 5 and waits for a listing of index 5 or later is woken by the first such listing
    /// all the same (it used to wait for the next change of its key, possibly forever).
    #[test]
    fn the_first_listing_past_the_wanted_index_wakes_the_watcher_even_if_its_key_did_not_change() {
        let mut watchers = Watchers::default();
        let key = Interest::Key("k".into());
        let wants = Arc::new(AtomicU64::new(0));
        let mut holder = watcher_wanting(&mut watchers, key.clone(), 0, Arc::clone(&wants));
        let mut bystander = watcher(&mut watchers, key, 1);
        watchers.publish(Listing::new(vec![entry("other", 1)], 3));
        holder.mark_unchanged();
        bystander.mark_unchanged();
        wants.store(5, Ordering::Release);
        // Below the wanted index, and `k` unchanged (absent): nobody is woken.
        watchers.publish(Listing::new(vec![entry("other", 4)], 4));
        assert!(!holder.has_changed().unwrap() && !bystander.has_changed().unwrap());
        // `k` was created at 5 and deleted at 6: absent in both listings, but 6 >= 5.
        watchers.publish(Listing::new(vec![entry("other", 4)], 6));
        assert!(
            holder.has_changed().unwrap(),
            "the holder waiting for index 5 was not woken"
        );
        assert!(!bystander.has_changed().unwrap());
        holder.mark_unchanged();
        // Once past it, only changes wake it again.
        watchers.publish(Listing::new(vec![entry("other", 4)], 7));
        assert!(!holder.has_changed().unwrap());
    }

    #[test]
    fn a_listing_wakes_only_the_watchers_of_changed_keys_and_prefixes() {
        let mut watchers = Watchers::default();
        let key = |k: &str| Interest::Key(k.into());
        let prefix = |p: &str| Interest::Prefix(p.into());
        let mut a = watcher(&mut watchers, key("d/a"), 0);
        let mut b = watcher(&mut watchers, key("d/b"), 1);
        let mut sem = watcher(&mut watchers, prefix("d/s/"), 2);
        let mut sem_too = watcher(&mut watchers, prefix("d/s/"), 3);
        let mut other = watcher(&mut watchers, prefix("d/t/"), 4);
        let listing = |entries| Listing::new(entries, 1);
        watchers.publish(listing(vec![entry("d/a", 1), entry("d/s/x", 1)]));
        for view in [&mut a, &mut b, &mut sem, &mut sem_too, &mut other] {
            assert!(view.has_changed().unwrap(), "the first listing goes to all");
            view.mark_unchanged();
        }
        watchers.publish(listing(vec![entry("d/a", 1), entry("d/s/x", 2)]));
        let woken = |views: [&mut watch::Receiver<View>; 5]| {
            views.map(|v| {
                // A removed watcher's sender is gone: it is never woken again.
                let woken = v.has_changed().unwrap_or(false);
                v.mark_unchanged();
                woken
            })
        };
        assert_eq!(
            woken([&mut a, &mut b, &mut sem, &mut sem_too, &mut other]),
            [false, false, true, true, false]
        );
        // A new key wakes its watcher, a deleted one its prefix's.
        watchers.publish(listing(vec![entry("d/a", 1), entry("d/b", 3)]));
        assert_eq!(
            woken([&mut a, &mut b, &mut sem, &mut sem_too, &mut other]),
            [false, true, true, true, false]
        );
        // A removed watcher is not woken; the others of its prefix still are.
        watchers.remove(&prefix("d/s/"), 2);
        assert!(sem.has_changed().is_err(), "a removed watcher is dropped");
        watchers.publish(listing(vec![entry("d/b", 3), entry("d/s/y", 4)]));
        assert_eq!(
            woken([&mut a, &mut b, &mut sem, &mut sem_too, &mut other]),
            [true, false, false, true, false]
        );
        watchers.remove(&prefix("d/s/"), 3);
        assert!(
            !watchers.prefixes.contains_key("d/s/"),
            "emptied prefixes go"
        );
        assert_eq!(watchers.drain().count(), 3);
        assert!(watchers.is_empty());
    }

    /// While nothing reads a group, the fences of its leases are suspended from when that began
    /// (a lease that joins meanwhile from when it joined); a listing lifts it, and a lease that
    /// leaves takes its fence along unsuspended.
    #[tokio::test(start_paused = true)]
    async fn fences_are_suspended_while_their_group_is_unread() {
        let mut watchers = Watchers {
            unread_since: Some(Instant::now()),
            ..Watchers::default()
        };
        let fence = || Fence::new(Duration::from_secs(10), Instant::now());
        let (a, b) = (fence(), fence());
        let started = Instant::now();
        let with_fence = |id, fence: &Fence| {
            let (sender, _) = watch::channel(View::Pending);
            Watcher {
                id,
                troubles: false,
                sender,
                wants: Arc::default(),
                fence: Some(fence.clone()),
            }
        };
        tokio::time::sleep(Duration::from_secs(1)).await;
        watchers.insert(Interest::Key("a".into()), with_fence(0, &a));
        assert_eq!(a.suspended_since(), Some(started + Duration::from_secs(1)));
        watchers.publish(Listing::new(vec![entry("a", 1)], 1));
        watchers.read();
        assert_eq!(a.suspended_since(), None);

        // A read failed: it covered the group until `failed`.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let failed = Instant::now();
        watchers.insert(Interest::Key("b".into()), with_fence(1, &b));
        assert_eq!(b.suspended_since(), None, "a read covers the group");
        tokio::time::sleep(Duration::from_secs(1)).await;
        watchers.unread(failed);
        watchers.unread(Instant::now());
        assert_eq!(a.suspended_since(), Some(failed));
        assert_eq!(b.suspended_since(), Some(failed));
        // Renewals no longer move the deadline: the lease self-fences 10 s after the failure.
        a.confirm(Instant::now());
        assert_eq!(a.deadline(), Some(failed + Duration::from_secs(10)));

        watchers.remove(&Interest::Key("b".into()), 1);
        assert_eq!(b.suspended_since(), None, "a lease that left");
        watchers.read();
        assert_eq!(a.suspended_since(), None);
        assert_eq!(a.deadline(), Some(Instant::now() + Duration::from_secs(10)));
    }

    #[test]
    fn listings_find_keys_and_prefixes() {
        let listing = Listing::new(
            vec![
                entry("s/b", 1),
                entry("s/a/x", 1),
                entry("s/a/.lock", 1),
                entry("s/ab", 1),
            ],
            7,
        );
        assert_eq!(listing.get("s/b").map(|e| e.key.as_str()), Some("s/b"));
        assert!(listing.get("s/c").is_none());
        let under: Vec<_> = listing.under("s/a/").iter().map(|e| &e.key).collect();
        assert_eq!(under, ["s/a/.lock", "s/a/x"]);
    }

    /// Groups as [`Watches`] keeps them: each new path joins a covering group, or gets one from
    /// [`new_group`], which absorbs the groups it covers.
    fn grouped(paths: &[&str], max: usize) -> Vec<String> {
        let mut groups: Vec<String> = Vec::new();
        for path in paths {
            if groups.iter().any(|g| path.starts_with(g.as_str())) {
                continue;
            }
            let wanted = new_group(groups.iter().map(String::as_str), max, path);
            groups.retain(|g| !g.starts_with(wanted.as_str()));
            groups.push(wanted);
        }
        groups.sort();
        groups
    }

    #[test]
    fn a_few_keys_are_watched_alone_and_many_under_their_common_prefixes() {
        assert_eq!(
            grouped(&["svc/a/leader", "svc/b/leader"], 5),
            ["svc/a/leader", "svc/b/leader"]
        );
        let mut many: Vec<String> = (0..50).map(|i| format!("scale/leader/{i}")).collect();
        many.extend((0..20).map(|i| format!("scale/sem/{i}/")));
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        assert_eq!(grouped(&many, 5), ["scale/leader/", "scale/sem/"]);
        // Nothing shared at all: the whole store, rather than more watches than connections.
        assert_eq!(grouped(&["a", "b", "c"], 2), [""]);
    }

    #[test]
    fn common_prefixes_respect_characters() {
        assert_eq!(common_prefix("jobs/a/", "jobs/b/"), "jobs/");
        assert_eq!(common_prefix("é/x", "é/y"), "é/");
        assert_eq!(common_prefix("x", "y"), "");
    }

    /// The model test of the bookkeeping, against a real agent: under random sequences of
    /// watches and unwatches on keys and prefixes that nest and diverge (so groups are started,
    /// widened and absorbed, with reads in flight, on a budget of two watches), every interest is
    /// covered by a running read within a listing's time, the registry keeps its rules, and a
    /// lease's fence is suspended only during such a gap.
    #[tokio::test]
    async fn every_interest_is_read_within_a_listing_under_any_reshaping() {
        use lease_tests::consul::Agent;
        const PATHS: [&str; 12] = [
            "m/a/1", "m/a/2", "m/a/", "m/b/1", "m/b/", "m/", "n/x/1", "n/y", "o", "op/1", "p/q/",
            "p/q/r",
        ];
        /// Far below the 30 s a key once went unread, far above a listing's few milliseconds on
        /// a loaded machine.
        const BOUND: Duration = Duration::from_secs(2);
        let agent = Agent::start().await;
        for (key, value) in [("m/a/1", "x"), ("n/y", "y"), ("p/q/r", "z")] {
            agent.put_key(key, value.as_bytes(), 0).await;
        }
        let consul = crate::Consul::builder()
            .address(agent.url())
            .max_connections(super::super::wire::MIN_CONNECTIONS)
            .build()
            .unwrap();
        let watches = consul.client().watches().clone();
        let mut slowest = Duration::ZERO;
        for seed in 1..=8_u64 {
            let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
            let mut random = move |below: usize| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                usize::try_from(state % below as u64).unwrap_or_default()
            };
            let mut watched: Vec<(Watched, Fence)> = Vec::new();
            for step in 0..40 {
                if watched.is_empty() || random(3) > 0 {
                    let path = PATHS[random(PATHS.len())];
                    let interest = if path.ends_with('/') {
                        Interest::Prefix(path.into())
                    } else {
                        Interest::Key(path.into())
                    };
                    let fence = Fence::new(Duration::from_secs(60), Instant::now());
                    let watch = watches.watch(interest, false, Some(&fence));
                    watched.push((watch, fence));
                } else {
                    let (watch, fence) = watched.swap_remove(random(watched.len()));
                    drop(watch);
                    assert_eq!(fence.suspended_since(), None, "a fence left suspended");
                }
                let started = Instant::now();
                loop {
                    let uncovered = watches.registry.uncovered();
                    if uncovered.is_empty() {
                        break;
                    }
                    assert!(
                        started.elapsed() < BOUND,
                        "seed {seed}, step {step}: not covered within {BOUND:?}: {uncovered:?}"
                    );
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                slowest = slowest.max(started.elapsed());
                for (_, fence) in &watched {
                    assert_eq!(
                        fence.suspended_since(),
                        None,
                        "seed {seed}, step {step}: a covered lease's fence is suspended"
                    );
                }
            }
        }
        eprintln!("slowest time to coverage: {slowest:?}");
    }
}
