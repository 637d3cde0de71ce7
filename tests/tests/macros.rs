//! `#[leader_only]` and `#[semaphore]` at run time, on the in-process memory backend.
//!
//! Each test uses its own keys: an invalidated session leaves its key under lock-delay.

use std::fmt::Display;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use lease_core::memory::Memory;
use lease_core::{
    Backend, BackendKind, GuardError, LeaseSpec, LostReason, Sequencer, Wait, leader_only,
    semaphore,
};
use lease_tests::{init_tracing, within};
use tokio::sync::{mpsc, oneshot};

const T: Duration = Duration::from_secs(10);

#[leader_only(key = "macros/free", backend = backend)]
async fn count_up(backend: &Memory, runs: &AtomicUsize) -> usize {
    runs.fetch_add(1, Ordering::SeqCst) + 1
}

#[tokio::test]
async fn the_body_runs_when_the_lease_is_free_and_the_lease_is_released_after() {
    init_tracing();
    let memory = Memory::new();
    let runs = AtomicUsize::new(0);
    assert_eq!(
        within(T, "first run", count_up(&memory, &runs)).await.ok(),
        Some(1)
    );
    // Released before returning: the next call takes it at once, and nothing is left behind.
    assert_eq!(
        within(T, "second run", count_up(&memory, &runs)).await.ok(),
        Some(2)
    );
    assert!(memory.sessions().is_empty(), "{:?}", memory.sessions());
}

#[leader_only(key = "macros/busy", wait = "never", backend = backend)]
async fn skip_when_busy(backend: &Memory, ran: &AtomicBool) {
    ran.store(true, Ordering::SeqCst);
}

#[leader_only(key = "macros/busy", wait = "200ms", backend = backend)]
async fn wait_briefly(backend: &Memory, ran: &AtomicBool) {
    ran.store(true, Ordering::SeqCst);
}

#[tokio::test]
async fn the_body_is_skipped_when_the_lease_is_held_elsewhere() {
    init_tracing();
    let memory = Memory::new();
    let other = within(
        T,
        "the other holder",
        memory.acquire(&LeaseSpec::leader("macros/busy")),
    )
    .await
    .expect("the key is free");
    let ran = AtomicBool::new(false);

    let skipped = within(
        T,
        "a call that does not wait",
        skip_when_busy(&memory, &ran),
    )
    .await;
    assert!(
        matches!(&skipped, Err(GuardError::Busy { key, .. }) if key == "macros/busy"),
        "{skipped:?}"
    );
    let timed_out = within(T, "a call that waits 200ms", wait_briefly(&memory, &ran)).await;
    assert!(
        timed_out.as_ref().is_err_and(GuardError::is_busy),
        "{timed_out:?}"
    );
    assert!(
        !ran.load(Ordering::SeqCst),
        "the body ran while the lease was held elsewhere"
    );

    other.release().await.expect("release");
    within(T, "a call after release", skip_when_busy(&memory, &ran))
        .await
        .expect("the lease is free again");
    assert!(ran.load(Ordering::SeqCst));
}

#[leader_only(key = "macros/wait", wait = "forever", backend = backend)]
async fn wait_for_the_lease(backend: Memory, started: oneshot::Sender<()>) -> &'static str {
    let _ = started.send(());
    "ran"
}

#[tokio::test]
async fn the_body_waits_for_the_lease_and_runs_once_it_is_free() {
    init_tracing();
    let memory = Memory::new();
    let other = within(
        T,
        "the other holder",
        memory.acquire(&LeaseSpec::leader("macros/wait")),
    )
    .await
    .expect("the key is free");
    let (started_tx, mut started_rx) = oneshot::channel();
    let call = tokio::spawn(wait_for_the_lease(memory.clone(), started_tx));

    // The waiter must not start while the other holder has the lease. Bounded, and only a
    // negative check: the release below is what lets it proceed.
    let early = tokio::time::timeout(Duration::from_millis(300), &mut started_rx).await;
    assert!(
        early.is_err(),
        "the body started while the lease was held elsewhere"
    );

    other.release().await.expect("release");
    within(T, "the waiting body to start", started_rx)
        .await
        .expect("started");
    let outcome = within(T, "the waiting call", call).await.expect("the task");
    assert_eq!(outcome.ok(), Some("ran"));
}

