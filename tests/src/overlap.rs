//! Checking "at most N at once" from the outside: holders record when they start and stop, the
//! checker sweeps the intervals.
//!
//! Timestamps are wall-clock nanoseconds so processes (`consul lock` children) and tasks can be
//! compared on one machine. A holder stamps its start after it holds and its end before it gives
//! back (or when its work is dropped), so every recorded interval lies inside the real one: an
//! overlap the checker finds is real.

use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

/// Wall-clock nanoseconds since the epoch.
pub fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default()
}

/// Records when it is dropped ([`now_ns`]): moved into guarded work, it stamps the moment the work
/// is cancelled (or ends), for loss → cancel timings.
#[derive(Debug, Default)]
pub struct DropStamp(Arc<Mutex<Option<u128>>>);

impl DropStamp {
    /// A stamp, and the slot it writes its drop time into.
    pub fn new() -> (DropStamp, Arc<Mutex<Option<u128>>>) {
        let at = Arc::new(Mutex::new(None));
        (DropStamp(Arc::clone(&at)), at)
    }
}

impl Drop for DropStamp {
    fn drop(&mut self) {
        *self.0.lock().unwrap() = Some(now_ns());
    }
}

/// A shared record of holder intervals.
#[derive(Clone, Debug, Default)]
pub struct Timeline {
    spans: Arc<Mutex<Vec<(u128, u128, String)>>>,
}

impl Timeline {
    /// An empty timeline.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records that `who` held from `start` to `end` (ns).
    pub fn record(&self, who: impl Into<String>, start: u128, end: u128) {
        self.spans.lock().unwrap().push((start, end, who.into()));
    }

    /// Starts an interval that ends when the returned guard drops (also when work is cancelled).
    pub fn hold(&self, who: impl Into<String>) -> HoldGuard {
        HoldGuard {
            timeline: self.clone(),
            who: who.into(),
            start: now_ns(),
        }
    }

    /// Reads `start end` lines (ns) that child processes appended to `path`.
    pub fn record_file(&self, who: &str, path: &std::path::Path) {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        for line in text.lines() {
            let mut parts = line.split_whitespace();
            if let (Some(Ok(start)), Some(Ok(end))) = (
                parts.next().map(str::parse::<u128>),
                parts.next().map(str::parse::<u128>),
            ) {
                self.record(who, start, end);
            }
        }
    }

    /// How many intervals were recorded.
    pub fn len(&self) -> usize {
        self.spans.lock().unwrap().len()
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The largest number of intervals open at one instant, and who they were.
    pub fn max_concurrency(&self) -> (usize, Vec<String>) {
        let spans = self.spans.lock().unwrap().clone();
        let mut events: Vec<(u128, i32, usize)> = Vec::new();
        for (i, (start, end, _)) in spans.iter().enumerate() {
            events.push((*start, 1, i));
            // Ends sort before starts at the same instant: touching intervals do not overlap.
            events.push((*end, -1, i));
        }
        events.sort_by_key(|&(t, delta, _)| (t, delta));
        let mut open = std::collections::BTreeSet::new();
        let (mut best, mut who) = (0, Vec::new());
        for (_, delta, i) in events {
            if delta > 0 {
                open.insert(i);
                if open.len() > best {
                    best = open.len();
                    who = open.iter().map(|&i| spans[i].2.clone()).collect();
                }
            } else {
                open.remove(&i);
            }
        }
        (best, who)
    }

    /// The gaps between consecutive intervals (ms), from one's end to the next one's start, in
    /// start order: the hand-off gaps of a leader lock. Panics if two intervals overlap.
    pub fn handoff_gaps_ms(&self) -> Vec<f64> {
        self.assert_at_most(1);
        let mut spans = self.spans.lock().unwrap().clone();
        spans.sort_unstable();
        spans
            .windows(2)
            .map(|w| w[1].0.saturating_sub(w[0].1) as f64 / 1e6)
            .collect()
    }

    /// Panics if more than `limit` intervals were ever open at once.
    pub fn assert_at_most(&self, limit: usize) {
        let (max, who) = self.max_concurrency();
        assert!(
            max <= limit,
            "{max} holders at once (limit {limit}): {who:?}"
        );
    }
}

/// Ends its interval when dropped.
#[derive(Debug)]
pub struct HoldGuard {
    timeline: Timeline,
    who: String,
    start: u128,
}

impl Drop for HoldGuard {
    fn drop(&mut self) {
        self.timeline
            .record(std::mem::take(&mut self.who), self.start, now_ns());
    }
}

/// A small deterministic generator for test schedules (xorshift64*), seeded per test.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator; the seed is printed so a failing schedule can be replayed.
    pub fn seeded(seed: u64) -> Self {
        eprintln!("rng seed {seed}");
        Rng(seed.max(1))
    }

