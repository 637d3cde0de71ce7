//! The HTTP API: each endpoint lease-consul calls (and the few an operator uses beside them),
//! decoding requests and writing answers as Consul 1.8's `agent/*_endpoint.go` do: the same
//! status codes, the same error texts (which the client reads), the same `X-Consul-*` headers.
//! JSON is written compactly (a dev agent indents it; the content is the same).

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Method, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, Limited};
use serde::Serialize;

use super::decode::{decode_service, decode_session};
use super::json::{EntryJson, SessionJson};
use super::state::{Entry, KvWrite, State};
use super::txn::{self, MAX_VALUE_SIZE};
use super::wire::{decode_path, encode_query, go_quote, parse_go_duration, parse_query};
use super::{Blocking, Model};

/// The most of a request body the model reads (above any limit of Consul's it checks).
const MAX_BODY: usize = 4 * 1024 * 1024;

/// An answer under construction.
#[derive(Debug)]
struct Reply {
    status: StatusCode,
    body: Bytes,
    content_type: Option<&'static str>,
    /// `X-Consul-Index`.
    index: Option<u64>,
    /// `X-Consul-KnownLeader` (and `X-Consul-LastContact: 0`).
    known_leader: Option<bool>,
}

impl Reply {
    fn new(status: StatusCode) -> Reply {
        Reply {
            status,
            body: Bytes::new(),
            content_type: None,
            index: None,
            known_leader: None,
        }
    }

    fn json(status: StatusCode, value: &impl Serialize) -> Reply {
        match serde_json::to_vec(value) {
            Ok(body) => Reply {
                body: Bytes::from(body),
                content_type: Some("application/json"),
                ..Reply::new(status)
            },
            Err(e) => Reply::text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        }
    }

    fn ok_json(value: &impl Serialize) -> Reply {
        Reply::json(StatusCode::OK, value)
    }

    fn text(status: StatusCode, text: impl Into<String>) -> Reply {
        Reply {
            body: Bytes::from(text.into()),
            content_type: Some("text/plain; charset=utf-8"),
            ..Reply::new(status)
        }
    }

    fn server_error(text: impl Into<String>) -> Reply {
        Reply::text(StatusCode::INTERNAL_SERVER_ERROR, text)
    }

    fn bad_request(text: impl Into<String>) -> Reply {
        Reply::text(StatusCode::BAD_REQUEST, text)
    }

    /// With the query metadata of an answered read.
    fn meta(mut self, index: u64) -> Reply {
        self.index = Some(index);
        self.known_leader = Some(true);
        self
    }

    fn into_response(self) -> Response<Full<Bytes>> {
        let mut response = Response::new(Full::new(self.body));
        *response.status_mut() = self.status;
        let headers = response.headers_mut();
        headers.insert(header::VARY, HeaderValue::from_static("Accept-Encoding"));
        if let Some(content_type) = self.content_type {
            headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
        }
        if let Some(index) = self.index {
            headers.insert("X-Consul-Index", HeaderValue::from(index));
        }
        if let Some(known) = self.known_leader {
            let known = if known { "true" } else { "false" };
            headers.insert("X-Consul-Knownleader", HeaderValue::from_static(known));
            headers.insert("X-Consul-Lastcontact", HeaderValue::from_static("0"));
        }
        response
    }
}

/// A decoded request.
struct Call {
    method: Method,
    path: String,
    query: Vec<(String, String)>,
    body: Bytes,
}

impl Call {
    fn has(&self, name: &str) -> bool {
        self.query.iter().any(|(n, _)| n == name)
    }

    fn param(&self, name: &str) -> Option<&str> {
        (self.query.iter())
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Answers one request.
pub(crate) async fn answer<B>(model: &Model, request: http::Request<B>) -> Response<Full<Bytes>>
where
    B: hyper::body::Body,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let (parts, body) = request.into_parts();
    let body = match Limited::new(body, MAX_BODY).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => {
            return Reply::text(StatusCode::PAYLOAD_TOO_LARGE, "Request body too large")
                .into_response();
        }
    };
    let Some(path) = decode_path(parts.uri.path()) else {
        return Reply::bad_request("400 Bad Request").into_response();
    };
    let call = Call {
        method: parts.method,
        path,
        query: parse_query(parts.uri.query().unwrap_or_default()),
        body,
    };
    route(model, &call).await.into_response()
}

