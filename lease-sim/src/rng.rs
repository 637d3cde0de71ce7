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
        // Lemire's multiply-and-shift: the bias is at most bound / 2^64, far below what a run
        // could see.
        ((u128::from(self.next_u64()) * u128::from(bound)) >> 64) as u64
    }

    /// A duration uniform in `[0, bound)`, as Consul's `lib.RandomStagger` draws it.
    pub fn stagger(&mut self, bound: Duration) -> Duration {
        let nanos = u64::try_from(bound.as_nanos()).unwrap_or(u64::MAX);
        Duration::from_nanos(self.below(nanos))
    }

    /// An ID as Consul's `uuid.GenerateUUID` makes one: 16 random bytes as 8-4-4-4-12 lowercase
    /// hex digits (no version or variant bits).
    pub fn uuid(&mut self) -> String {
        let (a, b) = (self.next_u64(), self.next_u64());
        format!(
            "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
            a >> 32,
            (a >> 16) & 0xffff,
            a & 0xffff,
            b >> 48,
            b & 0xffff_ffff_ffff
        )
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
    fn a_seed_gives_the_same_ids_and_another_seed_others() {
        let ids = |seed| {
            let mut rng = Rng::new(seed);
            (0..3).map(|_| rng.uuid()).collect::<Vec<_>>()
        };
        assert_eq!(ids(7), ids(7));
        assert_ne!(ids(7), ids(8));
        let id = &ids(7)[0];
        assert_eq!(id.len(), 36);
        assert_eq!(id.matches('-').count(), 4);
        assert!(id.chars().all(|c| c == '-' || c.is_ascii_hexdigit()));
        assert_eq!(Rng::new(1).below(0), 0);
        assert!(Rng::new(1).stagger(Duration::from_millis(5)) < Duration::from_millis(5));
    }

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
