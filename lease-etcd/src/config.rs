//! Configuring an [`Etcd`] backend: from the environment, or with [`EtcdBuilder`].

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use super::Etcd;
use super::client::EtcdClient;
use super::wire::{Credentials, Endpoint, Wire};
use lease_core::Error;
use lease_http::ClientConfig;
use lease_http::dial::Dial;

impl Etcd {
    /// A builder with etcd's defaults (`http://127.0.0.1:2379`), ignoring the environment.
    pub fn builder() -> EtcdBuilder {
        EtcdBuilder::new()
    }

    /// A backend configured from the environment (see [`EtcdBuilder::from_env`]).
    pub fn from_env() -> Result<Etcd, Error> {
        EtcdBuilder::from_env().build()
    }
}

/// Builds an [`Etcd`] backend.
///
/// # Examples
///
/// ```
/// use lease_etcd::Etcd;
///
/// let etcd = Etcd::builder()
///     .endpoints(["http://10.0.0.1:2379", "http://10.0.0.2:2379"])
///     .user("lease", "secret")
///     .build()?;
/// # let _ = etcd;
/// # Ok::<(), lease_core::Error>(())
/// ```
#[derive(Clone, Default)]
#[must_use]
pub struct EtcdBuilder {
    endpoints: Vec<String>,
    user: Option<(String, String)>,
    ca_cert: Option<PathBuf>,
    client_cert: Option<(PathBuf, PathBuf)>,
    dial: Option<Arc<dyn Dial>>,
}

impl fmt::Debug for EtcdBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdBuilder")
            .field("endpoints", &self.endpoints)
            .field("user", &self.user.as_ref().map(|(user, _)| user))
            .field("ca_cert", &self.ca_cert)
            .field("client_cert", &self.client_cert)
            .field("dial", &self.dial)
            .finish()
    }
}

impl EtcdBuilder {
    /// No endpoints yet (`http://127.0.0.1:2379` unless some are given), no credentials, no TLS.
    pub fn new() -> Self {
        Self::default()
    }

    /// The configuration in the environment:
    ///
    /// - `ETCD_ENDPOINTS`: comma-separated client URLs (`http://host:2379`, or `host:2379`);
    /// - `ETCD_USER` (`user` or `user:password`) and `ETCD_PASSWORD`, as `etcdctl --user`;
    /// - `ETCD_CACERT`: a PEM CA certificate to trust for `https://` endpoints;
    /// - `ETCD_CERT` and `ETCD_KEY`: a client certificate and its PKCS #8 key, both PEM.
    pub fn from_env() -> Self {
        let var = |name| std::env::var(name).ok().filter(|v: &String| !v.is_empty());
        let mut builder = EtcdBuilder::new();
        if let Some(endpoints) = var("ETCD_ENDPOINTS") {
            builder = builder.endpoints(endpoints.split(','));
        }
        if let Some(user) = var("ETCD_USER") {
            let (user, password) = match user.split_once(':') {
                Some((user, password)) => (user.to_owned(), password.to_owned()),
                None => (user, var("ETCD_PASSWORD").unwrap_or_default()),
            };
            builder = builder.user(user, password);
        }
        if let Some(ca) = var("ETCD_CACERT") {
            builder = builder.ca_cert(ca);
        }
        if let (Some(cert), Some(key)) = (var("ETCD_CERT"), var("ETCD_KEY")) {
            builder = builder.client_cert(cert, key);
        }
        builder
    }

    /// The cluster's client URLs. Requests go to one at a time, and move on to the next when it
    /// cannot be reached.
    pub fn endpoints<I, S>(mut self, endpoints: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.endpoints = endpoints
            .into_iter()
            .map(Into::into)
            .map(|e| e.trim().to_owned())
            .filter(|e| !e.is_empty())
            .collect();
        self
    }

    /// Authenticate as `user` (etcd's `auth enable`d RBAC).
    pub fn user(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.user = Some((user.into(), password.into()));
        self
    }

    /// Trust this PEM CA certificate (beside the system's roots) for `https://` endpoints.
    pub fn ca_cert(mut self, path: impl Into<PathBuf>) -> Self {
        self.ca_cert = Some(path.into());
        self
    }

    /// Present this client certificate (PEM) with its PKCS #8 key (PEM), for a cluster started
    /// with `--client-cert-auth`.
    pub fn client_cert(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        self.client_cert = Some((cert.into(), key.into()));
        self
    }

    /// How the client opens its connections to the endpoints: through `dial` (a tunnel, a Unix
    /// socket, the in-memory network of a test) instead of TCP to each endpoint's host and port,
    /// which it is given. TLS, for `https://` endpoints, runs over what `dial` returns.
    pub fn dial(mut self, dial: impl Dial) -> Self {
        self.dial = Some(Arc::new(dial));
        self
    }

