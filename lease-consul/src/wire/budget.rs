//! How many connections one client may use, and how it behaves while the agent refuses them.
//!
//! Consul limits each client IP to `limits.http_max_conns_per_client` concurrent HTTP
//! connections (200 by default), and every process on a host that talks to its local agent
//! shares that budget. Over HTTP/1.1 a connection carries one request at a time, so a client
//! never has more requests in flight than its budget of `max` connections allows:
//! [`Budget::admit`] hands out `max` permits when the client's own pool counts its connections
//! (the `pool` module: then at most `max` are ever open), and `max − 1` when it cannot (the
//! application's reqwest client), keeping the last connection for the pool's connect race (a
//! request that started connecting and was then served by a connection that came free meanwhile
//! still finishes its connection and parks it). That bound is not exact: two races at once can
//! open one more.
//!
//! Each prefix watch (the `watch` module) holds a **watch slot** for as long as it runs: one of
//! [`Budget::max_watches`] (all the requests but two), taken out of what the other requests may
//! use. Its reads are admitted by the slot alone, never queued behind the other requests: a burst
//! of thousands of acquisitions cannot delay the read that would tell a holder its key changed.
//! The other requests (the heartbeat, renewals, acquisitions, releases) share what the watches
//! leave, two at the least, so they never wait for a watch either. A slot taken while all of
//! those are in flight is paid back by the next one to finish (for that moment one more request
//! than the budget may be admitted; the counting pool still opens no connection past it, so that
//! request waits for one to come free).
//!
//! The **outage gate** keeps a refusing agent from being answered with a retry storm. From the
//! first refused, dropped or unreachable request (or a 429 answer) on, the whole client sends one
//! request at a time, each after a jittered pause that doubles from 100 ms up to 2 s; so a process
//! sends at most 20 requests per second during an outage, however many leases it holds or waits
//! for. The first answer of any kind (the agent is talking again) opens the gate. A request
//! waits at a closed gate for [`GATE_WAIT`] at most, then fails with the error that closed it
//! (which names the agent's connection limit): queued behind every retry of a process's leases,
//! a new acquire took 15 s and more to learn why the agent refuses it.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{Notify, Semaphore, SemaphorePermit};
use tokio::time::Instant;

use lease_core::backoff::Backoff;

use super::ApiError;

/// The default number of connections one client may open to the agent.
pub(crate) const DEFAULT_MAX_CONNECTIONS: usize = 8;
/// The fewest connections a client can work with: one for watches, two for everything else,
/// one for the pool's connect race (or a second watch, where connections are counted).
pub(crate) const MIN_CONNECTIONS: usize = 4;

/// The first pause of the outage gate. Jitter draws each pause from `[p / 2, p]`, so this
/// bounds an outage's request rate at 1 / 50 ms = 20 per second.
const GATE_FIRST: Duration = Duration::from_millis(100);
const GATE_MAX: Duration = Duration::from_secs(2);
/// The longest a request waits at a closed gate before it fails with the outage's error: a few
/// of the longest pauses. Nothing is sent meanwhile, so the bound does not raise the rate.
pub(crate) const GATE_WAIT: Duration = Duration::from_secs(5);

/// The requests in flight that watches may never take: the heartbeat, renewals, acquisitions
/// and releases always find one.
const KEPT_FOR_BRIEF: usize = 2;

/// The connection budget and outage gate of one client (see the module docs).
#[derive(Debug)]
pub(crate) struct Budget {
    /// What the requests other than watch reads may have in flight: the budget less the slots
    /// the watches hold.
    brief: Semaphore,
    /// Slots taken while no brief permit was free: each brief request that ends pays one back
    /// instead of returning its permit.
    debt: AtomicUsize,
    /// One per running watch: `max_watches` of them.
    watch_slots: Semaphore,
    max_watches: usize,
    gate: Gate,
}

/// What a request is admitted as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Answered at once; shares what the watches leave.
    Brief,
    /// A read of a watch, admitted by the [`WatchSlot`] its watch holds.
    Watch,
}

