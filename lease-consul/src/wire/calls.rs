//! The Consul HTTP API calls this crate makes, one method each.

use std::time::Duration;

use reqwest::{Method, StatusCode, Url};
use serde::Deserialize;

use super::answer::{expect_ok, parse_bool, parse_json};
use super::budget::{Kind, WatchSlot};
use super::http::{ConsulHttp, REQUEST_TIMEOUT};
use super::types::{Behavior, Blocking, KvEntry, TxnOp};
use lease_http::ApiError;

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

impl ConsulHttp {
    /// `GET /v1/status/leader`: any answer, a 500 "No cluster leader" too, is the agent
    /// answering (the reachability probe's request).
    pub(crate) async fn status_leader(&self) -> Result<(), ApiError> {
        self.call(Method::GET, self.url(["status", "leader"]), None)
            .await
            .map(drop)
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

    pub(super) async fn kv_read(
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

    pub(super) async fn kv_write(&self, url: Url, value: Vec<u8>) -> Result<bool, ApiError> {
        let (status, _, bytes) = self.call(Method::PUT, url, Some(value)).await?;
        expect_ok(status, &bytes)?;
        parse_bool(&bytes)
    }
}
