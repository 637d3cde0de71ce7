//! The simulation's random numbers: one seeded stream per purpose, so that a schedule is a seed.

use std::time::Duration;

/// A seeded stream of random numbers (splitmix64: cheap, and any seed gives a good stream).
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// The stream of `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// A stream of its own for `purpose`, drawn from this one's seed: what one part of the
    /// simulation draws then does not move the draws of another.
    pub fn fork(&self, purpose: &str) -> Rng {
        let mut mixed = self.0;
        for byte in purpose.bytes() {
            mixed = Rng(mixed ^ u64::from(byte)).next_u64();
        }
        Rng(mixed)
    }

    /// The next number.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..bound` (0 for a bound of 0).
    pub fn below(&mut self, bound: u64) -> u64 {
        if bound == 0 {
            return 0;
        }
        self.next_u64() % bound
    }

    /// A number in `low..=high`.
    pub fn between(&mut self, low: u64, high: u64) -> u64 {
        low + self.below(high.saturating_sub(low) + 1)
    }

    /// True with probability `percent`/100.
    pub fn percent(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// A duration in `low..=high`, to the microsecond.
    pub fn duration(&mut self, low: Duration, high: Duration) -> Duration {
        let (low, high) = (low.as_micros() as u64, high.as_micros() as u64);
        Duration::from_micros(self.between(low, high))
    }

    /// One of `items`, or `None` if there are none.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> Option<&'a T> {
        if items.is_empty() {
            return None;
        }
        items.get(self.below(items.len() as u64) as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_is_a_stream_and_forks_differ() {
        let (mut a, mut b) = (Rng::new(1), Rng::new(1));
        assert_eq!(a.next_u64(), b.next_u64());
        let (mut x, mut y) = (a.fork("net"), a.fork("faults"));
        assert_ne!(x.next_u64(), y.next_u64());
        for _ in 0..1000 {
            let d = a.duration(Duration::from_millis(1), Duration::from_millis(3));
            assert!(d >= Duration::from_millis(1) && d <= Duration::from_millis(3));
            assert!(a.below(7) < 7);
        }
    }
}
