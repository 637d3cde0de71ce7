use super::*;

#[test]
fn a_file_that_cannot_be_read_is_named_and_kept_as_the_source() {
    let missing = std::env::temp_dir().join("lease-consul-no-such-ca.pem");
    let error = ConsulBuilder::new()
        .address("https://127.0.0.1:8501")
        .ca_cert(&missing)
        .build()
        .expect_err("no CA file");
    assert!(error.to_string().contains("CONSUL_CACERT"), "{error}");
    let source = std::error::Error::source(&error).expect("the I/O error");
    let io = source
        .downcast_ref::<std::io::Error>()
        .expect("an I/O error");
    assert_eq!(io.kind(), std::io::ErrorKind::NotFound);
}

#[test]
fn addresses_parse_like_the_cli() {
    let env = AddressOrigin::Env;
    let parse =
        |address, ssl| base_url(address, ssl, env).map(|(url, port)| (url.to_string(), port));
    assert_eq!(
        parse(None, false).unwrap(),
        ("http://127.0.0.1:8500/".to_owned(), true)
    );
    assert_eq!(
        parse(Some("10.0.0.1:8501"), true).unwrap(),
        ("https://10.0.0.1:8501/".to_owned(), true)
    );
    assert_eq!(
        parse(Some("http://h:1"), true).unwrap(),
        ("http://h:1/".to_owned(), true)
    );
    assert_eq!(
        parse(Some("consul.internal"), false).unwrap(),
        ("http://consul.internal/".to_owned(), false)
    );
    for bad in [
        "unix:///tmp/c.sock",
        "http://h:1/v1",
        "http://u:p@h:1",
        "http://h:notaport",
        "ftp://h",
    ] {
        assert!(parse(Some(bad), false).is_err(), "{bad}");
    }
}

/// Only an address read from `CONSUL_HTTP_ADDR` is blamed on it; a builder's is blamed on
/// the builder call.
#[test]
fn address_errors_name_where_the_address_came_from() {
    for bad in [
        "http://h:notaport",
        "ftp://h",
        "http://h:1/v1",
        "http://u:p@h:1",
    ] {
        let Err(Error::Config {
            message: from_builder,
            ..
        }) = base_url(Some(bad), false, AddressOrigin::Builder)
        else {
            panic!("{bad} was accepted");
        };
        assert!(!from_builder.contains("CONSUL_HTTP_ADDR"), "{from_builder}");
        assert!(
            !from_builder.contains("CONSUL_HTTP_TOKEN"),
            "{from_builder}"
        );
        assert!(
            from_builder.contains("ConsulBuilder::address"),
            "{from_builder}"
        );
        let Err(Error::Config {
            message: from_env, ..
        }) = base_url(Some(bad), false, AddressOrigin::Env)
        else {
            panic!("{bad} was accepted");
        };
        assert!(from_env.contains("CONSUL_HTTP_ADDR"), "{from_env}");
    }
    let Err(Error::Config { message: built, .. }) =
        ConsulBuilder::new().address("http://h:notaport").build()
    else {
        panic!("accepted");
    };
    assert!(!built.contains("CONSUL_HTTP_ADDR"), "{built}");
    assert_eq!(
        ConsulBuilder::new().address_origin(),
        AddressOrigin::Default { from_env: false }
    );
    assert_eq!(
        ConsulBuilder::from_env().address("h:1").address_origin(),
        AddressOrigin::Builder
    );
}

#[test]
fn a_missing_port_is_named_in_messages() {
    let consul = ConsulBuilder::new()
        .address("consul.internal")
        .build()
        .unwrap();
    let address = consul.client().wire().address();
    assert!(
        address.starts_with("http://consul.internal:80 (")
            && address.contains("no port, so http's default 80 was assumed")
            && address.contains("8500"),
        "{address}"
    );
    let tls = ConsulBuilder::new()
        .address("https://consul.internal")
        .build()
        .unwrap();
    assert!(
        tls.client()
            .wire()
            .address()
            .contains("https's default 443 was assumed"),
        "{}",
        tls.client().wire().address()
    );
    for given in ["consul.internal:80", "http://consul.internal:8500"] {
        let consul = ConsulBuilder::new().address(given).build().unwrap();
        assert!(
            !consul.client().wire().address().contains("assumed"),
            "{}",
            consul.client().wire().address()
        );
    }
}