async fn route(model: &Model, call: &Call) -> Reply {
    let path = call.path.as_str();
    let method = &call.method;
    let allow = |allowed: &[Method]| -> Result<(), Reply> {
        if allowed.contains(method) {
            Ok(())
        } else {
            Err(Reply::text(
                StatusCode::METHOD_NOT_ALLOWED,
                format!("method {method} not allowed"),
            ))
        }
    };
    let outcome = if path == "/v1/status/leader" {
        allow(&[Method::GET]).map(|()| status_leader(model))
    } else if let Some(key) = path.strip_prefix("/v1/kv/") {
        let allowed = allow(&[Method::GET, Method::PUT, Method::DELETE]);
        match allowed {
            Ok(()) => kv(model, call, key).await,
            Err(reply) => Err(reply),
        }
    } else if path == "/v1/txn" {
        allow(&[Method::PUT, Method::POST]).and_then(|()| txn(model, call))
    } else if path == "/v1/session/create" {
        allow(&[Method::PUT]).and_then(|()| session_create(model, call))
    } else if let Some(id) = path.strip_prefix("/v1/session/renew/") {
        allow(&[Method::PUT]).and_then(|()| session_renew(model, call, id))
    } else if let Some(id) = path.strip_prefix("/v1/session/destroy/") {
        allow(&[Method::PUT]).and_then(|()| session_destroy(model, call, id))
    } else if let Some(id) = path.strip_prefix("/v1/session/info/") {
        match allow(&[Method::GET]) {
            Ok(()) => session_info(model, call, id).await,
            Err(reply) => Err(reply),
        }
    } else if path == "/v1/session/list" {
        match allow(&[Method::GET]) {
            Ok(()) => session_list(model, call).await,
            Err(reply) => Err(reply),
        }
    } else if path == "/v1/agent/service/register" {
        allow(&[Method::PUT]).and_then(|()| service_register(model, call))
    } else if let Some(id) = path.strip_prefix("/v1/agent/service/deregister/") {
        allow(&[Method::PUT]).and_then(|()| service_deregister(model, call, id))
    } else if let Some(id) = path.strip_prefix("/v1/agent/check/pass/") {
        allow(&[Method::PUT]).and_then(|()| check_pass(model, call, id))
    } else {
        Err(Reply::text(StatusCode::NOT_FOUND, "404 page not found\n"))
    };
    outcome.unwrap_or_else(|reply| reply)
}

// ---- What every server endpoint checks first ----

/// `?ns=`: Consul's open-source edition refuses it.
fn no_namespace(call: &Call) -> Result<(), Reply> {
    if call.param("ns").is_some_and(|ns| !ns.is_empty()) {
        return Err(Reply::bad_request(
            "Bad request: Invalid query parameter: \"ns\" - Namespaces are a Consul Enterprise \
             feature",
        ));
    }
    Ok(())
}

/// `?dc=` naming another datacenter: nothing routes there.
fn our_datacenter(model: &Model, call: &Call) -> Result<(), Reply> {
    match call.param("dc") {
        Some(dc) if !dc.is_empty() && dc != model.config().datacenter => {
            Err(Reply::server_error("No path to datacenter"))
        }
        _ => Ok(()),
    }
}

/// `HTTPServer.parse`: the consistency mode and the blocking parameters.
fn query_options(call: &Call) -> Result<Option<Blocking>, Reply> {
    if call.has("stale") && call.has("consistent") {
        return Err(Reply::bad_request(
            "Cannot specify ?stale with ?consistent, conflicting semantics.",
        ));
    }
    let wait = match call.param("wait") {
        None => None,
        Some(wait) => match parse_go_duration(wait) {
            Ok(nanos) => Some(Duration::from_nanos(u64::try_from(nanos).unwrap_or(0))),
            Err(_) => return Err(Reply::bad_request("Invalid wait time")),
        },
    };
    let index = match call.param("index") {
        None => 0,
        Some(index) => match index.parse::<u64>() {
            Ok(index) => index,
            Err(_) => return Err(Reply::bad_request("Invalid index")),
        },
    };
    Ok(Some(Blocking { index, wait }).filter(|b| b.index > 0))
}

/// Go's `strconv.ParseUint(text, 10, 64)`, with its error message.
fn parse_uint(text: &str) -> Result<u64, Reply> {
    text.parse::<u64>().map_err(|_| {
        let all_digits = !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit());
        let why = if all_digits {
            "value out of range"
        } else {
            "invalid syntax"
        };
        Reply::server_error(format!(
            "strconv.ParseUint: parsing {}: {why}",
            go_quote(text)
        ))
    })
}

fn status_leader(model: &Model) -> Reply {
    let leader = model.read(State::has_leader);
    let address = if leader {
        model.config().leader_address.as_str()
    } else {
        ""
    };
    Reply::ok_json(&address)
}

// ---- KV ----

async fn kv(model: &Model, call: &Call, key: &str) -> Result<Reply, Reply> {
    let blocking = query_options(call)?;
    no_namespace(call)?;
    match call.method {
        Method::GET => kv_read(model, call, key, blocking).await,
        Method::PUT => kv_put(model, call, key),
        _ => kv_delete(model, call, key),
    }
}

