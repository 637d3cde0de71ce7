//! Watches: etcd's watch server (`v3rpc/watch.go`) over its watchable store
//! (`mvcc/watchable_store.go`), as one client stream sees them.
//!
//! A stream carries many watches, each under an ID of the client's choosing (or the stream's
//! next free one, from 0, for ID 0). Creating one answers `created` at once, with the current
//! revision; then:
//! - a watch from the next revision on (or later) is **synced**: every write transaction
//!   sends it one answer with that revision's events in its range, as the write commits;
//! - a watch from a past revision is **unsynced** until the store's sync loop
//!   (every [`Config::sync_interval`](super::config::Config)) sends it the events since then from the
//!   history (up to 1,000 revisions an answer), with
//!   the current revision; a watch whose start was compacted away is answered
//!   `compact_revision` (and `canceled`) there instead, with revision 0.
//!
//! With `prev_kv`, each event but a key's creation carries the key as it was the revision
//! before, if that is not compacted. With `progress_notify`, a watch that was sent nothing for a
//! whole progress interval (10 minutes and up to a tenth more, drawn per stream) is sent an
//! empty answer with the current revision. A cancel answers `canceled`; a watch etcd refused
//! (duplicate ID, empty range, no permission) answers `created` and `canceled` with ID -1 and the
//! reason. Fragmentation is never asked for by the client, so never done.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use lease_etcd::proto::{Event, ResponseHeader, WatchCreateRequest, WatchResponse};

use super::error;
use super::mvcc::{Span, Store};

/// Where a stream's answers go (the response stream the client reads).
pub(crate) type Outbox = mpsc::UnboundedSender<Result<WatchResponse, tonic::Status>>;

/// The most revisions one catch-up answer covers (`watchBatchMaxRevs`).
const BATCH_MAX_REVS: usize = 1000;

/// The ID of a refused watch (`clientv3.InvalidWatchID`).
const INVALID_WATCH_ID: i64 = -1;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Synced,
    Unsynced,
    /// Its start was compacted away: answered so, and dead, though its ID stays taken until the
    /// client cancels it (as etcd's watch stream keeps it).
    Compacted,
}

#[derive(Debug)]
struct Watcher {
    span: Span,
    /// The first revision not sent yet.
    min_rev: i64,
    phase: Phase,
    prev_kv: bool,
    /// With `progress_notify`: whether nothing was sent since the last progress tick.
    idle: Option<bool>,
}

/// One client stream.
#[derive(Debug)]
struct Stream {
    outbox: Outbox,
    /// The stream's auth token (its metadata), checked at each creation.
    token: Option<String>,
    watchers: BTreeMap<i64, Watcher>,
    next_auto_id: i64,
    progress_every: Duration,
    next_progress: Instant,
}

/// Every watch stream.
#[derive(Debug)]
pub(crate) struct Watches {
    streams: BTreeMap<u64, Stream>,
    last_stream: u64,
    /// The sync loop's next turn, and its period.
    sync_at: Instant,
    sync_every: Duration,
}

fn header(revision: i64) -> Option<ResponseHeader> {
    Some(ResponseHeader { revision })
}

/// Sends `answer` into `outbox`; false if the client is gone.
fn deliver(outbox: &Outbox, answer: WatchResponse) -> bool {
    outbox.send(Ok(answer)).is_ok()
}

/// `events` with the key as it was before each (see the module docs), if the watch asked.
fn with_prev(store: &Store, events: Vec<Event>, prev_kv: bool) -> Vec<Event> {
    if !prev_kv {
        return events;
    }
    events
        .into_iter()
        .map(|mut event| {
            event.prev_kv = store.prev_kv(&event);
            event
        })
        .collect()
}

impl Watches {
    pub(crate) fn new(sync_at: Instant, sync_every: Duration) -> Watches {
        Watches {
            streams: BTreeMap::new(),
            last_stream: 0,
            sync_at,
            sync_every: sync_every.max(Duration::from_micros(1)),
        }
    }

    /// A new stream answering into `outbox`, with the client's `token`; `progress_every`: its
    /// progress interval. Returns its number.
    pub(crate) fn open(
        &mut self,
        outbox: Outbox,
        token: Option<String>,
        progress_every: Duration,
        now: Instant,
    ) -> u64 {
        self.last_stream += 1;
        let stream = Stream {
            outbox,
            token,
            watchers: BTreeMap::new(),
            next_auto_id: 0,
            progress_every,
            next_progress: now.checked_add(progress_every).unwrap_or(now),
        };
        self.streams.insert(self.last_stream, stream);
        self.last_stream
    }

    /// Ends stream `id` (the client went), with its watches.
    pub(crate) fn close(&mut self, id: u64) {
        self.streams.remove(&id);
    }

