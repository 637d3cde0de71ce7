//! A guarded call nested in guarded work on the same key is refused at once with "already held
//! by this task": never "held elsewhere", and never a wait for itself under `wait = "forever"`.
//!
//! On the memory backend through the macros, `guarded` and a campaign's worker; once on Consul.

use std::time::Duration;

use lease_core::leader::Campaign;
use lease_core::memory::Memory;
use lease_core::{
    BoxError, CancellationToken, Error, GuardError, LeaseSpec, guarded, leader_only, semaphore,
};
use lease_tests::consul::Agent;
use lease_tests::{init_tracing, within};

const T: Duration = Duration::from_secs(10);

#[leader_only(key = "nesting/leader", backend = backend)]
async fn outer(backend: &Memory) -> Result<(), GuardError> {
    inner(backend).await
}

// The default wait, forever: without the check this would wait for `outer`'s lease.
#[leader_only(key = "nesting/leader", backend = backend)]
async fn inner(backend: &Memory) {}

#[tokio::test]
async fn a_nested_leader_only_call_on_the_same_key_is_refused_at_once() {
    init_tracing();
    let memory = Memory::new();
    let outcome = within(T, "the outer call", outer(&memory)).await;
    let Ok(Err(GuardError::AlreadyHeld { key })) = &outcome else {
        panic!("expected the inner call to be refused, got {outcome:?}");
    };
    assert_eq!(key, "nesting/leader");
    let message = outcome
        .expect("the outer call ran")
        .unwrap_err()
        .to_string();
    assert!(message.contains("already held by this task"), "{message}");
    assert!(!message.contains("held elsewhere"), "{message}");
    // The outer lease was released as usual, and the inner call took nothing.
    assert!(memory.sessions().is_empty(), "{:?}", memory.sessions());
    // Not nested, the same call runs.
    within(T, "the inner call alone", inner(&memory))
        .await
        .expect("the key is free");
}

#[semaphore("nesting/reports", 3, backend = backend)]
async fn render_all(backend: &Memory) -> Result<(), GuardError> {
    render_one(backend).await
}

#[semaphore("nesting/reports", 3, backend = backend)]
async fn render_one(backend: &Memory) {}

#[tokio::test]
async fn a_nested_semaphore_call_on_the_same_semaphore_is_refused() {
    init_tracing();
    let memory = Memory::new();
    let outcome = within(T, "the outer call", render_all(&memory)).await;
    assert!(
        matches!(&outcome, Ok(Err(GuardError::AlreadyHeld { key })) if key == "nesting/reports"),
        "{outcome:?}"
    );
}

#[tokio::test]
async fn nested_guarded_calls_are_refused_on_the_same_key_and_run_on_another() {
    init_tracing();
    let memory = Memory::new();
    let spec = LeaseSpec::leader("nesting/direct");
    let outcome = within(
        T,
        "the outer guarded call",
        guarded(&memory, &spec, async {
            let same = guarded(&memory, &spec, async {}).await;
            let other = guarded(&memory, &LeaseSpec::leader("nesting/other"), async {
                lease_core::current_sequencer().map(|s| s.key().to_owned())
            })
            .await;
            // Back in the outer work, the outer lease is the current one again.
            let current = lease_core::current_sequencer().map(|s| s.key().to_owned());
            (same, other, current)
        }),
    )
    .await
    .expect("the outer call ran");
    let (same, other, current) = outcome;
    assert!(
        matches!(&same, Err(GuardError::AlreadyHeld { key }) if key == "nesting/direct"),
        "{same:?}"
    );
    assert_eq!(other.ok().flatten().as_deref(), Some("nesting/other"));
    assert_eq!(current.as_deref(), Some("nesting/direct"));
    // `?` into lease_core::Error keeps the meaning.
    let folded: Error = same.unwrap_err().into();
    assert!(matches!(folded, Error::AlreadyHeld { .. }), "{folded:?}");
    assert!(!folded.is_transient());
}

#[tokio::test]
async fn a_campaign_worker_calling_guarded_work_on_its_own_key_is_refused() {
    init_tracing();
    let memory = Memory::new();
    let spec = LeaseSpec::leader("nesting/campaign");
    let shutdown = CancellationToken::new();
    let (seen_tx, mut seen_rx) = tokio::sync::mpsc::unbounded_channel();
    let worker_spec = spec.clone();
    let worker_memory = memory.clone();
    let running = tokio::spawn(
        Campaign::try_new(memory.clone(), spec)
            .expect("a valid spec")
            .run_until(shutdown.clone(), move |_lease| {
                let seen_tx = seen_tx.clone();
                let spec = worker_spec.clone();
                let memory = worker_memory.clone();
                async move {
                    let current = lease_core::current_sequencer();
                    let nested = guarded(&memory, &spec, async {}).await;
                    let _ = seen_tx.send((current, nested));
                    std::future::pending::<Result<(), BoxError>>().await
                }
            }),
    );
    let (current, nested) = within(T, "the worker", seen_rx.recv())
        .await
        .expect("the worker reports");
    assert_eq!(
        current.as_ref().map(|s| s.key()),
        Some("nesting/campaign"),
        "the worker sees its term's sequencer"
    );
    assert!(
        matches!(&nested, Err(GuardError::AlreadyHeld { key }) if key == "nesting/campaign"),
        "{nested:?}"
    );
    shutdown.cancel();
    within(T, "the campaign to step down", running)
        .await
        .expect("the campaign task")
        .expect("a clean end");
}

#[tokio::test]
async fn a_nested_call_on_consul_is_refused_without_touching_the_agent() {
    init_tracing();
    let agent = Agent::start().await;
    let consul = agent.backend();
    let spec = LeaseSpec::leader("nesting/consul").lock_delay(Duration::ZERO);
    let outcome = within(
        T,
        "the outer guarded call",
        guarded(&consul, &spec, async {
            let sessions = agent.sessions().await.len();
            let nested = guarded(&consul, &spec, async {}).await;
            (sessions, nested, agent.sessions().await.len())
        }),
    )
    .await
    .expect("the outer call ran");
    let (before, nested, after) = outcome;
    assert!(
        matches!(&nested, Err(GuardError::AlreadyHeld { key }) if key == "nesting/consul"),
        "{nested:?}"
    );
    assert_eq!(before, after, "the refused call created no session");
}