/// Tells the test when the body it belongs to is dropped.
struct DropGuard(Option<oneshot::Sender<()>>);

impl Drop for DropGuard {
    fn drop(&mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(());
        }
    }
}

#[leader_only(key = "macros/lost", lock_delay = "0s", backend = backend)]
async fn run_until_cancelled(
    backend: Memory,
    running: oneshot::Sender<Sequencer>,
    dropped: oneshot::Sender<()>,
) -> u32 {
    let _guard = DropGuard(Some(dropped));
    let sequencer = lease_core::current_sequencer().expect("inside the guarded body");
    let _ = running.send(sequencer);
    std::future::pending::<()>().await;
    0
}

#[tokio::test]
async fn the_body_is_cancelled_when_the_lease_is_lost() {
    init_tracing();
    let memory = Memory::new();
    let (running_tx, running_rx) = oneshot::channel();
    let (dropped_tx, dropped_rx) = oneshot::channel();
    let call = tokio::spawn(run_until_cancelled(memory.clone(), running_tx, dropped_tx));

    let sequencer = within(T, "the body to start", running_rx)
        .await
        .expect("started");
    assert!(
        memory.invalidate_session(sequencer.holder()),
        "the session exists"
    );

    within(T, "the body to be dropped", dropped_rx)
        .await
        .expect("the drop guard ran");
    let outcome = within(T, "the call to return", call)
        .await
        .expect("the task");
    assert!(
        matches!(
            outcome,
            Err(GuardError::Lost(LostReason::SessionInvalidated))
        ),
        "{outcome:?}"
    );
}

#[leader_only(key = "macros/deleted", lock_delay = "0s", backend = backend)]
async fn run_until_key_deleted(backend: Memory, running: oneshot::Sender<()>) {
    let _ = running.send(());
    std::future::pending::<()>().await;
}

#[tokio::test]
async fn deleting_the_key_cancels_the_body() {
    init_tracing();
    let memory = Memory::new();
    let (running_tx, running_rx) = oneshot::channel();
    let call = tokio::spawn(run_until_key_deleted(memory.clone(), running_tx));
    within(T, "the body to start", running_rx)
        .await
        .expect("started");
    assert!(memory.delete_key("macros/deleted"));
    let outcome = within(T, "the call to return", call)
        .await
        .expect("the task");
    assert!(
        matches!(outcome, Err(GuardError::Lost(LostReason::KeyDeleted))),
        "{outcome:?}"
    );
}

#[leader_only(key = "macros/sequencer", backend = backend)]
async fn report_sequencer(backend: &Memory) -> (Option<Sequencer>, Vec<String>, bool) {
    let watcher = lease_core::current_lease().expect("inside the guarded body");
    (
        lease_core::current_sequencer(),
        backend.sessions(),
        watcher.is_held(),
    )
}

#[tokio::test]
async fn the_sequencer_inside_is_the_lease_s_and_changes_per_acquisition() {
    init_tracing();
    let memory = Memory::new();
    assert_eq!(
        lease_core::current_sequencer(),
        None,
        "outside guarded work"
    );

    let (first, sessions, held) = within(T, "first call", report_sequencer(&memory))
        .await
        .expect("free");
    let first = first.expect("a sequencer inside");
    assert!(held);
    assert_eq!(first.backend(), BackendKind::Memory);
    assert_eq!(first.key(), "macros/sequencer");
    // The holder is the session the backend shows for the running lease.
    assert_eq!(sessions, vec![first.holder().to_owned()]);

    let (second, _, _) = within(T, "second call", report_sequencer(&memory))
        .await
        .expect("free");
    let second = second.expect("a sequencer inside");
    assert_ne!(first, second, "each acquisition has its own fencing token");
    assert!(second.index() > first.index(), "{first} then {second}");
    assert_eq!(lease_core::current_sequencer(), None, "outside again");
}

