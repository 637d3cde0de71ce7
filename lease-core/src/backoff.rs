//! The one backoff of lease-core and its backends, and its jitter.
//!
//! A pause that doubles from `first` up to `max`, each one drawn from `[pause / 2, pause]` so
//! that clients that failed together do not retry together (a retry storm against an agent that
//! is refusing connections is what this prevents). The arithmetic saturates, whatever the bounds.

use std::time::Duration;

/// A growing, jittered pause between attempts.
#[derive(Clone, Debug)]
pub struct Backoff {
    first: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    /// Pauses from `first` (at least a millisecond) doubling up to `max` (at least `first`).
    pub fn new(first: Duration, max: Duration) -> Self {
        let first = first.max(Duration::from_millis(1));
        let max = max.max(first);
        Backoff {
            first,
            max,
            next: first,
        }
    }

    /// Back to the first pause, after a success.
    pub fn reset(&mut self) {
        self.next = self.first;
    }

    /// The next pause, jittered; the one after is up to twice as long.
    pub fn next_pause(&mut self) -> Duration {
        let pause = self.next;
        self.next = self.next.saturating_mul(2).min(self.max);
        jitter(pause)
    }

    /// Sleeps for the next pause.
    pub async fn wait(&mut self) {
        tokio::time::sleep(self.next_pause()).await;
    }
}

/// A random duration in `[d / 2, d]`.
pub fn jitter(d: Duration) -> Duration {
    let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    if nanos < 2 {
        return d;
    }
    Duration::from_nanos(nanos / 2 + random_below(nanos / 2 + 1))
}

/// A cheap, non-cryptographic random number below `bound` (0 for a bound of 0): jitter and
/// nonces need spread, not secrecy. Under [`runtime::local`](crate::runtime::local), drawn from
/// that call's seed, so a simulation replays exactly.
pub fn random_below(bound: u64) -> u64 {
    if let Some(draw) = crate::runtime::local_draw() {
        return draw % bound.max(1);
    }
    use std::collections::hash_map::RandomState;
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    // RandomState's keys are per process (and per thread); the counter makes draws differ
    // within one nanosecond.
    static DRAWS: AtomicU64 = AtomicU64::new(0);
    let mut hasher = RandomState::new().build_hasher();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    hasher.write_u128(now.map(|d| d.as_nanos()).unwrap_or_default());
    hasher.write_u64(DRAWS.fetch_add(1, Ordering::Relaxed));
    hasher.finish() % bound.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_within_jitter_up_to_max_and_resets() {
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_millis(350));
        let bounds = [100, 200, 350, 350];
        for max in bounds {
            let pause = backoff.next_pause();
            let max = Duration::from_millis(max);
            assert!(pause >= max / 2 && pause <= max, "{pause:?} vs {max:?}");
        }
        backoff.reset();
        assert!(backoff.next_pause() <= Duration::from_millis(100));
    }

    #[test]
    fn saturates_at_extreme_bounds() {
        let mut backoff = Backoff::new(Duration::MAX, Duration::MAX);
        for _ in 0..4 {
            // Jitter works in u64 nanoseconds (about 584 years): far, never an overflow.
            assert!(backoff.next_pause() > Duration::from_secs(86_400 * 365));
        }
        let mut zero = Backoff::new(Duration::ZERO, Duration::ZERO);
        assert!(zero.next_pause() <= Duration::from_millis(1));
    }
}
