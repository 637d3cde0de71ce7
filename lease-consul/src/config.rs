//! Where the Consul agent is and how to talk to it, configured like Consul's own CLI.

use std::path::PathBuf;
use std::time::Duration;

use lease_core::Error;

use super::backend::Consul;
use super::client::Client;
use super::keepalive::KeepAlive;
use super::wire::{self, AddressOrigin, ConsulHttp, Token};

#[derive(Clone, Debug)]
enum TokenSource {
    Value(Token),
    File(PathBuf),
}

/// Configuration for a [`Consul`] backend.
///
/// [`from_env`](Self::from_env) reads the variables `consul` itself reads; each builder method
/// overrides one of them:
///
/// | variable | builder method | meaning |
/// | --- | --- | --- |
/// | `CONSUL_HTTP_ADDR` | [`address`](Self::address) | `host:port` or a URL; default `127.0.0.1:8500` |
/// | `CONSUL_HTTP_SSL` | [`ssl`](Self::ssl) | `true` to use `https` for a `host:port` address |
/// | `CONSUL_HTTP_TOKEN` | [`token`](Self::token) | ACL token, sent as the `X-Consul-Token` header |
/// | `CONSUL_HTTP_TOKEN_FILE` | [`token_file`](Self::token_file) | a file holding the token |
/// | `CONSUL_CACERT` | [`ca_cert`](Self::ca_cert) | a PEM file of the CA that signed the agent's certificate |
/// | `CONSUL_CLIENT_CERT`, `CONSUL_CLIENT_KEY` | [`client_cert`](Self::client_cert) | a PEM client certificate and its key, for an agent with `verify_incoming` |
/// | `CONSUL_HTTP_SSL_VERIFY` | [`ssl_verify`](Self::ssl_verify) | `false` to accept any server certificate |
/// | `CONSUL_TLS_SERVER_NAME` | [`tls_server_name`](Self::tls_server_name) | the name the agent's certificate is checked against (and sent as SNI) |
/// | `CONSUL_DATACENTER` | [`datacenter`](Self::datacenter) | the datacenter to use (`?dc=`) |
/// | `CONSUL_NAMESPACE` | [`namespace`](Self::namespace) | the namespace to use (`?ns=`, Consul Enterprise) |
///
/// Beside them: [`connect_timeout`](Self::connect_timeout), [`dial`](Self::dial) to open the
/// connections another way than TCP, and [`http_client`](Self::http_client) to bring your own
/// `reqwest::Client`.
///
/// TLS is rustls with the platform's certificate verifier (lease-core's default `rustls`
/// feature), or the platform's TLS library with the `native-tls` feature instead.
///
/// The token is never put in a URL, never logged, and never shown by `Debug`.
///
/// # Examples
///
/// ```
/// use lease_consul::Consul;
///
/// let consul = Consul::builder()
///     .address("https://consul.internal:8501")
///     .token("s3cr3t")
///     .datacenter("eu-west")
///     .build()
///     .unwrap();
/// // The token is never shown.
/// assert!(!format!("{consul:?}").contains("s3cr3t"));
/// ```
#[derive(Clone, Debug, Default)]
#[must_use]
pub struct ConsulBuilder {
    address: Option<String>,
    /// Whether `address` (if any) came from `CONSUL_HTTP_ADDR`, and whether the environment
    /// was read at all.
    address_from_env: bool,
    from_env: bool,
    ssl: Option<bool>,
    token: Option<TokenSource>,
    ca_cert: Option<PathBuf>,
    client_cert: Option<ClientCert>,
    ssl_verify: Option<bool>,
    tls_server_name: Option<String>,
    connect_timeout: Option<Duration>,
    http_client: Option<reqwest::Client>,
    dial: Option<DialWith>,
    datacenter: Option<String>,
    namespace: Option<String>,
    node_checks: Option<Vec<String>>,
    semaphore_pool: Option<Duration>,
    max_connections: Option<usize>,
    keep_alive: KeepAlive,
}

/// The builder's [`Dial`](lease_http::dial::Dial), shared by the clients it builds.
#[derive(Clone, Debug)]
struct DialWith(std::sync::Arc<dyn lease_http::dial::Dial>);

/// A client certificate and its key, as given (`CONSUL_CLIENT_CERT` and `CONSUL_CLIENT_KEY`
/// may come one without the other: [`ConsulBuilder::build`] says which is missing).
#[derive(Clone, Debug, Default)]
struct ClientCert {
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
}

