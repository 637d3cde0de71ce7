//! [`PostgresBuilder`]: the URL, the schema, the connection budget and the TCP settings of a
//! [`Postgres`] backend; [`Postgres::from_env`] reads the URL from the environment.

use std::time::Duration;

use lease_core::Error;
use tokio_postgres::config::Host;

use super::Postgres;
use super::client::Shared;

/// The environment variable [`Postgres::from_env`] reads first.
pub const URL_ENV: &str = "LEASE_POSTGRES_URL";
/// The environment variable [`Postgres::from_env`] reads when [`URL_ENV`] is not set.
pub const DATABASE_URL_ENV: &str = "DATABASE_URL";

/// The schema the backend's tables live in unless [`PostgresBuilder::schema`] says otherwise.
pub const DEFAULT_SCHEMA: &str = "lease";

/// How a [`Postgres`] backend connects. Build it with [`Postgres::builder`].
///
/// ```
/// use std::time::Duration;
/// use lease_postgres::Postgres;
///
/// let postgres = Postgres::builder()
///     .url("postgres://app@db.internal:5432/app")
///     .schema("leases")
///     .max_connections(2)
///     .tcp_user_timeout(Duration::from_secs(8))
///     .build()?;
/// # let _ = postgres;
/// # Ok::<(), lease_core::Error>(())
/// ```
#[derive(Clone, Debug)]
#[must_use]
pub struct PostgresBuilder {
    url: Option<String>,
    schema: String,
    max_connections: usize,
    tcp_user_timeout: Duration,
    connect_timeout: Duration,
    /// Set by [`PostgresBuilder::application_name`]; else the URL's, else `lease`.
    application_name: Option<String>,
    install: bool,
}

impl Default for PostgresBuilder {
    fn default() -> Self {
        PostgresBuilder {
            url: None,
            schema: DEFAULT_SCHEMA.to_owned(),
            max_connections: 2,
            tcp_user_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(5),
            application_name: None,
            install: true,
        }
    }
}

impl PostgresBuilder {
    /// The defaults: no URL yet, schema `lease`, 2 connections for work (plus one that listens),
    /// `tcp_user_timeout` 10 s, connect timeout 5 s, `application_name` `lease`, and the tables
    /// installed on first use.
    pub fn new() -> Self {
        Self::default()
    }

    /// The database: a `postgres://user:password@host:port/database?…` URL or a libpq
    /// key-value string (`host=… user=… dbname=…`), as tokio-postgres parses them. Required.
    pub fn url(mut self, url: impl Into<String>) -> Self {
        self.url = Some(url.into());
        self
    }

    /// The schema of the backend's tables and functions (default `lease`): 1 to 40 of `a`–`z`,
    /// `0`–`9` and `_`, not starting with a digit. Every process sharing leases must use the
    /// same one.
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = schema.into();
        self
    }

    /// How many connections carry acquisitions, renewals, releases and checks (default 2, at
    /// least 1), however many leases this handle and its clones hold or wait for; one more
    /// connection listens for the table's notifications.
    pub fn max_connections(mut self, max: usize) -> Self {
        self.max_connections = max;
        self
    }

    /// How long data sent on a connection may stay unacknowledged before the connection is
    /// dropped (`TCP_USER_TIMEOUT`, on Linux), on our side and, through the session settings
    /// `tcp_user_timeout` and `tcp_keepalives_*` set after connecting (best effort), on the
    /// server's (default 10 s, the shortest lease TTL): a partitioned client's sessions end on
    /// both sides within about that long. Keepalives are sent after a third of it idle. Zero
    /// leaves the system's defaults.
    pub fn tcp_user_timeout(mut self, timeout: Duration) -> Self {
        self.tcp_user_timeout = timeout;
        self
    }

    /// How long connecting may take (default 5 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The `application_name` of the connections, as `pg_stat_activity` shows them. Default:
    /// the URL's `application_name` parameter, else `lease`. This setting wins over the URL's.
    pub fn application_name(mut self, name: impl Into<String>) -> Self {
        self.application_name = Some(name.into());
        self
    }

    /// Whether to install the tables on first use (default true): the migration
    /// [`LEASE_SQL`](crate::LEASE_SQL), idempotent, run once per handle. Turn it off when a
    /// migration of yours installs it and the role may not create a schema.
    pub fn install(mut self, install: bool) -> Self {
        self.install = install;
        self
    }

    /// The backend. Nothing is connected yet: the first acquisition (or check, or
    /// observation) connects.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] when there is no URL, the URL does not parse, names no host or asks
    /// for TLS (`sslmode=require`, not supported yet), or the schema name breaks its rule.
    pub fn build(self) -> Result<Postgres, Error> {
        let url = self.url.ok_or_else(|| {
            Error::config(format!(
                "no PostgreSQL URL: give one to Postgres::new or PostgresBuilder::url, or set \
                 {URL_ENV} (or {DATABASE_URL_ENV}) for Postgres::from_env"
            ))
        })?;
        let mut config: tokio_postgres::Config = url.parse().map_err(|e| {
            Error::config_caused_by(
                format!(
                    "the PostgreSQL URL does not parse ({e}): use postgres://user:password@host:5432/database"
                ),
                e,
            )
        })?;
        if config.get_hosts().is_empty() {
            return Err(Error::config(
                "the PostgreSQL URL names no host: use postgres://user:password@host:5432/database",
            ));
        }
        if config.get_ssl_mode() == tokio_postgres::config::SslMode::Require {
            return Err(Error::config(
                "the PostgreSQL URL asks for TLS (sslmode=require), which this version of \
                 lease-postgres does not support yet: use sslmode=disable or prefer, on a \
                 network you trust",
            ));
        }
        check_schema(&self.schema)?;
        if self.max_connections == 0 {
            return Err(Error::config(
                "max_connections must be at least 1: the backend needs a connection for its work",
            ));
        }
        match &self.application_name {
            Some(name) => {
                config.application_name(name);
            }
            None if config.get_application_name().is_none() => {
                config.application_name("lease");
            }
            None => {}
        }
        config.connect_timeout(self.connect_timeout);
        // The server's side of the same settings, set after connecting rather than as startup
        // options, which some poolers refuse.
        let mut session_sql = None;
        if !self.tcp_user_timeout.is_zero() {
            let timeout = self.tcp_user_timeout;
            let idle = (timeout / 3).max(Duration::from_secs(1));
            config.tcp_user_timeout(timeout);
            config.keepalives(true);
            config.keepalives_idle(idle);
            config.keepalives_interval(Duration::from_secs(1));
            session_sql = Some(format!(
                "SET tcp_user_timeout = {}; SET tcp_keepalives_idle = {}; \
                 SET tcp_keepalives_interval = 1",
                timeout.as_millis(),
                idle.as_secs()
            ));
        }
        let address = address_of(&config);
        Ok(Postgres::from_shared(Shared::new(
            config,
            session_sql,
            address,
            self.schema,
            self.max_connections,
            self.install,
        )))
    }

    /// A builder with the URL from the environment: `LEASE_POSTGRES_URL`, else `DATABASE_URL`.
    pub fn from_env() -> Self {
        let url = std::env::var(URL_ENV)
            .ok()
            .filter(|url| !url.is_empty())
            .or_else(|| {
                std::env::var(DATABASE_URL_ENV)
                    .ok()
                    .filter(|url| !url.is_empty())
            });
        PostgresBuilder {
            url,
            ..PostgresBuilder::default()
        }
    }
}