    /// Validates the configuration and builds the backend. No request is sent.
    pub fn build(self) -> Result<Etcd, Error> {
        let read = |path: &PathBuf, what: &str| {
            std::fs::read(path).map_err(|e| {
                let message = format!("cannot read the etcd {what} {}: {e}", path.display());
                Error::config_caused_by(message, e)
            })
        };
        let mut tls = ClientConfig {
            ca_pem: self
                .ca_cert
                .as_ref()
                .map(|p| read(p, "CA certificate (ETCD_CACERT)"))
                .transpose()?,
            identity_pem: match &self.client_cert {
                Some((cert, key)) => Some((
                    read(cert, "client certificate (ETCD_CERT)")?,
                    read(key, "client key (ETCD_KEY)")?,
                )),
                None => None,
            },
            dial: self.dial,
            ..ClientConfig::default()
        };
        let secure = tls.wants_tls();
        let endpoints = if self.endpoints.is_empty() {
            vec!["127.0.0.1:2379".to_owned()]
        } else {
            self.endpoints
        };
        let endpoints = endpoints
            .iter()
            .map(|e| endpoint(e, secure))
            .collect::<Result<Vec<_>, _>>()?;
        if endpoints.iter().any(|e| e.https) && !lease_http::TLS {
            return Err(lease_http::tls_missing("an https etcd endpoint"));
        }
        tls.https = endpoints.iter().any(|e| e.https);
        let credentials = self
            .user
            .map(|(user, password)| Credentials { user, password });
        if credentials.as_ref().is_some_and(|c| c.user.is_empty()) {
            return Err(Error::config("the etcd user name is empty (ETCD_USER)"));
        }
        let wire = Wire::new(tls, endpoints, credentials).map_err(|e| {
            let message = format!(
                "cannot set up TLS for etcd: {}",
                lease_http::DisplayChain(&*e)
            );
            Error::config(message)
        })?;
        Ok(Etcd::from_client(EtcdClient::new(wire)))
    }
}

/// An endpoint from `http://host:port`, `https://host:port` or `host:port` (then `https` if
/// TLS material was given, as etcdctl does).
fn endpoint(endpoint: &str, secure: bool) -> Result<Endpoint, Error> {
    let invalid = |why: &str| {
        Error::config(format!(
            "invalid etcd endpoint {endpoint:?} (ETCD_ENDPOINTS): {why}"
        ))
    };
    let (scheme, rest) = match endpoint.split_once("://") {
        Some((scheme, rest)) => (scheme.to_ascii_lowercase(), rest),
        None => ((if secure { "https" } else { "http" }).to_owned(), endpoint),
    };
    if scheme != "http" && scheme != "https" {
        return Err(invalid("use http://host:port or https://host:port"));
    }
    let authority = rest.trim_end_matches('/');
    if authority.contains('@') {
        return Err(Error::config(format!(
            "the etcd endpoint {} carries credentials; use ETCD_USER and ETCD_PASSWORD (or EtcdBuilder::user)",
            authority.rsplit_once('@').map_or("", |(_, host)| host)
        )));
    }
    if authority.contains('/') {
        return Err(invalid("an endpoint has no path: use http://host:port"));
    }
    let parsed: http::uri::Authority = authority.parse().map_err(|e| invalid(&format!("{e}")))?;
    let host = parsed.host().trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return Err(invalid("no host"));
    }
    let port = parsed.port_u16().unwrap_or(2379);
    Ok(Endpoint {
        url: format!("{scheme}://{}:{port}", parsed.host()),
        host: host.to_owned(),
        port,
        https: scheme == "https",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_parse_like_etcdctl() {
        assert_eq!(
            endpoint("127.0.0.1:2379", false).unwrap().url,
            "http://127.0.0.1:2379"
        );
        let tls = endpoint("etcd-0:2379", true).unwrap();
        assert_eq!((tls.url.as_str(), tls.https), ("https://etcd-0:2379", true));
        assert_eq!(endpoint("http://[::1]:2379/", false).unwrap().host, "::1");
        assert_eq!(endpoint("http://etcd-0", false).unwrap().port, 2379);
        assert!(endpoint("ftp://x:1", false).is_err());
        assert!(endpoint("http://u:p@x:1", false).is_err());
        assert!(endpoint("http://x:1/v3", false).is_err());
        let etcd = EtcdBuilder::new()
            .endpoints(" http://a:1 ,, b:2".split(','))
            .build()
            .unwrap();
        assert_eq!(etcd.endpoints(), "http://a:1,http://b:2");
    }
    #[test]
    fn password_is_redacted() {
        let builder = EtcdBuilder::new().user("root", "hunter2");
        assert!(!format!("{builder:?}").contains("hunter2"));
        let etcd = builder.build().unwrap();
        assert!(!format!("{etcd:?}").contains("hunter2"));
    }
}
