use quote::ToTokens;

use super::suggest::{closest, edit_distance};
use super::*;

/// The messages of the errors `args` gives on `kind`, in order.
fn errors(kind: Kind, args: &str) -> Vec<String> {
    let raw: RawArgs = syn::parse_str(args).expect("the arguments parse as syntax");
    match LeaseArgs::from_raw(kind, raw) {
        Ok(_) => Vec::new(),
        Err(error) => error.into_iter().map(|e| e.to_string()).collect(),
    }
}

const LEADER_ARGS: &str = "expected one of `key`, `wait`, `ttl`, `lock_delay`, `min_hold`, \
                           `max_run`, `backend`, `crate`";
const SEMAPHORE_ARGS: &str = "expected one of `name`, `limit`, `wait`, `ttl`, `lock_delay`, \
                              `min_hold`, `max_run`, `backend`, `crate`";

#[test]
fn a_misspelt_key_is_one_error_that_names_the_key() {
    assert_eq!(
        errors(Kind::Leader, r#"kye = "jobs/x""#),
        [format!(
            "unknown argument `kye` for #[leader_only]; {LEADER_ARGS}; did you mean `key`?"
        )]
    );
}

#[test]
fn misspelt_name_and_limit_are_one_error_each_and_nothing_is_missing() {
    assert_eq!(
        errors(Kind::Semaphore, r#"nmae = "reports", limt = 3"#),
        [
            format!(
                "unknown argument `nmae` for #[semaphore]; {SEMAPHORE_ARGS}; \
                 did you mean `name`?"
            ),
            format!(
                "unknown argument `limt` for #[semaphore]; {SEMAPHORE_ARGS}; \
                 did you mean `limit`?"
            ),
        ]
    );
}

#[test]
fn a_misspelt_optional_argument_names_it() {
    assert_eq!(
        errors(Kind::Leader, r#"key = "jobs/x", lock_dealy = "0s""#),
        [format!(
            "unknown argument `lock_dealy` for #[leader_only]; {LEADER_ARGS}; \
             did you mean `lock_delay`?"
        )]
    );
}

#[test]
fn an_unknown_argument_like_none_gets_no_hint_and_the_key_is_still_missing() {
    assert_eq!(
        errors(Kind::Leader, r#"lease = "jobs/x""#),
        [
            format!("unknown argument `lease` for #[leader_only]; {LEADER_ARGS}"),
            "missing `key`: write #[leader_only(key = \"jobs/compact\")]".to_owned(),
        ]
    );
}

#[test]
fn a_misspelling_only_excuses_the_argument_it_looks_like() {
    assert_eq!(
        errors(Kind::Semaphore, r#"nmae = "reports""#),
        [
            format!(
                "unknown argument `nmae` for #[semaphore]; {SEMAPHORE_ARGS}; \
                 did you mean `name`?"
            ),
            "missing `limit`: write #[semaphore(name = \"reports\", limit = 3)]".to_owned(),
        ]
    );
}

/// The path `crate = …` gives, as written, or the errors.
fn crate_path(kind: Kind, args: &str) -> Result<Option<String>, Vec<String>> {
    let raw: RawArgs = syn::parse_str(args).expect("the arguments parse as syntax");
    match LeaseArgs::from_raw(kind, raw) {
        Ok(args) => Ok(args
            .krate
            .map(|krate| krate.path.to_token_stream().to_string())),
        Err(error) => Err(error.into_iter().map(|e| e.to_string()).collect()),
    }
}

#[test]
fn crate_takes_a_path_in_a_string() {
    for (args, expected) in [
        (r#"key = "jobs/a""#, None),
        (
            r#"key = "jobs/a", crate = "my_facade::lease""#,
            Some("my_facade :: lease"),
        ),
        (
            r#"crate = "::lease_core", key = "jobs/a""#,
            Some(":: lease_core"),
        ),
        (
            r#""jobs/a", crate = "crate::lease""#,
            Some("crate :: lease"),
        ),
        (
            r#""jobs/a", crate = "self::facade""#,
            Some("self :: facade"),
        ),
        (r#""jobs/a", crate = " renamed ""#, Some("renamed")),
    ] {
        assert_eq!(
            crate_path(Kind::Leader, args),
            Ok(expected.map(str::to_owned)),
            "{args}"
        );
    }
    assert_eq!(
        crate_path(Kind::Semaphore, r#""reports", 3, crate = "facade""#),
        Ok(Some("facade".to_owned()))
    );
}

#[test]
fn crate_that_is_not_a_path_in_a_string_is_one_error() {
    const EXPECTED: &str = "`crate` must be the path to lease-core, or to a module that \
                            re-exports it, in a string: e.g. `crate = \"my_facade::lease\"`";
    for value in [
        r#""not a path!""#,
        r#""""#,
        r#""lease_core::""#,
        r#""lease_core::Wait<u8>""#,
        r#""lease_core::Wait::<u8>""#,
        r#""$crate""#,
        "lease_core",
        "::lease_core",
        "3",
    ] {
        assert_eq!(
            crate_path(Kind::Leader, &format!(r#"key = "jobs/a", crate = {value}"#)),
            Err(vec![EXPECTED.to_owned()]),
            "{value}"
        );
    }
    assert_eq!(
        crate_path(Kind::Leader, r#"key = "jobs/a", crate = "a", crate = "b""#),
        Err(vec!["`crate` specified more than once".to_owned()])
    );
}

#[test]
fn closest_picks_the_argument_a_name_looks_like() {
    let leader = Kind::Leader.accepted();
    let semaphore = Kind::Semaphore.accepted();
    for (name, known, expected) in [
        ("kye", leader, Some("key")),
        ("ky", leader, Some("key")),
        ("Key", leader, Some("key")),
        ("KEY", leader, Some("key")),
        ("wiat", leader, Some("wait")),
        ("tll", leader, Some("ttl")),
        ("lockdelay", leader, Some("lock_delay")),
        ("delay_lock", leader, Some("lock_delay")),
        ("max_rnu", leader, Some("max_run")),
        ("minhold", leader, Some("min_hold")),
        ("backedn", leader, Some("backend")),
        ("limt", semaphore, Some("limit")),
        ("nmae", semaphore, Some("name")),
        ("krate", leader, Some("crate")),
        ("create", semaphore, Some("crate")),
        ("Crate", leader, Some("crate")),
        // Too far from every argument to be a misspelling of one.
        ("timeout", leader, None),
        ("type", leader, None),
        ("lease", leader, None),
        ("k", leader, None),
        // The other attribute's arguments are not suggested.
        ("limit", leader, None),
        ("key", semaphore, None),
    ] {
        assert_eq!(closest(name, known), expected, "{name}");
    }
}

#[test]
fn edit_distance_counts_a_swap_as_one_edit() {
    for (a, b, distance) in [
        ("", "", 0),
        ("key", "key", 0),
        ("", "key", 3),
        ("key", "", 3),
        ("kye", "key", 1),
        ("ky", "key", 1),
        ("kkey", "key", 1),
        ("kez", "key", 1),
        ("eky", "key", 1),
        ("yek", "key", 2),
        ("kitten", "sitting", 3),
        ("ca", "abc", 3),
    ] {
        assert_eq!(edit_distance(a, b), distance, "{a} -> {b}");
        assert_eq!(edit_distance(b, a), distance, "{b} -> {a}");
    }
}
