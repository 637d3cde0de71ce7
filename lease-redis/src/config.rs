//! [`RedisBuilder`]: the URL (a server, or `redis+sentinel://` sentinels and a master's name),
//! TLS, the key prefix, the timeouts and the replica sync of a [`Redis`] backend;
//! [`Redis::from_env`] reads the URL from the environment.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use lease_core::Error;
use redis::RedisConnectionInfo;

use crate::client::Shared;
use crate::redis::Redis;
use crate::wire::{Connector, DEFAULT_PREFIX, Endpoint, Wire};

/// The environment variable [`Redis::from_env`] reads first.
pub const URL_ENV: &str = "LEASE_REDIS_URL";
/// The environment variable [`Redis::from_env`] reads when [`URL_ENV`] is not set.
pub const REDIS_URL_ENV: &str = "REDIS_URL";

/// The port of a URL that names none: Redis's (a sentinel's for `redis+sentinel://`).
const REDIS_PORT: u16 = 6379;
const SENTINEL_PORT: u16 = 26379;

impl Redis {
    /// A backend for the server at `url`, with the defaults of [`RedisBuilder`]. Nothing is
    /// connected yet: the first use connects.
    ///
    /// - `redis://[[user]:password@]host[:port][/db]`: one server (a master);
    /// - `rediss://…`: the same over TLS (feature `rustls`, on by default), the certificate
    ///   verified against the platform's roots and [`RedisBuilder::ca_cert`];
    /// - `redis+sentinel://[[user]:password@]host[:port][,host[:port]…]/master[/db]`: the
    ///   master that these sentinels name `master`, asked again after every failover (the
    ///   password is the master's; the sentinels are asked without one);
    ///   `rediss+sentinel://` with TLS to both.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] when the URL does not parse, or asks for TLS in a build without it.
    pub fn new(url: &str) -> Result<Redis, Error> {
        RedisBuilder::new().url(url).build()
    }

    /// A builder, for TLS, the key prefix, the timeouts and the replica sync.
    pub fn builder() -> RedisBuilder {
        RedisBuilder::new()
    }

    /// A backend for the server named by the environment: `LEASE_REDIS_URL`, or else
    /// `REDIS_URL`, with the defaults of [`RedisBuilder`].
    ///
    /// # Errors
    ///
    /// [`Error::Config`] when neither is set, or the URL does not parse.
    pub fn from_env() -> Result<Redis, Error> {
        let url = std::env::var(URL_ENV)
            .or_else(|_| std::env::var(REDIS_URL_ENV))
            .map_err(|_| {
                Error::config(format!(
                    "set {URL_ENV} (or {REDIS_URL_ENV}) to the server's URL, e.g. \
                     redis://127.0.0.1:6379"
                ))
            })?;
        Redis::new(&url)
    }
}

/// How a [`Redis`] backend connects. Build it with [`Redis::builder`].
///
/// ```
/// use std::time::Duration;
/// use lease_redis::Redis;
///
/// let redis = Redis::builder()
///     .url("redis://:secret@cache.internal:6379/0")
///     .prefix("app:lease:")
///     .request_timeout(Duration::from_secs(2))
///     .replica_wait(Some(Duration::from_millis(500)))
///     .build()?;
/// # let _ = redis;
/// # Ok::<(), lease_core::Error>(())
/// ```
#[derive(Clone, Debug)]
#[must_use]
pub struct RedisBuilder {
    url: Option<String>,
    prefix: String,
    ca_cert: Option<PathBuf>,
    tls_server_name: Option<String>,
    connect_timeout: Duration,
    request_timeout: Duration,
    replica_wait: Option<Duration>,
}

impl Default for RedisBuilder {
    fn default() -> Self {
        RedisBuilder {
            url: None,
            prefix: DEFAULT_PREFIX.to_owned(),
            ca_cert: None,
            tls_server_name: None,
            connect_timeout: Duration::from_secs(3),
            request_timeout: Duration::from_secs(3),
            replica_wait: Some(Duration::from_secs(1)),
        }
    }
}

impl RedisBuilder {
    /// The defaults: no URL yet, prefix `lease:`, 3 s to connect and for each request, and a
    /// second's `WAIT` for the replicas after each acquisition.
    pub fn new() -> Self {
        Self::default()
    }

    /// The URL read from `LEASE_REDIS_URL`, else `REDIS_URL`, if either is set.
    pub fn from_env() -> Self {
        let builder = RedisBuilder::new();
        match std::env::var(URL_ENV).or_else(|_| std::env::var(REDIS_URL_ENV)) {
            Ok(url) => builder.url(url),
            Err(_) => builder,
        }
    }

    /// The server's URL (see [`Redis::new`]).
    pub fn url(mut self, url: impl Into<String>) -> Self {
        self.url = Some(url.into());
        self
    }

    /// The prefix of every key and channel of this backend, `lease:` by default: a leader key
    /// `jobs/a` is `lease:{jobs/a}`. Without `{` or `}` (the name's hash tag follows it).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// A PEM file of CA certificates to trust, beside the platform's roots, for `rediss://`.
    pub fn ca_cert(mut self, path: impl Into<PathBuf>) -> Self {
        self.ca_cert = Some(path.into());
        self
    }