    /// A generator seeded from the clock.
    pub fn from_time() -> Self {
        Self::seeded((now_ns() as u64) | 1)
    }

    /// The next number in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n.max(1)
    }
}

/// The benchmarks' semaphore run: `jobs` tasks each acquire `spec` on `backend`, hold it for
/// `job` (lost while held: a failure) and release it. Returns how long until the last had
/// finished. Fails if the run takes longer than `stall` (a liveness bound, not a timing), if more
/// than the spec's limit held at once, or if a job never held.
pub async fn semaphore_jobs<B>(
    backend: &B,
    spec: &lease_core::LeaseSpec,
    jobs: usize,
    job: std::time::Duration,
    stall: std::time::Duration,
) -> std::time::Duration
where
    B: lease_core::Backend + Clone + 'static,
{
    let limit = match spec.target() {
        lease_core::Target::Semaphore { limit, .. } => *limit as usize,
        _ => 1,
    };
    let started = std::time::Instant::now();
    let timeline = hold_in_turn(backend, spec, "job", jobs, job, stall).await;
    let took = started.elapsed();
    timeline.assert_at_most(limit);
    took
}

/// The benchmarks' leader hand-off, in `rounds` rounds: in each, `contenders` tasks each acquire
/// the leader `spec(round)` on `backend`, hold it for `hold` (lost while held: a failure) and
/// release it. Returns the gaps (ms) between one holder's end and the next one's start, of every
/// round. Fails if a round takes longer than `stall` (a liveness bound, not a timing), if two held
/// at once, or if a contender never held.
pub async fn leader_handoff<B>(
    backend: &B,
    rounds: usize,
    spec: impl Fn(usize) -> lease_core::LeaseSpec,
    contenders: usize,
    hold: std::time::Duration,
    stall: std::time::Duration,
) -> Vec<f64>
where
    B: lease_core::Backend + Clone + 'static,
{
    let mut gaps = Vec::new();
    for round in 0..rounds {
        let spec = spec(round);
        let timeline = hold_in_turn(backend, &spec, "contender", contenders, hold, stall).await;
        gaps.extend(timeline.handoff_gaps_ms());
    }
    gaps
}

/// What [`semaphore_jobs`] and [`leader_handoff`] share: `n` tasks (`<role>-<i>`) each acquire
/// `spec` on `backend`, hold it under [`Lease::run`](lease_core::Lease::run) for `hold` (lost
/// while held: a failure) and release it. Returns their holds, once every one has held and
/// released. Fails if they take longer than `stall` (a liveness bound, not a timing), or if one
/// never held; how many may hold at once is the caller's to judge.
async fn hold_in_turn<B>(
    backend: &B,
    spec: &lease_core::LeaseSpec,
    role: &str,
    n: usize,
    hold: std::time::Duration,
    stall: std::time::Duration,
) -> Timeline
where
    B: lease_core::Backend + Clone + 'static,
{
    let timeline = Timeline::new();
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let (backend, spec, timeline) = (backend.clone(), spec.clone(), timeline.clone());
            let who = format!("{role}-{i}");
            tokio::spawn(async move {
                let lease = backend
                    .acquire(&spec)
                    .await
                    .unwrap_or_else(|error| panic!("{who}: acquire: {error}"));
                let guard = timeline.hold(who.clone());
                // Lost while held (its work cut short, or the release reporting the loss): a failure.
                lease
                    .run(tokio::time::sleep(hold))
                    .await
                    .unwrap_or_else(|reason| panic!("{who}: lease lost while held: {reason:?}"));
                drop(guard);
                lease
                    .release()
                    .await
                    .unwrap_or_else(|error| panic!("{who}: release: {error}"));
            })
        })
        .collect();
    let joined = async {
        for task in tasks {
            task.await.unwrap();
        }
    };
    tokio::time::timeout(stall, joined)
        .await
        .unwrap_or_else(|_| panic!("{n} {role}s on {:?} stalled for {stall:?}", spec.key()));
    assert_eq!(timeline.len(), n, "not every {role} held {:?}", spec.key());
    timeline
}