#[semaphore("macros/reports", 2, wait = "never", backend = backend)]
async fn hold_a_slot(
    backend: Memory,
    holding: Arc<AtomicUsize>,
    entered: mpsc::Sender<()>,
    leave: Arc<tokio::sync::Notify>,
) -> usize {
    let now = holding.fetch_add(1, Ordering::SeqCst) + 1;
    let _ = entered.send(()).await;
    leave.notified().await;
    holding.fetch_sub(1, Ordering::SeqCst);
    now
}

#[tokio::test]
async fn a_semaphore_runs_at_most_limit_bodies_at_once() {
    init_tracing();
    let memory = Memory::new();
    let holding = Arc::new(AtomicUsize::new(0));
    let leave = Arc::new(tokio::sync::Notify::new());
    let (entered_tx, mut entered_rx) = mpsc::channel(4);
    let mut calls = Vec::new();
    for _ in 0..2 {
        calls.push(tokio::spawn(hold_a_slot(
            memory.clone(),
            Arc::clone(&holding),
            entered_tx.clone(),
            Arc::clone(&leave),
        )));
        within(T, "a body to take a slot", entered_rx.recv())
            .await
            .expect("entered");
    }
    let third = within(
        T,
        "a third call",
        hold_a_slot(
            memory.clone(),
            Arc::clone(&holding),
            entered_tx.clone(),
            Arc::clone(&leave),
        ),
    )
    .await;
    assert!(third.as_ref().is_err_and(GuardError::is_busy), "{third:?}");
    assert_eq!(holding.load(Ordering::SeqCst), 2);

    leave.notify_waiters();
    for call in calls {
        let outcome = within(T, "a holder to finish", call)
            .await
            .expect("the task");
        assert!(outcome.is_ok(), "{outcome:?}");
    }
    assert_eq!(holding.load(Ordering::SeqCst), 0);
}

#[derive(Clone)]
struct Jobs {
    backend: Memory,
    runs: u32,
}

impl Jobs {
    #[leader_only(key = "macros/methods/ref", backend = &self.backend)]
    async fn by_ref(&self) -> u32 {
        self.runs
    }

    #[leader_only(key = "macros/methods/mut", backend = self.backend.clone())]
    async fn by_mut(&mut self) -> u32 {
        self.runs += 1;
        self.runs
    }

    #[semaphore(name = "macros/methods/value", limit = 1, backend = self.backend.clone())]
    async fn by_value(self) -> Self {
        self
    }
}

#[leader_only(key = "macros/generic", backend = backend)]
async fn describe<B: Backend, T: Display + Send>(backend: &B, value: T) -> String {
    format!("<{value}>")
}

#[tokio::test]
async fn methods_and_generic_functions_are_guarded() {
    init_tracing();
    let mut jobs = Jobs {
        backend: Memory::new(),
        runs: 0,
    };
    assert_eq!(within(T, "&mut self", jobs.by_mut()).await.ok(), Some(1));
    assert_eq!(within(T, "&self", jobs.by_ref()).await.ok(), Some(1));
    let jobs = within(T, "self", jobs.by_value()).await.expect("free");
    assert_eq!(jobs.runs, 1);

    let backend: Arc<dyn Backend> = Arc::new(Memory::new());
    assert_eq!(
        within(T, "generic", describe(&backend, 7))
            .await
            .ok()
            .as_deref(),
        Some("<7>")
    );
    assert_eq!(
        within(T, "generic", describe(&jobs.backend, "x"))
            .await
            .ok()
            .as_deref(),
        Some("<x>")
    );
}

trait Job {
    fn backend(&self) -> Memory;

