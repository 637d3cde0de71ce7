//! Where the library's spans and events go: the campaign worker runs in the caller's span, the
//! long-lived `lease.hold` span follows from `lease.acquire` instead of living under the request
//! that acquired, and a campaign's acquire failures log at the level of its leader watch's
//! retries. Captured with a layer on this thread (every test here runs on a `current_thread`
//! runtime, so the tasks the library spawns run on it too).

use std::sync::Arc;
use std::time::Duration;

use lease_core::CancellationToken;
use lease_core::leader::{Campaign, LeaderEvent};
use lease_core::memory::Memory;
use lease_core::{Backend, BoxError, BoxFuture, LeaseSpec};
use lease_tests::capture::{Capture, EventRecord};
use lease_tests::within;
use tokio::sync::mpsc;
use tracing::Instrument;

const EVENT: Duration = Duration::from_secs(10);

/// The serials of `event`'s spans and of all their ancestors.
fn ancestry(capture: &Capture, event: &EventRecord) -> Vec<u64> {
    let mut found = Vec::new();
    for &serial in &event.scope {
        let mut next = Some(serial);
        while let Some(serial) = next {
            found.push(serial);
            next = capture.span(serial).and_then(|s| s.parent);
        }
    }
    found
}

/// Runs a campaign on the memory backend whose worker logs "worker ran", and returns that event.
/// `start` turns the campaign's future into the task, as a caller would.
async fn worker_event(
    capture: &Capture,
    key: &str,
    start: impl FnOnce(
        Campaign,
        CancellationToken,
        mpsc::UnboundedSender<()>,
    ) -> tokio::task::JoinHandle<()>,
) -> EventRecord {
    let backend: Arc<dyn Backend> = Arc::new(Memory::new());
    let shutdown = CancellationToken::new();
    let (ran_tx, mut ran) = mpsc::unbounded_channel();
    let running = start(
        Campaign::new(backend, LeaseSpec::leader(key)),
        shutdown.clone(),
        ran_tx,
    );
    within(EVENT, "the worker to run", ran.recv()).await;
    shutdown.cancel();
    within(EVENT, "the campaign to stop", running)
        .await
        .unwrap();
    let ran = capture.events_containing("worker ran");
    assert_eq!(ran.len(), 1, "{ran:#?}");
    ran[0].clone()
}

/// A worker whose future (run by the task the campaign spawns) logs "worker ran".
fn logging_worker(
    ran: mpsc::UnboundedSender<()>,
) -> impl FnMut(lease_core::LeaseWatcher) -> BoxFuture<'static, Result<(), BoxError>> + Send {
    move |_lease| {
        let ran = ran.clone();
        Box::pin(async move {
            tracing::info!("worker ran");
            let _ = ran.send(());
            std::future::pending().await
        })
    }
}

#[tokio::test]
async fn the_campaign_worker_runs_in_the_span_current_where_the_campaign_was_spawned() {
    let (capture, _guard) = Capture::scoped();
    let caller = tracing::info_span!("caller");
    let event = worker_event(&capture, "spans/spawned", |campaign, shutdown, ran| {
        // Called in the caller's span, polled by a task outside any span.
        let run = caller.in_scope(|| campaign.run_until(shutdown, logging_worker(ran)));
        tokio::spawn(async move {
            run.await.unwrap();
        })
    })
    .await;
    let caller = capture.spans_named("caller")[0].serial;
    assert!(
        ancestry(&capture, &event).contains(&caller),
        "the worker's event is not in the caller's span: {event:?}, spans {:#?}",
        capture.spans()
    );
}

#[tokio::test]
async fn the_campaign_worker_runs_in_the_span_the_campaign_is_instrumented_with() {
    let (capture, _guard) = Capture::scoped();
    let event = worker_event(&capture, "spans/instrumented", |campaign, shutdown, ran| {
        let run = campaign
            .run_until(shutdown, logging_worker(ran))
            .instrument(tracing::info_span!("compactor"));
        tokio::spawn(async move {
            run.await.unwrap();
        })
    })
    .await;
    let compactor = capture.spans_named("compactor")[0].serial;
    assert!(
        ancestry(&capture, &event).contains(&compactor),
        "the worker's event is not in the campaign's span: {event:?}, spans {:#?}",
        capture.spans()
    );
}

#[tokio::test]
async fn the_hold_span_follows_from_the_acquire_and_is_not_under_the_request() {
    let (capture, _guard) = Capture::scoped();
    let memory = Memory::new();
    let request = tracing::info_span!("http.request");
    // As a handler does: the acquire called (and so its span made) in the request's span.
    let lease = async { memory.acquire(&LeaseSpec::leader("spans/hold")).await }
        .instrument(request.clone())
        .await
        .unwrap();
    drop(request);
    lease.release().await.unwrap();

    let request = capture.spans_named("http.request")[0].serial;
    let acquire = capture.spans_named("lease.acquire");
    assert_eq!(acquire.len(), 1, "{acquire:#?}");
    assert_eq!(acquire[0].parent, Some(request), "{acquire:#?}");
    let hold = capture.spans_named("lease.hold");
    assert_eq!(hold.len(), 1, "{hold:#?}");
    assert_eq!(hold[0].parent, None, "lease.hold has a parent: {hold:#?}");
    assert_eq!(hold[0].follows_from, vec![acquire[0].serial], "{hold:#?}");
    // What the holder task logs (its release) is under lease.hold, not under the request.
    let released = capture.events_containing("lease released");
    assert!(!released.is_empty(), "{:#?}", capture.events());
    for event in &released {
        let spans = ancestry(&capture, event);
        assert!(spans.contains(&hold[0].serial), "{event:?}");
        assert!(!spans.contains(&request), "{event:?}");
    }
}

/// Consul answering 500 to everything: the campaign cannot acquire and its leader watch cannot
/// observe. Both retry, and say so at one level.
#[tokio::test]
async fn acquire_failures_log_at_the_level_of_leader_watch_retries() {
    let (capture, _guard) = Capture::scoped();
    let agent = lease_tests::consul::Agent::start().await;
    let proxy = lease_tests::proxy::Proxy::start(agent.addr())
        .await
        .unwrap();
    proxy.set_http_500(true);
    let backend = Arc::new(
        lease_consul::Consul::builder()
            .address(proxy.url())
            .build()
            .unwrap(),
    );
    let shutdown = CancellationToken::new();
    let campaign = Campaign::new(backend, LeaseSpec::leader("spans/outage"))
        .backoff(Duration::from_millis(10), Duration::from_millis(100));
    let mut events = campaign.handle().events();
    let running = tokio::spawn(campaign.hold_until(shutdown.clone()));
    within(EVENT, "a failed acquire", async {
        while !matches!(events.recv().await, Ok(LeaderEvent::AcquireFailed { .. })) {}
    })
    .await;
    let find = |needle: &str| capture.events_containing(needle).first().cloned();
    let (acquire, observe) = within(EVENT, "a retried observation", async {
        loop {
            if let (Some(acquire), Some(observe)) = (
                find("campaign: acquire failed, retrying"),
                find("leader watch: cannot observe yet; retrying"),
            ) {
                return (acquire, observe);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert_eq!(acquire.level, observe.level, "{acquire:?} / {observe:?}");
    shutdown.cancel();
    within(EVENT, "the campaign to stop", running)
        .await
        .unwrap()
        .unwrap();
}