/// The benchmarks' loss → cancel trial, `trials` times. Trial `t` acquires `spec(t)` on
/// `backend`, runs work that never ends under the lease ([`Lease::run`](lease_core::Lease::run),
/// a [`DropStamp`] in the work), and once the work runs applies `fault` to the lease's sequencer:
/// an operator taking the lease away (a revoked lease, a deleted row, a destroyed session), which
/// `fault_done` describes for the failure messages ("its lease was revoked"). Returns each
/// trial's time (ms) from just before the fault until the work was dropped.
///
/// Fails if the work is not dropped within the spec's fence interval
/// ([`LeaseSpec::fence_after`](lease_core::LeaseSpec::fence_after)) from the fault, or if `run`
/// does not report the loss.
pub async fn loss_to_cancel<B>(
    backend: &B,
    trials: usize,
    mut spec: impl FnMut(usize) -> lease_core::LeaseSpec,
    mut fault: impl AsyncFnMut(&lease_core::Sequencer),
    fault_done: &str,
) -> Vec<f64>
where
    B: lease_core::Backend,
{
    let mut samples = Vec::new();
    for trial in 0..trials {
        let spec = spec(trial);
        let fence = spec.fence_after();
        let lease = backend
            .acquire(&spec)
            .await
            .unwrap_or_else(|error| panic!("trial {trial}: acquire {:?}: {error}", spec.key()));
        let sequencer = lease.sequencer().clone();
        let (stamp, dropped) = DropStamp::new();
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let runner = tokio::spawn(async move {
            let work = async move {
                let _stamp = stamp;
                let _ = ready_tx.send(());
                std::future::pending::<()>().await
            };
            assert!(lease.run(work).await.is_err(), "the work ended on its own");
        });
        ready_rx.await.unwrap();
        let t0 = now_ns();
        fault(&sequencer).await;
        tokio::time::timeout(fence, runner)
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "trial {trial}: the work still ran {fence:?} after {fault_done}, the fence \
                     interval"
                )
            })
            .unwrap();
        let t1 = dropped.lock().unwrap().expect("work dropped");
        let noticed_ms = t1.saturating_sub(t0) as f64 / 1e6;
        assert!(
            noticed_ms < fence.as_secs_f64() * 1e3,
            "trial {trial}: the work ran {noticed_ms:.1} ms after {fault_done}, past the fence \
             interval {fence:?}"
        );
        samples.push(noticed_ms);
    }
    samples
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaps_between_touching_and_separate_intervals() {
        let t = Timeline::new();
        t.record("b", 12_000_000, 20_000_000);
        t.record("a", 0, 10_000_000);
        t.record("c", 20_000_000, 25_000_000);
        assert_eq!(t.handoff_gaps_ms(), vec![2.0, 0.0]);
    }

    #[test]
    fn sweeps_intervals() {
        let t = Timeline::new();
        t.record("a", 0, 10);
        t.record("b", 5, 15);
        t.record("c", 10, 20);
        assert_eq!(t.max_concurrency().0, 2);
        t.record("d", 6, 7);
        assert_eq!(t.max_concurrency().0, 3);
    }
}