/// The hints of a failed connection name `CONSUL_HTTP_ADDR` only for an address read from it.
#[tokio::test]
async fn unreachable_hints_name_where_the_address_came_from() {
    use crate::wire::{ApiError, hint};
    // Nothing listens on port 1: refused at once, no server needed.
    let refused = reqwest::get("http://127.0.0.1:1/").await.unwrap_err();
    let error = ApiError::Transport(std::sync::Arc::new(refused));
    for origin in [
        AddressOrigin::Builder,
        AddressOrigin::Default { from_env: false },
    ] {
        let hint = hint(&error, origin, false);
        assert!(!hint.contains("CONSUL_HTTP_ADDR"), "{origin:?}: {hint}");
        assert!(
            hint.contains("ConsulBuilder::address"),
            "{origin:?}: {hint}"
        );
    }
    for origin in [
        AddressOrigin::Env,
        AddressOrigin::Default { from_env: true },
    ] {
        let hint = hint(&error, origin, false);
        assert!(hint.contains("CONSUL_HTTP_ADDR"), "{origin:?}: {hint}");
    }
}

#[test]
fn token_is_redacted() {
    let b = ConsulBuilder::new().token("abc-secret");
    assert!(!format!("{b:?}").contains("abc-secret"));
}

/// As Go's `strconv.ParseBool`, which the `consul` CLI reads its flags with.
#[test]
fn flags_read_like_the_cli() {
    for on in ["1", "t", "T", "true", "TRUE", "True"] {
        assert!(env_true(on) && !env_false(on), "{on}");
    }
    for off in ["0", "f", "F", "false", "FALSE", "False"] {
        assert!(env_false(off) && !env_true(off), "{off}");
    }
}

/// `CONSUL_CLIENT_CERT` and `CONSUL_CLIENT_KEY` come from the environment one by one; the
/// error names the one missing.
#[test]
fn a_client_certificate_without_its_key_names_what_is_missing() {
    let cases = [
        (
            Some("cert.pem"),
            None,
            "CONSUL_CLIENT_CERT is set without CONSUL_CLIENT_KEY",
        ),
        (
            None,
            Some("key.pem"),
            "CONSUL_CLIENT_KEY is set without CONSUL_CLIENT_CERT",
        ),
    ];
    for (cert, key, expected) in cases {
        let builder = ConsulBuilder {
            client_cert: Some(ClientCert {
                cert: cert.map(PathBuf::from),
                key: key.map(PathBuf::from),
            }),
            ..ConsulBuilder::new()
        };
        let error = builder.build().unwrap_err().to_string();
        assert!(error.contains(expected), "{error}");
    }
}

#[test]
fn tls_settings_are_checked_when_built() {
    let missing = ConsulBuilder::new()
        .address("https://127.0.0.1:8501")
        .ca_cert("/nonexistent/ca.pem")
        .build()
        .unwrap_err()
        .to_string();
    assert!(
        missing.contains("cannot read the CA certificate (CONSUL_CACERT) /nonexistent/ca.pem"),
        "{missing}"
    );
    let not_a_name = ConsulBuilder::new()
        .address("https://127.0.0.1:8501")
        .tls_server_name("not a host")
        .build()
        .unwrap_err()
        .to_string();
    assert!(not_a_name.contains("is not a host name"), "{not_a_name}");
    let given = ConsulBuilder::new()
        .http_client(reqwest::Client::new())
        .connect_timeout(Duration::from_secs(1))
        .build()
        .unwrap_err()
        .to_string();
    assert!(given.contains("connect_timeout cannot apply"), "{given}");
    // A client of one's own, with nothing else about TLS, is fine.
    ConsulBuilder::new()
        .http_client(reqwest::Client::new())
        .namespace("team-a")
        .build()
        .unwrap();
}