async fn kv_read(
    model: &Model,
    call: &Call,
    key: &str,
    blocking: Option<Blocking>,
) -> Result<Reply, Reply> {
    if call.has("keys") {
        our_datacenter(model, call)?;
        let separator = call
            .param("separator")
            .or_else(|| call.param("seperator"))
            .unwrap_or_default()
            .to_owned();
        let (index, keys) = model
            .query(blocking, |state| state.kv_keys(key, &separator))
            .await
            .map_err(Reply::server_error)?;
        if keys.is_empty() && !key.is_empty() {
            return Ok(Reply::new(StatusCode::NOT_FOUND).meta(index));
        }
        return Ok(Reply::ok_json(&keys).meta(index));
    }
    let recurse = call.has("recurse");
    if !recurse && key.is_empty() {
        return Err(Reply::bad_request("Missing key name"));
    }
    our_datacenter(model, call)?;
    let (index, entries) = if recurse {
        model
            .query(blocking, |state| state.kv_list(key))
            .await
            .map_err(Reply::server_error)?
    } else {
        model
            .query(blocking, |state| {
                state
                    .kv_get(key)
                    .map(|(index, entry)| (index, entry.into_iter().collect::<Vec<Entry>>()))
            })
            .await
            .map_err(Reply::server_error)?
    };
    if entries.is_empty() {
        return Ok(Reply::new(StatusCode::NOT_FOUND).meta(index));
    }
    if call.has("raw") && !recurse {
        let value = entries.first().map(|e| e.value.clone()).unwrap_or_default();
        return Ok(Reply {
            body: Bytes::from(value),
            content_type: Some("text/plain"),
            ..Reply::new(StatusCode::OK)
        }
        .meta(index));
    }
    let json: Vec<EntryJson<'_>> = entries.iter().map(EntryJson::new).collect();
    Ok(Reply::ok_json(&json).meta(index))
}

/// Refuses more than one of `flags` in the query, as Consul's `conflictingFlags` does.
fn conflicting(call: &Call, flags: &[&str]) -> Result<(), Reply> {
    if flags.iter().filter(|flag| call.has(flag)).count() > 1 {
        return Err(Reply::bad_request(format!(
            "Conflicting flags: {}\n",
            encode_query(&call.query)
        )));
    }
    Ok(())
}

fn kv_put(model: &Model, call: &Call, key: &str) -> Result<Reply, Reply> {
    if key.is_empty() {
        return Err(Reply::bad_request("Missing key name"));
    }
    conflicting(call, &["cas", "acquire", "release"])?;
    let flags = call
        .param("flags")
        .map(parse_uint)
        .transpose()?
        .unwrap_or(0);
    let cas = call.param("cas").map(parse_uint).transpose()?;
    if call.body.len() > MAX_VALUE_SIZE {
        return Err(Reply::text(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "Request body({} bytes) too large, max size: {MAX_VALUE_SIZE} bytes. See \
                 https://www.consul.io/docs/agent/options.html#kv_max_value_size.",
                call.body.len()
            ),
        ));
    }
    let entry = Entry::new(key, flags, call.body.to_vec());
    let with_session = |session: &str| Entry {
        session: session.to_owned(),
        ..entry.clone()
    };
    let write = if let Some(session) = call.param("acquire") {
        KvWrite::Lock {
            entry: with_session(session),
        }
    } else if let Some(session) = call.param("release") {
        KvWrite::Unlock {
            entry: with_session(session),
        }
    } else if let Some(index) = cas {
        KvWrite::Cas {
            entry: entry.clone(),
            index,
        }
    } else {
        KvWrite::Set {
            entry: entry.clone(),
        }
    };
    let plain = matches!(write, KvWrite::Set { .. });
    our_datacenter(model, call)?;
    let done = model
        .write(|state, now| state.kv_apply(now, write))
        .map_err(Reply::server_error)?;
    Ok(Reply::ok_json(&(plain || done)))
}

fn kv_delete(model: &Model, call: &Call, key: &str) -> Result<Reply, Reply> {
    conflicting(call, &["recurse", "cas"])?;
    let write = if call.has("recurse") {
        KvWrite::DeleteTree {
            prefix: key.to_owned(),
        }
    } else if key.is_empty() {
        return Err(Reply::bad_request("Missing key name"));
    } else if let Some(cas) = call.param("cas") {
        KvWrite::DeleteCas {
            key: key.to_owned(),
            index: parse_uint(cas)?,
        }
    } else {
        KvWrite::Delete {
            key: key.to_owned(),
        }
    };
    let cas = matches!(write, KvWrite::DeleteCas { .. });
    our_datacenter(model, call)?;
    let done = model
        .write(|state, now| state.kv_apply(now, write))
        .map_err(Reply::server_error)?;
    Ok(Reply::ok_json(&(!cas || done)))
}

