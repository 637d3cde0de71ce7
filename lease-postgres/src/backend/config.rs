//! [`PostgresBuilder`]: the URL, the schema, the connection budget and the TCP settings of a
//! [`Postgres`] backend; [`Postgres::from_env`] reads the URL from the environment.

use std::borrow::Cow;
use std::path::PathBuf;
use std::time::Duration;

use lease_core::Error;
use tokio_postgres::config::Host;

use super::client::Shared;
use super::postgres::Postgres;
use super::wire::{DEFAULT_SCHEMA, Wire};

/// The environment variable [`Postgres::from_env`] reads first.
pub const URL_ENV: &str = "LEASE_POSTGRES_URL";
/// The environment variable [`Postgres::from_env`] reads when [`URL_ENV`] is not set.
pub const DATABASE_URL_ENV: &str = "DATABASE_URL";

impl Postgres {
    /// A backend for the database at `url` (`postgres://user:password@host:5432/database`, or
    /// a libpq key-value string), with the defaults of [`PostgresBuilder`]. Nothing is
    /// connected yet: the first use connects (and installs the tables).
    ///
    /// # Errors
    ///
    /// [`Error::Config`] when the URL does not parse or names no host.
    pub fn new(url: &str) -> Result<Postgres, Error> {
        PostgresBuilder::new().url(url).build()
    }

    /// A builder, for the schema, the connection budget and the TCP settings.
    pub fn builder() -> PostgresBuilder {
        PostgresBuilder::new()
    }