/// The permits of one admitted request, held until its answer has been read.
#[derive(Debug)]
pub(crate) struct Admission<'a> {
    budget: &'a Budget,
    brief: Option<SemaphorePermit<'a>>,
}

impl Drop for Admission<'_> {
    fn drop(&mut self) {
        if let Some(permit) = self.brief.take() {
            if self.budget.pay_debt() {
                permit.forget();
            }
        }
    }
}

/// The share of the budget one running watch holds (see the module docs); given back when
/// dropped.
#[derive(Debug)]
pub(crate) struct WatchSlot<'a> {
    budget: &'a Budget,
    _slot: Option<SemaphorePermit<'a>>,
}

impl Drop for WatchSlot<'_> {
    fn drop(&mut self) {
        if !self.budget.pay_debt() {
            self.budget.brief.add_permits(1);
        }
    }
}

impl Budget {
    /// The budget of a client allowed `max` connections, whose pool counts them (`counted`) or
    /// may race one more (see the module docs).
    pub(crate) fn new(max: usize, counted: bool) -> Self {
        let max = max.max(MIN_CONNECTIONS);
        let requests = if counted { max } else { max - 1 };
        let max_watches = requests - KEPT_FOR_BRIEF;
        Budget {
            brief: Semaphore::new(requests),
            debt: AtomicUsize::new(0),
            watch_slots: Semaphore::new(max_watches),
            max_watches,
            gate: Gate::default(),
        }
    }

    /// How many watches may run at once: all the requests in flight but two, so requests that
    /// do not block never wait behind watches for long.
    pub(crate) fn max_watches(&self) -> usize {
        self.max_watches
    }

    /// Waits for a slot for one watch (at once, unless `max_watches` are running), and takes it
    /// out of what brief requests may use.
    pub(crate) async fn watch_slot(&self) -> WatchSlot<'_> {
        // The semaphores are never closed, so `acquire` never fails.
        let slot = self.watch_slots.acquire().await.ok();
        if self.brief.forget_permits(1) == 0 {
            self.debt.fetch_add(1, Ordering::AcqRel);
        }
        WatchSlot {
            budget: self,
            _slot: slot,
        }
    }

    /// Waits until a request of `kind` may be sent: through the outage gate, then (a brief one)
    /// for its share of the connections. A watch's read needs no more: its watch holds a slot.
    /// The request holds the admission until its answer has been read. Fails with the outage's
    /// error when the gate stays closed to it for [`GATE_WAIT`].
    pub(crate) async fn admit(&self, kind: Kind) -> Result<Admission<'_>, ApiError> {
        self.gate.pass().await?;
        let brief = match kind {
            Kind::Brief => self.brief.acquire().await.ok(),
            Kind::Watch => None,
        };
        Ok(Admission {
            budget: self,
            brief,
        })
    }

    /// Pays one slot of debt, if there is any.
    fn pay_debt(&self) -> bool {
        self.debt
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |d| d.checked_sub(1))
            .is_ok()
    }

    /// The agent answered (with any status): the gate opens.
    pub(crate) fn answered(&self) {
        self.gate.open();
    }

    /// A request was refused, dropped or could not reach the agent (`error`). Returns whether
    /// this began an outage (the caller warns once per outage).
    pub(crate) fn refused(&self, error: &ApiError) -> bool {
        self.gate.close(error)
    }
}

#[derive(Debug)]
struct Gate {
    /// Fast path: no outage, nothing to wait for.
    closed: AtomicBool,
    /// One request at a time passes a closed gate, in arrival order.
    turnstile: tokio::sync::Mutex<()>,
    state: Mutex<GateState>,
    opened: Notify,
}

#[derive(Debug)]
struct GateState {
    backoff: Backoff,
    /// When the next request may pass a closed gate.
    next: Instant,
    closed: bool,
    /// The latest refusal: what a request that waits too long at the closed gate fails with.
    cause: Option<ApiError>,
}