// ---- Transactions ----

fn txn(model: &Model, call: &Call) -> Result<Reply, Reply> {
    our_datacenter(model, call)?;
    let answer = model
        .write(|state, now| txn::run(state, now, &call.body))
        .map_err(|refused| {
            let status =
                StatusCode::from_u16(refused.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            Reply::text(status, refused.message)
        })?;
    let status = StatusCode::from_u16(answer.status).unwrap_or(StatusCode::OK);
    let mut reply = Reply {
        body: Bytes::from(answer.body),
        content_type: Some("application/json"),
        ..Reply::new(status)
    };
    if answer.read_only {
        reply.known_leader = Some(true);
    }
    Ok(reply)
}

// ---- Sessions ----

fn session_create(model: &Model, call: &Call) -> Result<Reply, Reply> {
    no_namespace(call)?;
    let new = decode_session(&call.body)
        .map_err(|e| Reply::bad_request(format!("Request decode failed: {e}")))?;
    our_datacenter(model, call)?;
    let id = model
        .write(|state, now| state.session_create(now, new))
        .map_err(Reply::server_error)?;
    #[derive(Serialize)]
    struct Created {
        #[serde(rename = "ID")]
        id: String,
    }
    Ok(Reply::ok_json(&Created { id }))
}

fn missing_session(id: &str) -> Result<(), Reply> {
    if id.is_empty() {
        return Err(Reply::bad_request("Missing session"));
    }
    Ok(())
}

fn session_renew(model: &Model, call: &Call, id: &str) -> Result<Reply, Reply> {
    query_options(call)?;
    no_namespace(call)?;
    missing_session(id)?;
    our_datacenter(model, call)?;
    let renewed = model
        .write(|state, now| state.session_renew(now, id))
        .map_err(Reply::server_error)?;
    match renewed {
        Some(session) => Ok(Reply::ok_json(&[SessionJson::new(&session)])),
        None => Err(Reply::text(
            StatusCode::NOT_FOUND,
            format!("Session id '{id}' not found"),
        )),
    }
}

fn session_destroy(model: &Model, call: &Call, id: &str) -> Result<Reply, Reply> {
    no_namespace(call)?;
    missing_session(id)?;
    our_datacenter(model, call)?;
    model
        .write(|state, now| state.session_destroy(now, id))
        .map_err(Reply::server_error)?;
    Ok(Reply::ok_json(&true))
}

/// An error of a session read: answered with the (empty) query metadata Consul's deferred
/// `setMeta` writes.
fn failed_read(error: String) -> Reply {
    let mut reply = Reply::server_error(error);
    reply.index = Some(1);
    reply.known_leader = Some(false);
    reply
}

async fn session_info(model: &Model, call: &Call, id: &str) -> Result<Reply, Reply> {
    let blocking = query_options(call)?;
    no_namespace(call)?;
    missing_session(id)?;
    our_datacenter(model, call)?;
    let (index, session) = model
        .query(blocking, |state| state.session_info(id))
        .await
        .map_err(failed_read)?;
    let json: Vec<SessionJson<'_>> = session.iter().map(SessionJson::new).collect();
    Ok(Reply::ok_json(&json).meta(index))
}

async fn session_list(model: &Model, call: &Call) -> Result<Reply, Reply> {
    let blocking = query_options(call)?;
    no_namespace(call)?;
    our_datacenter(model, call)?;
    let (index, sessions) = model
        .query(blocking, State::session_list)
        .await
        .map_err(failed_read)?;
    let json: Vec<SessionJson<'_>> = sessions.iter().map(SessionJson::new).collect();
    Ok(Reply::ok_json(&json).meta(index))
}

// ---- The agent's services and checks ----

fn service_register(model: &Model, call: &Call) -> Result<Reply, Reply> {
    no_namespace(call)?;
    let (id, check) = decode_service(&call.body).map_err(Reply::bad_request)?;
    model.write(|state, now| state.register_service(now, &id, check));
    Ok(Reply::new(StatusCode::OK))
}

fn service_deregister(model: &Model, call: &Call, id: &str) -> Result<Reply, Reply> {
    no_namespace(call)?;
    model.write(|state, now| state.deregister_service(now, id));
    Ok(Reply::new(StatusCode::OK))
}

fn check_pass(model: &Model, call: &Call, id: &str) -> Result<Reply, Reply> {
    no_namespace(call)?;
    model
        .write(|state, now| state.check_pass(now, id))
        .map_err(Reply::server_error)?;
    Ok(Reply::new(StatusCode::OK))
}