    /// A backend for the database named by the environment: `LEASE_POSTGRES_URL`, or else
    /// `DATABASE_URL`, with the defaults of [`PostgresBuilder`].
    ///
    /// # Errors
    ///
    /// [`Error::Config`] when neither is set, or the URL does not parse.
    pub fn from_env() -> Result<Postgres, Error> {
        PostgresBuilder::from_env().build()
    }
}

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
    /// Set by [`PostgresBuilder::ca_cert`]; else the URL's `sslrootcert`.
    ca_cert: Option<PathBuf>,
    /// Set by [`PostgresBuilder::advance_fence`].
    advance_fence: bool,
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
            ca_cert: None,
            advance_fence: false,
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

    /// Whether every leader acquisition registers the new holder with the fence
    /// ([`fence`](crate::fence), installed in the same database) in the transaction that
    /// acquires (default false): from the commit that makes a process the holder of a key, every
    /// older holder's fenced transaction on the key is refused (`lease_fence.advance`), whether
    /// or not the new holder has written. For data in the same database as the leases; install
    /// the fence first ([`fence::FENCE_SQL`](crate::fence::FENCE_SQL)), or acquisitions fail with
    /// the database's error. Semaphore holders are not advanced (the fence refuses them).
    ///
    /// The acquisition waits for an older holder's fenced transaction that is open on the key
    /// (and the attempts sent beside it in one statement wait with it); set
    /// `idle_in_transaction_session_timeout` below the TTL on the sessions that fence. An
    /// advance that fails (the fence not installed, a newer holder already recorded) fails
    /// the attempts of its statement with the database's error.
    pub fn advance_fence(mut self, advance: bool) -> Self {
        self.advance_fence = advance;
        self
    }

    /// A PEM file of the CA certificates that may sign the server's certificate, trusted
    /// beside the platform's roots when the URL says `sslmode=require` (libpq's `sslrootcert`;
    /// the URL's `sslrootcert=PATH` is read too, and this setting wins over it). Read by
    /// [`build`](Self::build).
    ///
    /// TLS follows the URL's `sslmode` (feature `rustls`, on by default): `disable`, plain TCP;
    /// `prefer` (the default), TLS when the server offers it, its certificate not verified (as
    /// libpq's `prefer`); `require`, TLS or no connection, the certificate verified and the
    /// URL's host checked against it (libpq's `verify-full`; the URL's `verify-ca` and
    /// `verify-full` are read as `require`).
    ///
    /// ```no_run
    /// use lease_postgres::Postgres;
    ///
    /// let postgres = Postgres::builder()
    ///     .url("postgres://app@db.example.com:5432/app?sslmode=require")
    ///     // The CA that signed the server's certificate, e.g. your provider's bundle.
    ///     .ca_cert("/etc/ssl/certs/db-provider-ca.pem")
    ///     .build()?;
    /// # let _ = postgres;
    /// # Ok::<(), lease_core::Error>(())
    /// ```
    pub fn ca_cert(mut self, path: impl Into<PathBuf>) -> Self {
        self.ca_cert = Some(path.into());
        self
    }

    /// The backend. Nothing is connected yet: the first acquisition (or check, or
    /// observation) connects.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] when there is no URL, the URL does not parse or names no host, the CA
    /// file cannot be read, TLS is asked for (`sslmode=require`) in a build without the `rustls`
    /// feature, or the schema name breaks its rule.
    pub fn build(self) -> Result<Postgres, Error> {
        let url = self.url.ok_or_else(|| {
            Error::config(format!(
                "no PostgreSQL URL: give one to Postgres::new or PostgresBuilder::url, or set \
                 {URL_ENV} (or {DATABASE_URL_ENV}) for Postgres::from_env"
            ))
        })?;
        let (url, url_ca_cert) = libpq_tls_params(&url);
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
        let ca_pem = match self.ca_cert.or(url_ca_cert) {
            Some(path) => Some(std::fs::read(&path).map_err(|e| {
                Error::config_caused_by(
                    format!(
                        "cannot read the PostgreSQL CA certificate {} ({e}): give a readable \
                         PEM file to PostgresBuilder::ca_cert or the URL's sslrootcert",
                        path.display()
                    ),
                    e,
                )
            })?),
            None => None,
        };
        let tls = super::wire::connector(config.get_ssl_mode(), ca_pem.as_deref())?;
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
        let mut session_sql = self
            .advance_fence
            .then(|| "SET lease_postgres.advance_fence = 'on'".to_owned());
        if !self.tcp_user_timeout.is_zero() {
            let timeout = self.tcp_user_timeout;
            let idle = (timeout / 3).max(Duration::from_secs(1));
            config.tcp_user_timeout(timeout);
            config.keepalives(true);
            config.keepalives_idle(idle);
            config.keepalives_interval(Duration::from_secs(1));
            let tcp = format!(
                "SET tcp_user_timeout = {}; SET tcp_keepalives_idle = {}; \
                 SET tcp_keepalives_interval = 1",
                timeout.as_millis(),
                idle.as_secs()
            );
            session_sql = Some(match session_sql {
                Some(fence) => format!("{fence}; {tcp}"),
                None => tcp,
            });
        }
        let address = address_of(&config);
        Ok(Postgres::from_shared(Shared::new(Wire::new(
            config,
            session_sql,
            tls,
            address,
            self.schema,
            self.max_connections,
            self.install,
        ))))
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

/// The URL with libpq's TLS parameters that tokio-postgres does not parse made into ones it
/// does: `sslmode=verify-ca` and `verify-full` become `require` (which verifies as
/// `verify-full` does here), and `sslrootcert=PATH` is taken out and returned. Both forms: a
/// `postgres://` URL's query, and a key-value string's unquoted `key=value` words.
fn libpq_tls_params(url: &str) -> (Cow<'_, str>, Option<PathBuf>) {
    let mut root_cert = None;
    let mut changed = false;
    let mut param = |key: &str, value: &str| -> Option<String> {
        match (key, value) {
            ("sslmode", "verify-ca" | "verify-full") => {
                changed = true;
                Some("sslmode=require".to_owned())
            }
            ("sslrootcert", path) => {
                changed = true;
                root_cert = Some(PathBuf::from(lease_core::address::percent_decoded(path)));
                None
            }
            _ => Some(format!("{key}={value}")),
        }
    };
    let rewritten = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        match url.split_once('?') {
            Some((base, query)) => {
                let kept: Vec<String> = query
                    .split('&')
                    .filter_map(|pair| match pair.split_once('=') {
                        Some((key, value)) => param(key, value),
                        None => Some(pair.to_owned()),
                    })
                    .collect();
                if kept.is_empty() {
                    base.to_owned()
                } else {
                    format!("{base}?{}", kept.join("&"))
                }
            }
            None => url.to_owned(),
        }
    } else {
        url.split_whitespace()
            .filter_map(|word| match word.split_once('=') {
                Some((key, value)) if !value.starts_with('\'') => param(key, value),
                _ => Some(word.to_owned()),
            })
            .collect::<Vec<_>>()
            .join(" ")
    };
    if changed {
        (Cow::Owned(rewritten), root_cert)
    } else {
        (Cow::Borrowed(url), None)
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
        let err = Postgres::new("postgres://u@h/db?sslmode=require&sslrootcert=/no/such.pem")
            .unwrap_err();
        assert!(err.to_string().contains("/no/such.pem"), "{err}");
        let err = Postgres::builder()
            .url("postgres://u@h/db")
            .schema("Bad-Name")
            .build()
            .unwrap_err();
        assert!(err.to_string().contains("schema"), "{err}");
    }

    #[cfg(not(feature = "rustls"))]
    #[test]
    fn a_build_without_tls_refuses_sslmode_require() {
        let err = Postgres::new("postgres://u@h/db?sslmode=require").unwrap_err();
        assert!(err.to_string().contains("`rustls` feature"), "{err}");
        assert!(Postgres::new("postgres://u@h/db?sslmode=prefer").is_ok());
    }

    #[test]
    fn libpq_tls_parameters_become_ones_tokio_postgres_reads() {
        let (url, ca) = libpq_tls_params(
            "postgres://u@h/db?sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem&application_name=x",
        );
        assert_eq!(url, "postgres://u@h/db?sslmode=require&application_name=x");
        assert_eq!(ca, Some(PathBuf::from("/etc/ca.pem")));
        let (url, ca) = libpq_tls_params("host=h sslmode=verify-ca sslrootcert=/ca.pem user=u");
        assert_eq!(url, "host=h sslmode=require user=u");
        assert_eq!(ca, Some(PathBuf::from("/ca.pem")));
        let plain = "postgres://u@h/db?sslmode=prefer";
        assert_eq!(libpq_tls_params(plain), (Cow::Borrowed(plain), None));
        let (url, _) = libpq_tls_params("postgres://u@h/db?sslrootcert=/ca.pem");
        assert_eq!(url, "postgres://u@h/db");
        assert!(url.parse::<tokio_postgres::Config>().is_ok());
    }

    #[test]
    fn the_url_names_the_sessions_unless_the_builder_does() {
        let name = |builder: PostgresBuilder| {
            let postgres = builder.build().unwrap();
            postgres
                .shared
                .wire
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
