//! The real PostgreSQL the fence tests use: a database of its own per test, dropped when the test
//! ends, so tests run in parallel and a run can follow another.
//!
//! The server is `LEASE_TEST_POSTGRES_URL` (a `postgres://` URL), by default
//! `postgres://postgres@127.0.0.1:5432/postgres`: the local server with trust authentication, as
//! `scripts/test.sh` starts it (`pg_ctlcluster 15 main start`, or `apt-get install postgresql`
//! first). A test that cannot reach it fails with a message that says how to start it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio_postgres::{Client, NoTls};

/// The environment variable naming the server for the tests.
pub const URL_ENV: &str = "LEASE_TEST_POSTGRES_URL";
/// The server used when `LEASE_TEST_POSTGRES_URL` is not set.
pub const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// How long connecting may take before the test fails.
const CONNECT_WITHIN: Duration = Duration::from_secs(10);

/// The server's URL for the tests (its database is the one test databases are created from).
pub fn url() -> String {
    std::env::var(URL_ENV).unwrap_or_else(|_| DEFAULT_URL.to_owned())
}

/// `url` with its database replaced by `database` (query parameters kept).
pub fn with_database(url: &str, database: &str) -> String {
    let (scheme, rest) = url
        .split_once("://")
        .unwrap_or_else(|| panic!("{URL_ENV} must be a postgres:// URL, not {url:?}"));
    let (rest, query) = match rest.split_once('?') {
        Some((rest, query)) => (rest, format!("?{query}")),
        None => (rest, String::new()),
    };
    let authority = rest.split('/').next().unwrap_or(rest);
    format!("{scheme}://{authority}/{database}{query}")
}

/// Connects to `url`, driving the connection on a task of its own. Panics, saying how to start
/// PostgreSQL, when the server cannot be reached.
pub async fn connect(url: &str) -> Client {
    let connecting = tokio::time::timeout(CONNECT_WITHIN, tokio_postgres::connect(url, NoTls));
    let (client, connection) = match connecting.await {
        Ok(Ok(connected)) => connected,
        Ok(Err(e)) => unreachable_server(url, &with_sources(&e)),
        Err(_) => unreachable_server(url, &format!("no answer within {CONNECT_WITHIN:?}")),
    };
    tokio::spawn(async move {
        // Ends with the client; an error here shows in the test's next query.
        let _ = connection.await;
    });
    client
}

/// `error` and its sources, `: `-separated (tokio-postgres keeps the cause, such as "connection
/// refused", in the source).
pub fn with_sources(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

fn unreachable_server(url: &str, error: &dyn std::fmt::Display) -> ! {
    panic!(
        "cannot connect to PostgreSQL at {url}: {error}. The PostgreSQL tests need a server: \
         start it with `pg_ctlcluster 15 main start` (Debian), or install it with \
         `apt-get install postgresql` (`bash scripts/test.sh` does either), or point {URL_ENV} at \
         a running server whose role may create databases."
    )
}

/// A database of one test, created empty (from `template0`) and dropped when this is dropped.
#[derive(Debug)]
pub struct TestDb {
    name: String,
    url: String,
}

impl TestDb {
    /// Creates the database `lease_test_<test>_<pid>_<n>`.
    pub async fn create(test: &str) -> TestDb {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let test: String = test
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_lowercase()
                } else {
                    '_'
                }
            })
            .take(30)
            .collect();
        let name = format!(
            "lease_test_{test}_{}_{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let admin = connect(&url()).await;
        admin
            .batch_execute(&format!("CREATE DATABASE \"{name}\" TEMPLATE template0"))
            .await
            .unwrap_or_else(|e| panic!("cannot create the test database {name}: {e:?}"));
        let url = with_database(&url(), &name);
        TestDb { name, url }
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its URL, for other clients (sqlx, worker processes).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// A new connection to it.
    pub async fn connect(&self) -> Client {
        connect(&self.url).await
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        // Drop may run inside a runtime (at the end of a test) or outside one: a thread of its
        // own with a runtime of its own works in both.
        let name = self.name.clone();
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            runtime.block_on(async {
                let (client, connection) =
                    tokio::time::timeout(CONNECT_WITHIN, tokio_postgres::connect(&url(), NoTls))
                        .await
                        .map_err(|_| "no answer".to_owned())?
                        .map_err(|e| e.to_string())?;
                tokio::spawn(connection);
                client
                    .batch_execute(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
                    .await
                    .map_err(|e| e.to_string())
            })
        })
        .join();
        match dropped {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("could not drop the test database {}: {e}", self.name),
            Err(_) => eprintln!("dropping the test database {} panicked", self.name),
        }
    }
}

/// Waits until the backend `pid` waits for a lock held by another session (judged from
/// `pg_blocking_pids`), polling every 10 ms; panics after `limit`.
pub async fn wait_until_blocked(observer: &Client, pid: i32, limit: Duration) {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let row = observer
            .query_one("SELECT cardinality(pg_blocking_pids($1))", &[&pid])
            .await
            .unwrap();
        if row.get::<_, i32>(0) > 0 {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "backend {pid} did not start waiting for a lock within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The backend process id of `client`'s session.
pub async fn backend_pid(client: &Client) -> i32 {
    client
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0)
}