    #[leader_only(key = "macros/trait", backend = self.backend())]
    async fn run(&self) -> &'static str {
        "provided"
    }
}

impl Job for Jobs {
    fn backend(&self) -> Memory {
        self.backend.clone()
    }
}

#[tokio::test]
async fn provided_trait_methods_are_guarded() {
    init_tracing();
    let jobs = Jobs {
        backend: Memory::new(),
        runs: 0,
    };
    assert_eq!(
        within(T, "trait method", jobs.run()).await.ok(),
        Some("provided")
    );
}

#[leader_only(key = "macros/result", backend = backend)]
async fn parse(backend: &Memory, text: &str) -> Result<u32, std::num::ParseIntError> {
    let n: u32 = text.trim().parse()?;
    if n == 0 {
        return Ok(100);
    }
    Ok(n * 2)
}

#[leader_only(key = "macros/impl-trait", backend = backend)]
async fn shown(backend: &Memory, n: u32) -> impl Display + use<> {
    format!("n={n}")
}

#[tokio::test]
async fn return_types_keep_their_meaning() {
    init_tracing();
    let memory = Memory::new();
    // The body's own error stays inside `Ok`: it ran, and failed on its own terms.
    let parsed = within(T, "parse", parse(&memory, "21")).await;
    assert!(matches!(parsed, Ok(Ok(42))), "{parsed:?}");
    let early = within(T, "parse", parse(&memory, "0")).await;
    assert!(matches!(early, Ok(Ok(100))), "{early:?}");
    let failed = within(T, "parse", parse(&memory, "x")).await;
    assert!(matches!(failed, Ok(Err(_))), "{failed:?}");

    let text = within(T, "impl Trait", shown(&memory, 3))
        .await
        .expect("free");
    assert_eq!(text.to_string(), "n=3");
}

mod shadowed {
    //! Names that would capture relative paths in the generated code.
    #![allow(dead_code)]

    mod lease_core {
        pub(super) struct GuardError;
    }

    mod tokio {}

    #[::lease_core::leader_only(key = "macros/shadowed", backend = backend)]
    pub(super) async fn shadowed(backend: &::lease_core::memory::Memory) -> u8 {
        1
    }
}

#[tokio::test]
async fn generated_code_ignores_user_modules_named_like_its_crates() {
    init_tracing();
    let memory = Memory::new();
    assert_eq!(
        within(T, "shadowed", shadowed::shadowed(&memory))
            .await
            .ok(),
        Some(1)
    );
}

#[leader_only(key = "macros/default", wait = "never")]
async fn on_the_default_backend() -> Option<Sequencer> {
    lease_core::current_sequencer()
}

#[tokio::test]
async fn without_a_backend_argument_the_default_backend_is_used() {
    init_tracing();
    // The only test in this binary that touches the process-wide default
    // (tests/macros_no_default.rs checks the unset case in its own process).
    let memory = Memory::new();
    lease_core::set_default_backend(memory.clone());
    let sequencer = within(T, "default backend", on_the_default_backend())
        .await
        .expect("free")
        .expect("inside");
    assert_eq!(sequencer.key(), "macros/default");

    // It really came from that store: held there, the call is busy.
    let other = memory
        .acquire(&LeaseSpec::leader("macros/default").wait(Wait::Never))
        .await
        .expect("free");
    let busy = within(T, "default backend, busy", on_the_default_backend()).await;
    assert!(busy.as_ref().is_err_and(GuardError::is_busy), "{busy:?}");
    other.release().await.expect("release");
}

#[leader_only(key = "macros/scoped-default", wait = "never")]
async fn on_the_scoped_default(mine: &Memory) -> usize {
    // Held in the caller's own store, whatever the other tests scope or set meanwhile.
    let held_here = mine.sessions().len();
    tokio::task::yield_now().await;
    held_here
}