    /// The name the server's certificate must carry, when it is not the URL's host (a
    /// server reached by IP address, or through a tunnel).
    pub fn tls_server_name(mut self, name: impl Into<String>) -> Self {
        self.tls_server_name = Some(name.into());
        self
    }

    /// How long connecting (TCP, TLS, the handshake) may take. Default 3 s.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long a request may go unanswered before it counts as failed, and its connection
    /// as broken (another is opened). Default 3 s: far above a healthy answer, below the
    /// shortest TTL's renewal period.
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// After an acquisition, wait up to this long (`WAIT`) for every replica the master had
    /// when the connection opened to have it, and give the acquisition back and try again if
    /// one has not (Redisson's replica sync). Default one second; `None` returns an
    /// acquisition as soon as the master has it. Nothing is waited for without replicas. Keep
    /// it below the request timeout: `WAIT` holds up the command connection while it waits.
    pub fn replica_wait(mut self, wait: Option<Duration>) -> Self {
        self.replica_wait = wait;
        self
    }

    /// The backend.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] when no URL was set, it does not parse, the prefix has a brace, a
    /// timeout is zero or above an hour, or TLS
    /// is asked for in a build without it (or its CA file cannot be read).
    pub fn build(self) -> Result<Redis, Error> {
        let Some(url) = self.url.as_deref() else {
            return Err(Error::config(
                "no Redis URL: call RedisBuilder::url, or set LEASE_REDIS_URL",
            ));
        };
        if self.prefix.contains(['{', '}']) {
            return Err(Error::config(format!(
                "the key prefix {:?} has a brace: the hash tag of a name's keys follows it",
                self.prefix
            )));
        }
        for (name, timeout) in [
            ("connect_timeout", self.connect_timeout),
            ("request_timeout", self.request_timeout),
        ] {
            if timeout.is_zero() || timeout > MAX_TIMEOUT {
                return Err(Error::config(format!(
                    "RedisBuilder::{name} is {timeout:?}: give it more than zero and at most \
                     {MAX_TIMEOUT:?} (a few seconds is usual)"
                )));
            }
        }
        let parsed = parse_url(url)?;
        let ca_pem = match &self.ca_cert {
            Some(path) => Some(std::fs::read(path).map_err(|e| {
                Error::config_caused_by(format!("cannot read the CA file {}", path.display()), e)
            })?),
            None => None,
        };
        #[cfg(feature = "rustls")]
        let tls = match parsed.tls {
            true => Some(tls_connector(ca_pem)?),
            false => None,
        };
        #[cfg(not(feature = "rustls"))]
        if parsed.tls {
            let _ = ca_pem;
            return Err(lease_http::tls_missing("a rediss:// URL"));
        }
        let connector = Connector {
            endpoint: parsed.endpoint,
            info: parsed.info,
            #[cfg(feature = "rustls")]
            tls,
            tls_name: self.tls_server_name,
            connect_timeout: self.connect_timeout,
            request_timeout: self.request_timeout,
            open: Arc::new(AtomicUsize::new(0)),
        };
        let wire = Wire::new(parsed.address, self.prefix, connector, self.replica_wait);
        Ok(Redis::from_shared(Shared::new(wire)))
    }
}

/// rustls as lease-http configures it for the other backends (the platform's verifier, extra
/// roots), offering no ALPN protocol: Redis speaks none.
#[cfg(feature = "rustls")]
fn tls_connector(ca_pem: Option<Vec<u8>>) -> Result<tokio_rustls::TlsConnector, Error> {
    let config = lease_http::ClientConfig {
        https: true,
        ca_pem,
        ..lease_http::ClientConfig::default()
    };
    let tls = lease_http::tls::rustls_client_config(&config, "redis")
        .map_err(|e| Error::config_caused_by("cannot set up TLS for Redis", e))?;
    let mut tls = (*tls).clone();
    tls.alpn_protocols.clear();
    Ok(tokio_rustls::TlsConnector::from(Arc::new(tls)))
}

/// What a URL says.
#[derive(Debug)]
struct Parsed {
    endpoint: Endpoint,
    info: RedisConnectionInfo,
    tls: bool,
    address: String,
}

/// The longest connect or request timeout [`RedisBuilder::build`] takes: far above any useful
/// one, and far enough below `Instant`'s range that a deadline `now + timeout` always exists.
const MAX_TIMEOUT: Duration = Duration::from_secs(3600);

fn bad_url(url: &str, why: &str) -> Error {
    // Never the password in an error.
    let shown = match url.split_once('@') {
        Some((before, after)) => match before.split_once("://") {
            Some((scheme, _)) => format!("{scheme}://…@{after}"),
            None => format!("…@{after}"),
        },
        None => url.to_owned(),
    };
    Error::config(format!(
        "the Redis URL {shown:?} {why}; write redis://[:password@]host:port[/db], rediss://… \
         for TLS, or redis+sentinel://host:26379[,host:port]/master[/db]"
    ))
}

