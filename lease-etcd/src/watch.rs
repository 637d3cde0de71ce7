//! One watch stream for the whole client: every holder's watch of its own key, every waiter's
//! watch of the key ahead of it (or of a semaphore's prefix), every observer's, multiplexed on
//! one `Watch` call, as etcd's own client does.
//!
//! Each watch gets an ID of the client's choosing (etcd 3.4 takes `watch_id` on creation), so
//! creations go out at once, without waiting for one another, and every answer is routed by its
//! ID to its [`WatchStream`]. Dropping a `WatchStream` cancels its watch (a shared watch's, with
//! its last subscriber).
//!
//! **Shared watches.** Every waiter of a semaphore watches the same prefix: one etcd watch per
//! range serves all of them ([`Watches::watch_shared`]), its answers copied to each waiter's
//! [`WatchStream`], so a release is one event on the stream, not one per waiter (etcd parks a
//! stream's many small answers as a "slow watcher" and retries them only every few
//! milliseconds). A waiter joining the shared watch after its read at revision `R` gets the
//! events after `R` that the watch already delivered from a replay of its recent events, then
//! the rest as they come: it sees every event a watch of its own from `R + 1` would (and may see
//! earlier ones the shared watch had not delivered yet, which waiters filter by revision). When the
//! replay no longer reaches back to `R` (or the shared watch starts after `R + 1`), it gets a
//! watch of its own. The etcd watch is cancelled with its last subscriber.
//!
//! When the stream breaks (the connection dropped, the member went away), one task opens it
//! again, on the next endpoint if the failure was the transport's, and creates every watch again
//! from the revision after the last event it delivered, so no event is missed: a watch sees the
//! same events across the break, only later. While the watches are being created again the
//! process does not see its leases, so the fences of the pooled etcd leases are suspended from
//! the break until every watch is back ([`Pool::suspend`](super::pool::Pool::suspend)). A watch
//! whose revision etcd compacted meanwhile ends with an error, as it would on creation: its
//! owner reads instead.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::pool::Pool;
use super::wire::proto::{
    Event, RangeRequest, WatchCancelRequest, WatchCreateRequest, WatchRequest, WatchRequestUnion,
    WatchResponse,
};
use super::wire::{self, ApiError, REQUEST_TIMEOUT, Use, Wire, status_error};
use lease_http::{Reopen, grpc};

type Delivery = Result<WatchResponse, ApiError>;

/// The client's watches and the stream that carries them.
pub(crate) struct Watches {
    state: Mutex<State>,
    /// The pooled etcd leases, whose fences are suspended while the watches are down.
    pool: Arc<Pool>,
}

impl std::fmt::Debug for Watches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watches")
            .field("watching", &self.lock().watchers.len())
            .finish()
    }
}

#[derive(Default)]
struct State {
    last_id: i64,
    watchers: BTreeMap<i64, Watcher>,
    /// The shared watch of each range (its key and range end), by etcd watch ID.
    shared: BTreeMap<(Vec<u8>, Vec<u8>), i64>,
    /// Where the current stream takes requests, while it is open (or opening).
    stream: Option<mpsc::UnboundedSender<WatchRequest>>,
    /// The stream task: started by a watch if it is not running (its runtime ended).
    task: lease_http::Task,
    /// The watches being created again on a new stream; the fences resume when none is left.
    recreating: BTreeSet<i64>,
}

struct Watcher {
    /// The creation request, its start revision moved past every event delivered.
    create: WatchCreateRequest,
    /// Who gets the answers, by subscriber number: one, or every waiter on a shared watch.
    deliver: Vec<(u64, mpsc::UnboundedSender<Delivery>)>,
    /// A shared watch's recent events, for the subscribers that join it later.
    replay: Option<Replay>,
    /// Whether etcd answered its creation on the current stream (a refusal names no watch: it
    /// is the answer to the oldest creation not answered yet, as etcd answers in order).
    answered: bool,
}

/// How many events a shared watch keeps for the subscribers that join it later.
const REPLAY_EVENTS: usize = 256;

/// The events a shared watch delivered after revision `after`: every one of them, in order.
struct Replay {
    after: i64,
    events: VecDeque<Event>,
}