/// Calls the guarded fn many times, each time yielding inside it, under `mine` as the scoped
/// default; with a process-wide default, a parallel test would swap the store underneath.
async fn calls_under_a_scoped_default(mine: Memory) {
    for round in 0..50 {
        let held = lease_core::with_default_backend(mine.clone(), on_the_scoped_default(&mine));
        let held = within(T, "a call on the scoped default", held).await;
        assert_eq!(
            held.ok(),
            Some(1),
            "round {round}: not acquired from this test's store"
        );
        assert!(mine.sessions().is_empty(), "round {round}: released");
    }
}

// The two tests below run in parallel (libtest's default) with different memory stores and the
// same key, next to `without_a_backend_argument_the_default_backend_is_used`, which sets the
// process-wide default: each takes the key from its own store every time.
#[tokio::test]
async fn a_scoped_default_backend_is_this_tests_own_a() {
    init_tracing();
    calls_under_a_scoped_default(Memory::new()).await;
}

#[tokio::test]
async fn a_scoped_default_backend_is_this_tests_own_b() {
    init_tracing();
    calls_under_a_scoped_default(Memory::new()).await;
}

#[tokio::test]
async fn scopes_interleaved_in_one_task_each_keep_their_backend() {
    init_tracing();
    let (a, b) = (Memory::new(), Memory::new());
    let barrier = tokio::sync::Barrier::new(2);
    let in_scope = |mine: Memory| {
        let barrier = &barrier;
        lease_core::with_default_backend(mine.clone(), async move {
            let outcome = lease_core::guarded_by_default(
                &LeaseSpec::leader("macros/scoped-join").wait(Wait::Never),
                async {
                    // Both hold the same key at once: only possible in two different stores.
                    barrier.wait().await;
                    mine.sessions().len()
                },
            )
            .await;
            // Nested scopes: the innermost wins, and the outer comes back after it.
            let inner = Memory::new();
            let nested = lease_core::with_default_backend(inner.clone(), async {
                lease_core::guarded_by_default(&LeaseSpec::leader("macros/scoped-join"), async {
                    inner.sessions().len()
                })
                .await
            })
            .await;
            (outcome.ok(), nested.ok())
        })
    };
    let (from_a, from_b) = within(T, "both scopes", async {
        tokio::join!(in_scope(a.clone()), in_scope(b.clone()))
    })
    .await;
    assert_eq!(from_a, (Some(1), Some(1)));
    assert_eq!(from_b, (Some(1), Some(1)));
}

#[leader_only(key = format!("macros/tenants/{tenant}"), wait = "never", backend = backend)]
async fn per_tenant(backend: &Memory, tenant: &str, ran: &AtomicUsize) -> Option<Sequencer> {
    ran.fetch_add(1, Ordering::SeqCst);
    lease_core::current_sequencer()
}

#[tokio::test]
async fn a_key_built_from_the_arguments_is_evaluated_per_call_and_checked_at_run_time() {
    init_tracing();
    let memory = Memory::new();
    let ran = AtomicUsize::new(0);
    let acme = within(T, "tenant acme", per_tenant(&memory, "acme", &ran)).await;
    assert_eq!(
        acme.ok().flatten().map(|s| s.key().to_owned()).as_deref(),
        Some("macros/tenants/acme")
    );
    // Another tenant's key is another lease: held by someone else, acme still runs.
    let other = memory
        .acquire(&LeaseSpec::leader("macros/tenants/globex").wait(Wait::Never))
        .await
        .expect("free");
    let acme = within(T, "acme, globex held", per_tenant(&memory, "acme", &ran)).await;
    assert!(acme.is_ok(), "{acme:?}");
    let globex = within(T, "globex, held", per_tenant(&memory, "globex", &ran)).await;
    assert!(
        globex.as_ref().is_err_and(GuardError::is_busy),
        "{globex:?}"
    );
    other.release().await.expect("release");

    // A key that breaks the key rule fails before anything is acquired; the body does not run.
    let before = ran.load(Ordering::SeqCst);
    let bad = within(T, "an empty segment", per_tenant(&memory, "", &ran)).await;
    assert!(
        matches!(&bad, Err(GuardError::Backend(lease_core::Error::InvalidKey { key, .. })) if key == "macros/tenants/"),
        "{bad:?}"
    );
    assert_eq!(ran.load(Ordering::SeqCst), before);
    assert!(memory.sessions().is_empty(), "{:?}", memory.sessions());
}

