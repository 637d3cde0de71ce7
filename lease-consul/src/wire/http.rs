//! The wire client: where requests go, what they carry, and how each is sent within the
//! connection budget, counted and watched for reachability.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use reqwest::{Method, StatusCode, Url};

use super::answer::status_error;
use super::budget::{Budget, Kind};
use super::error::{LIMIT_HINT, hint};
use super::settings::{AddressOrigin, Settings, Token};
use super::transport::HttpClient;
use lease_core::BackendKind;
use lease_core::Error;
use lease_core::backend::Reachability;
use lease_core::backend::ReachabilityTracker;
use lease_core::metrics::RequestError;
use lease_http::{ApiError, ErrorContext};

/// Timeout of a request that does not block server-side.
pub(super) const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// The Consul HTTP API, as this crate uses it.
pub(crate) struct ConsulHttp {
    client: HttpClient,
    /// What the client was configured with, to configure its detached twin alike.
    pub(super) settings: Settings,
    /// The agent's address, as configured (for messages).
    base: Url,
    /// The base of request URLs: `base`, or `base` naming the TLS server name.
    endpoint: Url,
    /// Set once the agent refused `?ns=` (Consul's open-source edition has no namespaces).
    namespace_refused: AtomicBool,
    budget: Budget,
    requests: AtomicU64,
    writes: AtomicU64,
    cas_conflicts: AtomicU64,
    /// This client on a connection pool of the clean-up runtime, built by the first clean-up
    /// that needs it (see [`ConsulHttp::detached`]).
    detached: OnceLock<Option<Arc<ConsulHttp>>>,
    reachability: ReachabilityTracker,
}

impl fmt::Debug for ConsulHttp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConsulHttp")
            .field("address", &self.base.as_str())
            .field("token", &self.settings.token.as_ref().map(|_| "<redacted>"))
            .field("datacenter", &self.settings.datacenter)
            .field("namespace", &self.settings.namespace)
            .finish_non_exhaustive()
    }
}

impl ConsulHttp {
    /// A client for the agent at `base`. A TLS server name in `settings` must be a valid host
    /// (the builder checks).
    pub(crate) fn new(client: HttpClient, base: Url, settings: Settings) -> Arc<Self> {
        let budget = Budget::new(settings.max_connections, client.counts_connections());
        let mut endpoint = base.clone();
        if let Some(name) = &settings.server_name {
            let _checked_by_the_builder = endpoint.set_host(Some(name));
        }
        Arc::new(ConsulHttp {
            client,
            base,
            endpoint,
            namespace_refused: AtomicBool::new(false),
            budget,
            settings,
            requests: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            cas_conflicts: AtomicU64::new(0),
            detached: OnceLock::new(),
            reachability: ReachabilityTracker::default(),
        })
    }

    /// The same client on its own connection pool, for the clean-ups that run on the detached
    /// runtime (the connections of this one belong to the runtime that made them). `None` if the
    /// TLS configuration cannot be built again. An application's own client is shared as it is.
    ///
    /// Built once and shared by every clean-up of this client: a runtime that shuts down with
    /// many leases hands over a clean-up for each, and building a TLS-capable client costs about
    /// a quarter of a second of CPU (loading the system's roots), which made a process holding
    /// 2,000 leases take nine minutes to exit.
    pub(crate) fn detached(&self) -> Option<Arc<ConsulHttp>> {
        self.detached.get_or_init(|| self.build_detached()).clone()
    }

    fn build_detached(&self) -> Option<Arc<ConsulHttp>> {
        Some(ConsulHttp::new(
            self.client.rebuilt()?,
            self.base.clone(),
            self.settings.clone(),
        ))
    }

    /// The connection budget of this client (a watch takes its slot from it).
    pub(crate) fn budget(&self) -> &Budget {
        &self.budget
    }

    /// The agent's address, for messages: with the port, and saying so when it was assumed.
    pub(crate) fn address(&self) -> String {
        let base = self.base.as_str().trim_end_matches('/');
        if self.settings.port_given {
            return base.to_owned();
        }
        let port = self.base.port_or_known_default().unwrap_or(80);
        format!(
            "{base}:{port} (the address gives no port, so {}'s default {port} was assumed; a \
             Consul agent's HTTP API listens on 8500 unless configured otherwise)",
            self.base.scheme()
        )
    }

