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

    /// A new connection to it, with the fence installed and the `fenced_writes` table that
    /// `lease-fenced-writer` writes its rows into (each with its server-side `written_at`).
    pub async fn connect_for_fenced_writes(&self) -> Client {
        let client = self.connect().await;
        lease_postgres::fence::tokio_postgres::install(&client)
            .await
            .unwrap_or_else(|e| panic!("cannot install the fence in {}: {e}", self.name));
        client
            .batch_execute(
                "CREATE TABLE fenced_writes (id bigserial PRIMARY KEY, lease_key text NOT NULL, \
                 lease_index bigint NOT NULL, holder text NOT NULL, pid bigint NOT NULL, \
                 attempt bigint NOT NULL, written_at timestamptz NOT NULL DEFAULT clock_timestamp())",
            )
            .await
            .unwrap_or_else(|e| panic!("cannot create fenced_writes in {}: {e}", self.name));
        client
    }

    /// The operator's outage: `ALTER DATABASE … ALLOW_CONNECTIONS false`, so every new
    /// connection is refused (SQLSTATE 55000, "database … is not currently accepting
    /// connections", superusers too), then `pg_terminate_backend` of every session of the
    /// database (the test's own connections to it included). Returns how many were terminated.
    pub async fn refuse_connections(&self) -> i64 {
        let server = connect(&url()).await;
        server
            .batch_execute(&format!(
                "ALTER DATABASE \"{}\" ALLOW_CONNECTIONS false",
                self.name
            ))
            .await
            .unwrap_or_else(|e| panic!("cannot close {} to connections: {e:?}", self.name));
        server
            .query_one(
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity \
                 WHERE datname = $1 AND pid <> pg_backend_pid()",
                &[&self.name],
            )
            .await
            .unwrap_or_else(|e| panic!("cannot terminate the sessions of {}: {e:?}", self.name))
            .get(0)
    }

    /// The end of [`refuse_connections`](TestDb::refuse_connections)'s outage:
    /// `ALTER DATABASE … ALLOW_CONNECTIONS true`.
    pub async fn accept_connections(&self) {
        connect(&url())
            .await
            .batch_execute(&format!(
                "ALTER DATABASE \"{}\" ALLOW_CONNECTIONS true",
                self.name
            ))
            .await
            .unwrap_or_else(|e| panic!("cannot open {} to connections: {e:?}", self.name));
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

/// The rows of the PostgreSQL lease backend's table (`lease.leases`, in the default schema) whose
/// key is `key` or under `key/`, each as `key holder`: what a run left behind. (To delete a
/// holder's row, as an operator, use the backend's own `Postgres::delete_holder`.)
pub async fn lease_rows(client: &Client, key: &str) -> Result<Vec<String>, tokio_postgres::Error> {
    let under = format!(
        "{}/%",
        key.replace('\\', "\\\\")
            .replace('%', "\\%")
            .replace('_', "\\_")
    );
    let rows = client
        .query(
            "SELECT lease_key, holder FROM lease.leases WHERE lease_key = $1 OR lease_key LIKE $2 \
             ORDER BY lease_key, holder",
            &[&key, &under],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| format!("{} {}", r.get::<_, String>(0), r.get::<_, String>(1)))
        .collect())
}

/// The sessions of the current database whose `application_name` is `LIKE` `pattern`, other
/// than the caller's, each as `<application_name> pid <pid>`.
pub async fn sessions_named(
    client: &Client,
    pattern: &str,
) -> Result<Vec<String>, tokio_postgres::Error> {
    let rows = client
        .query(
            "SELECT application_name, pid FROM pg_stat_activity \
             WHERE datname = current_database() AND application_name LIKE $1 \
             AND pid <> pg_backend_pid()",
            &[&pattern],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| format!("{} pid {}", r.get::<_, String>(0), r.get::<_, i32>(1)))
        .collect())
}

/// The operator's other fault: `pg_terminate_backend` of every session whose
/// `application_name` is `name` (a client connected with `?application_name=<name>` in its URL),
/// other than the caller's. Returns how many were terminated.
pub async fn terminate_sessions(
    client: &Client,
    application_name: &str,
) -> Result<i64, tokio_postgres::Error> {
    let row = client
        .query_one(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE application_name = $1 AND pid <> pg_backend_pid()",
            &[&application_name],
        )
        .await?;
    Ok(row.get(0))
}

/// The server's address in `url` (`host:port`, port 5432 if none), resolved, for a
/// [`Proxy`](crate::proxy::Proxy) in front of it.
pub fn server_addr(url: &str) -> std::net::SocketAddr {
    use std::net::ToSocketAddrs;
    let authority = authority(url);
    let host_port = authority.rsplit('@').next().unwrap_or(authority);
    let with_port = if host_port.contains(':') {
        host_port.to_owned()
    } else {
        format!("{host_port}:5432")
    };
    with_port
        .to_socket_addrs()
        .ok()
        .and_then(|mut addrs| addrs.next())
        .unwrap_or_else(|| panic!("cannot resolve the PostgreSQL server {with_port:?} of {url}"))
}

/// `url` pointed at `addr` (a proxy) instead of its server, its sessions named
/// `application_name` (so an operator can find them in `pg_stat_activity`).
pub fn through(url: &str, addr: std::net::SocketAddr, application_name: &str) -> String {
    let (scheme, rest) = url
        .split_once("://")
        .unwrap_or_else(|| panic!("{URL_ENV} must be a postgres:// URL, not {url:?}"));
    let authority = authority(url);
    let user = authority
        .rsplit_once('@')
        .map(|(user, _)| format!("{user}@"))
        .unwrap_or_default();
    let rest = &rest[authority.len()..];
    let sep = if rest.contains('?') { '&' } else { '?' };
    format!("{scheme}://{user}{addr}{rest}{sep}application_name={application_name}")
}

fn authority(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    rest.split(['/', '?']).next().unwrap_or(rest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_is_pointed_at_a_proxy_with_its_user_database_and_parameters() {
        let addr: std::net::SocketAddr = "127.0.0.1:4000".parse().unwrap();
        assert_eq!(
            through("postgres://u:p@db:5432/app?sslmode=disable", addr, "w1"),
            "postgres://u:p@127.0.0.1:4000/app?sslmode=disable&application_name=w1"
        );
        assert_eq!(
            through("postgres://127.0.0.1/app", addr, "w1"),
            "postgres://127.0.0.1:4000/app?application_name=w1"
        );
        assert_eq!(
            server_addr("postgres://u@127.0.0.1/x"),
            "127.0.0.1:5432".parse().unwrap()
        );
    }
}
