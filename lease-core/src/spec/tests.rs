use super::*;

/// The byte-wise rule (a `const fn`) says what a rule over chars would, control characters
/// included, for every one-char key and a sample of longer ones.
#[test]
fn the_key_rule_reads_utf8_as_chars_do() {
    let by_chars = |key: &str| key.chars().any(char::is_control);
    for c in (0..0x3000).filter_map(char::from_u32) {
        let key = format!("a{c}b");
        let control = key_rule_broken(&key) == Some("the key contains a control character");
        assert_eq!(control, by_chars(&key), "{c:?}");
    }
    assert_eq!(key_rule_broken(""), Some("the key is empty"));
    assert_eq!(
        key_rule_broken("a//b"),
        Some("the key contains an empty segment ('//')")
    );
    assert_eq!(key_rule_broken("a/"), Some("remove the trailing '/'"));
    assert_eq!(
        key_rule_broken("/"),
        Some("keys are relative: remove the leading '/'")
    );
    assert_eq!(key_rule_broken("jobs/é/ü"), None);
    let dots = Some("the key contains a '.' or '..' segment, which paths resolve away");
    for key in [
        ".",
        "..",
        "jobs/./nightly",
        "jobs/../nightly",
        "./jobs",
        "jobs/..",
    ] {
        assert_eq!(key_rule_broken(key), dots, "{key}");
    }
    for key in ["jobs/.hidden", "jobs/...", "a.b/c..d", ".x"] {
        assert_eq!(key_rule_broken(key), None, "{key}");
    }
}

#[test]
fn defaults_are_valid() {
    assert!(LeaseSpec::leader("a/b").validate().is_ok());
    assert!(LeaseSpec::semaphore("a/b", 1).validate().is_ok());
}

#[test]
fn rejects_out_of_range_values() {
    let s = || LeaseSpec::leader("k");
    assert!(matches!(
        s().ttl(Duration::from_secs(5)).validate(),
        Err(Error::InvalidTtl { .. })
    ));
    assert!(matches!(
        s().ttl(Duration::from_secs(86_401)).validate(),
        Err(Error::InvalidTtl { .. })
    ));
    assert!(matches!(
        s().ttl(Duration::from_millis(10_500)).validate(),
        Err(Error::InvalidTtl { .. })
    ));
    assert!(matches!(
        s().lock_delay(Duration::from_secs(61)).validate(),
        Err(Error::InvalidLockDelay { .. })
    ));
    assert!(s().lock_delay(Duration::ZERO).validate().is_ok());
    assert!(matches!(
        LeaseSpec::semaphore("k", 0).validate(),
        Err(Error::InvalidLimit { limit: 0, .. })
    ));
}

#[test]
fn fence_lead_moves_the_deadline_earlier_within_bounds() {
    let spec = LeaseSpec::leader("k").ttl(Duration::from_secs(15));
    assert_eq!(spec.fence_after(), Duration::from_millis(13_500));
    let led = spec.clone().fence_lead(Duration::from_secs(5));
    assert_eq!(led.fence_after(), Duration::from_millis(8_500));
    assert!(led.validate().is_ok());
    // 15 s less 1.5 s less 6 s is exactly half the TTL: still allowed; a bit more is not.
    assert!(
        spec.clone()
            .fence_lead(Duration::from_secs(6))
            .validate()
            .is_ok()
    );
    assert!(matches!(
        spec.fence_lead(Duration::from_millis(6_001)).validate(),
        Err(Error::InvalidFenceLead { .. })
    ));
}

#[test]
fn rejects_bad_keys() {
    for key in ["", "/k", "k/", "a//b", "a\nb"] {
        assert!(
            matches!(
                LeaseSpec::leader(key).validate(),
                Err(Error::InvalidKey { .. })
            ),
            "{key:?}"
        );
    }
}

mod props {
    use proptest::prelude::*;

    use super::super::*;

    /// Any duration, with the range edges and whole seconds near them drawn often.
    fn duration() -> impl Strategy<Value = Duration> {
        prop_oneof![
            (any::<u64>(), 0..1_000_000_000u32).prop_map(|(s, n)| Duration::new(s, n)),
            (0..100_000u64, 0..1_000_000_000u32).prop_map(|(s, n)| Duration::new(s, n)),
            (0..100_000u64).prop_map(Duration::from_secs),
            prop::sample::select(vec![
                Duration::ZERO,
                Duration::from_nanos(1),
                MIN_TTL - Duration::from_nanos(1),
                MIN_TTL,
                MAX_TTL,
                MAX_TTL + Duration::from_nanos(1),
                MAX_LOCK_DELAY,
                MAX_LOCK_DELAY + Duration::from_nanos(1),
                Duration::MAX,
            ]),
        ]
    }

    fn wait() -> impl Strategy<Value = Wait> {
        prop_oneof![
            Just(Wait::Forever),
            Just(Wait::Never),
            duration().prop_map(Wait::UpTo),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn validate_never_panics_and_enforces_the_ranges(
            semaphore in any::<bool>(),
            limit in prop_oneof![Just(0u32), Just(1), Just(u32::MAX), any::<u32>()],
            wait in wait(),
            ttl in duration(),
            lock_delay in duration(),
            settle in duration(),
        ) {
            let spec = if semaphore {
                LeaseSpec::semaphore("a/b", limit)
            } else {
                LeaseSpec::leader("a/b")
            };
            let spec = spec.wait(wait).ttl(ttl).lock_delay(lock_delay).settle(settle);
            let ok = (!semaphore || limit > 0)
                && (MIN_TTL..=MAX_TTL).contains(&ttl)
                && ttl.subsec_nanos() == 0
                && lock_delay <= MAX_LOCK_DELAY
                && settle <= MAX_LOCK_DELAY;
            let result = spec.validate();
            prop_assert_eq!(result.is_ok(), ok, "{:?}", result);
            // The error's message is built from the values too.
            if let Err(e) = result {
                let _ = e.to_string();
            }
        }

        #[test]
        fn any_wait_has_a_deadline_without_overflow(wait in wait()) {
            let started = Instant::now();
            let deadline = wait.deadline(started);
            match wait {
                Wait::Forever => prop_assert_eq!(deadline, None),
                Wait::Never => prop_assert_eq!(deadline, Some(started)),
                Wait::UpTo(d) => {
                    let deadline = deadline.expect("an UpTo wait has a deadline");
                    prop_assert!(deadline >= started);
                    if let Some(exact) = started.checked_add(d) {
                        prop_assert!(deadline <= exact);
                    }
                }
            }
        }

        #[test]
        fn validate_never_panics_on_any_key(key in any::<String>(), limit in any::<u32>()) {
            let _ = LeaseSpec::leader(key.clone()).validate();
            let _ = LeaseSpec::semaphore(key, limit).validate();
        }
    }
}