    /// Whether requests go over `https`.
    pub(crate) fn https(&self) -> bool {
        self.endpoint.scheme() == "https"
    }

    /// Where the agent's address came from (for hints that name what to change).
    pub(crate) fn origin(&self) -> AddressOrigin {
        self.settings.origin
    }

    /// Whether the agent answered this client's last request.
    pub(crate) fn reachability(&self) -> Reachability {
        self.reachability.get()
    }

    /// How many requests this client has sent.
    pub(crate) fn requests_sent(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// Counts a compare-and-set this client lost to another writer.
    pub(crate) fn count_cas_conflict(&self) {
        self.cas_conflicts.fetch_add(1, Ordering::Relaxed);
    }

    /// How many compare-and-set writes this client lost to another writer.
    pub(crate) fn cas_conflicts(&self) -> u64 {
        self.cas_conflicts.load(Ordering::Relaxed)
    }

    /// How many of them were writes (PUT, DELETE): each one a Raft apply in Consul.
    pub(crate) fn writes_sent(&self) -> u64 {
        self.writes.load(Ordering::Relaxed)
    }

    pub(super) fn url<'a>(&self, path: impl IntoIterator<Item = &'a str>) -> Url {
        let mut url = self.endpoint.clone();
        if let Ok(mut segments) = url.path_segments_mut() {
            segments.clear().push("v1").extend(path);
        }
        if let Some(dc) = &self.settings.datacenter {
            url.query_pairs_mut().append_pair("dc", dc);
        }
        if let Some(ns) = &self.settings.namespace {
            if !self.namespace_refused.load(Ordering::Relaxed) {
                url.query_pairs_mut().append_pair("ns", ns);
            }
        }
        url
    }

    /// After a 400 answer to `url`: if it was the agent refusing `?ns=` (an open-source agent
    /// has no namespaces), stops sending it and returns `url` without it, to send again.
    fn without_refused_namespace(&self, url: &Url, status: StatusCode, body: &[u8]) -> Option<Url> {
        if status != StatusCode::BAD_REQUEST || !url.query_pairs().any(|(name, _)| name == "ns") {
            return None;
        }
        let text = String::from_utf8_lossy(body);
        if !(text.contains("\"ns\"") || text.contains("amespace")) {
            return None;
        }
        if !self.namespace_refused.swap(true, Ordering::Relaxed) {
            tracing::debug!(
                agent = %self.address(),
                namespace = self.settings.namespace.as_deref().unwrap_or_default(),
                answer = %text.trim(),
                "the Consul agent refused the namespace (its edition has none); using the default"
            );
        }
        let mut stripped = url.clone();
        let kept: Vec<(String, String)> = url
            .query_pairs()
            .filter(|(name, _)| name != "ns")
            .map(|(name, value)| (name.into_owned(), value.into_owned()))
            .collect();
        stripped.set_query(None);
        if !kept.is_empty() {
            stripped.query_pairs_mut().extend_pairs(kept);
        }
        Some(stripped)
    }

    pub(super) fn kv_url(&self, key: &str) -> Url {
        self.url(std::iter::once("kv").chain(key.split('/')))
    }

    /// Sends one request and reads its whole answer, holding a connection of the budget for
    /// exactly that long. A request the agent refused for its `?ns=` is sent again without it.
    pub(super) async fn exchange(
        &self,
        method: Method,
        url: Url,
        body: Option<Vec<u8>>,
        timeout: Duration,
        kind: Kind,
    ) -> Result<(StatusCode, Option<u64>, Vec<u8>), ApiError> {
        // Only a request that carries `?ns=` may be sent twice, so only it keeps a copy.
        if self.settings.namespace.is_none() || self.namespace_refused.load(Ordering::Relaxed) {
            return self.exchange_once(method, url, body, timeout, kind).await;
        }
        let answer = self
            .exchange_once(method.clone(), url.clone(), body.clone(), timeout, kind)
            .await;
        if let Ok((status, _, bytes)) = &answer {
            if let Some(url) = self.without_refused_namespace(&url, *status, bytes) {
                return self.exchange_once(method, url, body, timeout, kind).await;
            }
        }
        answer
    }