/// The schema rule: a plain lowercase identifier, short enough that `<schema>_leases` is a
/// channel name PostgreSQL keeps whole.
fn check_schema(schema: &str) -> Result<(), Error> {
    let valid = (1..=40).contains(&schema.len())
        && !schema.starts_with(|c: char| c.is_ascii_digit())
        && schema
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if valid {
        Ok(())
    } else {
        Err(Error::config(format!(
            "invalid schema name {schema:?}: use 1 to 40 of a-z, 0-9 and _, not starting with a digit"
        )))
    }
}

/// `host:port/database`, never the password: what errors and `Debug` show.
fn address_of(config: &tokio_postgres::Config) -> String {
    let host = match config.get_hosts().first() {
        Some(Host::Tcp(host)) => host.clone(),
        Some(Host::Unix(path)) => path.display().to_string(),
        None => String::new(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let database = config.get_dbname().or(config.get_user()).unwrap_or("");
    format!("{host}:{port}/{database}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_is_needed_and_checked() {
        assert!(matches!(
            PostgresBuilder::new().build(),
            Err(Error::Config { .. })
        ));
        let err = Postgres::new("postgres://u@h:notaport/db").unwrap_err();
        assert!(err.to_string().contains("does not parse"), "{err}");
        let err = Postgres::new("postgres://u@h/db?sslmode=require").unwrap_err();
        assert!(err.to_string().contains("TLS"), "{err}");
        let err = Postgres::builder()
            .url("postgres://u@h/db")
            .schema("Bad-Name")
            .build()
            .unwrap_err();
        assert!(err.to_string().contains("schema"), "{err}");
    }

    #[test]
    fn the_url_names_the_sessions_unless_the_builder_does() {
        let name = |builder: PostgresBuilder| {
            let postgres = builder.build().unwrap();
            postgres
                .shared
                .config
                .get_application_name()
                .map(str::to_owned)
        };
        let url = "postgres://u@h/db?application_name=worker-7";
        assert_eq!(
            name(Postgres::builder().url(url)).as_deref(),
            Some("worker-7")
        );
        assert_eq!(
            name(Postgres::builder().url(url).application_name("mine")).as_deref(),
            Some("mine")
        );
        assert_eq!(
            name(Postgres::builder().url("postgres://u@h/db")).as_deref(),
            Some("lease")
        );
    }

    #[test]
    fn the_address_hides_the_password() {
        let postgres = Postgres::new("postgres://app:secret@db.internal:6543/app").unwrap();
        let shown = format!("{postgres:?}");
        assert!(shown.contains("db.internal:6543/app"), "{shown}");
        assert!(!shown.contains("secret"), "{shown}");
    }
}
