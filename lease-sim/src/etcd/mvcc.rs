//! The multi-version key-value store: etcd's `mvcc` package as lease-etcd sees it.
//!
//! One revision counter for the whole store (1 before the first write, as a new etcd's), raised
//! by one for every write transaction that changes something; each change in it gets the next
//! sub-revision. Every kept version of every key is in one log ordered by (revision,
//! sub-revision), which is what historical reads and watches from a past revision read, and each
//! key's index lists its versions. A key carries its create and mod revision, its version (1 for
//! a key written once since it was created) and the lease it is attached to.
//!
//! Compaction at revision C keeps, of every key, only its newest version at or before C (and
//! nothing of a key whose newest version there is a deletion), as etcd's `keyIndex.compact` and
//! the backend's compaction do; reads before C answer `ErrCompacted`.

use std::collections::{BTreeMap, BTreeSet};

use lease_etcd::proto::{Event, KeyValue};

use super::error;

/// `mvccpb.Event.EventType`.
pub(crate) const PUT: i32 = 0;
pub(crate) const DELETE: i32 = 1;

/// A key range as etcd reads `key` and `range_end`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Span {
    /// `range_end` empty: the key alone.
    Key(Vec<u8>),
    /// `range_end` `"\0"`: every key from `key` on.
    From(Vec<u8>),
    /// `[key, range_end)`.
    Range(Vec<u8>, Vec<u8>),
}

impl Span {
    pub(crate) fn of(key: &[u8], range_end: &[u8]) -> Span {
        match range_end {
            [] => Span::Key(key.to_vec()),
            [0] => Span::From(key.to_vec()),
            end => Span::Range(key.to_vec(), end.to_vec()),
        }
    }

    pub(crate) fn contains(&self, key: &[u8]) -> bool {
        match self {
            Span::Key(k) => k.as_slice() == key,
            Span::From(from) => key >= from.as_slice(),
            Span::Range(from, end) => key >= from.as_slice() && key < end.as_slice(),
        }
    }

    /// The keys of `map` in the span, in key order.
    fn keys<'a, V>(&self, map: &'a BTreeMap<Vec<u8>, V>) -> Vec<&'a Vec<u8>> {
        match self {
            Span::Key(k) => map.get_key_value(k).map(|(k, _)| k).into_iter().collect(),
            Span::From(from) => map.range(from.clone()..).map(|(k, _)| k).collect(),
            Span::Range(from, end) if from < end => map
                .range(from.clone()..end.clone())
                .map(|(k, _)| k)
                .collect(),
            Span::Range(..) => Vec::new(),
        }
    }
}

/// A position in the log: (revision, sub-revision).
type Rev = (i64, i64);

/// The store.
#[derive(Debug)]
pub(crate) struct Store {
    /// The current revision.
    rev: i64,
    /// The revision compacted at; -1 before the first compaction, as etcd's `compactMainRev`.
    compacted: i64,
    /// Every kept version, by position: the key and its value then (`None`: deleted then).
    log: BTreeMap<Rev, (Vec<u8>, Option<KeyValue>)>,
    /// Each key's versions, oldest first.
    index: BTreeMap<Vec<u8>, Vec<Rev>>,
    /// The keys attached to each lease (etcd's lessor keeps the same, as its items).
    leased: BTreeMap<i64, BTreeSet<Vec<u8>>>,
}

/// A write transaction in progress: the revision it writes at and the changes so far.
#[derive(Debug)]
pub(crate) struct Write {
    main: i64,
    events: Vec<Event>,
}

impl Write {
    fn sub(&self) -> i64 {
        i64::try_from(self.events.len()).unwrap_or(i64::MAX)
    }

    /// Whether it changed anything yet.
    pub(crate) fn changed(&self) -> bool {
        !self.events.is_empty()
    }
}

impl Default for Store {
    fn default() -> Self {
        Store {
            rev: 1,
            compacted: -1,
            log: BTreeMap::new(),
            index: BTreeMap::new(),
            leased: BTreeMap::new(),
        }
    }
}

impl Store {
    pub(crate) fn rev(&self) -> i64 {
        self.rev
    }

    pub(crate) fn compacted(&self) -> i64 {
        self.compacted
    }

    /// The version of `key` at revision `at`, if it existed then (`at` must be kept).
    pub(crate) fn kv_at(&self, key: &[u8], at: i64) -> Option<&KeyValue> {
        let revs = self.index.get(key)?;
        let newest = revs.iter().rev().find(|(main, _)| *main <= at)?;
        self.log.get(newest).and_then(|(_, kv)| kv.as_ref())
    }

    /// The keys in `span` as they were at revision `at`, in key order.
    pub(crate) fn range_at(&self, span: &Span, at: i64) -> Vec<KeyValue> {
        span.keys(&self.index)
            .into_iter()
            .filter_map(|key| self.kv_at(key, at).cloned())
            .collect()
    }

    /// The revision a read of `at` (0 or less: now) is served at, if the store still has it:
    /// etcd's `rangeKeys` checks; `current` is the reading transaction's revision.
    pub(crate) fn readable(&self, at: i64, current: i64) -> Result<i64, tonic::Status> {
        if at > current {
            return Err(error::future_rev());
        }
        let at = if at <= 0 { current } else { at };
        if at < self.compacted {
            return Err(error::compacted());
        }
        Ok(at)
    }