/// Whether an environment value turns a flag on, as the `consul` CLI reads booleans.
fn env_true(value: &str) -> bool {
    matches!(value, "1" | "t" | "T" | "true" | "TRUE" | "True")
}

/// Whether an environment value turns a flag off.
fn env_false(value: &str) -> bool {
    matches!(value, "0" | "f" | "F" | "false" | "FALSE" | "False")
}

impl Consul {
    /// A builder with Consul's defaults, ignoring the environment.
    pub fn builder() -> ConsulBuilder {
        ConsulBuilder::new()
    }

    /// A backend configured from the environment as the `consul` CLI is
    /// (see [`ConsulBuilder::from_env`]).
    pub fn from_env() -> Result<Consul, Error> {
        ConsulBuilder::from_env().build()
    }
}

impl ConsulBuilder {
    /// A builder with Consul's defaults (`127.0.0.1:8500`, no token), ignoring the environment.
    pub fn new() -> Self {
        Self::default()
    }

    /// A builder seeded from the variables the `consul` CLI reads (see the table
    /// [above](Self)): `CONSUL_HTTP_ADDR`, `CONSUL_HTTP_SSL`, `CONSUL_HTTP_TOKEN`,
    /// `CONSUL_HTTP_TOKEN_FILE`, `CONSUL_CACERT`, `CONSUL_CLIENT_CERT`, `CONSUL_CLIENT_KEY`,
    /// `CONSUL_HTTP_SSL_VERIFY`, `CONSUL_TLS_SERVER_NAME`, `CONSUL_DATACENTER` and
    /// `CONSUL_NAMESPACE`. Empty variables count as unset.
    pub fn from_env() -> Self {
        let var = |name| std::env::var(name).ok().filter(|v| !v.is_empty());
        let mut builder = Self::new();
        builder.address = var("CONSUL_HTTP_ADDR");
        builder.address_from_env = builder.address.is_some();
        builder.from_env = true;
        builder.ssl = var("CONSUL_HTTP_SSL").map(|v| env_true(&v));
        builder.token = var("CONSUL_HTTP_TOKEN")
            .map(|t| TokenSource::Value(Token(t)))
            .or_else(|| var("CONSUL_HTTP_TOKEN_FILE").map(|p| TokenSource::File(p.into())));
        builder.ca_cert = var("CONSUL_CACERT").map(PathBuf::from);
        let (cert, key) = (var("CONSUL_CLIENT_CERT"), var("CONSUL_CLIENT_KEY"));
        if cert.is_some() || key.is_some() {
            builder.client_cert = Some(ClientCert {
                cert: cert.map(PathBuf::from),
                key: key.map(PathBuf::from),
            });
        }
        builder.ssl_verify = var("CONSUL_HTTP_SSL_VERIFY").map(|v| !env_false(&v));
        builder.tls_server_name = var("CONSUL_TLS_SERVER_NAME");
        builder.datacenter = var("CONSUL_DATACENTER");
        builder.namespace = var("CONSUL_NAMESPACE");
        builder
    }

    /// The agent's address: `host:port`, or a URL `http://host:port` / `https://host:port`.
    pub fn address(mut self, address: impl Into<String>) -> Self {
        self.address = Some(address.into());
        self.address_from_env = false;
        self
    }

    /// Use `https` for an address given as `host:port`.
    pub fn ssl(mut self, ssl: bool) -> Self {
        self.ssl = Some(ssl);
        self
    }

