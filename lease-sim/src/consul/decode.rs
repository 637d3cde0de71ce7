//! The request bodies of the session and agent endpoints, decoded as Consul's agent decodes
//! them: its defaults, its field names in any case, its duration forms, its error texts.

use std::time::Duration;

use serde_json::Value;

use super::state::{CheckStatus, NewCheck, NewSession, SERF_HEALTH};
use super::txn::field;
use super::wire::parse_go_duration;

/// Consul's default session lock-delay.
const DEFAULT_LOCK_DELAY: i64 = 15_000_000_000;
/// `lockDelayMinThreshold`: a lock-delay below this many nanoseconds is taken as seconds.
const LOCK_DELAY_MIN_THRESHOLD: i64 = 1000;

/// `FixupLockDelay`: a duration string, or a number of nanoseconds; below a microsecond it is
/// taken as seconds.
fn lock_delay(value: &Value) -> Result<i64, String> {
    let nanos = match value {
        Value::String(text) => parse_go_duration(text)?,
        Value::Number(number) => number
            .as_i64()
            .or_else(|| number.as_f64().map(|f| f as i64))
            .unwrap_or(0),
        other => {
            return Err(format!(
                "cannot decode {other} as a duration (the model's wording)"
            ));
        }
    };
    Ok(if nanos < LOCK_DELAY_MIN_THRESHOLD {
        nanos.saturating_mul(1_000_000_000)
    } else {
        nanos
    })
}

fn strings(value: &Value) -> Result<Vec<String>, String> {
    let items = value.as_array().ok_or_else(|| {
        format!("expected a list of check IDs, got {value} (the model's wording)")
    })?;
    Ok(items
        .iter()
        .filter_map(|item| item.as_str().map(str::to_owned))
        .collect())
}

fn text(object: &Value, name: &str) -> Option<String> {
    field(object, name)
        .and_then(Value::as_str)
        .map(str::to_owned)
}

pub(crate) fn decode_session(body: &[u8]) -> Result<NewSession, String> {
    let mut new = NewSession {
        lock_delay: DEFAULT_LOCK_DELAY,
        node_checks: vec![SERF_HEALTH.to_owned()],
        ..NewSession::default()
    };
    if body.is_empty() {
        return Ok(new);
    }
    let raw: Value = serde_json::from_slice(body).map_err(|e| e.to_string())?;
    if !raw.is_object() {
        return Err(format!(
            "expected an object, got {raw} (the model's wording)"
        ));
    }
    new.name = text(&raw, "Name").unwrap_or_default();
    new.node = text(&raw, "Node").filter(|n| !n.is_empty());
    new.behavior = text(&raw, "Behavior").unwrap_or_default();
    new.ttl = text(&raw, "TTL").unwrap_or_default();
    if let Some(delay) = field(&raw, "LockDelay") {
        new.lock_delay = lock_delay(delay)?;
    }
    // Checks given (even none) replace the default serfHealth; Consul 1.8 shows the legacy
    // `Checks` as node checks.
    let has = |name: &str| {
        (raw.as_object().into_iter().flatten()).any(|(key, _)| key.eq_ignore_ascii_case(name))
    };
    if has("NodeChecks") {
        new.node_checks = field(&raw, "NodeChecks")
            .map(strings)
            .transpose()?
            .unwrap_or_default();
    } else if has("Checks") {
        new.node_checks = field(&raw, "Checks")
            .map(strings)
            .transpose()?
            .unwrap_or_default();
    }
    if let Some(checks) = field(&raw, "ServiceChecks") {
        let items = checks
            .as_array()
            .ok_or_else(|| format!("expected a list of service checks, got {checks}"))?;
        new.service_checks = Some(items.iter().filter_map(|c| text(c, "ID")).collect());
    }
    Ok(new)
}

pub(crate) fn decode_service(body: &[u8]) -> Result<(String, Option<NewCheck>), String> {
    let decode_failed = |e: String| format!("Request decode failed: {e}");
    if body.is_empty() {
        return Err(decode_failed("EOF".to_owned()));
    }
    let raw: Value = serde_json::from_slice(body).map_err(|e| decode_failed(e.to_string()))?;
    let name = text(&raw, "Name").unwrap_or_default();
    if name.is_empty() {
        return Err("Missing service name".to_owned());
    }
    let id = text(&raw, "ID").filter(|id| !id.is_empty()).unwrap_or(name);
    let definition = match (field(&raw, "Check"), field(&raw, "Checks")) {
        (Some(check), _) => Some(check.clone()),
        (None, Some(Value::Array(checks))) if checks.len() == 1 => checks.first().cloned(),
        (None, Some(Value::Array(checks))) if checks.is_empty() => None,
        (None, None) => None,
        _ => {
            return Err("the model keeps at most one check per service".to_owned());
        }
    };
    let Some(definition) = definition else {
        return Ok((id, None));
    };
    let duration = |name: &str| -> Result<Option<i64>, String> {
        match field(&definition, name) {
            None => Ok(None),
            Some(Value::String(text)) => parse_go_duration(text).map(Some).map_err(decode_failed),
            Some(Value::Number(n)) => Ok(n.as_i64()),
            Some(other) => Err(decode_failed(format!(
                "cannot decode {other} as a duration"
            ))),
        }
    };
    let ttl = duration("TTL")?;
    let reap_after = duration("DeregisterCriticalServiceAfter")?;
    let Some(ttl) = ttl else {
        return Err("the model supports TTL checks only (give the check a TTL)".to_owned());
    };
    let Some(ttl) = u64::try_from(ttl).ok().filter(|ns| *ns > 0) else {
        return Err("Invalid check: TTL must be > 0 for TTL checks".to_owned());
    };
    let status = match text(&definition, "Status").filter(|s| !s.is_empty()) {
        None => CheckStatus::Critical,
        Some(status) => CheckStatus::parse(&status)
            .ok_or_else(|| "Status for checks must 'passing', 'warning', 'critical'".to_owned())?,
    };
    let check_id = text(&definition, "CheckID")
        .or_else(|| text(&definition, "ID"))
        .filter(|c| !c.is_empty())
        .unwrap_or_else(|| format!("service:{id}"));
    Ok((
        id,
        Some(NewCheck {
            id: check_id,
            ttl: Duration::from_nanos(ttl),
            status,
            reap_after: reap_after
                .and_then(|ns| u64::try_from(ns).ok())
                .filter(|ns| *ns > 0)
                .map(Duration::from_nanos),
        }),
    ))
}
