//! Reading Consul's answers: the index header, the status, JSON and `true`/`false` bodies.

use reqwest::StatusCode;

use lease_http::ApiError;

/// The `X-Consul-Index` of an answer, if it carries a readable one.
pub(super) fn consul_index(headers: &reqwest::header::HeaderMap) -> Option<u64> {
    headers
        .get("X-Consul-Index")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
}

pub(super) fn expect_ok(status: StatusCode, body: &[u8]) -> Result<(), ApiError> {
    if status.is_success() {
        return Ok(());
    }
    Err(status_error(status, body))
}

pub(super) fn status_error(status: StatusCode, body: &[u8]) -> ApiError {
    // Consul's error bodies are short plain text; keep at most a line of it.
    let text = String::from_utf8_lossy(body);
    ApiError::Status {
        status,
        grpc_code: None,
        message: text.trim().chars().take(300).collect(),
    }
}

pub(super) fn parse_json<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(bytes).map_err(|e| ApiError::Malformed(e.to_string()))
}

pub(super) fn parse_bool(bytes: &[u8]) -> Result<bool, ApiError> {
    match bytes.trim_ascii() {
        b"true" => Ok(true),
        b"false" => Ok(false),
        other => Err(ApiError::Malformed(format!(
            "expected true or false, got {:?}",
            String::from_utf8_lossy(&other[..other.len().min(100)])
        ))),
    }
}
