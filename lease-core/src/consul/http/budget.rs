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
//! Blocking queries (the watches) may hold at most [`Budget::max_watches`] of those permits at
//! once, whatever asks for them: a watch that was absorbed by a wider one still waits for its
//! answer (abandoning it would leave its connection open on the agent, outside the budget), so
//! for a moment there can be more reads wanting to block than watches. They wait for each other,
//! never for the two permits kept for requests that answer at once: the heartbeat, renewals,
//! acquisitions and releases always find a connection.
//!
//! The **outage gate** keeps a refusing agent from being answered with a retry storm. From the
//! first refused, dropped or unreachable request on, the whole client sends one request at a
//! time, each after a jittered pause that doubles from 100 ms up to 2 s; so a process sends at
//! most 20 requests per second during an outage, however many leases it holds or waits for.
//! The first answer of any kind (the agent is talking again) opens the gate.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{Notify, Semaphore, SemaphorePermit};
use tokio::time::Instant;

use crate::backoff::Backoff;

/// The default number of connections one client may open to the agent.
pub(crate) const DEFAULT_MAX_CONNECTIONS: usize = 8;
/// The fewest connections a client can work with: one for watches, two for everything else,
/// one for the pool's connect race (or a second watch, where connections are counted).
pub(crate) const MIN_CONNECTIONS: usize = 4;

/// The first pause of the outage gate. Jitter draws each pause from `[p / 2, p]`, so this
/// bounds an outage's request rate at 1 / 50 ms = 20 per second.
const GATE_FIRST: Duration = Duration::from_millis(100);
const GATE_MAX: Duration = Duration::from_secs(2);

/// The requests in flight that watches may never take: the heartbeat, renewals, acquisitions
/// and releases always find one.
const KEPT_FOR_BRIEF: usize = 2;

/// The connection budget and outage gate of one client (see the module docs).
#[derive(Debug)]
pub(crate) struct Budget {
    in_flight: Semaphore,
    /// Permits to block, taken before an `in_flight` one: `max_watches` of them.
    blocking: Semaphore,
    max_watches: usize,
    gate: Gate,
}

/// What a request is admitted as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Answered at once.
    Brief,
    /// A blocking query: may be held by the agent until something changes.
    Blocking,
}

/// The permits of one admitted request, held until its answer has been read.
#[derive(Debug)]
pub(crate) struct Admission<'a> {
    _blocking: Option<SemaphorePermit<'a>>,
    _connection: Option<SemaphorePermit<'a>>,
}

impl Budget {
    /// The budget of a client allowed `max` connections, whose pool counts them (`counted`) or
    /// may race one more (see the module docs).
    pub(crate) fn new(max: usize, counted: bool) -> Self {
        let max = max.max(MIN_CONNECTIONS);
        let requests = if counted { max } else { max - 1 };
        Budget {
            in_flight: Semaphore::new(requests),
            blocking: Semaphore::new(requests - KEPT_FOR_BRIEF),
            max_watches: requests - KEPT_FOR_BRIEF,
            gate: Gate::default(),
        }
    }

    /// How many of them blocking queries may keep busy: all the requests in flight but two, so
    /// requests that do not block never wait behind watches for long.
    pub(crate) fn max_watches(&self) -> usize {
        self.max_watches
    }

    /// Waits until a request of `kind` may be sent: for a permit to block (a blocking query),
    /// through the outage gate, then for a connection. The request holds the permits until its
    /// answer has been read.
    pub(crate) async fn admit(&self, kind: Kind) -> Admission<'_> {
        // The semaphores are never closed, so `acquire` never fails.
        let blocking = match kind {
            Kind::Brief => None,
            Kind::Blocking => self.blocking.acquire().await.ok(),
        };
        self.gate.pass().await;
        Admission {
            _blocking: blocking,
            _connection: self.in_flight.acquire().await.ok(),
        }
    }

    /// The agent answered (with any status): the gate opens.
    pub(crate) fn answered(&self) {
        self.gate.open();
    }

    /// A request was refused, dropped or could not reach the agent. Returns whether this began
    /// an outage (the caller warns once per outage).
    pub(crate) fn refused(&self) -> bool {
        self.gate.close()
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
            }),
            opened: Notify::new(),
        }
    }
}

impl Gate {
    async fn pass(&self) {
        if !self.closed.load(Ordering::Acquire) {
            return;
        }
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
                () = tokio::time::sleep_until(next) => {}
                () = opened => {}
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

    fn close(&self) -> bool {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
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

    #[tokio::test(start_paused = true)]
    async fn a_closed_gate_admits_at_most_twenty_requests_a_second() {
        let budget = Arc::new(Budget::new(8, false));
        assert!(budget.refused());
        assert!(!budget.refused(), "one outage, one warning");
        let passed = Arc::new(AtomicUsize::new(0));
        let outage = Arc::new(AtomicBool::new(true));
        let started = Instant::now();
        let tasks: Vec<_> = (0..1000)
            .map(|_| {
                let (budget, passed) = (Arc::clone(&budget), Arc::clone(&passed));
                let outage = Arc::clone(&outage);
                tokio::spawn(async move {
                    let _permit = budget.admit(Kind::Brief).await;
                    passed.fetch_add(1, Ordering::Relaxed);
                    if outage.load(Ordering::Relaxed) {
                        budget.refused();
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

    /// A pool that counts its connections gets all of them for requests; one that cannot keeps
    /// one for its connect race.
    #[tokio::test]
    async fn no_more_than_max_requests_are_in_flight() {
        for (counted, admitted) in [(true, 5), (false, 4)] {
            let budget = Budget::new(5, counted);
            let mut held = Vec::new();
            for _ in 0..admitted {
                held.push(budget.admit(Kind::Brief).await);
            }
            let one_more =
                tokio::time::timeout(Duration::from_millis(20), budget.admit(Kind::Brief)).await;
            assert!(one_more.is_err(), "request {} was admitted", admitted + 1);
            drop(held);
            let _next = budget.admit(Kind::Brief).await;
        }
        assert_eq!(
            Budget::new(1, false).max_watches(),
            MIN_CONNECTIONS - 1 - KEPT_FOR_BRIEF
        );
    }

    /// However many blocking queries wait (an absorbed watch still reading beside the one that
    /// replaced it), two requests that answer at once still get through: the heartbeat never
    /// waits behind the watches.
    #[tokio::test]
    async fn blocking_queries_never_take_the_permits_kept_for_brief_requests() {
        let budget = Budget::new(8, false);
        let mut blocked = Vec::new();
        for _ in 0..budget.max_watches() {
            blocked.push(budget.admit(Kind::Blocking).await);
        }
        let one_more =
            tokio::time::timeout(Duration::from_millis(20), budget.admit(Kind::Blocking)).await;
        assert!(
            one_more.is_err(),
            "a blocking query beyond max_watches was admitted"
        );
        let brief = [
            budget.admit(Kind::Brief).await,
            budget.admit(Kind::Brief).await,
        ];
        drop(brief);
        drop(blocked.pop());
        let _next = budget.admit(Kind::Blocking).await;
    }
}
