//! The Consul HTTP API calls this crate makes, one method each, and what their answers mean.
//!
//! Everything that comes back over the network is parsed without panicking: an answer we cannot
//! read becomes an [`ApiError`], which knows whether retrying could help (transport errors and 5xx
//! answers: Consul electing a leader, a proxy in trouble) or not (a 403, a 400).

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use reqwest::{Method, StatusCode, Url};
use serde::Deserialize;

mod budget;
mod error;
mod pool;
mod types;

use budget::Kind;
pub(crate) use budget::{Budget, DEFAULT_MAX_CONNECTIONS, MIN_CONNECTIONS, WatchSlot};
pub(crate) use error::hint;
pub(crate) use lease_http::ApiError;
use pool::Pool;
pub(crate) use types::{Behavior, Blocking, KvEntry, TxnOp};

use super::config::{AddressOrigin, KeepAlive, Token};
use super::keepalive::KeepAlives;
use super::session::ReleasedSessions;
use super::watch::Watches;
use lease_core::BackendKind;
use lease_core::BoxError;
use lease_core::backend::ReachabilityTracker;
use lease_core::backend::{Keepers, Reachability};
use lease_core::metrics::RequestError;
use lease_http::ClientConfig;

/// The node check every session is tied to unless configured otherwise (Consul's default).
const SERF_HEALTH: &str = "serfHealth";

/// How a session stays alive.
#[derive(Clone, Copy, Debug)]
pub(crate) enum SessionLife<'a> {
    /// Renewed by its holder within this TTL.
    Ttl(Duration),
    /// Tied to this agent check (beside the node checks): invalidated when it turns critical.
    Check(&'a str),
}

/// Timeout of a request that does not block server-side.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// The HTTP client requests go through.
#[derive(Clone, Debug)]
pub(crate) enum HttpClient {
    /// Built here: its connector counts connections, so at most `config.max_connections`
    /// are ever open (see the `pool` module); `config` builds it again for another runtime.
    Counted {
        pool: Box<Pool>,
        config: ClientConfig,
    },
    /// The application's own ([`ConsulBuilder::http_client`](super::ConsulBuilder::http_client)).
    Given(reqwest::Client),
}

impl HttpClient {
    /// The client `config` describes.
    pub(crate) fn build(config: ClientConfig) -> Result<HttpClient, BoxError> {
        Ok(HttpClient::Counted {
            pool: Box::new(Pool::new(&config)?),
            config,
        })
    }

    /// Whether this client's connections are counted, so the budget may use every one of them
    /// for requests (else one is kept for the pool's connect race).
    fn counts_connections(&self) -> bool {
        matches!(self, HttpClient::Counted { .. })
    }

    /// The same client on a connection pool of its own, if this crate built it.
    fn rebuilt(&self) -> Option<HttpClient> {
        match self {
            HttpClient::Counted { config, .. } => HttpClient::build(config.clone()).ok(),
            HttpClient::Given(client) => Some(HttpClient::Given(client.clone())),
        }
    }

    /// Sends one request and reads its whole answer.
    async fn send(
        &self,
        method: Method,
        url: Url,
        token: Option<&str>,
        body: Option<Vec<u8>>,
        timeout: Duration,
    ) -> Result<(StatusCode, Option<u64>, Vec<u8>), ApiError> {
        let client = match self {
            HttpClient::Counted { pool, .. } => {
                return pool
                    .send(method, &url, token, body, timeout)
                    .await
                    .map_err(ApiError::pool);
            }
            HttpClient::Given(client) => client,
        };
        let mut request = client.request(method, url).timeout(timeout);
        if let Some(token) = token {
            request = request.header("X-Consul-Token", token);
        }
        if let Some(body) = body {
            request = request.body(body);
        }
        let response = request.send().await.map_err(ApiError::transport)?;
        let status = response.status();
        let index = consul_index(response.headers());
        let bytes = response.bytes().await.map_err(ApiError::transport)?;
        Ok((status, index, bytes.to_vec()))
    }
}

/// What a client is configured with, beyond its address and HTTP client.
#[derive(Clone, Debug)]
pub(crate) struct Settings {
    pub(crate) token: Option<Token>,
    pub(crate) datacenter: Option<String>,
    pub(crate) namespace: Option<String>,
    /// The TLS server name requests' URLs name instead of the address's host.
    pub(crate) server_name: Option<String>,
    pub(crate) node_checks: Option<Vec<String>>,
    pub(crate) max_connections: usize,
    pub(crate) keep_alive: KeepAlive,
    /// Where the address came from, for hints.
    pub(crate) origin: AddressOrigin,
    /// Whether the address gives the port (else the scheme's default was assumed).
    pub(crate) port_given: bool,
}