fn host_port(text: &str, default_port: u16) -> Option<(String, u16)> {
    if let Some(rest) = text.strip_prefix('[') {
        // [::1]:6379
        let (host, after) = rest.split_once(']')?;
        let port = match after.strip_prefix(':') {
            Some(port) => port.parse().ok()?,
            None if after.is_empty() => default_port,
            None => return None,
        };
        return Some((host.to_owned(), port));
    }
    match text.rsplit_once(':') {
        Some((host, port)) => Some((host.to_owned(), port.parse().ok()?)),
        None => Some((text.to_owned(), default_port)),
    }
    .filter(|(host, _)| !host.is_empty())
}

fn parse_url(url: &str) -> Result<Parsed, Error> {
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| bad_url(url, "has no scheme"))?;
    let (tls, sentinel) = match scheme {
        "redis" | "valkey" => (false, false),
        "rediss" | "valkeys" => (true, false),
        "redis+sentinel" => (false, true),
        "rediss+sentinel" => (true, true),
        _ => return Err(bad_url(url, "has a scheme this backend does not know")),
    };
    let rest = rest.split(['?', '#']).next().unwrap_or_default();
    let (userinfo, rest) = match rest.rsplit_once('@') {
        Some((userinfo, rest)) => (Some(userinfo), rest),
        None => (None, rest),
    };
    let (hosts, path) = match rest.split_once('/') {
        Some((hosts, path)) => (hosts, path),
        None => (rest, ""),
    };
    let mut info = RedisConnectionInfo::default();
    if let Some(userinfo) = userinfo {
        let (user, password) = match userinfo.split_once(':') {
            Some((user, password)) => (user, Some(password)),
            None => (userinfo, None),
        };
        if !user.is_empty() {
            info = info.set_username(lease_core::address::percent_decoded(user));
        }
        if let Some(password) = password.filter(|p| !p.is_empty()) {
            info = info.set_password(lease_core::address::percent_decoded(password));
        }
    }
    let mut path = path.split('/').filter(|p| !p.is_empty());
    let (endpoint, address) = if sentinel {
        let sentinels: Vec<(String, u16)> = hosts
            .split(',')
            .map(|h| host_port(h, SENTINEL_PORT))
            .collect::<Option<_>>()
            .ok_or_else(|| bad_url(url, "has a sentinel address that does not parse"))?;
        if sentinels.is_empty() {
            return Err(bad_url(url, "names no sentinel"));
        }
        let master = path
            .next()
            .ok_or_else(|| bad_url(url, "names no master (…/master)"))?
            .to_owned();
        let address = format!("sentinel master {master:?} at {hosts}");
        (Endpoint::Sentinel { sentinels, master }, address)
    } else {
        let (host, port) =
            host_port(hosts, REDIS_PORT).ok_or_else(|| bad_url(url, "has no host[:port]"))?;
        let address = format!("{host}:{port}");
        (Endpoint::Server { host, port }, address)
    };
    if let Some(db) = path.next() {
        let db: i64 = db
            .parse()
            .map_err(|_| bad_url(url, "has a database that is not a number"))?;
        info = info.set_db(db);
    }
    Ok(Parsed {
        endpoint,
        info,
        tls,
        address,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_a_server_or_the_sentinels_of_a_master() {
        let p = parse_url("redis://:s%40cret@cache:6380/2").unwrap();
        assert_eq!(p.address, "cache:6380");
        assert_eq!(p.info.password(), Some("s@cret"));
        assert_eq!(p.info.db(), 2);
        assert!(!p.tls);
        let p = parse_url("rediss://app:pw@[::1]").unwrap();
        assert!(p.tls);
        assert_eq!(p.address, "::1:6379");
        assert_eq!(p.info.username(), Some("app"));
        let p = parse_url("redis+sentinel://a:1,b/mymaster/3").unwrap();
        match p.endpoint {
            Endpoint::Sentinel { sentinels, master } => {
                assert_eq!(sentinels, [("a".into(), 1), ("b".into(), 26379)]);
                assert_eq!(master, "mymaster");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(p.info.db(), 3);
        let bad = parse_url("http://:hunter2@host").unwrap_err().to_string();
        assert!(!bad.contains("hunter2"), "{bad}");
        assert!(parse_url("redis://host/x").is_err());
        assert!(parse_url("redis+sentinel://a/").is_err());
        // A `%` before a multi-byte character is kept, not sliced through.
        let p = parse_url("redis://:%aé@cache").unwrap();
        assert_eq!(p.info.password(), Some("%aé"));
    }

    #[test]
    fn timeouts_out_of_range_are_refused_with_their_name() {
        for (builder, name) in [
            (
                Redis::builder().request_timeout(Duration::MAX),
                "request_timeout",
            ),
            (
                Redis::builder().connect_timeout(Duration::ZERO),
                "connect_timeout",
            ),
        ] {
            let error = builder
                .url("redis://cache")
                .build()
                .unwrap_err()
                .to_string();
            assert!(error.contains(name), "{error}");
        }
    }
}