    /// The keys attached to lease `id`, in key order.
    pub(crate) fn keys_of(&self, id: i64) -> Vec<Vec<u8>> {
        self.leased
            .get(&id)
            .map(|keys| keys.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Every key now, in key order.
    pub(crate) fn current(&self) -> Vec<KeyValue> {
        self.index
            .keys()
            .filter_map(|key| self.kv_at(key, self.rev).cloned())
            .collect()
    }

    /// Starts a write transaction, at the next revision.
    pub(crate) fn begin(&self) -> Write {
        Write {
            main: self.rev.saturating_add(1),
            events: Vec::new(),
        }
    }

    /// The revision a read inside `write` sees: its own changes included.
    pub(crate) fn read_rev(&self, write: &Write) -> i64 {
        if write.changed() {
            write.main
        } else {
            self.rev
        }
    }

    /// Puts `key` in `write`: a new version, or the first of a new generation.
    pub(crate) fn put(&mut self, write: &mut Write, key: &[u8], value: Vec<u8>, lease: i64) {
        let now = self.read_rev(write);
        let previous = self.kv_at(key, now).cloned();
        let kv = KeyValue {
            key: key.to_vec(),
            create_revision: previous.as_ref().map_or(write.main, |p| p.create_revision),
            mod_revision: write.main,
            version: previous.as_ref().map_or(0, |p| p.version).saturating_add(1),
            value,
            lease,
        };
        if let Some(previous) = &previous {
            self.detach(previous.lease, key);
        }
        if lease != 0 {
            self.leased.entry(lease).or_default().insert(key.to_vec());
        }
        self.record(write, key, Some(kv.clone()));
        write.events.push(Event {
            kind: PUT,
            kv: Some(kv),
            prev_kv: None,
        });
    }

    /// Deletes the keys in `span` in `write`; returns how many there were.
    pub(crate) fn delete(&mut self, write: &mut Write, span: &Span) -> i64 {
        let now = self.read_rev(write);
        let gone: Vec<KeyValue> = self.range_at(span, now);
        for previous in &gone {
            self.detach(previous.lease, &previous.key);
            self.record(write, &previous.key, None);
            write.events.push(Event {
                kind: DELETE,
                kv: Some(KeyValue {
                    key: previous.key.clone(),
                    mod_revision: write.main,
                    ..KeyValue::default()
                }),
                prev_kv: None,
            });
        }
        i64::try_from(gone.len()).unwrap_or(i64::MAX)
    }

    fn record(&mut self, write: &Write, key: &[u8], kv: Option<KeyValue>) {
        let at = (write.main, write.sub());
        self.log.insert(at, (key.to_vec(), kv));
        self.index.entry(key.to_vec()).or_default().push(at);
    }

    fn detach(&mut self, lease: i64, key: &[u8]) {
        if lease == 0 {
            return;
        }
        if let Some(keys) = self.leased.get_mut(&lease) {
            keys.remove(key);
            if keys.is_empty() {
                self.leased.remove(&lease);
            }
        }
    }

    /// Ends `write`: the revision rises if it changed anything. Returns its events, for the
    /// watchers, and the revision they were written at.
    pub(crate) fn commit(&mut self, write: Write) -> (i64, Vec<Event>) {
        if write.changed() {
            self.rev = write.main;
        }
        (write.main, write.events)
    }

    /// The events in the log from revision `from` through the current one, of keys in `span`,
    /// covering at most `max_revs` revisions; and the revision the next batch starts at, if
    /// more are left (etcd's `eventBatch.moreRev`).
    pub(crate) fn events_since(
        &self,
        from: i64,
        span: &Span,
        max_revs: usize,
    ) -> (Vec<Event>, Option<i64>) {
        let mut events = Vec::new();
        let mut revs = 0;
        let mut last = None;
        for ((main, _), (key, kv)) in self.log.range((from, 0)..) {
            if !span.contains(key) {
                continue;
            }
            if last != Some(*main) {
                revs += 1;
                if revs > max_revs {
                    return (events, Some(*main));
                }
                last = Some(*main);
            }
            events.push(match kv {
                Some(kv) => Event {
                    kind: PUT,
                    kv: Some(kv.clone()),
                    prev_kv: None,
                },
                None => Event {
                    kind: DELETE,
                    kv: Some(KeyValue {
                        key: key.clone(),
                        mod_revision: *main,
                        ..KeyValue::default()
                    }),
                    prev_kv: None,
                },
            });
        }
        (events, None)
    }

    /// The key as it was before `event`, for a watch with `prev_kv` (as etcd's watch server
    /// reads it: at the event's revision less one, if that is not compacted; none for a key's
    /// creation).
    pub(crate) fn prev_kv(&self, event: &Event) -> Option<KeyValue> {
        let kv = event.kv.as_ref()?;
        let creation = event.kind == PUT && kv.create_revision == kv.mod_revision;
        let before = kv.mod_revision.saturating_sub(1);
        if creation || before < self.compacted {
            return None;
        }
        self.kv_at(&kv.key, before).cloned()
    }

    /// Compacts the history at `rev`: etcd's `Compact`, with its errors.
    pub(crate) fn compact(&mut self, rev: i64) -> Result<(), tonic::Status> {
        if rev <= self.compacted {
            return Err(error::compacted());
        }
        if rev > self.rev {
            return Err(error::future_rev());
        }
        self.compacted = rev;
        let mut emptied = Vec::new();
        for (key, revs) in &mut self.index {
            let older = revs.partition_point(|(main, _)| *main <= rev);
            if older == 0 {
                continue;
            }
            // The newest version at or before `rev` stays, unless it is a deletion.
            let keep_newest = revs
                .get(older - 1)
                .and_then(|newest| self.log.get(newest))
                .is_some_and(|(_, kv)| kv.is_some());
            let drop_to = if keep_newest { older - 1 } else { older };
            for at in revs.drain(..drop_to) {
                self.log.remove(&at);
            }
            if revs.is_empty() {
                emptied.push(key.clone());
            }
        }
        for key in emptied {
            self.index.remove(&key);
        }
        Ok(())
    }
}
