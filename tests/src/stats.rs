//! Summaries of timing samples, the quick mode, and the sizes and the memory figure of the scale
//! benchmarks.
//!
//! Every benchmark has a quick mode (`LEASE_BENCH_QUICK=1`): a few trials in a few seconds, which
//! CI runs in the test profile (`cargo test --benches`), so a benchmark never rots unrun. In
//! every mode a benchmark asserts the correctness bounds it measures around (no loss noticed
//! later than the fence interval, no overlap, no lease lost while held): a run that breaks one
//! fails, whatever its timings. Timings themselves are never asserted.

/// The `p`-th percentile (0 to 100) of `samples`, by nearest rank; NaN for no samples.
pub fn percentile(samples: &[f64], p: f64) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

/// Whether the benchmark runs in its quick mode (`LEASE_BENCH_QUICK` set to anything but `0`).
pub fn quick() -> bool {
    std::env::var_os("LEASE_BENCH_QUICK").is_some_and(|v| v != "0")
}

/// `full` in a full run, `quick` in the quick mode.
pub fn scaled<T>(full: T, quick: T) -> T {
    if self::quick() { quick } else { full }
}

/// The sizes (N) a scale benchmark runs: `SCALE_NS` (comma-separated, as `100,1000`), else 100,
/// 1,000 and 10,000; 100 in the quick mode.
pub fn scale_sizes() -> Vec<usize> {
    std::env::var("SCALE_NS")
        .ok()
        .map(|v| v.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_else(|| scaled(vec![100, 1_000, 10_000], vec![100]))
}

/// How long a scale benchmark holds its N leases, idle, before counting them: `SCALE_HOLD_S`
/// (seconds), else `full`; 2 s in the quick mode.
pub fn scale_hold(full: std::time::Duration) -> std::time::Duration {
    std::env::var("SCALE_HOLD_S")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .map_or(
            scaled(full, std::time::Duration::from_secs(2)),
            std::time::Duration::from_secs,
        )
}

/// This process's resident memory in KB (`VmRSS` in `/proc/self/status`; Linux only).
pub fn rss_kb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        let samples = [5.0, 1.0, 3.0, 2.0, 4.0];
        assert_eq!(percentile(&samples, 0.0), 1.0);
        assert_eq!(percentile(&samples, 50.0), 3.0);
        assert_eq!(percentile(&samples, 100.0), 5.0);
        assert!(percentile(&[], 50.0).is_nan());
    }
}
