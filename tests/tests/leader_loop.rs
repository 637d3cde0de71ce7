//! The campaign loop (`lease_core::leader`): a worker runs only while elected, is cancelled on
//! loss, the loop campaigns again, hands over at once on shutdown, survives a panicking worker,
//! retries exactly the transient errors, shares its terms and events through handles, and every
//! node observes each new leader (and this node never reports "nobody" while it leads).
//!
//! Run: `cargo test -p lease-tests --test leader_loop` (the Consul hand-over test starts a dev
//! agent; see `lease_tests::consul`).
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use lease_core::CancellationToken;
use lease_core::leader::{
    AfterWorker, Campaign, CampaignEnd, CampaignState, LeaderEvent, Observation,
};
use lease_core::memory::Memory;
use lease_core::{Backend, BoxError, LeaseSpec, LostReason, Sequencer, Wait};
use lease_tests::within;
use tokio::sync::mpsc;

const EVENT: Duration = Duration::from_secs(10);

/// A campaign whose events arrive on a channel, tagged with the node's name.
fn campaign(
    backend: Arc<dyn Backend>,
    spec: LeaseSpec,
    node: &'static str,
    events: &mpsc::UnboundedSender<(&'static str, LeaderEvent)>,
) -> Campaign {
    let events = events.clone();
    Campaign::new(backend, spec)
        .backoff(Duration::from_millis(10), Duration::from_millis(100))
        .on_event(move |event| {
            let _ = events.send((node, event));
        })
}

/// Waits for the first event `pick` accepts, skipping the others.
async fn next_matching<T>(
    events: &mut mpsc::UnboundedReceiver<(&'static str, LeaderEvent)>,
    what: &str,
    pick: impl FnMut(&'static str, &LeaderEvent) -> Option<T>,
) -> T {
    next_matching_within(EVENT, events, what, pick).await
}

/// [`next_matching`] with a bound of `limit`.
async fn next_matching_within<T>(
    limit: Duration,
    events: &mut mpsc::UnboundedReceiver<(&'static str, LeaderEvent)>,
    what: &str,
    mut pick: impl FnMut(&'static str, &LeaderEvent) -> Option<T>,
) -> T {
    within(limit, what, async {
        loop {
            let (node, event) = events.recv().await.expect("campaigns ended");
            if let Some(found) = pick(node, &event) {
                return found;
            }
        }
    })
    .await
}

fn elected(node: &'static str, event: &LeaderEvent) -> Option<(&'static str, Sequencer)> {
    match event {
        LeaderEvent::Elected { sequencer } => Some((node, sequencer.clone())),
        _ => None,
    }
}

/// Sends on a channel when dropped: proof that a worker's future was dropped.
struct DropSignal(mpsc::UnboundedSender<Sequencer>, Sequencer);

impl Drop for DropSignal {
    fn drop(&mut self) {
        let _ = self.0.send(self.1.clone());
    }
}

fn spec(key: &str) -> LeaseSpec {
    LeaseSpec::leader(key)
        .ttl(Duration::from_secs(15))
        .lock_delay(Duration::ZERO)
}

#[tokio::test]
async fn worker_is_cancelled_on_loss_and_the_campaign_runs_again() {
    lease_tests::init_tracing();
    let memory = Memory::new();
    let (events_tx, mut events) = mpsc::unbounded_channel();
    let (dropped_tx, mut dropped) = mpsc::unbounded_channel();
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(
        campaign(Arc::new(memory.clone()), spec("loop/loss"), "a", &events_tx).run_until(
            shutdown.clone(),
            move |lease| {
                let signal = DropSignal(dropped_tx.clone(), lease.sequencer().clone());
                async move {
                    let _signal = signal;
                    std::future::pending::<Result<(), BoxError>>().await
                }
            },
        ),
    );

    let (_, first) = next_matching(&mut events, "the first election", elected).await;
    assert!(memory.invalidate_session(first.holder()));
    let (seq, reason) = next_matching(&mut events, "the loss", |_, event| match event {
        LeaderEvent::Lost { sequencer, reason } => Some((sequencer.clone(), reason.clone())),
        _ => None,
    })
    .await;
    assert_eq!(
        (seq, reason),
        (first.clone(), LostReason::SessionInvalidated)
    );
    // The worker was dropped before the loss was reported.
    assert_eq!(dropped.try_recv().ok(), Some(first.clone()));

    let (_, second) = next_matching(&mut events, "the re-election", elected).await;
    assert!(second.index() > first.index());
    assert_ne!(second.holder(), first.holder());

    shutdown.cancel();
    let end = within(EVENT, "the campaign to stop", run).await.unwrap();
    assert_eq!(end.unwrap(), CampaignEnd::Shutdown);
    assert_eq!(dropped.try_recv().ok(), Some(second));
    assert!(memory.sessions().is_empty(), "{:?}", memory.sessions());
}

/// Two nodes with a 15 s lock-delay and TTL: the follower is elected long before either could
/// run out, which only an explicit release on shutdown allows.
async fn shutdown_hands_over_at_once(backend: Arc<dyn Backend>, key: &str, limit: Duration) {
    let spec = LeaseSpec::leader(key)
        .ttl(Duration::from_secs(15))
        .lock_delay(Duration::from_secs(15));
    let (events_tx, mut events) = mpsc::unbounded_channel();
    let tokens = [CancellationToken::new(), CancellationToken::new()];
    let mut runs = Vec::new();
    for (node, token) in ["a", "b"].into_iter().zip(&tokens) {
        let campaign = campaign(Arc::clone(&backend), spec.clone(), node, &events_tx);
        runs.push(tokio::spawn(campaign.run_until(token.clone(), |_lease| {
            std::future::pending::<Result<(), BoxError>>()
        })));
    }
    let (leader, first) = next_matching(&mut events, "the first election", elected).await;
    let leader_index = usize::from(leader == "b");
    tokens[leader_index].cancel();
    let (follower, second) = next_matching_within(
        limit,
        &mut events,
        "the follower's election after the leader's shutdown",
        elected,
    )
    .await;
    assert_ne!(follower, leader);
    assert!(second.index() > first.index());
    let end = within(
        EVENT,
        "the old leader's campaign to stop",
        runs.remove(leader_index),
    )
    .await
    .unwrap();
    assert_eq!(end.unwrap(), CampaignEnd::Shutdown);
    for token in &tokens {
        token.cancel();
    }
    within(EVENT, "the new leader's campaign to stop", runs.remove(0))
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn shutdown_hands_over_at_once_on_memory() {
    lease_tests::init_tracing();
    let memory = Memory::new();
    shutdown_hands_over_at_once(
        Arc::new(memory.clone()),
        "loop/handover",
        Duration::from_secs(2),
    )
    .await;
    assert!(memory.sessions().is_empty());
}

#[tokio::test]
async fn a_panicking_worker_steps_down_and_the_campaign_goes_on() {
    lease_tests::init_tracing();
    let memory = Memory::new();
    let (events_tx, mut events) = mpsc::unbounded_channel();
    let shutdown = CancellationToken::new();
    let calls = Arc::new(AtomicU32::new(0));
    let worker_calls = Arc::clone(&calls);
    let run = tokio::spawn(
        campaign(
            Arc::new(memory.clone()),
            spec("loop/panic"),
            "a",
            &events_tx,
        )
        .run_until(shutdown.clone(), move |_lease| {
            let call = worker_calls.fetch_add(1, Ordering::SeqCst);
            async move {
                match call {
                    0 => panic!("boom in the worker"),
                    1 => Err::<(), BoxError>("the worker gave up".into()),
                    _ => std::future::pending().await,
                }
            }
        }),
    );
    let message = next_matching(&mut events, "the panic report", |_, event| match event {
        LeaderEvent::WorkerPanicked { message, .. } => Some(message.clone()),
        _ => None,
    })
    .await;
    assert!(message.contains("boom in the worker"), "{message}");
    let error = next_matching(&mut events, "the failure report", |_, event| match event {
        LeaderEvent::WorkerFailed { error, .. } => Some(error.to_string()),
        _ => None,
    })
    .await;
    assert_eq!(error, "the worker gave up");
    let (_, third) = next_matching(&mut events, "the third election", elected).await;
    assert_eq!(third.index(), 3);
    shutdown.cancel();
    within(EVENT, "the campaign to stop", run)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn a_finished_worker_ends_the_campaign_or_runs_again_as_configured() {
    lease_tests::init_tracing();
    let memory = Memory::new();
    let backend: Arc<dyn Backend> = Arc::new(memory.clone());
    let end = within(
        EVENT,
        "a campaign whose worker finishes",
        Campaign::new(Arc::clone(&backend), spec("loop/finish"))
            .run_until(CancellationToken::new(), |_lease| async { Ok(()) }),
    )
    .await
    .unwrap();
    assert_eq!(end, CampaignEnd::WorkerFinished);
    assert!(memory.sessions().is_empty());

    let (events_tx, mut events) = mpsc::unbounded_channel();
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(
        campaign(Arc::clone(&backend), spec("loop/finish"), "a", &events_tx)
            .after_worker_returns(AfterWorker::Recampaign)
            .run_until(shutdown.clone(), |_lease| async { Ok(()) }),
    );
    for _ in 0..3 {
        next_matching(&mut events, "a finished tenure", |_, event| {
            matches!(event, LeaderEvent::WorkerFinished { .. }).then_some(())
        })
        .await;
    }
    shutdown.cancel();
    within(EVENT, "the campaign to stop", run)
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn observers_see_each_new_leader() {
    lease_tests::init_tracing();
    let memory = Memory::new();
    let backend: Arc<dyn Backend> = Arc::new(memory.clone());
    let key = "loop/observe";
    let mut follower = backend.observe_leader(key).await.unwrap();
    assert_eq!(follower.leader(), None);

    let (events_tx, mut events) = mpsc::unbounded_channel();
    let mut tokens = Vec::new();
    let mut runs = Vec::new();
    for node in ["a", "b", "c"] {
        let token = CancellationToken::new();
        let campaign = campaign(
            Arc::clone(&backend),
            spec(key).value(format!("http://{node}.internal")),
            node,
            &events_tx,
        );
        runs.push(tokio::spawn(campaign.run_until(token.clone(), |_lease| {
            std::future::pending::<Result<(), BoxError>>()
        })));
        tokens.push((node, token));
    }

    let mut seen = Vec::new();
    for _ in 0..3 {
        let (node, sequencer) = next_matching(&mut events, "an election", elected).await;
        let expected = format!("http://{node}.internal");
        let leader = within(
            EVENT,
            "the follower to observe the new leader",
            follower.wait_for(|leader| leader.is_some_and(|l| l.sequencer == sequencer)),
        )
        .await
        .unwrap()
        .unwrap();
        assert_eq!(leader.value_str(), Some(expected.as_str()));
        // Every campaigning node hears of the new leader too.
        next_matching(
            &mut events,
            "a LeaderChanged event",
            |_, event| match event {
                LeaderEvent::LeaderChanged { leader: Some(l) } if l.sequencer == sequencer => {
                    Some(())
                }
                _ => None,
            },
        )
        .await;
        seen.push(sequencer.index());
        let (_, token) = tokens.iter().find(|(n, _)| *n == node).unwrap();
        token.cancel();
    }
    assert!(seen.windows(2).all(|w| w[1] > w[0]), "{seen:?}");
    within(
        EVENT,
        "the follower to observe that nobody leads",
        follower.wait_for(|leader| leader.is_none()),
    )
    .await
    .unwrap();
    for run in runs {
        within(EVENT, "a campaign to stop", run)
            .await
            .unwrap()
            .unwrap();
    }
}

#[tokio::test]
async fn shutdown_hands_over_within_100ms_on_consul() {
    lease_tests::init_tracing();
    let agent = lease_tests::consul::Agent::start().await;
    shutdown_hands_over_at_once(
        Arc::new(agent.backend()),
        "loop/handover",
        Duration::from_millis(100),
    )
    .await;
}

/// Reports when it is dropped.
struct DroppedSignal(Option<tokio::sync::oneshot::Sender<()>>);

impl Drop for DroppedSignal {
    fn drop(&mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(());
        }
    }
}

#[tokio::test]
async fn dropping_the_campaign_mid_tenure_drops_the_worker() {
    let memory = Memory::new();
    let backend: Arc<dyn Backend> = Arc::new(memory.clone());
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let (dropped_tx, dropped_rx) = tokio::sync::oneshot::channel();
    let mut started_tx = Some(started_tx);
    let mut dropped_tx = Some(dropped_tx);
    let campaign = Campaign::new(backend, LeaseSpec::leader("loop/dropped"));
    let running = tokio::spawn(campaign.run_until(CancellationToken::new(), move |_lease| {
        let signal = DroppedSignal(dropped_tx.take());
        let started = started_tx.take();
        async move {
            let _signal = signal;
            if let Some(started) = started {
                let _ = started.send(());
            }
            std::future::pending::<Result<(), BoxError>>().await
        }
    }));
    within(EVENT, "the worker to start", started_rx)
        .await
        .unwrap();
    // Drop the campaign's future (as a select! or an aborted task would), not its token.
    running.abort();
    within(
        EVENT,
        "the worker to be dropped with its campaign",
        dropped_rx,
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn transient_errors_are_retried_until_elected() {
    lease_tests::init_tracing();
    let memory = Memory::new();
    let other = memory.acquire(&spec("loop/busy")).await.unwrap();
    let (events_tx, mut events) = mpsc::unbounded_channel();
    let shutdown = CancellationToken::new();
    let campaign = campaign(
        Arc::new(memory.clone()),
        spec("loop/busy").wait(Wait::Never),
        "a",
        &events_tx,
    );
    let handle = campaign.handle();
    let run = tokio::spawn(campaign.hold_until(shutdown.clone()));
    for _ in 0..2 {
        let error = next_matching(&mut events, "a retried failure", |_, event| match event {
            LeaderEvent::AcquireFailed { error, .. } => Some(Arc::clone(error)),
            _ => None,
        })
        .await;
        assert!(error.is_busy() && error.is_transient(), "{error:?}");
    }
    assert!(handle.last_error().is_some_and(|e| e.is_busy()));
    assert_eq!(handle.state(), CampaignState::Running);
    other.release().await.unwrap();
    next_matching(&mut events, "the election", elected).await;
    assert!(handle.last_error().is_none());
    shutdown.cancel();
    within(EVENT, "the campaign to stop", run)
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn handles_share_the_terms_state_and_events_of_one_campaign() {
    lease_tests::init_tracing();
    let memory = Memory::new();
    let campaign =
        Campaign::try_new(Arc::new(memory.clone()), spec("loop/handle").value("me")).unwrap();
    let handles = [campaign.handle(), campaign.handle()];
    assert_eq!(handles[0].state(), CampaignState::NotStarted);
    let mut events = handles[1].events();
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(campaign.hold_until(shutdown.clone()));

    let sequencer = within(EVENT, "the election", async {
        loop {
            if let LeaderEvent::Elected { sequencer } = events.recv().await.unwrap() {
                return sequencer;
            }
        }
    })
    .await;
    for handle in &handles {
        assert_eq!(handle.state(), CampaignState::Running);
        assert_eq!(
            handle.term().map(|t| t.sequencer().clone()),
            Some(sequencer.clone())
        );
        let leader = handle.leader().unwrap();
        assert_eq!(
            (&leader.sequencer, leader.value_str()),
            (&sequencer, Some("me"))
        );
    }
    assert_eq!(memory.sessions(), vec![sequencer.holder().to_owned()]);

    shutdown.cancel();
    within(EVENT, "the release", async {
        loop {
            if let LeaderEvent::Released {
                sequencer: released,
            } = events.recv().await.unwrap()
            {
                assert_eq!(released, sequencer);
                return;
            }
        }
    })
    .await;
    within(EVENT, "the campaign to stop", run)
        .await
        .unwrap()
        .unwrap();
    for handle in &handles {
        assert_eq!(handle.state(), CampaignState::Ended(CampaignEnd::Shutdown));
        assert!(handle.term().is_none() && !handle.is_leader());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_never_reports_nobody_leading_through_a_backend_outage() {
    lease_tests::init_tracing();
    let agent = lease_tests::consul::Agent::start().await;
    let proxy = lease_tests::proxy::Proxy::start(agent.addr())
        .await
        .unwrap();
    let backend = Arc::new(
        lease_consul::Consul::builder()
            .address(proxy.url())
            .build()
            .unwrap(),
    );
    let (events_tx, mut events) = mpsc::unbounded_channel();
    let (worker_tx, mut worker_dropped) = mpsc::unbounded_channel();
    let shutdown = CancellationToken::new();
    let campaign = campaign(backend, spec("loop/outage").value("me"), "a", &events_tx);
    let handle = campaign.handle();
    let run = tokio::spawn(campaign.run_until(shutdown.clone(), move |lease| {
        let signal = DropSignal(worker_tx.clone(), lease.sequencer().clone());
        async move {
            let _signal = signal;
            std::future::pending::<Result<(), BoxError>>().await
        }
    }));
    let (_, sequencer) = next_matching(&mut events, "the election", elected).await;
    // The watch may report this node just before the campaign does: no order between the two.
    let mut leaders = handle.leaders();
    within(
        EVENT,
        "this node as the leader",
        leaders.wait_for(|l| l.as_ref().is_some_and(|l| l.sequencer == sequencer)),
    )
    .await
    .unwrap();

    // Consul answers every request with 500 for a while, well within the lease's fence (TTL
    // 15 s): the watch of who leads ends and cannot start again, but the lease holds.
    proxy.set_http_500(true);
    let watch = handle.leader_watch().unwrap().clone();
    within(EVENT, "the watch to lose sight of the key", async {
        let mut observation = watch.subscribe();
        let _ = observation
            .wait_for(|o| matches!(o, Observation::Unknown))
            .await;
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(handle.is_leader());
    assert_eq!(
        handle.leader().map(|l| l.sequencer),
        Some(sequencer.clone())
    );
    proxy.set_http_500(false);
    within(EVENT, "the watch to see the key again", async {
        let mut observation = watch.subscribe();
        let _ = observation
            .wait_for(|o| o.leader().is_some_and(|l| l.sequencer == sequencer))
            .await;
    })
    .await;

    // Nothing said this node no longer leads, and its worker ran on throughout.
    while let Ok((_, event)) = events.try_recv() {
        match event {
            LeaderEvent::LeaderChanged { leader: None } | LeaderEvent::Lost { .. } => {
                panic!("reported during the outage while this node led: {event:?}")
            }
            _ => {}
        }
    }
    assert!(worker_dropped.try_recv().is_err());
    assert!(handle.is_leader());
    shutdown.cancel();
    within(EVENT, "the campaign to stop", run)
        .await
        .unwrap()
        .unwrap();
}
