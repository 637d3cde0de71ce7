use super::*;

#[test]
fn reads_both_holder_forms_and_writes_consuls() {
    let map = parse_lock(br#"{"Limit":3,"Holders":{"a":true,"b":true}}"#).unwrap();
    let list = parse_lock(br#"{"Limit":3,"Holders":["a","b"]}"#).unwrap();
    assert_eq!(map, list);
    assert_eq!(
        encode_lock(&map),
        br#"{"Holders":{"a":true,"b":true},"Limit":3}"#.to_vec()
    );
    assert_eq!(parse_lock(&encode_lock(&map)).unwrap(), map);
    assert!(
        parse_lock(br#"{"Limit":1,"Holders":null}"#)
            .unwrap()
            .holders
            .is_empty()
    );
}

/// `jobs/a` and `jobs/ab` are two semaphores: a read of the first lists the second's keys.
#[test]
fn only_the_semaphore_s_own_directory_counts() {
    let held = |key: &str, session: &str| KvEntry {
        key: key.into(),
        flags: SEMAPHORE_FLAGS,
        value: None,
        session: Some(session.into()),
        lock_index: 1,
        modify_index: 5,
        create_index: 5,
    };
    let entries = [
        held("jobs/ab/s1", "s1"),
        held("jobs/a/s2", "s2"),
        held("jobs/abc", "s3"),
    ];
    let snapshot = read_snapshot("jobs/a", &entries, 9);
    assert_eq!(snapshot.live, BTreeSet::from(["s2".to_owned()]));
    assert_eq!(snapshot.contenders.keys().collect::<Vec<_>>(), ["s2"]);
    assert!(matches!(snapshot.lock, Ok(None)));
}

#[test]
fn refuses_what_it_cannot_read() {
    for bad in [
        &b"\xff\x00garbage"[..],
        b"[1,2]",
        br#"{"Holders":{}}"#,
        br#"{"Limit":-2,"Holders":{}}"#,
        br#"{"Limit":0}"#,
        br#"{"Limit":2.5}"#,
        br#"{"Limit":"3"}"#,
        br#"{"Limit":3,"Holders":"a"}"#,
        br#"{"Limit":3,"Holders":[1]}"#,
        br#"{"Limit":3,"Holders":{"a":"yes"}}"#,
    ] {
        assert!(parse_lock(bad).is_err(), "{}", String::from_utf8_lossy(bad));
    }
}

mod props {
    use proptest::prelude::*;
    use serde_json::{Value, json};

    use super::super::*;

    /// Session-ish IDs, and any other text: JSON strings escape what they must.
    fn holder() -> impl Strategy<Value = String> {
        prop_oneof![
            "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
            any::<String>(),
        ]
    }

    fn holders() -> impl Strategy<Value = BTreeSet<String>> {
        prop::collection::btree_set(holder(), 0..8)
    }

    /// Any JSON document, a few levels deep.
    fn json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>().prop_map(Value::from),
            any::<String>().prop_map(Value::from),
        ];
        leaf.prop_recursive(4, 32, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::from),
                prop::collection::btree_map(
                    prop_oneof![Just("Limit".to_owned()), Just("Holders".to_owned()), ".*"],
                    inner,
                    0..6,
                )
                .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// Text close to a lock value, for the paths past "is it JSON".
    fn near_miss() -> impl Strategy<Value = String> {
        concat!(
            r#"\{( *"Limit" *: *(-?[0-9]{0,22}(\.[0-9]{0,3})?([eE][+-]?[0-9]{1,3})?|"3"|null|true|\[\]|\{\}),?)?"#,
            r#"( *"Holders" *: *(null|\[("[a-z]{0,3}",?|[0-9],?|null,?){0,4}\]"#,
            r#"|\{("[a-z]{0,3}" *: *(true|false|null|1|"yes"),?){0,4}\}|"a"|0)?)?\}?"#,
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn parsing_any_bytes_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
            let _ = parse_lock(&bytes);
        }

        #[test]
        fn parsing_any_json_never_panics(value in json()) {
            let _ = parse_lock(value.to_string().as_bytes());
        }

        #[test]
        fn parsing_near_misses_never_panics(text in near_miss()) {
            if let Ok(value) = parse_lock(text.as_bytes()) {
                prop_assert!(value.limit > 0);
            }
        }

        #[test]
        fn parsing_deep_nesting_never_panics(depth in 0usize..20_000, open in "[\\[{]") {
            let text = if open == "[" {
                "[".repeat(depth)
            } else {
                r#"{"Limit":"#.repeat(depth)
            };
            let _ = parse_lock(text.as_bytes());
        }

        #[test]
        fn the_map_form_round_trips(limit in 1..=u64::MAX, holders in holders()) {
            let value = LockValue { limit, holders };
            prop_assert_eq!(parse_lock(&encode_lock(&value)), Ok(value));
        }

        #[test]
        fn the_map_form_drops_false_entries(
            limit in 1..=u64::MAX,
            held in holders(),
            released in holders(),
        ) {
            let mut map = serde_json::Map::new();
            for h in &released {
                map.insert(h.clone(), Value::Bool(false));
            }
            for h in &held {
                map.insert(h.clone(), Value::Bool(true));
            }
            let bytes = json!({"Limit": limit, "Holders": map}).to_string();
            prop_assert_eq!(
                parse_lock(bytes.as_bytes()),
                Ok(LockValue { limit, holders: held })
            );
        }

        #[test]
        fn the_list_form_reads_as_a_set(
            limit in 1..=u64::MAX,
            list in prop::collection::vec(holder(), 0..8),
        ) {
            let bytes = json!({"Limit": limit, "Holders": list}).to_string();
            let value = parse_lock(bytes.as_bytes());
            let holders = list.into_iter().collect::<BTreeSet<_>>();
            prop_assert_eq!(value.as_ref(), Ok(&LockValue { limit, holders }));
            // Written back, it is Consul's map form, which reads the same.
            let value = value.expect("checked above");
            prop_assert_eq!(parse_lock(&encode_lock(&value)), Ok(value));
        }

        #[test]
        fn reading_any_lock_entry_never_panics(
            flags in prop_oneof![Just(SEMAPHORE_FLAGS), any::<u64>()],
            raw in prop_oneof![
                prop::collection::vec(any::<u8>(), 0..64)
                    .prop_map(|b| base64::Engine::encode(
                        &base64::engine::general_purpose::STANDARD,
                        b,
                    )),
                any::<String>(),
            ],
            session in proptest::option::of("[a-c]{0,1}"),
        ) {
            let entry = KvEntry {
                key: lock_key("p"),
                flags,
                value: Some(raw),
                session,
                lock_index: 1,
                modify_index: 2,
                create_index: 2,
            };
            let snapshot = read_snapshot("p", &[entry], 3);
            let _ = (snapshot.limit(), snapshot.live_holders(), snapshot.records_holder("a"));
        }
    }
}
