//! The model's one source of randomness: a seeded SplitMix64, for session IDs and the jitter of
//! blocking queries, so a seed gives the same IDs and the same answer times on every run.

use std::time::Duration;

/// SplitMix64 (Steele, Lea and Flood): small, fast, and good enough for IDs and jitter.
#[derive(Clone, Debug)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A uniform draw from `[0, bound)`; 0 when `bound` is 0.
    pub(crate) fn below(&mut self, bound: u64) -> u64 {
        if bound == 0 {
            return 0;
        }
        // Lemire's multiply-and-shift: the bias is at most bound / 2^64, far below what a test
        // could see.
        ((u128::from(self.next_u64()) * u128::from(bound)) >> 64) as u64
    }

    /// A duration uniform in `[0, bound)`, as Consul's `lib.RandomStagger` draws it.
    pub(crate) fn stagger(&mut self, bound: Duration) -> Duration {
        let nanos = u64::try_from(bound.as_nanos()).unwrap_or(u64::MAX);
        Duration::from_nanos(self.below(nanos))
    }

    /// A session ID as Consul's `uuid.GenerateUUID` makes it: 16 random bytes as
    /// 8-4-4-4-12 lowercase hex digits (no version or variant bits).
    pub(crate) fn uuid(&mut self) -> String {
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
    }

    #[test]
    fn draws_stay_below_their_bound() {
        let mut rng = Rng::new(1);
        assert_eq!(rng.below(0), 0);
        for _ in 0..1000 {
            assert!(rng.below(16) < 16);
            assert!(rng.stagger(Duration::from_millis(5)) < Duration::from_millis(5));
        }
    }
}
