//! TLS of the PostgreSQL lease backend (feature `rustls`) against the test server, as the URL's
//! `sslmode` asks: `disable` plain, `prefer` encrypted when the server offers TLS (not
//! verified), `require` encrypted and verified, with the server's CA given by `sslrootcert` (or
//! `PostgresBuilder::ca_cert`) and the host checked against the certificate. Which sessions
//! are encrypted is read from the server (`pg_stat_ssl`), not assumed.
//!
//! With `ssl` on (`SHOW ssl`), `require` is tested with the server's own certificate as the CA
//! (a self-signed one, such as Debian's snakeoil for `localhost`), over the host name `localhost`
//! on the test server's port, and over `127.0.0.1`, which the certificate does not name. With `ssl` off, `require` must fail with an error naming TLS, and
//! `prefer` connect in plain.
//!
//! Run: `cargo test -p lease-tests --test postgres_tls`

use lease_core::{Backend, Error, LeaseSpec, Wait};
use lease_postgres::Postgres;
use lease_tests::postgres::TestDb;
use tokio_postgres::Client;

/// Whether the sessions named `app` are encrypted: `Some(true)` if all are, `Some(false)` if
/// none is, `None` if there are none. Panics on a mix.
async fn encrypted(admin: &Client, app: &str) -> Option<bool> {
    let rows = admin
        .query(
            "SELECT s.ssl FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
             WHERE a.application_name = $1",
            &[&app],
        )
        .await
        .unwrap();
    let all: Vec<bool> = rows.iter().map(|r| r.get(0)).collect();
    assert!(
        all.iter().all(|e| *e == all[0]),
        "{app}: some sessions encrypted, some not: {all:?}"
    );
    all.first().copied()
}

/// `db`'s URL with `params` added to its query.
fn with_params(db: &TestDb, params: &str) -> String {
    let url = db.url();
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{params}")
}

/// Acquires and releases one lease on `postgres`, and says whether its sessions (named `app`)
/// were encrypted.
async fn lease_over(postgres: &Postgres, admin: &Client, app: &str) -> Result<bool, Error> {
    let lease = postgres.acquire(&LeaseSpec::leader("tls/one")).await?;
    let encrypted = encrypted(admin, app).await;
    lease.release().await?;
    postgres.shutdown().await;
    Ok(encrypted.unwrap_or_else(|| panic!("{app}: no session found")))
}

#[tokio::test]
async fn tls_follows_the_urls_sslmode() {
    lease_tests::init_tracing();
    let db = TestDb::create("tls").await;
    let admin = db.connect().await;
    let ssl: String = admin.query_one("SHOW ssl", &[]).await.unwrap().get(0);
    let ssl_on = ssl == "on";
    eprintln!("the test server has ssl {ssl}");

    let build = |params: &str, app: &str| {
        Postgres::builder()
            .url(with_params(&db, params))
            .application_name(app)
            .build()
            .unwrap()
    };

    let plain = build("sslmode=disable", "tls-disable");
    assert!(
        !lease_over(&plain, &admin, "tls-disable").await.unwrap(),
        "sslmode=disable encrypted"
    );

    // tokio-postgres's default is `prefer`: TLS when the server offers it, else plain.
    let preferred = build("", "tls-prefer");
    assert_eq!(
        lease_over(&preferred, &admin, "tls-prefer").await.unwrap(),
        ssl_on,
        "sslmode=prefer against a server with ssl {ssl}"
    );

    if !ssl_on {
        let error = build("sslmode=require", "tls-require")
            .acquire(&LeaseSpec::leader("tls/one").wait(Wait::Never))
            .await
            .unwrap_err();
        eprintln!("sslmode=require against a server with ssl off: {error}");
        assert!(
            error.to_string().contains("the server has TLS off"),
            "{error}"
        );
        assert!(!error.is_transient(), "{error}");
        return;
    }

    // The server's own certificate as the CA (a self-signed one), over a name it carries.
    let cert_file: String = admin
        .query_one("SHOW ssl_cert_file", &[])
        .await
        .unwrap()
        .get(0);
    let pem = std::fs::read(&cert_file).unwrap_or_else(|e| {
        panic!("the server's certificate {cert_file} must be readable for this test: {e}")
    });
    let names = certificate_names(&pem);
    assert!(
        names.iter().any(|n| n == "localhost"),
        "the server's certificate {cert_file} names {names:?}, not localhost: this test connects \
         to localhost"
    );
    let port = lease_tests::postgres::server_addr(db.url()).port();
    let by_name = |params: &str| {
        format!(
            "postgres://postgres@localhost:{port}/{}?{params}",
            db.name()
        )
    };
    let refused = |postgres: Postgres, what: &'static str| async move {
        let error = postgres
            .acquire(&LeaseSpec::leader("tls/one").wait(Wait::Never))
            .await
            .unwrap_err();
        eprintln!("{what}: {error}");
        assert!(error.to_string().contains("TLS"), "{what}: {error}");
        assert!(
            !error.is_transient(),
            "{what}: a TLS failure is not worth retrying: {error}"
        );
        error.to_string()
    };

    // libpq's parameters: verify-full with sslrootcert.
    let verified = Postgres::builder()
        .url(by_name(&format!(
            "sslmode=verify-full&sslrootcert={cert_file}"
        )))
        .application_name("tls-verify-full")
        .build()
        .unwrap();
    assert!(
        lease_over(&verified, &admin, "tls-verify-full")
            .await
            .unwrap(),
        "sslmode=verify-full with the CA"
    );

    // The CA given to the builder, over an address the certificate does not name. (Without
    // the CA the outcome depends on the machine: Debian lists its snakeoil certificate among
    // the system's roots, in /etc/ssl/certs.)
    let text = refused(
        Postgres::builder()
            .url(with_params(&db, "sslmode=require"))
            .ca_cert(&cert_file)
            .build()
            .unwrap(),
        "sslmode=require with the CA, over 127.0.0.1",
    )
    .await;
    assert!(text.contains("ca_cert"), "the hint says what to do: {text}");
}

/// The DNS names of a PEM certificate's subjectAltName, read with `openssl x509`.
fn certificate_names(pem: &[u8]) -> Vec<String> {
    use std::io::Write;
    let mut child = std::process::Command::new("openssl")
        .args(["x509", "-noout", "-ext", "subjectAltName"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("this test reads the certificate with openssl: {e}"));
    child.stdin.take().unwrap().write_all(pem).unwrap();
    let out = child.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split([',', '\n'])
        .filter_map(|part| part.trim().strip_prefix("DNS:").map(str::to_owned))
        .collect()
}
