//! Which groups run: the registry that starts, widens and ends them (every interest covered by
//! exactly one group, no more groups than watch slots), and each group's task, handed the wire
//! client when it starts.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use super::group::{Interest, Listing, Shared, lock};
use crate::wire::{Blocking, ConsulHttp, WatchSlot};
use lease_http::backoff;

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

/// Which groups run, and who watches what in each.
#[derive(Debug)]
pub(super) struct Registry {
    pub(super) max_groups: usize,
    pub(super) groups: Mutex<BTreeMap<String, Group>>,
    /// Absorbed groups whose last read is still in flight, oldest first: a group that finds no
    /// watch slot free abandons one of them.
    retired: Mutex<Vec<Arc<Shared>>>,
    pub(super) next_id: AtomicU64,
}

#[derive(Debug)]
pub(super) struct Group {
    pub(super) shared: Arc<Shared>,
}

#[derive(Debug)]
pub(super) struct Registration {
    pub(super) registry: Arc<Registry>,
    pub(super) interest: Interest,
    pub(super) id: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.registry.remove(&self.interest, self.id);
    }
}

impl Registry {
    pub(super) fn new(max_groups: usize) -> Self {
        Registry {
            max_groups: max_groups.max(1),
            groups: Mutex::default(),
            retired: Mutex::default(),
            next_id: AtomicU64::new(0),
        }
    }

    /// The prefix of the group that covers `path`, started (or widened) if none does; a new
    /// group's task is handed `wire`.
    pub(super) fn group_for(
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
        lease_core::runtime::spawn(run(
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
    use crate::watch::Watched;
    use lease_core::backend::Fence;

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
            .max_connections(crate::wire::MIN_CONNECTIONS)
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