impl Default for Gate {
    fn default() -> Self {
        Gate {
            closed: AtomicBool::new(false),
            turnstile: tokio::sync::Mutex::new(()),
            state: Mutex::new(GateState {
                backoff: Backoff::new(GATE_FIRST, GATE_MAX),
                next: Instant::now(),
                closed: false,
                cause: None,
            }),
            opened: Notify::new(),
        }
    }
}

impl Gate {
    /// Waits for this request's turn: at once while the gate is open; at a closed gate, one
    /// request per pause, in arrival order, for at most [`GATE_WAIT`].
    async fn pass(&self) -> Result<(), ApiError> {
        if !self.closed.load(Ordering::Acquire) {
            return Ok(());
        }
        let give_up = Instant::now() + GATE_WAIT;
        let turn = async {
            let _turn = self.turnstile.lock().await;
            loop {
                let opened = self.opened.notified();
                let next = {
                    let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
                    if !state.closed {
                        return;
                    }
                    let now = Instant::now();
                    if state.next <= now {
                        state.next = now + state.backoff.next_pause();
                        return;
                    }
                    state.next
                };
                tokio::select! {
                    biased;
                    () = tokio::time::sleep_until(next) => {}
                    () = opened => {}
                }
            }
        };
        match tokio::time::timeout_at(give_up, turn).await {
            Ok(()) => Ok(()),
            Err(_) => {
                let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
                match &state.cause {
                    Some(cause) if state.closed => Err(cause.clone()),
                    // Opened just now: go ahead.
                    _ => Ok(()),
                }
            }
        }
    }

    fn open(&self) {
        if !self.closed.load(Ordering::Acquire) {
            return;
        }
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.closed {
            state.closed = false;
            state.backoff.reset();
            self.closed.store(false, Ordering::Release);
            tracing::info!("the Consul agent answers again");
        }
        drop(state);
        self.opened.notify_waiters();
    }

    fn close(&self, cause: &ApiError) -> bool {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.cause = Some(cause.clone());
        let began = !state.closed;
        if began {
            state.closed = true;
            state.next = Instant::now() + state.backoff.next_pause();
            self.closed.store(true, Ordering::Release);
        }
        began
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::AtomicUsize;

    use super::*;

    fn refusal() -> ApiError {
        ApiError::pool(Box::new(std::io::Error::from(
            std::io::ErrorKind::ConnectionReset,
        )))
    }

    /// Admits a request at an open gate.
    async fn admitted_now(budget: &Budget) -> Admission<'_> {
        budget.admit(Kind::Brief).await.expect("an open gate")
    }