#[leader_only(key = "macros/stack/leader", wait = "never", backend = backend)]
#[semaphore("macros/stack/slots", 1, wait = "never", backend = backend)]
async fn stacked(backend: &Memory, ran: &AtomicUsize) -> Option<Sequencer> {
    ran.fetch_add(1, Ordering::SeqCst);
    lease_core::current_sequencer()
}

#[tokio::test]
async fn stacked_attributes_hold_both_leases_and_return_one_result() {
    init_tracing();
    let memory = Memory::new();
    let ran = AtomicUsize::new(0);
    // One Result: not Result<Result<…, GuardError>, GuardError>.
    let outcome: Result<Option<Sequencer>, GuardError> =
        within(T, "both free", stacked(&memory, &ran)).await;
    let inside = outcome.expect("both leases free").expect("inside");
    // The innermost lease's: a slot's sequencer names its holder key under the prefix.
    assert!(inside.key().starts_with("macros/stack/slots/"), "{inside}");
    assert!(memory.sessions().is_empty(), "both released");

    for busy_key in ["macros/stack/leader", "macros/stack/slots"] {
        let spec = if busy_key.ends_with("leader") {
            LeaseSpec::leader(busy_key)
        } else {
            LeaseSpec::semaphore(busy_key, 1)
        };
        let other = memory.acquire(&spec).await.expect("free");
        let outcome = within(T, "one of them busy", stacked(&memory, &ran)).await;
        assert!(
            matches!(&outcome, Err(GuardError::Busy { key, .. }) if key == busy_key),
            "{outcome:?}"
        );
        other.release().await.expect("release");
    }
    assert_eq!(
        ran.load(Ordering::SeqCst),
        1,
        "the body ran only with both held"
    );
    assert!(memory.sessions().is_empty(), "{:?}", memory.sessions());
}

#[leader_only(key = "macros/scheduled", wait = "never", min_hold = "1h", max_run = "2h", backend = backend)]
async fn fast_scheduled_job(backend: &Memory, ran: &AtomicUsize) {
    ran.fetch_add(1, Ordering::SeqCst);
}

#[leader_only(key = "macros/too-long", max_run = "50ms", backend = backend)]
async fn job_that_hangs(backend: &Memory) {
    std::future::pending::<()>().await
}

#[tokio::test]
async fn min_hold_and_max_run_on_the_attribute() {
    init_tracing();
    let memory = Memory::new();
    let ran = AtomicUsize::new(0);
    within(T, "the job", fast_scheduled_job(&memory, &ran))
        .await
        .expect("ran");
    // Fired again (another node's skewed schedule): the lease is still kept, the job skips.
    let again = within(T, "the job again", fast_scheduled_job(&memory, &ran)).await;
    assert!(again.as_ref().is_err_and(GuardError::is_busy), "{again:?}");
    assert_eq!(ran.load(Ordering::SeqCst), 1);
    // A shutdown gives the kept lease back at once (documented on LeaseSpec::min_hold).
    within(T, "shutdown", memory.shutdown()).await;
    assert!(memory.sessions().is_empty(), "{:?}", memory.sessions());

    let other = Memory::new();
    let hung = within(T, "the hanging job", job_that_hangs(&other)).await;
    assert!(
        matches!(&hung, Err(GuardError::TimedOut { key, .. }) if key == "macros/too-long"),
        "{hung:?}"
    );
    assert!(other.sessions().is_empty(), "released after max_run");
}