/// The Consul HTTP API, as this crate uses it.
pub(crate) struct ConsulHttp {
    client: HttpClient,
    /// What the client was configured with, to configure its detached twin alike.
    settings: Settings,
    /// The holder tasks of every lease this client (and its clones) acquired.
    keepers: Keepers,
    /// The agent's address, as configured (for messages).
    base: Url,
    /// The base of request URLs: `base`, or `base` naming the TLS server name.
    endpoint: Url,
    /// Set once the agent refused `?ns=` (Consul's open-source edition has no namespaces).
    namespace_refused: AtomicBool,
    budget: Budget,
    /// Every blocking query of this client, multiplexed.
    watches: Watches,
    /// The heartbeat checks this client's sessions are tied to.
    keep_alives: KeepAlives,
    requests: AtomicU64,
    writes: AtomicU64,
    cas_conflicts: AtomicU64,
    /// This client on a connection pool of the clean-up runtime, built by the first clean-up
    /// that needs it (see [`ConsulHttp::detached`]).
    detached: OnceLock<Option<Arc<ConsulHttp>>>,
    reachability: ReachabilityTracker,
    /// Probes the agent while it is unreachable (see [`ConsulHttp::probed_reachability`]).
    probe: lease_http::Probe,
    /// The sessions this client gave back with a clean release, lately.
    released: ReleasedSessions,
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
            keepers: Keepers::new(),
            base,
            endpoint,
            namespace_refused: AtomicBool::new(false),
            watches: Watches::new(budget.max_watches()),
            budget,
            keep_alives: KeepAlives::new(settings.keep_alive),
            settings,
            requests: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            cas_conflicts: AtomicU64::new(0),
            detached: OnceLock::new(),
            reachability: ReachabilityTracker::default(),
            probe: lease_http::Probe::default(),
            released: ReleasedSessions::default(),
        })
    }

    /// The holder tasks of this client's leases.
    pub(crate) fn keepers(&self) -> &Keepers {
        &self.keepers
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
        let settings = Settings {
            keep_alive: self.keep_alives.mode(),
            ..self.settings.clone()
        };
        Some(ConsulHttp::new(
            self.client.rebuilt()?,
            self.base.clone(),
            settings,
        ))
    }

    /// The prefix watches of this client.
    pub(crate) fn watches(&self) -> &Watches {
        &self.watches
    }

    /// The sessions this client gave back with a clean release, lately.
    pub(crate) fn released(&self) -> &ReleasedSessions {
        &self.released
    }

    /// The connection budget of this client (a watch takes its slot from it).
    pub(crate) fn budget(&self) -> &Budget {
        &self.budget
    }

    /// The heartbeats of this client's sessions.
    pub(crate) fn keep_alives(&self) -> &KeepAlives {
        &self.keep_alives
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

    /// Whether the agent answered this client's last request, probing it in the background while
    /// it did not (`GET /v1/status/leader` about every second, until one is answered), so that
    /// the answer turns current again without other traffic.
    pub(crate) fn probed_reachability(self: &Arc<Self>) -> Reachability {
        self.probe
            .watch(self, ConsulHttp::reachability, |http| async move {
                // Any answer, a 500 "No cluster leader" too, is the agent answering.
                let _ = http
                    .call(Method::GET, http.url(["status", "leader"]), None)
                    .await;
            })
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

    fn url<'a>(&self, path: impl IntoIterator<Item = &'a str>) -> Url {
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

    fn kv_url(&self, key: &str) -> Url {
        self.url(std::iter::once("kv").chain(key.split('/')))
    }

    /// Sends one request and reads its whole answer, holding a connection of the budget for
    /// exactly that long. A request the agent refused for its `?ns=` is sent again without it.
    async fn exchange(
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
        let _admission = self.budget.admit(kind).await;
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
        if let Some(error) = refused.filter(|_| self.budget.refused()) {
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
    async fn call(
        &self,
        method: Method,
        url: Url,
        body: Option<Vec<u8>>,
    ) -> Result<(StatusCode, Option<u64>, Vec<u8>), ApiError> {
        self.exchange(method, url, body, REQUEST_TIMEOUT, Kind::Brief)
            .await
    }

    /// `PUT /v1/session/create`; returns the new session's ID. The session lives as long as
    /// `keep_alive` says: renewed within `ttl`, or tied to an agent check.
    pub(crate) async fn session_create(
        &self,
        name: &str,
        keep_alive: SessionLife<'_>,
        lock_delay: Duration,
        behavior: Behavior,
    ) -> Result<String, ApiError> {
        let mut body = serde_json::json!({
            "Name": name,
            // Consul reads a duration string; "0s" really disables the delay.
            "LockDelay": format!("{}ms", lock_delay.as_millis()),
            "Behavior": match behavior {
                Behavior::Release => "release",
                Behavior::Delete => "delete",
            },
        });
        let node_checks = self.settings.node_checks.as_deref();
        match keep_alive {
            SessionLife::Ttl(ttl) => {
                body["TTL"] = serde_json::json!(format!("{}s", ttl.as_secs()));
                if let Some(checks) = node_checks {
                    body["NodeChecks"] = serde_json::json!(checks);
                }
            }
            SessionLife::Check(check) => {
                body["NodeChecks"] = match node_checks {
                    Some(checks) => serde_json::json!(checks),
                    None => serde_json::json!([SERF_HEALTH]),
                };
                body["ServiceChecks"] = serde_json::json!([{ "ID": check }]);
            }
        }
        let body = serde_json::to_vec(&body).map_err(|e| ApiError::Malformed(e.to_string()))?;
        let (status, _, bytes) = self
            .call(Method::PUT, self.url(["session", "create"]), Some(body))
            .await?;
        expect_ok(status, &bytes)?;
        #[derive(Deserialize)]
        struct Created {
            #[serde(rename = "ID")]
            id: String,
        }
        let created: Created = parse_json(&bytes)?;
        if created.id.is_empty() {
            return Err(ApiError::Malformed(
                "session/create returned an empty ID".into(),
            ));
        }
        Ok(created.id)
    }

    /// `PUT /v1/agent/service/register`: a service `id` whose one check, also `id`, is a TTL
    /// check that starts passing; Consul deregisters it once it has been critical for
    /// `reap_after` (at least a minute).
    pub(crate) async fn agent_register_ttl_check(
        &self,
        id: &str,
        name: &str,
        ttl: Duration,
        reap_after: Duration,
    ) -> Result<(), ApiError> {
        let body = serde_json::json!({
            "ID": id,
            "Name": name,
            "Check": {
                "CheckID": id,
                "Name": "lease holder process alive",
                "TTL": format!("{}s", ttl.as_secs()),
                "Status": "passing",
                "DeregisterCriticalServiceAfter": format!("{}s", reap_after.as_secs()),
            },
        });
        let body = serde_json::to_vec(&body).map_err(|e| ApiError::Malformed(e.to_string()))?;
        let (status, _, bytes) = self
            .call(
                Method::PUT,
                self.url(["agent", "service", "register"]),
                Some(body),
            )
            .await?;
        expect_ok(status, &bytes)
    }

    /// `PUT /v1/agent/check/pass/<id>`: `Ok(false)` if the agent no longer knows the check.
    pub(crate) async fn agent_check_pass(&self, id: &str) -> Result<bool, ApiError> {
        let (status, _, bytes) = self
            .call(Method::PUT, self.url(["agent", "check", "pass", id]), None)
            .await?;
        // Consul 1.8 answers 500 "CheckID ... does not have associated TTL" for an unknown check.
        if status == StatusCode::NOT_FOUND
            || (status.is_server_error()
                && String::from_utf8_lossy(&bytes).contains("does not have associated TTL"))
        {
            return Ok(false);
        }
        expect_ok(status, &bytes)?;
        Ok(true)
    }

    /// `PUT /v1/agent/service/deregister/<id>` (which invalidates the sessions tied to its check).
    pub(crate) async fn agent_deregister(&self, id: &str) -> Result<(), ApiError> {
        let (status, _, bytes) = self
            .call(
                Method::PUT,
                self.url(["agent", "service", "deregister", id]),
                None,
            )
            .await?;
        if status == StatusCode::NOT_FOUND {
            return Ok(());
        }
        expect_ok(status, &bytes)
    }

    /// `PUT /v1/session/renew/<id>`: `Ok(false)` if the session no longer exists.
    pub(crate) async fn session_renew(&self, id: &str) -> Result<bool, ApiError> {
        let (status, _, bytes) = self
            .call(Method::PUT, self.url(["session", "renew", id]), None)
            .await?;
        if status == StatusCode::NOT_FOUND {
            return Ok(false);
        }
        expect_ok(status, &bytes)?;
        Ok(true)
    }

    /// `GET /v1/session/info/<id>?consistent`: whether the session exists.
    pub(crate) async fn session_exists(&self, id: &str) -> Result<bool, ApiError> {
        Ok(self.session_lock_delay(id).await?.is_some())
    }

    /// `GET /v1/session/info/<id>?consistent`: the session's lock-delay, `None` if it does not
    /// exist.
    pub(crate) async fn session_lock_delay(&self, id: &str) -> Result<Option<Duration>, ApiError> {
        #[derive(Deserialize)]
        struct Info {
            /// Nanoseconds.
            #[serde(rename = "LockDelay", default)]
            lock_delay: u64,
        }
        let mut url = self.url(["session", "info", id]);
        url.query_pairs_mut().append_key_only("consistent");
        let (status, _, bytes) = self.call(Method::GET, url, None).await?;
        expect_ok(status, &bytes)?;
        let sessions: Option<Vec<Info>> = parse_json(&bytes)?;
        Ok(sessions
            .and_then(|s| s.into_iter().next())
            .map(|info| Duration::from_nanos(info.lock_delay)))
    }

    /// `PUT /v1/session/destroy/<id>`. Destroying a session that is gone succeeds.
    pub(crate) async fn session_destroy(&self, id: &str) -> Result<(), ApiError> {
        let (status, _, bytes) = self
            .call(Method::PUT, self.url(["session", "destroy", id]), None)
            .await?;
        expect_ok(status, &bytes)
    }

    /// `GET /v1/kv/<key>?consistent`: the entry (none if the key does not exist) and the index.
    pub(crate) async fn kv_get(&self, key: &str) -> Result<(Option<KvEntry>, u64), ApiError> {
        let mut url = self.kv_url(key);
        url.query_pairs_mut().append_key_only("consistent");
        let (entries, index) = self.kv_read(url, None, Kind::Brief).await?;
        Ok((entries.into_iter().find(|e| e.key == key), index))
    }

    /// `GET /v1/kv/<prefix>?recurse&consistent`.
    pub(crate) async fn kv_list(&self, prefix: &str) -> Result<(Vec<KvEntry>, u64), ApiError> {
        let mut url = self.kv_url(prefix);
        url.query_pairs_mut()
            .append_key_only("recurse")
            .append_key_only("consistent");
        self.kv_read(url, None, Kind::Brief).await
    }

    /// `GET /v1/kv/<prefix>?recurse&index=`: a blocking query on everything under `prefix`
    /// (in Consul's default consistency mode: the leader answers without a verification round,
    /// which would cost more than the whole read on a large prefix; a watcher that must not act
    /// on a state older than its own write compares indexes).
    ///
    /// Admitted by the `slot` of the watch that reads, never queued behind brief requests.
    pub(crate) async fn kv_watch(
        &self,
        prefix: &str,
        blocking: Option<Blocking>,
        _slot: &WatchSlot<'_>,
    ) -> Result<(Vec<KvEntry>, u64), ApiError> {
        let mut url = self.kv_url(prefix);
        url.query_pairs_mut().append_key_only("recurse");
        self.kv_read(url, blocking, Kind::Watch).await
    }

    async fn kv_read(
        &self,
        mut url: Url,
        blocking: Option<Blocking>,
        kind: Kind,
    ) -> Result<(Vec<KvEntry>, u64), ApiError> {
        let mut timeout = REQUEST_TIMEOUT;
        if let Some(b) = blocking {
            url.query_pairs_mut()
                .append_pair("index", &b.index.to_string())
                .append_pair("wait", &format!("{}ms", b.wait.as_millis().max(1)));
            // Consul adds up to wait/16 of jitter before answering.
            timeout = b.wait + b.wait / 16 + REQUEST_TIMEOUT;
        }
        let (status, index, bytes) = self.exchange(Method::GET, url, None, timeout, kind).await?;
        if status != StatusCode::NOT_FOUND {
            expect_ok(status, &bytes)?;
        }
        let index = index.ok_or_else(|| ApiError::Malformed("no X-Consul-Index header".into()))?;
        if status == StatusCode::NOT_FOUND {
            return Ok((Vec::new(), index));
        }
        Ok((parse_json(&bytes)?, index))
    }

    /// `PUT /v1/kv/<key>?release=<session>&flags=<flags>` (the value is emptied, as `consul lock`
    /// does, so no stale leader stays advertised).
    pub(crate) async fn kv_release(
        &self,
        key: &str,
        session: &str,
        flags: u64,
    ) -> Result<bool, ApiError> {
        let mut url = self.kv_url(key);
        url.query_pairs_mut()
            .append_pair("release", session)
            .append_pair("flags", &flags.to_string());
        self.kv_write(url, Vec::new()).await
    }

    /// `DELETE /v1/kv/<key>`, with `?cas=<index>` if given.
    pub(crate) async fn kv_delete(&self, key: &str, cas: Option<u64>) -> Result<bool, ApiError> {
        let mut url = self.kv_url(key);
        if let Some(cas) = cas {
            url.query_pairs_mut().append_pair("cas", &cas.to_string());
        }
        let (status, _, bytes) = self.call(Method::DELETE, url, None).await?;
        expect_ok(status, &bytes)?;
        parse_bool(&bytes)
    }

    /// `PUT /v1/txn`: all of `ops` or none. `Ok(Ok(entries))` has one entry per op that returns
    /// one; `Ok(Err(failed))` names the ops Consul refused (a stale CAS index, a lock not taken).
    pub(crate) async fn txn(
        &self,
        ops: &[TxnOp<'_>],
    ) -> Result<Result<Vec<KvEntry>, Vec<usize>>, ApiError> {
        let body: Vec<serde_json::Value> = ops.iter().copied().map(TxnOp::to_json).collect();
        let body = serde_json::to_vec(&body).map_err(|e| ApiError::Malformed(e.to_string()))?;
        let (status, _, bytes) = self
            .call(Method::PUT, self.url(["txn"]), Some(body))
            .await?;
        #[derive(Deserialize)]
        #[serde(rename_all = "PascalCase")]
        struct Answer {
            #[serde(default)]
            results: Option<Vec<TxnResult>>,
            #[serde(default)]
            errors: Option<Vec<TxnFailure>>,
        }
        #[derive(Deserialize)]
        #[serde(rename_all = "PascalCase")]
        struct TxnResult {
            #[serde(rename = "KV")]
            kv: Option<KvEntry>,
        }
        #[derive(Deserialize)]
        #[serde(rename_all = "PascalCase")]
        struct TxnFailure {
            op_index: usize,
        }
        if status == StatusCode::CONFLICT {
            let answer: Answer = parse_json(&bytes)?;
            return Ok(Err(answer
                .errors
                .unwrap_or_default()
                .into_iter()
                .map(|e| e.op_index)
                .collect()));
        }
        expect_ok(status, &bytes)?;
        let answer: Answer = parse_json(&bytes)?;
        Ok(Ok(answer
            .results
            .unwrap_or_default()
            .into_iter()
            .filter_map(|r| r.kv)
            .collect()))
    }

    async fn kv_write(&self, url: Url, value: Vec<u8>) -> Result<bool, ApiError> {
        let (status, _, bytes) = self.call(Method::PUT, url, Some(value)).await?;
        expect_ok(status, &bytes)?;
        parse_bool(&bytes)
    }
}

/// The `X-Consul-Index` of an answer, if it carries a readable one.
fn consul_index(headers: &reqwest::header::HeaderMap) -> Option<u64> {
    headers
        .get("X-Consul-Index")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
}

fn expect_ok(status: StatusCode, body: &[u8]) -> Result<(), ApiError> {
    if status.is_success() {
        return Ok(());
    }
    Err(status_error(status, body))
}

fn status_error(status: StatusCode, body: &[u8]) -> ApiError {
    // Consul's error bodies are short plain text; keep at most a line of it.
    let text = String::from_utf8_lossy(body);
    ApiError::Status {
        status,
        grpc_code: None,
        message: text.trim().chars().take(300).collect(),
    }
}

fn parse_json<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(bytes).map_err(|e| ApiError::Malformed(e.to_string()))
}

fn parse_bool(bytes: &[u8]) -> Result<bool, ApiError> {
    match bytes.trim_ascii() {
        b"true" => Ok(true),
        b"false" => Ok(false),
        other => Err(ApiError::Malformed(format!(
            "expected true or false, got {:?}",
            String::from_utf8_lossy(&other[..other.len().min(100)])
        ))),
    }
}
