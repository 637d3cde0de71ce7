use super::*;

#[test]
fn a_custom_kind_parses_back_once_this_process_knows_it() {
    let text = "tests-unknown:1:h:k";
    let unknown = text.parse::<Sequencer>().unwrap_err();
    assert!(
        unknown.to_string().contains("BackendKind::custom"),
        "{unknown}"
    );
    let kind = BackendKind::custom("tests-unknown");
    assert_eq!(kind.as_str(), "tests-unknown");
    assert_eq!(
        BackendKind::custom("tests-unknown"),
        kind,
        "naming it twice is the same kind"
    );
    let parsed: Sequencer = text.parse().expect("known now");
    assert_eq!(parsed, Sequencer::new(kind, "k", 1, "h"));
}

#[test]
fn a_custom_kind_is_a_plain_name_and_not_a_built_in_one() {
    for bad in [
        "",
        "Upper",
        "has:colon",
        "sp ace",
        "consul",
        "memory",
        &"x".repeat(33),
    ] {
        let name: &'static str = Box::leak(bad.to_owned().into_boxed_str());
        let panicked = std::panic::catch_unwind(|| BackendKind::custom(name));
        assert!(panicked.is_err(), "{bad:?} was accepted");
    }
}

#[test]
fn round_trips_awkward_keys() {
    for key in ["a", "a:b", "sp ace/ü/%41", "x%", "semaphores/reports/.lock"] {
        let seq = Sequencer::new(BackendKind::Amqp, key, u64::MAX, "q:1-B");
        let text = seq.to_string();
        assert!(text.bytes().all(|b| (b'!'..=b'~').contains(&b)), "{text}");
        assert_eq!(text.parse::<Sequencer>(), Ok(seq));
    }
}

#[test]
fn rejects_malformed_text() {
    for bad in [
        "",
        "consul",
        "consul:1:s",
        "zookeeper:1:s:k",
        "consul:-1:s:k",
        "consul:+1:s:k",
        "consul::s:k",
        "consul:00:s:k",
        "consul:07:s:k",
        "consul:99999999999999999999:s:k",
        "consul:1::k",
        "consul:1:s:",
        "consul:1:s:%4",
        "consul:1:s:%zz",
        "consul:1:s:a b",
        "consul:1:s:%FF",
        "consul:1:s:%+A",
        "consul:1:s:%3a",
        "consul:1:s:%21",
        "consul:1:%73:k",
        "consul:0.1:s:k",
        "consul:.1:s:k",
        "consul:1.:s:k",
        "consul:01.1:s:k",
        "consul:1.01:s:k",
        "consul:1.2.3:s:k",
        "consul:99999999999999999999.1:s:k",
    ] {
        assert!(bad.parse::<Sequencer>().is_err(), "{bad:?} parsed");
    }
}

#[test]
fn the_generation_orders_before_the_index_and_old_texts_have_none() {
    let old: Sequencer = "consul:65:s1:k".parse().unwrap();
    assert_eq!((old.generation(), old.index()), (0, 65));
    assert_eq!(old.to_string(), "consul:65:s1:k");
    let first: Sequencer = "consul:40.65:s1:k".parse().unwrap();
    assert_eq!(
        first,
        Sequencer::new(BackendKind::Consul, "k", 65, "s1").with_generation(40)
    );
    // The key deleted and re-created: its LockIndex restarts, its CreateIndex rises.
    let recreated = Sequencer::new(BackendKind::Consul, "k", 3, "s2").with_generation(212);
    assert_eq!(recreated.to_string(), "consul:212.3:s2:k");
    assert!(recreated.order() > first.order());
    // A text without a generation is older than any with one.
    assert!(first.order() > old.order());
    assert_ne!(first, old);
    let bad = "consul:01.1:s:k".parse::<Sequencer>().unwrap_err();
    assert_eq!(bad.reason(), "the generation has a leading zero");
    assert_eq!(old.with_generation(40), first);
}

#[test]
fn error_truncates_long_input() {
    let long = "x".repeat(10_000);
    let err = long.parse::<Sequencer>().unwrap_err();
    assert!(err.to_string().len() < 300);
}

mod props {
    use proptest::prelude::*;

    use super::super::*;

    fn backend() -> impl Strategy<Value = BackendKind> {
        prop_oneof![
            Just(BackendKind::Consul),
            Just(BackendKind::Amqp),
            Just(BackendKind::Memory),
            Just(BackendKind::Etcd),
            Just(BackendKind::Postgres),
        ]
    }

    /// Non-empty text of any chars, weighted towards the ones the encoding treats specially.
    fn part() -> impl Strategy<Value = String> {
        let special = prop::sample::select(vec![
            '/',
            ':',
            '%',
            ' ',
            '\0',
            '\n',
            '\t',
            '\u{7f}',
            '\u{80}',
            '#',
            '~',
            '!',
            'A',
            'f',
            'ü',
            '\u{2028}',
            '\u{feff}',
            '\u{10ffff}',
        ]);
        prop::collection::vec(prop_oneof![any::<char>(), special], 1..40)
            .prop_map(String::from_iter)
    }

    /// Text shaped like a sequencer, so the parser gets past its first checks.
    fn near_miss() -> impl Strategy<Value = String> {
        concat!(
            "(consul|amqp|memory|etcd|)",
            ":(0[0-9]?|[1-9][0-9]{0,3}|[0-9+-]{0,22})(\\.[0-9]{0,3})?",
            ":[!-9;-~]{0,6}(%[0-9A-F]{2}|%[0-9A-Fa-f+]{0,2}| |é)?[!-9;-~]{0,6}",
            ":[!-9;-~]{0,6}(%[0-9A-F]{2}|%[0-9A-Fa-f+]{0,2}| |é|:)?[!-9;-~]{0,6}",
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn parsing_any_text_never_panics(s in any::<String>()) {
            let _ = s.parse::<Sequencer>();
        }

        #[test]
        fn parsing_near_misses_never_panics_and_accepts_only_canonical_text(s in near_miss()) {
            if let Ok(seq) = s.parse::<Sequencer>() {
                prop_assert_eq!(seq.to_string(), s);
            }
        }

        #[test]
        fn round_trips_any_parts(
            backend in backend(),
            key in part(),
            generation in prop_oneof![Just(0u64), any::<u64>()],
            index in any::<u64>(),
            holder in part(),
        ) {
            let seq = Sequencer::new(backend, key, index, holder).with_generation(generation);
            let text = seq.to_string();
            prop_assert!(text.bytes().all(|b| (b'!'..=b'~').contains(&b)), "{}", text);
            prop_assert_eq!(text.parse::<Sequencer>(), Ok(seq));
        }
    }
}
