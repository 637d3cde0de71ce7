//! One watch stream for the whole client: every holder's watch of its own key, every waiter's
//! watch of the key ahead of it (or of a semaphore's prefix), every observer's, multiplexed on
//! one `Watch` call, as etcd's own client does.
//!
//! Each watch gets an ID of the client's choosing (etcd 3.4 takes `watch_id` on creation), so
//! creations go out at once, without waiting for one another, and every answer is routed by its
//! ID to its [`WatchStream`]. Dropping a `WatchStream` cancels its watch.
//!
//! When the stream breaks (the connection dropped, the member went away), one task opens it
//! again, on the next endpoint if the failure was the transport's, and creates every watch again
//! from the revision after the last event it delivered, so no event is missed: a watch sees the
//! same events across the break, only later. While the watches are being created again the
//! process does not see its leases, so the fences of the pooled etcd leases are suspended from
//! the break until every watch is back ([`Pool::suspend`](super::pool::Pool::suspend)). A watch
//! whose revision etcd compacted meanwhile ends with an error, as it would on creation: its
//! owner reads instead.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use http::uri::PathAndQuery;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::client::Grpc;
use tonic_prost::ProstCodec;

use super::grpc::{ApiError, EtcdClient, REQUEST_TIMEOUT, Use, status_error};
use super::proto::{
    RangeRequest, WatchCancelRequest, WatchCreateRequest, WatchRequest, WatchRequestUnion,
    WatchResponse, path,
};
use lease_http::grpc;

type Delivery = Result<WatchResponse, ApiError>;

/// The client's watches and the stream that carries them.
#[derive(Default)]
pub(crate) struct Watches {
    state: Mutex<State>,
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
    watchers: HashMap<i64, Watcher>,
    /// Where the current stream takes requests, while it is open (or opening).
    stream: Option<mpsc::UnboundedSender<WatchRequest>>,
    /// Closed when the stream task is gone (its runtime ended): the next watch starts another.
    task: Option<mpsc::Sender<()>>,
    /// The watches being created again on a new stream; the fences resume when none is left.
    recreating: HashSet<i64>,
}

struct Watcher {
    /// The creation request, its start revision moved past every event delivered.
    create: WatchCreateRequest,
    deliver: mpsc::UnboundedSender<Delivery>,
}

fn create_request(create: &WatchCreateRequest) -> WatchRequest {
    WatchRequest {
        request_union: Some(WatchRequestUnion::Create(create.clone())),
    }
}