impl Replay {
    fn keep(&mut self, events: &[Event]) {
        self.events.extend(events.iter().cloned());
        while self.events.len() > REPLAY_EVENTS {
            if let Some(oldest) = self.events.pop_front() {
                // Events of that revision may be left, but every later one is kept.
                self.after = self.after.max(oldest.kv().mod_revision);
            }
        }
    }

    /// The events after `revision`, if every one of them is kept.
    fn since(&self, revision: i64) -> Option<Vec<Event>> {
        (revision >= self.after).then(|| {
            self.events
                .iter()
                .filter(|e| e.kv().mod_revision > revision)
                .cloned()
                .collect()
        })
    }
}

fn create_request(create: &WatchCreateRequest) -> WatchRequest {
    WatchRequest {
        request_union: Some(WatchRequestUnion::Create(create.clone())),
    }
}

impl Watches {
    /// No watches yet; `pool`: the leases whose fences the stream's breaks suspend.
    pub(crate) fn new(pool: Arc<Pool>) -> Watches {
        Watches {
            state: Mutex::default(),
            pool,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Watches `range` from `start_revision` on, with the previous key-value of each event;
    /// returns once etcd has created the watch. The stream task, if it is not running, starts
    /// with `wire` and ends when `closed` is cancelled.
    pub(crate) async fn watch(
        watches: &Arc<Watches>,
        wire: &Arc<Wire>,
        closed: &CancellationToken,
        range: &RangeRequest,
        start_revision: i64,
    ) -> Result<WatchStream, ApiError> {
        let stream = Watches::create(watches, wire, closed, range, start_revision, false);
        stream.created().await
    }

    /// As [`watch`](Watches::watch), on the range's shared watch if there is one that can serve
    /// every event after `start_revision - 1` (see the module docs); else on a new one, shared
    /// with whoever watches the range next.
    pub(crate) async fn watch_shared(
        watches: &Arc<Watches>,
        wire: &Arc<Wire>,
        closed: &CancellationToken,
        range: &RangeRequest,
        start_revision: i64,
    ) -> Result<WatchStream, ApiError> {
        let joined = {
            let mut state = watches.lock();
            let state = &mut *state;
            let range_key = (range.key.clone(), range.range_end.clone());
            state.shared.get(&range_key).copied().and_then(|id| {
                let watcher = state.watchers.get_mut(&id)?;
                let replayed = watcher.replay.as_ref()?.since(start_revision - 1)?;
                let (deliver, delivered) = mpsc::unbounded_channel();
                state.last_id += 1;
                let sub = state.last_id.unsigned_abs();
                watcher.deliver.push((sub, deliver));
                let queued = (!replayed.is_empty()).then(|| WatchResponse {
                    watch_id: id,
                    events: replayed,
                    ..WatchResponse::default()
                });
                Some(WatchStream {
                    id,
                    sub,
                    delivered,
                    watches: Arc::downgrade(watches),
                    queued,
                })
            })
        };
        match joined {
            Some(stream) => Ok(stream),
            None => {
                let stream = Watches::create(watches, wire, closed, range, start_revision, true);
                stream.created().await
            }
        }
    }

    /// Creates a watch (sending its creation if the stream is open); `shared`: the range's
    /// shared watch from now on.
    fn create(
        watches: &Arc<Watches>,
        wire: &Arc<Wire>,
        closed: &CancellationToken,
        range: &RangeRequest,
        start_revision: i64,
        shared: bool,
    ) -> WatchStream {
        let (deliver, delivered) = mpsc::unbounded_channel();
        let id = {
            let mut state = watches.lock();
            let start = || {
                let task = StreamTask {
                    wire: Arc::clone(wire),
                    watches: Arc::clone(watches),
                };
                lease_http::reopen(task, "etcd watch", closed.clone())
            };
            if state.task.ensure(start) {
                state.stream = None;
            }
            state.last_id += 1;
            let id = state.last_id;
            let create = WatchCreateRequest {
                key: range.key.clone(),
                range_end: range.range_end.clone(),
                start_revision,
                progress_notify: true,
                prev_kv: true,
                watch_id: id,
            };
            if let Some(stream) = &state.stream {
                let _ = stream.send(create_request(&create));
            }
            let replay = shared.then(|| {
                state
                    .shared
                    .insert((range.key.clone(), range.range_end.clone()), id);
                Replay {
                    after: start_revision - 1,
                    events: VecDeque::new(),
                }
            });
            let watcher = Watcher {
                create,
                deliver: vec![(id.unsigned_abs(), deliver)],
                replay,
                answered: false,
            };
            state.watchers.insert(id, watcher);
            id
        };
        wire.count_request(false);
        WatchStream {
            id,
            sub: id.unsigned_abs(),
            delivered,
            watches: Arc::downgrade(watches),
            queued: None,
        }
    }

    /// How many etcd watches the client has open, and how many streams they feed.
    #[cfg(test)]
    pub(crate) fn counts(&self) -> (usize, usize) {
        let state = self.lock();
        let streams = state.watchers.values().map(|w| w.deliver.len()).sum();
        (state.watchers.len(), streams)
    }

    /// Ends subscriber `sub` of watch `id`; the etcd watch with its last subscriber.
    fn cancel(&self, id: i64, sub: u64) {
        let mut state = self.lock();
        let Some(watcher) = state.watchers.get_mut(&id) else {
            return;
        };
        watcher.deliver.retain(|(s, _)| *s != sub);
        if watcher.deliver.is_empty() && state.remove(id, true) {
            // Under the lock, as the stream's break suspends them.
            self.pool.resume();
        }
    }

    /// Routes one answer of the stream to its watch.
    fn dispatch(&self, message: WatchResponse) {
        let mut state = self.lock();
        // etcd refuses a creation (a range the user may not read, say) with the ID -1: it
        // answers the oldest creation still unanswered.
        let refused = message.watch_id == -1 && message.created && message.canceled;
        let id = match refused {
            true => match state.watchers.iter().find(|(_, w)| !w.answered) {
                Some((id, _)) => *id,
                None => return,
            },
            false => message.watch_id,
        };
        let back = (message.created || message.canceled) && state.back(id);
        let Some(watcher) = state.watchers.get_mut(&id) else {
            if back {
                self.pool.resume();
            }
            return;
        };
        watcher.answered |= message.created || message.canceled;
        if message.created && watcher.create.start_revision == 0 {
            // A watch from now has seen everything up to its creation: opened again after a
            // break, it goes on from there.
            watcher.create.start_revision = message.revision() + 1;
        }
        if let Some(last) = message.events.last() {
            let revision = last.kv.as_ref().map_or(0, |kv| kv.mod_revision);
            watcher.create.start_revision = watcher.create.start_revision.max(revision + 1);
            if let Some(replay) = &mut watcher.replay {
                replay.keep(&message.events);
            }
        } else if !message.created && !message.canceled && message.revision() > 0 {
            // A progress notification: the watch has seen everything up to its revision.
            let next = message.revision() + 1;
            watcher.create.start_revision = watcher.create.start_revision.max(next);
        }
        let resume = if message.canceled {
            let error = cancelled(&message);
            for (_, deliver) in &watcher.deliver {
                let _ = deliver.send(Err(error.clone()));
            }
            state.remove(id, false)
        } else {
            watcher
                .deliver
                .retain(|(_, deliver)| deliver.send(Ok(message.clone())).is_ok());
            watcher.deliver.is_empty() && state.remove(id, true)
        };
        if back || resume {
            self.pool.resume();
        }
    }
}

impl State {
    /// Watch `id` is back on a new stream; true if it was the last one the fences waited for.
    fn back(&mut self, id: i64) -> bool {
        self.recreating.remove(&id) && self.recreating.is_empty()
    }

    /// The stream broke: no watch is back until the next one is open (which waits for every
    /// watch again), whatever the broken stream had confirmed.
    fn broke(&mut self) {
        self.stream = None;
        self.recreating.clear();
    }

    /// Forgets watch `id`; `cancel`: asks etcd to cancel it too (not for a watch etcd ended).
    /// True if it was the last watch the fences waited for (see [`State::back`]).
    fn remove(&mut self, id: i64, cancel: bool) -> bool {
        let Some(watcher) = self.watchers.remove(&id) else {
            return false;
        };
        let range_key = (watcher.create.key, watcher.create.range_end);
        if self.shared.get(&range_key) == Some(&id) {
            self.shared.remove(&range_key);
        }
        if let (true, Some(stream)) = (cancel, &self.stream) {
            let cancel = WatchCancelRequest { watch_id: id };
            let _ = stream.send(WatchRequest {
                request_union: Some(WatchRequestUnion::Cancel(cancel)),
            });
        }
        self.back(id)
    }
}

/// The stream's task: the wire client and the watches it carries, handed to it when it starts;
/// [`lease_http::reopen`] opens the stream again when it breaks, until the client is gone.
struct StreamTask {
    wire: Arc<Wire>,
    watches: Arc<Watches>,
}

impl Reopen for StreamTask {
    type Error = ApiError;

    /// Opens the stream, creates every watch on it, and routes its answers until it breaks.
    async fn serve(&mut self, first: bool, pause: &mut lease_core::backoff::Backoff) -> ApiError {
        let (requests, outgoing) = mpsc::unbounded_channel();
        {
            let mut state = self.watches.lock();
            let state = &mut *state;
            state.recreating = if first {
                BTreeSet::new()
            } else {
                state.watchers.keys().copied().collect()
            };
            for watcher in state.watchers.values_mut() {
                watcher.answered = false;
                let _ = requests.send(create_request(&watcher.create));
            }
            if !first && state.recreating.is_empty() {
                self.watches.pool.resume();
            }
            state.stream = Some(requests);
        }
        serve(&self.wire, &self.watches, outgoing, pause).await
    }

    fn broke(&mut self, _: &ApiError) {
        // Until every watch is back, nothing sees the leases. Under the lock, so a watch
        // cancelled meanwhile cannot count as the last one back (see `State::back`).
        let mut state = self.watches.lock();
        state.broke();
        self.watches.pool.suspend(Instant::now());
    }
}

/// One stream, from its opening to its end; returns why it ended.
async fn serve(
    wire: &Wire,
    watches: &Watches,
    outgoing: mpsc::UnboundedReceiver<WatchRequest>,
    pause: &mut lease_core::backoff::Backoff,
) -> ApiError {
    let (i, opening) = match wire.watch(outgoing).await {
        Ok(opening) => opening,
        Err(error) => return error,
    };
    let mut responses = match opening.await {
        Ok(opened) => opened,
        Err(status) => return broken(wire, i, status_error(status)),
    };
    wire.reachability_tracker().answered(true);
    loop {
        let message = tokio::select! {
            biased;
            message = responses.message() => message,
            () = wire.channels().moved_from(i) => return wire::moved(),
        };
        match message {
            Ok(Some(message)) => {
                pause.reset();
                if message.canceled && is_token_refusal(&message.cancel_reason) {
                    // The stream's token expired: authenticate again and open another stream,
                    // which creates this watch again.
                    wire.token_refused();
                    return ApiError::Status {
                        status: http::StatusCode::OK,
                        grpc_code: Some(grpc::UNAUTHENTICATED),
                        message: message.cancel_reason,
                    };
                }
                watches.dispatch(message);
            }
            Ok(None) => return stream_ended(),
            Err(status) => return broken(wire, i, status_error(status)),
        }
    }
}

fn broken(wire: &Wire, endpoint: usize, error: ApiError) -> ApiError {
    if matches!(error, ApiError::Transport(_)) {
        wire.channels().move_on(endpoint, Use::Streams);
        wire.reachability_tracker().answered(false);
    }
    if matches!(
        error,
        ApiError::Status {
            grpc_code: Some(grpc::UNAUTHENTICATED),
            ..
        }
    ) {
        wire.token_refused();
    }
    error
}

fn is_token_refusal(reason: &str) -> bool {
    reason.contains("invalid auth token")
}

fn stream_ended() -> ApiError {
    ApiError::Status {
        status: http::StatusCode::OK,
        grpc_code: Some(grpc::UNAVAILABLE),
        message: "the watch stream ended".into(),
    }
}

fn cancelled(message: &WatchResponse) -> ApiError {
    let reason = if message.compact_revision > 0 {
        format!(
            "the watch's start revision was compacted (compact revision {})",
            message.compact_revision
        )
    } else {
        format!("etcd cancelled the watch: {}", message.cancel_reason)
    };
    // Compaction is "retry from a fresh read"; a cancellation for permission is not transient.
    let code =
        if message.cancel_reason.contains("auth") || message.cancel_reason.contains("permission") {
            grpc::PERMISSION_DENIED
        } else {
            grpc::UNAVAILABLE
        };
    ApiError::Status {
        status: http::StatusCode::OK,
        grpc_code: Some(code),
        message: reason,
    }
}

/// An open watch on the client's stream; dropping it cancels the watch.
#[derive(Debug)]
pub(crate) struct WatchStream {
    id: i64,
    /// This stream among the watch's subscribers.
    sub: u64,
    delivered: mpsc::UnboundedReceiver<Delivery>,
    watches: Weak<Watches>,
    /// Events to return first: those that came with the watch's creation, a shared watch's replay,
    /// or those given back (`put_back`).
    queued: Option<WatchResponse>,
}

impl WatchStream {
    /// Waits for etcd's answer to the watch's creation.
    async fn created(mut self) -> Result<WatchStream, ApiError> {
        let first = tokio::time::timeout(REQUEST_TIMEOUT, self.delivered.recv()).await;
        match first {
            Ok(Some(Ok(message))) => {
                if !message.events.is_empty() {
                    self.queued = Some(message);
                }
                Ok(self)
            }
            Ok(Some(Err(error))) => Err(error),
            Ok(None) => Err(stream_ended()),
            Err(_) => Err(ApiError::TimedOut),
        }
    }

    /// Gives `events` (the rest of a batch, in order) back: the next [`next`](WatchStream::next)
    /// returns them first.
    pub(crate) fn put_back(&mut self, events: Vec<Event>) {
        if events.is_empty() {
            return;
        }
        let mut batch = self.queued.take().unwrap_or_default();
        batch.events.splice(0..0, events);
        self.queued = Some(batch);
    }

    /// The next batch of events (at least one). Errors when etcd cancels the watch (a revision
    /// compacted away, a lost permission) or the client is gone.
    pub(crate) async fn next(&mut self) -> Result<WatchResponse, ApiError> {
        if let Some(queued) = self.queued.take() {
            return Ok(queued);
        }
        loop {
            match self.delivered.recv().await {
                Some(Ok(message)) if !message.events.is_empty() => return Ok(message),
                Some(Ok(_)) => {}
                Some(Err(error)) => return Err(error),
                None => return Err(stream_ended()),
            }
        }
    }
}

impl Drop for WatchStream {
    fn drop(&mut self) {
        if let Some(watches) = self.watches.upgrade() {
            watches.cancel(self.id, self.sub);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::proto::KeyValue;

    fn event(revision: i64) -> Event {
        Event {
            kind: 1,
            kv: Some(KeyValue {
                mod_revision: revision,
                ..KeyValue::default()
            }),
            prev_kv: None,
        }
    }

    fn revisions(events: &[Event]) -> Vec<i64> {
        events.iter().map(|e| e.kv().mod_revision).collect()
    }

    /// A watch cancelled after its stream broke, before the next stream is open, is not "the last
    /// one back": the fences stay suspended until every watch is back on the next stream.
    #[test]
    fn a_break_forgets_what_the_broken_stream_had_confirmed() {
        let mut state = State {
            recreating: [1, 2].into(),
            ..State::default()
        };
        assert!(!state.back(1), "2 is not back yet");
        state.broke();
        assert!(!state.back(2), "back on a stream that broke");
        assert!(state.stream.is_none());
    }

    /// A subscriber joining after its read at some revision gets exactly the events after it,
    /// while the replay reaches back that far; then none (it watches on its own).
    #[test]
    fn a_replay_serves_only_reads_it_reaches_back_to() {
        let mut replay = Replay {
            after: 9,
            events: VecDeque::new(),
        };
        assert_eq!(replay.since(8), None, "before the shared watch started");
        assert_eq!(replay.since(9), Some(Vec::new()));
        replay.keep(&[event(10), event(10), event(12)]);
        assert_eq!(revisions(&replay.since(9).unwrap()), [10, 10, 12]);
        assert_eq!(revisions(&replay.since(10).unwrap()), [12]);
        assert_eq!(revisions(&replay.since(15).unwrap()), [] as [i64; 0]);
        let many: Vec<Event> = (13..13 + REPLAY_EVENTS as i64).map(event).collect();
        replay.keep(&many);
        assert_eq!(replay.events.len(), REPLAY_EVENTS);
        assert_eq!(replay.since(11), None, "trimmed");
        let newest = 12 + REPLAY_EVENTS as i64;
        assert_eq!(revisions(&replay.since(newest - 1).unwrap()), [newest]);
    }
}