    async fn exchange_once(
        &self,
        method: Method,
        url: Url,
        body: Option<Vec<u8>>,
        timeout: Duration,
        kind: Kind,
    ) -> Result<(StatusCode, Option<u64>, Vec<u8>), ApiError> {
        let _admission = self.budget.admit(kind).await?;
        self.requests.fetch_add(1, Ordering::Relaxed);
        let write = method != Method::GET;
        if write {
            self.writes.fetch_add(1, Ordering::Relaxed);
        }
        lease_core::metrics::backend_request(BackendKind::Consul, write);
        let token = self.settings.token.as_ref().map(Token::expose);
        // A watch's read may rightly go unanswered for its whole wait: only the others tell a
        // hanging agent.
        let in_flight = (kind == Kind::Brief).then(|| self.reachability.sending());
        let answer = self.client.send(method, url, token, body, timeout).await;
        drop(in_flight);
        self.reachability
            .answered(!matches!(answer, Err(ApiError::Transport(_))));
        if let Err(error) = &answer {
            lease_core::metrics::backend_error(BackendKind::Consul, error.metric_kind());
        } else if let Ok((status, _, _)) = &answer {
            if !status.is_success() && *status != StatusCode::NOT_FOUND {
                lease_core::metrics::backend_error(BackendKind::Consul, RequestError::Status);
            }
        }
        let refused = match &answer {
            Ok((status @ StatusCode::TOO_MANY_REQUESTS, _, bytes)) => {
                Some(status_error(*status, bytes))
            }
            Err(error @ ApiError::Transport(_)) => Some(error.clone()),
            Ok(_) => {
                self.budget.answered();
                None
            }
            Err(_) => None,
        };
        if let Some(error) = refused.filter(|error| self.budget.refused(error)) {
            tracing::warn!(
                agent = %self.address(),
                %error,
                hint = hint(&error, self.settings.origin, self.https()),
                "a request to Consul got no answer; sending one request at a time until one does"
            );
        }
        answer
    }

    /// Sends and returns the body of a 2xx answer, or the status and body of another.
    pub(super) async fn call(
        &self,
        method: Method,
        url: Url,
        body: Option<Vec<u8>>,
    ) -> Result<(StatusCode, Option<u64>, Vec<u8>), ApiError> {
        self.exchange(method, url, body, REQUEST_TIMEOUT, Kind::Brief)
            .await
    }
}

impl ErrorContext for ConsulHttp {
    fn public_error(&self, error: ApiError, operation: impl fmt::Display) -> Error {
        let transient = error.is_transient();
        let hint = hint(&error, self.origin(), self.https());
        match error {
            ApiError::Transport(source) => Error::Unreachable {
                backend: "Consul",
                address: self.address(),
                hint,
                source: lease_http::unreachable_source(&*source),
            },
            ApiError::Status {
                status: StatusCode::FORBIDDEN,
                message,
                ..
            } => Error::PermissionDenied {
                operation: operation.to_string(),
                message,
                hint: "use an ACL token (CONSUL_HTTP_TOKEN, or ConsulBuilder::token) whose policy \
                       allows it",
            },
            ApiError::Status {
                status: StatusCode::TOO_MANY_REQUESTS,
                message,
                ..
            } => Error::Backend {
                backend: "Consul",
                operation: operation.to_string(),
                message: format!("429 Too Many Requests: {message}; {LIMIT_HINT}"),
                transient,
            },
            ApiError::Status { .. } | ApiError::Malformed(_) => Error::Backend {
                backend: "Consul",
                operation: operation.to_string(),
                message: error.to_string(),
                transient,
            },
            ApiError::TimedOut => Error::Backend {
                backend: "Consul",
                operation: operation.to_string(),
                message: "no answer in the time left; the agent may be overloaded".to_owned(),
                transient,
            },
        }
    }
}