    /// The ACL token, sent as `X-Consul-Token`.
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(TokenSource::Value(Token(token.into())));
        self
    }

    /// A file holding the ACL token (read once, by [`build`](Self::build)).
    pub fn token_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.token = Some(TokenSource::File(path.into()));
        self
    }

    /// A PEM file with the CA certificate to trust for `https`.
    pub fn ca_cert(mut self, path: impl Into<PathBuf>) -> Self {
        self.ca_cert = Some(path.into());
        self
    }

    /// A PEM client certificate and its PEM key, presented to an agent configured with
    /// `verify_incoming`. With the `rustls` feature the key may be PKCS #8, PKCS #1 or SEC1 (as
    /// `consul tls cert create` writes it); with `native-tls` it must be PKCS #8.
    pub fn client_cert(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        self.client_cert = Some(ClientCert {
            cert: Some(cert.into()),
            key: Some(key.into()),
        });
        self
    }

    /// Whether the agent's certificate is verified; default `true`. `false` accepts any
    /// certificate for any name: for a test agent only.
    pub fn ssl_verify(mut self, verify: bool) -> Self {
        self.ssl_verify = Some(verify);
        self
    }

    /// The name the agent's certificate must carry, and the SNI sent, when it differs from the
    /// address's host: for instance `server.dc1.consul` for an agent reached at `10.0.0.5:8501`.
    /// Connections still go to the address.
    pub fn tls_server_name(mut self, name: impl Into<String>) -> Self {
        self.tls_server_name = Some(name.into());
        self
    }

    /// How long establishing a connection to the agent (TCP and TLS) may take; default 5 s.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = Some(timeout);
        self
    }

    /// Send every request through `client`, for a TLS, proxy or connection setup of your own.
    ///
    /// Without it the client connects to the agent directly (it reads no `HTTP_PROXY`: the
    /// agent is normally local), over a connection pool of its own that counts its connections
    /// (see [`max_connections`](Self::max_connections)).
    ///
    /// The client's own settings then apply: [`ca_cert`](Self::ca_cert),
    /// [`client_cert`](Self::client_cert), [`ssl_verify`](Self::ssl_verify),
    /// [`tls_server_name`](Self::tls_server_name) and [`connect_timeout`](Self::connect_timeout)
    /// cannot be combined with it, and [`build`](Self::build) says so. Give it a connect timeout
    /// and no overall request timeout (blocking queries wait minutes; this crate bounds each
    /// request itself). [`max_connections`](Self::max_connections) still bounds how many
    /// requests this crate has in flight.
    ///
    /// Leases still held when their runtime shuts down are given back through this client from
    /// another runtime; its pooled connections belong to the runtime that opened them, so some
    /// of those give-backs may fail, leaving the leases to expire with their sessions. A client
    /// this crate builds itself does not have that limit.
    pub fn http_client(mut self, client: reqwest::Client) -> Self {
        self.http_client = Some(client);
        self
    }

    /// How the client opens its connections to the agent: through `dial` (a tunnel, a Unix
    /// socket, the in-memory network of a test) instead of TCP to the address's host and port,
    /// which it is given. TLS, for an `https` address, runs over what `dial` returns, and every
    /// connection still counts against [`max_connections`](Self::max_connections).
    pub fn dial(mut self, dial: impl lease_http::dial::Dial) -> Self {
        self.dial = Some(DialWith(std::sync::Arc::new(dial)));
        self
    }

    /// The datacenter, sent as `?dc=` on every request.
    pub fn datacenter(mut self, datacenter: impl Into<String>) -> Self {
        self.datacenter = Some(datacenter.into());
        self
    }

    /// The namespace, sent as `?ns=` on every request (Consul Enterprise). Consul's open-source
    /// edition has no namespaces and refuses the parameter; on such an agent the client drops it
    /// after the first refusal (a DEBUG event) and goes on in the default namespace.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = Some(namespace.into());
        self
    }

    /// The node health checks sessions are tied to. Default: Consul's (`serfHealth`). An empty
    /// list ties sessions to their TTL alone.
    pub fn node_checks<I, S>(mut self, checks: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.node_checks = Some(checks.into_iter().map(Into::into).collect());
        self
    }

    /// Reuse semaphore sessions and contender keys across acquisitions, keeping an idle one alive
    /// (renewed) for up to `idle_for` before destroying it.
    ///
    /// With a pool, a semaphore slot costs one write to take (one transaction: re-lock the
    /// contender key, which raises its LockIndex so the sequencer still changes, and join the
    /// holders) and one to give back, instead of five. Meant for per-request limits (lease-tower's
    /// semaphore layer). The price: idle sessions stay listed in Consul while pooled.
    pub fn semaphore_pool(mut self, idle_for: Duration) -> Self {
        self.semaphore_pool = Some(idle_for);
        self
    }

    /// How many connections this client (and its clones) may open to the agent at once;
    /// default 8, at least 4. Every lease shares them: blocking queries are multiplexed (up to
    /// `max − 2` connections watch prefixes that cover every key of interest), and other
    /// requests queue for the rest.
    ///
    /// The bound is exact: the client's connector counts each connection (plain or TLS) from
    /// connect to close. A client of your own ([`http_client`](Self::http_client)) pools its
    /// connections where they cannot be counted: its requests are then kept to `max − 1`,
    /// leaving one connection for its pool's connect race (a connection it finishes opening
    /// after another came free), so watches get `max − 3`, and two such races at once can open
    /// one connection past `max`.
    ///
    /// The agent allows each client IP `limits.http_max_conns_per_client` connections (default
    /// 200), shared by every process on the host: keep the sum of this budget over those
    /// processes below it.
    pub fn max_connections(mut self, max: usize) -> Self {
        self.max_connections = Some(max);
        self
    }

    /// How sessions are kept alive; default [`KeepAlive::AgentCheck`].
    pub fn keep_alive(mut self, keep_alive: KeepAlive) -> Self {
        self.keep_alive = keep_alive;
        self
    }

    fn address_origin(&self) -> AddressOrigin {
        match (&self.address, self.address_from_env) {
            (Some(_), true) => AddressOrigin::Env,
            (Some(_), false) => AddressOrigin::Builder,
            (None, _) => AddressOrigin::Default {
                from_env: self.from_env,
            },
        }
    }

    /// Validates the configuration and builds the backend. No request is sent.
    pub fn build(mut self) -> Result<Consul, Error> {
        let origin = self.address_origin();
        let (base, port_given) =
            base_url(self.address.as_deref(), self.ssl.unwrap_or(false), origin)?;
        let token = match self.token.take() {
            None => None,
            Some(TokenSource::Value(t)) => Some(t),
            Some(TokenSource::File(path)) => {
                let text = std::fs::read_to_string(&path).map_err(|e| {
                    let message = format!(
                        "cannot read the Consul token file {} (CONSUL_HTTP_TOKEN_FILE): {e}",
                        path.display()
                    );
                    Error::config_caused_by(message, e)
                })?;
                Some(Token(text.trim().to_owned()))
            }
        }
        .filter(|t| !t.0.is_empty());
        if let Some(t) = &token {
            if reqwest::header::HeaderValue::from_str(t.expose()).is_err() {
                return Err(Error::config(
                    "the Consul token contains characters not allowed in an HTTP header",
                ));
            }
        }
        let max_connections = self
            .max_connections
            .unwrap_or(wire::DEFAULT_MAX_CONNECTIONS);
        if max_connections < wire::MIN_CONNECTIONS {
            return Err(Error::config(format!(
                "max_connections {max_connections} is too few: a Consul client needs at least {} \
                 (one for watches, two for other requests, one spare)",
                wire::MIN_CONNECTIONS
            )));
        }
        let https = base.scheme() == "https";
        if let Some(name) = &self.tls_server_name {
            if !https {
                return Err(Error::config(format!(
                    "a TLS server name ({name:?}, CONSUL_TLS_SERVER_NAME or \
                     ConsulBuilder::tls_server_name) needs an https address; the agent's is {base}"
                )));
            }
            if base.clone().set_host(Some(name)).is_err() {
                return Err(Error::config(format!(
                    "the TLS server name {name:?} (CONSUL_TLS_SERVER_NAME or \
                     ConsulBuilder::tls_server_name) is not a host name"
                )));
            }
        }
        let client = match self.http_client {
            Some(client) => {
                let configured = [
                    (self.ca_cert.is_some(), "ca_cert (CONSUL_CACERT)"),
                    (
                        self.client_cert.is_some(),
                        "client_cert (CONSUL_CLIENT_CERT)",
                    ),
                    (
                        self.ssl_verify.is_some(),
                        "ssl_verify (CONSUL_HTTP_SSL_VERIFY)",
                    ),
                    (
                        self.tls_server_name.is_some(),
                        "tls_server_name (CONSUL_TLS_SERVER_NAME)",
                    ),
                    (self.connect_timeout.is_some(), "connect_timeout"),
                    (self.dial.is_some(), "dial"),
                ];
                if let Some((_, setting)) = configured.iter().find(|(set, _)| *set) {
                    return Err(Error::config(format!(
                        "ConsulBuilder::http_client was given a client of your own, so {setting} \
                         cannot apply: configure it on that reqwest::Client instead"
                    )));
                }
                wire::HttpClient::Given(client)
            }
            None => {
                let config = self.client_config(&base, max_connections)?;
                if (https || config.wants_tls()) && !lease_http::TLS {
                    return Err(lease_http::tls_missing("the Consul agent's https address"));
                }
                wire::HttpClient::build(config).map_err(|e| {
                    let message = format!(
                        "cannot build the HTTP client for Consul: {}",
                        lease_http::DisplayChain(&*e)
                    );
                    Error::config_caused_by(message, e)
                })?
            }
        };
        let settings = wire::Settings {
            token,
            datacenter: self.datacenter,
            namespace: self.namespace,
            server_name: self.tls_server_name,
            node_checks: self.node_checks,
            max_connections,
            origin,
            port_given,
        };
        let wire = ConsulHttp::new(client, base, settings);
        let client = Client::new(wire, self.keep_alive);
        Ok(Consul::from_parts(client, self.semaphore_pool))
    }

    /// How to build the HTTP client: the files read, and where to connect when the URL names
    /// the TLS server name.
    fn client_config(
        &self,
        base: &reqwest::Url,
        max_connections: usize,
    ) -> Result<lease_http::ClientConfig, Error> {
        let read = |path: &std::path::Path, what: &str| {
            std::fs::read(path).map_err(|e| {
                let message = format!("cannot read the {what} {}: {e}", path.display());
                Error::config_caused_by(message, e)
            })
        };
        let ca_pem = match &self.ca_cert {
            Some(path) => Some(read(path, "CA certificate (CONSUL_CACERT)")?),
            None => None,
        };
        let identity_pem = match &self.client_cert {
            None => None,
            Some(ClientCert {
                cert: Some(cert),
                key: Some(key),
            }) => Some((
                read(cert, "client certificate (CONSUL_CLIENT_CERT)")?,
                read(key, "client key (CONSUL_CLIENT_KEY)")?,
            )),
            Some(ClientCert { cert: None, .. }) => {
                return Err(Error::config(
                    "CONSUL_CLIENT_KEY is set without CONSUL_CLIENT_CERT: give both, or neither",
                ));
            }
            Some(ClientCert { key: None, .. }) => {
                return Err(Error::config(
                    "CONSUL_CLIENT_CERT is set without CONSUL_CLIENT_KEY: give both, or neither",
                ));
            }
        };
        let connect_to = self.tls_server_name.as_ref().map(|_| {
            let host =
                lease_core::address::bare_host(base.host_str().unwrap_or_default()).to_owned();
            (host, base.port_or_known_default().unwrap_or(443))
        });
        Ok(lease_http::ClientConfig {
            https: base.scheme() == "https",
            ca_pem,
            identity_pem,
            skip_verify: self.ssl_verify == Some(false),
            connect_to,
            connect_timeout: self.connect_timeout,
            max_connections,
            dial: self
                .dial
                .as_ref()
                .map(|dial| std::sync::Arc::clone(&dial.0)),
        })
    }
}