impl Watches {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Watches `range` from `start_revision` on, with the previous key-value of each event;
    /// returns once etcd has created the watch.
    pub(crate) async fn watch(
        client: &Arc<EtcdClient>,
        range: &RangeRequest,
        start_revision: i64,
    ) -> Result<WatchStream, ApiError> {
        let (deliver, delivered) = mpsc::unbounded_channel();
        let id = {
            let mut state = client.watches().lock();
            if state.task.as_ref().is_none_or(mpsc::Sender::is_closed) {
                let (alive, task_guard) = mpsc::channel(1);
                state.task = Some(alive);
                state.stream = None;
                tokio::spawn(run(
                    Arc::downgrade(client),
                    client.closed().clone(),
                    task_guard,
                ));
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
            state.watchers.insert(id, Watcher { create, deliver });
            id
        };
        client.count_request(false);
        let mut stream = WatchStream {
            id,
            delivered,
            client: Arc::downgrade(client),
            queued: None,
        };
        let first = tokio::time::timeout(REQUEST_TIMEOUT, stream.delivered.recv()).await;
        match first {
            Ok(Some(Ok(message))) => {
                if !message.events.is_empty() {
                    stream.queued = Some(message);
                }
                Ok(stream)
            }
            Ok(Some(Err(error))) => Err(error),
            Ok(None) => Err(stream_ended()),
            Err(_) => Err(ApiError::TimedOut),
        }
    }

    fn cancel(&self, id: i64) {
        let mut state = self.lock();
        if state.watchers.remove(&id).is_some() {
            state.recreating.remove(&id);
            if let Some(stream) = &state.stream {
                let cancel = WatchRequest {
                    request_union: Some(WatchRequestUnion::Cancel(WatchCancelRequest {
                        watch_id: id,
                    })),
                };
                let _ = stream.send(cancel);
            }
        }
    }

    /// Routes one answer of the stream to its watch.
    fn dispatch(&self, client: &EtcdClient, message: WatchResponse) {
        let mut state = self.lock();
        let id = message.watch_id;
        let Some(watcher) = state.watchers.get_mut(&id) else {
            return;
        };
        if let Some(last) = message.events.last() {
            let revision = last.kv.as_ref().map_or(0, |kv| kv.mod_revision);
            watcher.create.start_revision = watcher.create.start_revision.max(revision + 1);
        } else if !message.created && !message.canceled && message.revision() > 0 {
            // A progress notification: the watch has seen everything up to its revision.
            let next = message.revision() + 1;
            watcher.create.start_revision = watcher.create.start_revision.max(next);
        }
        let delivered = if message.canceled {
            let error = cancelled(&message);
            let _ = watcher.deliver.send(Err(error));
            false
        } else {
            watcher.deliver.send(Ok(message.clone())).is_ok()
        };
        if !delivered {
            state.watchers.remove(&id);
            if !message.canceled {
                if let Some(stream) = &state.stream {
                    let cancel = WatchCancelRequest { watch_id: id };
                    let _ = stream.send(WatchRequest {
                        request_union: Some(WatchRequestUnion::Cancel(cancel)),
                    });
                }
            }
        }
        if (message.created || message.canceled)
            && state.recreating.remove(&id)
            && state.recreating.is_empty()
        {
            client.pool().resume();
        }
    }
}

/// Runs the stream: opens it, creates every watch on it, routes its answers, and opens it again
/// when it breaks. Ends with the client.
async fn run(client: Weak<EtcdClient>, closed: CancellationToken, _alive: mpsc::Receiver<()>) {
    let mut pause = lease_http::backoff();
    let mut first = true;
    loop {
        let Some(strong) = client.upgrade() else {
            return;
        };
        let (requests, outgoing) = mpsc::unbounded_channel();
        {
            let mut state = strong.watches().lock();
            let state = &mut *state;
            state.recreating = if first {
                HashSet::new()
            } else {
                state.watchers.keys().copied().collect()
            };
            for watcher in state.watchers.values() {
                let _ = requests.send(create_request(&watcher.create));
            }
            if !first && state.recreating.is_empty() {
                strong.pool().resume();
            }
            state.stream = Some(requests);
        }
        first = false;
        let broke = tokio::select! {
            () = closed.cancelled() => return,
            broke = serve(&strong, outgoing, &mut pause) => broke,
        };
        {
            let mut state = strong.watches().lock();
            state.stream = None;
        }
        // Until every watch is back, nothing sees the leases.
        strong.pool().suspend(Instant::now());
        tracing::debug!(error = %broke, "the etcd watch stream broke; opening it again");
        drop(strong);
        tokio::select! {
            () = closed.cancelled() => return,
            () = pause.wait() => {}
        }
    }
}

/// One stream, from its opening to its end; returns why it ended.
async fn serve(
    client: &Arc<EtcdClient>,
    outgoing: mpsc::UnboundedReceiver<WatchRequest>,
    pause: &mut lease_core::backoff::Backoff,
) -> ApiError {
    let token = match client.token().await {
        Ok(token) => token,
        Err(error) => return error,
    };
    let (i, channel) = match client.channel(Use::Streams) {
        Ok(channel) => channel,
        Err(error) => return error,
    };
    let mut grpc = Grpc::new(channel);
    let request = client.request(UnboundedReceiverStream::new(outgoing), token.as_deref());
    let opened = async {
        grpc.ready()
            .await
            .map_err(|e| tonic::Status::from_error(e.into()))?;
        grpc.streaming(
            request,
            PathAndQuery::from_static(path::WATCH),
            ProstCodec::<WatchRequest, WatchResponse>::default(),
        )
        .await
    };
    let mut responses = match opened.await {
        Ok(response) => response.into_inner(),
        Err(status) => return broken(client, i, status_error(status)),
    };
    client.reachability_tracker().answered(true);
    loop {
        let message = tokio::select! {
            message = responses.message() => message,
            () = client.moved_from(i) => return moved(),
        };
        match message {
            Ok(Some(message)) => {
                pause.reset();
                if message.canceled && is_token_refusal(&message.cancel_reason) {
                    // The stream's token expired: authenticate again and open another stream,
                    // which creates this watch again.
                    client.token_refused();
                    return ApiError::Status {
                        status: http::StatusCode::OK,
                        grpc_code: Some(grpc::UNAUTHENTICATED),
                        message: message.cancel_reason,
                    };
                }
                client.watches().dispatch(client, message);
            }
            Ok(None) => return stream_ended(),
            Err(status) => return broken(client, i, status_error(status)),
        }
    }
}

fn broken(client: &EtcdClient, endpoint: usize, error: ApiError) -> ApiError {
    if matches!(error, ApiError::Transport(_)) {
        client.move_on(endpoint, Use::Streams);
        client.reachability_tracker().answered(false);
    }
    if matches!(
        error,
        ApiError::Status {
            grpc_code: Some(grpc::UNAUTHENTICATED),
            ..
        }
    ) {
        client.token_refused();
    }
    error
}

/// Why a stream left an endpoint that calls had moved away from.
pub(crate) fn moved() -> ApiError {
    ApiError::Status {
        status: http::StatusCode::OK,
        grpc_code: Some(grpc::UNAVAILABLE),
        message: "calls moved on to another etcd endpoint; following them".into(),
    }
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
    delivered: mpsc::UnboundedReceiver<Delivery>,
    client: Weak<EtcdClient>,
    /// Events that came with the watch's creation, returned by the first `next`.
    queued: Option<WatchResponse>,
}

impl WatchStream {
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
        if let Some(client) = self.client.upgrade() {
            client.watches().cancel(self.id);
        }
    }
}