    /// Ends every stream (a restart): their clients see them end.
    pub(crate) fn close_all(&mut self) {
        self.streams.clear();
    }

    pub(crate) fn token(&self, stream: u64) -> Option<&str> {
        self.streams.get(&stream)?.token.as_deref()
    }

    /// How many watches are open, over every stream (compacted ones not counted).
    pub(crate) fn count(&self) -> usize {
        self.streams
            .values()
            .flat_map(|s| s.watchers.values())
            .filter(|w| w.phase != Phase::Compacted)
            .count()
    }

    /// Answers a creation etcd refused before it reached the store (no permission): `reason`.
    pub(crate) fn refuse(&mut self, stream: u64, reason: String, store: &Store) {
        self.refused(stream, reason, store.rev());
    }

    fn refused(&mut self, stream: u64, reason: String, rev: i64) {
        let answer = WatchResponse {
            header: header(rev),
            watch_id: INVALID_WATCH_ID,
            created: true,
            canceled: true,
            cancel_reason: reason,
            ..WatchResponse::default()
        };
        self.send(stream, answer);
    }

    /// Creates a watch on `stream`; true if it starts unsynced (the sync loop has work).
    pub(crate) fn create(
        &mut self,
        stream: u64,
        create: &WatchCreateRequest,
        store: &Store,
    ) -> bool {
        let rev = store.rev();
        let Some(s) = self.streams.get_mut(&stream) else {
            return false;
        };
        let key = if create.key.is_empty() {
            vec![0]
        } else {
            create.key.clone()
        };
        let span = Span::of(&key, &create.range_end);
        if let Span::Range(from, end) = &span {
            if from >= end {
                self.refused(stream, error::EMPTY_WATCHER_RANGE.to_owned(), rev);
                return false;
            }
        }
        let id = if create.watch_id == 0 {
            while s.watchers.contains_key(&s.next_auto_id) {
                s.next_auto_id += 1;
            }
            s.next_auto_id += 1;
            s.next_auto_id - 1
        } else {
            create.watch_id
        };
        if s.watchers.contains_key(&id) {
            self.refused(stream, error::DUPLICATE_WATCH_ID.to_owned(), rev);
            return false;
        }
        let start = if create.start_revision == 0 {
            rev + 1
        } else {
            create.start_revision
        };
        let synced = start > rev;
        let watcher = Watcher {
            span,
            min_rev: if synced { start.max(rev + 1) } else { start },
            phase: if synced {
                Phase::Synced
            } else {
                Phase::Unsynced
            },
            prev_kv: create.prev_kv,
            idle: create.progress_notify.then_some(true),
        };
        s.watchers.insert(id, watcher);
        let created = WatchResponse {
            header: header(rev),
            watch_id: id,
            created: true,
            ..WatchResponse::default()
        };
        self.send(stream, created);
        !synced
    }

    /// Cancels watch `id` of `stream`, if it has one.
    pub(crate) fn cancel(&mut self, stream: u64, id: i64, store: &Store) {
        let Some(s) = self.streams.get_mut(&stream) else {
            return;
        };
        if s.watchers.remove(&id).is_none() {
            return;
        }
        let canceled = WatchResponse {
            header: header(store.rev()),
            watch_id: id,
            canceled: true,
            ..WatchResponse::default()
        };
        self.send(stream, canceled);
    }

    /// Sends `answer` on `stream`, forgetting the stream if its client is gone.
    fn send(&mut self, stream: u64, answer: WatchResponse) {
        let gone = self
            .streams
            .get(&stream)
            .is_some_and(|s| !deliver(&s.outbox, answer));
        if gone {
            self.streams.remove(&stream);
        }
    }

    /// The events of a write transaction at `rev`, to every synced watch they fall in.
    pub(crate) fn notify(&mut self, store: &Store, rev: i64, events: &[Event]) {
        let mut gone = Vec::new();
        for (stream_id, stream) in &mut self.streams {
            for (id, watcher) in &mut stream.watchers {
                if watcher.phase != Phase::Synced {
                    continue;
                }
                let mine: Vec<Event> = events
                    .iter()
                    .filter(|e| {
                        e.kv.as_ref().is_some_and(|kv| {
                            watcher.span.contains(&kv.key) && kv.mod_revision >= watcher.min_rev
                        })
                    })
                    .cloned()
                    .collect();
                if mine.is_empty() {
                    continue;
                }
                watcher.min_rev = rev + 1;
                if let Some(idle) = &mut watcher.idle {
                    *idle = false;
                }
                let answer = WatchResponse {
                    header: header(rev),
                    watch_id: *id,
                    events: with_prev(store, mine, watcher.prev_kv),
                    ..WatchResponse::default()
                };
                if !deliver(&stream.outbox, answer) {
                    gone.push(*stream_id);
                    break;
                }
            }
        }
        for stream in gone {
            self.streams.remove(&stream);
        }
    }