/// `http://127.0.0.1:8500` from `CONSUL_HTTP_ADDR`-style input, and whether it gives the port
/// (without one, the scheme's default is used, as the `consul` CLI does). Errors name the setting
/// the address came from.
fn base_url(
    address: Option<&str>,
    ssl: bool,
    origin: AddressOrigin,
) -> Result<(reqwest::Url, bool), Error> {
    let address = address.unwrap_or("127.0.0.1:8500").trim();
    let setting = origin.setting();
    let text = if address.contains("://") {
        address.to_owned()
    } else {
        format!("{}://{address}", if ssl { "https" } else { "http" })
    };
    let url = reqwest::Url::parse(&text).map_err(|e| {
        let message = format!(
            "invalid Consul address {address:?} ({setting}): {e}; use host:port or a URL \
             http://host:port"
        );
        Error::config_caused_by(message, e)
    })?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(Error::config(format!(
            "invalid Consul address {address:?} ({setting}): use http://, https:// or host:port \
             (unix sockets are not supported)"
        )));
    }
    if url.host_str().is_none() || url.query().is_some() || !matches!(url.path(), "" | "/") {
        return Err(Error::config(format!(
            "invalid Consul address {address:?} ({setting}): give only scheme, host and port"
        )));
    }
    if !url.username().is_empty() || url.password().is_some() {
        let token = match origin {
            AddressOrigin::Env => "CONSUL_HTTP_TOKEN",
            _ => "ConsulBuilder::token",
        };
        return Err(Error::config(format!(
            "do not put credentials in the Consul address ({setting}); give the ACL token with \
             {token}"
        )));
    }
    Ok((url, lease_core::address::has_port(address)))
}

#[cfg(test)]
mod tests;