    /// Admits a request, waiting again whenever the closed gate sends it away (as its caller's
    /// retries do).
    async fn admitted(budget: &Budget) -> Admission<'_> {
        loop {
            if let Ok(admission) = budget.admit(Kind::Brief).await {
                return admission;
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_closed_gate_admits_at_most_twenty_requests_a_second() {
        let budget = Arc::new(Budget::new(8, false));
        assert!(budget.refused(&refusal()));
        assert!(!budget.refused(&refusal()), "one outage, one warning");
        let passed = Arc::new(AtomicUsize::new(0));
        let outage = Arc::new(AtomicBool::new(true));
        let started = Instant::now();
        let tasks: Vec<_> = (0..1000)
            .map(|_| {
                let (budget, passed) = (Arc::clone(&budget), Arc::clone(&passed));
                let outage = Arc::clone(&outage);
                tokio::spawn(async move {
                    let _permit = admitted(&budget).await;
                    passed.fetch_add(1, Ordering::Relaxed);
                    if outage.load(Ordering::Relaxed) {
                        budget.refused(&refusal());
                    } else {
                        budget.answered();
                    }
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_secs(10)).await;
        let in_outage = passed.load(Ordering::Relaxed);
        assert!(in_outage <= 200, "{in_outage} requests in 10 s of outage");
        assert!(in_outage >= 5, "the gate still probes: {in_outage}");

        outage.store(false, Ordering::Relaxed);
        budget.answered();
        for task in tasks {
            task.await.unwrap();
        }
        assert_eq!(passed.load(Ordering::Relaxed), 1000);
        assert!(
            started.elapsed() < Duration::from_secs(11),
            "opened at once"
        );
    }

    /// A request that waits at the closed gate longer than `GATE_WAIT` fails with the error
    /// that closed it, having sent nothing; once the gate opens, it passes at once.
    #[tokio::test(start_paused = true)]
    async fn a_request_waits_at_a_closed_gate_no_longer_than_gate_wait() {
        let budget = Arc::new(Budget::new(8, false));
        budget.refused(&refusal());
        // Ten requests queued ahead, each passing after a pause of up to 2 s, each refused.
        let ahead: Vec<_> = (0..10)
            .map(|_| {
                let budget = Arc::clone(&budget);
                tokio::spawn(async move {
                    if budget.admit(Kind::Brief).await.is_ok() {
                        budget.refused(&refusal());
                    }
                })
            })
            .collect();
        tokio::task::yield_now().await;
        let started = Instant::now();
        let error = budget.admit(Kind::Brief).await.map(drop).unwrap_err();
        assert_eq!(started.elapsed(), GATE_WAIT);
        assert!(matches!(error, ApiError::Transport(_)), "{error:?}");
        budget.answered();
        let opened = Instant::now();
        drop(admitted(&budget).await);
        assert_eq!(opened.elapsed(), Duration::ZERO);
        for task in ahead {
            task.await.unwrap();
        }
    }

    /// A pool that counts its connections gets all of them for requests; one that cannot keeps
    /// one for its connect race.
    #[tokio::test]
    async fn no_more_than_max_requests_are_in_flight() {
        for (counted, admitted) in [(true, 5), (false, 4)] {
            let budget = Budget::new(5, counted);
            let mut held = Vec::new();
            for _ in 0..admitted {
                held.push(admitted_now(&budget).await);
            }
            let one_more =
                tokio::time::timeout(Duration::from_millis(20), budget.admit(Kind::Brief)).await;
            assert!(one_more.is_err(), "request {} was admitted", admitted + 1);
            drop(held);
            let _next = admitted_now(&budget).await;
        }
        assert_eq!(
            Budget::new(1, false).max_watches(),
            MIN_CONNECTIONS - 1 - KEPT_FOR_BRIEF
        );
    }

    /// Watches take their slots out of the brief requests' share, at once even while every
    /// brief permit is in use (paid back by the next brief request to end), and brief requests
    /// always keep two.
    #[tokio::test]
    async fn watches_take_their_slots_at_once_and_brief_requests_keep_two() {
        let budget = Budget::new(8, true);
        let mut brief = Vec::new();
        for _ in 0..8 {
            brief.push(admitted_now(&budget).await);
        }
        // Eight brief requests in flight, thousands more queued: a watch still starts.
        let mut slots = Vec::new();
        for _ in 0..budget.max_watches() {
            let slot = tokio::time::timeout(Duration::from_millis(100), budget.watch_slot());
            slots.push(slot.await.expect("a watch waited behind brief requests"));
        }
        let one_more = tokio::time::timeout(Duration::from_millis(20), budget.watch_slot()).await;
        assert!(one_more.is_err(), "a watch beyond max_watches started");
        // Its reads are admitted by the slot.
        let _read = budget.admit(Kind::Watch).await.expect("an open gate");
        // The debt is paid by the brief requests that end: two stay admitted, no third.
        brief.truncate(KEPT_FOR_BRIEF);
        let third = tokio::time::timeout(Duration::from_millis(20), budget.admit(Kind::Brief));
        assert!(
            third.await.is_err(),
            "more brief requests than the watches leave"
        );
        // Watches that end give their share back.
        slots.clear();
        for _ in 0..6 {
            brief.push(admitted_now(&budget).await);
        }
        assert_eq!(brief.len(), 8);
    }
}