    /// Whether any watch waits for the sync loop.
    fn unsynced(&self) -> bool {
        self.streams
            .values()
            .flat_map(|s| s.watchers.values())
            .any(|w| w.phase == Phase::Unsynced)
    }

    /// The sync loop's turn: every unsynced watch gets the events since its start from the
    /// history (or is answered compacted) and is synced.
    pub(crate) fn sync(&mut self, store: &Store) {
        let rev = store.rev();
        let compacted = store.compacted();
        let mut gone = Vec::new();
        for (stream_id, stream) in &mut self.streams {
            for (id, watcher) in &mut stream.watchers {
                if watcher.phase != Phase::Unsynced {
                    continue;
                }
                if watcher.min_rev < compacted {
                    watcher.phase = Phase::Compacted;
                    let answer = WatchResponse {
                        header: header(0),
                        watch_id: *id,
                        canceled: true,
                        compact_revision: compacted,
                        ..WatchResponse::default()
                    };
                    if !deliver(&stream.outbox, answer) {
                        gone.push(*stream_id);
                        break;
                    }
                    continue;
                }
                let mut alive = true;
                loop {
                    let (events, more) =
                        store.events_since(watcher.min_rev, &watcher.span, BATCH_MAX_REVS);
                    watcher.min_rev = more.unwrap_or(rev + 1);
                    if !events.is_empty() {
                        if let Some(idle) = &mut watcher.idle {
                            *idle = false;
                        }
                        let answer = WatchResponse {
                            header: header(rev),
                            watch_id: *id,
                            events: with_prev(store, events, watcher.prev_kv),
                            ..WatchResponse::default()
                        };
                        alive = deliver(&stream.outbox, answer);
                    }
                    if more.is_none() || !alive {
                        break;
                    }
                }
                if !alive {
                    gone.push(*stream_id);
                    break;
                }
                watcher.phase = Phase::Synced;
            }
        }
        for stream in gone {
            self.streams.remove(&stream);
        }
    }

    /// The progress ticks due by `now`: an empty answer with the current revision to each synced
    /// watch with `progress_notify` that was sent nothing since the last tick.
    fn progress(&mut self, store: &Store, now: Instant) {
        let mut gone = Vec::new();
        for (stream_id, stream) in &mut self.streams {
            if stream.next_progress > now {
                continue;
            }
            stream.next_progress = next_tick(stream.next_progress, stream.progress_every, now);
            for (id, watcher) in &mut stream.watchers {
                let Some(idle) = &mut watcher.idle else {
                    continue;
                };
                let due = std::mem::replace(idle, true);
                if due && watcher.phase == Phase::Synced {
                    let answer = WatchResponse {
                        header: header(store.rev()),
                        watch_id: *id,
                        ..WatchResponse::default()
                    };
                    if !deliver(&stream.outbox, answer) {
                        gone.push(*stream_id);
                        break;
                    }
                }
            }
        }
        for stream in gone {
            self.streams.remove(&stream);
        }
    }

    /// Does what is due by `now` (the sync loop's turn, progress ticks).
    pub(crate) fn run_due(&mut self, store: &Store, now: Instant) {
        if self.sync_at <= now {
            if self.unsynced() {
                self.sync(store);
            }
            self.sync_at = next_tick(self.sync_at, self.sync_every, now);
        }
        self.progress(store, now);
    }

    /// When there is something to do next: the sync loop's turn if a watch waits for it, and
    /// the streams' progress ticks (of those with a watch that asked for them).
    pub(crate) fn next_deadline(&self, now: Instant) -> Option<Instant> {
        let sync = self.unsynced().then(|| self.sync_at.max(now));
        let progress = self
            .streams
            .values()
            .filter(|s| s.watchers.values().any(|w| w.idle.is_some()))
            .map(|s| s.next_progress)
            .min();
        match (sync, progress) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// The first tick of a clock ticking every `every` from `at` that is after `now` (or `at` itself
/// if it is after `now`).
fn next_tick(at: Instant, every: Duration, now: Instant) -> Instant {
    if at > now {
        return at;
    }
    let every_nanos = every.as_nanos().max(1);
    let behind = now.duration_since(at).as_nanos();
    let ticks = behind / every_nanos + 1;
    let ahead = u64::try_from(ticks.saturating_mul(every_nanos)).unwrap_or(u64::MAX);
    at.checked_add(Duration::from_nanos(ahead))
        .or_else(|| now.checked_add(Duration::from_secs(86_400 * 365)))
        .unwrap_or(now)
}
