//! One argument's value: the checked forms ([`WaitArg`], [`Millis`], [`CratePath`]) and the
//! parser of each argument, which checks literals at compile time.

use proc_macro2::Span;
use syn::spanned::Spanned;
use syn::{Expr, ExprLit, Lit, LitInt, LitStr, Path};

/// How long to wait for a lease held elsewhere.
pub(crate) enum WaitArg {
    Forever,
    Never,
    UpTo(Millis),
}

/// A duration checked at compile time, with the span of the literal it came from.
pub(crate) struct Millis {
    pub(crate) millis: u64,
    pub(crate) span: Span,
}

/// `crate = "…"`: the path the generated code names lease-core by, with the literal it was read
/// from (for errors about it).
pub(crate) struct CratePath {
    pub(crate) path: Path,
    pub(crate) lit: LitStr,
}

fn lit(value: &Expr) -> Option<&Lit> {
    match value {
        Expr::Lit(ExprLit { lit, .. }) => Some(lit),
        // `key = ("a")` and macro-expanded literals arrive wrapped in a group.
        Expr::Group(group) => lit(&group.expr),
        Expr::Paren(paren) => lit(&paren.expr),
        _ => None,
    }
}

/// A key or name: a string, or any expression of type `&str` or `String`. A string literal is
/// checked against lease-core's key rule at compile time by the expansion (see `expand::spec`),
/// anything else by `LeaseSpec::validate` at run time.
pub(super) fn parse_key(name: &str, value: Expr) -> syn::Result<Expr> {
    match lit(&value) {
        Some(Lit::Str(_)) | None => Ok(value),
        Some(_) => Err(syn::Error::new(
            value.span(),
            format!(
                "`{name}` must be a string: a literal (`{name} = \"jobs/compact\"`), a constant \
                 (`{name} = KEYS::COMPACT`) or an expression (`{name} = format!(\"tenant/{{id}}\")`)"
            ),
        )),
    }
}

/// A limit: an integer literal, checked here, or any other expression of type `u32` (a
/// constant), checked at run time.
pub(super) fn parse_limit(value: Expr) -> syn::Result<Expr> {
    let int = match lit(&value) {
        Some(Lit::Int(int)) => int.clone(),
        None if matches!(&value, Expr::Unary(unary) if matches!(unary.op, syn::UnOp::Neg(_))) => {
            return Err(syn::Error::new(
                value.span(),
                "`limit` must be an integer from 1 to 4294967295",
            ));
        }
        None => return Ok(value),
        Some(_) => {
            return Err(syn::Error::new(
                value.span(),
                "`limit` must be an integer from 1 to 4294967295: a literal (`limit = 3`) or a \
                 `u32` constant (`limit = LIMITS::REPORTS`)",
            ));
        }
    };
    match int.base10_parse::<u32>() {
        Ok(0) => Err(syn::Error::new(
            int.span(),
            "`limit` must be at least 1: a semaphore with no slots would never run the function",
        )),
        // Re-emitted unsuffixed: `3u64` was accepted as a number, not as a type.
        Ok(_) => Ok(Expr::Lit(ExprLit {
            attrs: Vec::new(),
            lit: Lit::Int(LitInt::new(int.base10_digits(), int.span())),
        })),
        Err(_) => Err(syn::Error::new(
            int.span(),
            "`limit` must be an integer from 1 to 4294967295",
        )),
    }
}

/// `crate = "…"`: a path without generic arguments (`my_facade::lease`, `::lease_core`,
/// `crate::lease`), in a string as tokio's and serde's `crate` arguments take it. Whether it
/// leads to lease-core is the compiler's to say, at the literal.
pub(super) fn parse_crate(value: &Expr) -> syn::Result<CratePath> {
    let expected = |span| {
        syn::Error::new(
            span,
            "`crate` must be the path to lease-core, or to a module that re-exports it, in a \
             string: e.g. `crate = \"my_facade::lease\"`",
        )
    };
    match lit(value) {
        Some(Lit::Str(lit)) => match lit.parse_with(Path::parse_mod_style) {
            Ok(path) => Ok(CratePath {
                path,
                lit: lit.clone(),
            }),
            Err(_) => Err(expected(lit.span())),
        },
        _ => Err(expected(value.span())),
    }
}

fn duration_literal(name: &str, value: &Expr) -> syn::Result<LitStr> {
    match lit(value) {
        Some(Lit::Str(s)) => Ok(s.clone()),
        _ => Err(syn::Error::new(
            value.span(),
            format!(
                "`{name}` must be a string literal such as \"30s\", \"500ms\", \"2m\" or \"1h\""
            ),
        )),
    }
}

pub(super) fn parse_wait(value: &Expr) -> syn::Result<WaitArg> {
    let text = duration_literal("wait", value)?;
    match text.value().as_str() {
        "forever" => Ok(WaitArg::Forever),
        "never" => Ok(WaitArg::Never),
        _ => parse_duration(&text, "; or \"forever\" / \"never\"").map(WaitArg::UpTo),
    }
}

// These ranges mirror lease_core's MIN_TTL, MAX_TTL and MAX_LOCK_DELAY (Consul's limits), so a
// mistake is caught where it is written; `LeaseSpec::validate` checks them again at run time.
const MIN_TTL_SECS: u64 = 10;
const MAX_TTL_SECS: u64 = 86_400;
const MAX_LOCK_DELAY_SECS: u64 = 60;

pub(super) fn parse_ttl(value: &Expr) -> syn::Result<Millis> {
    let text = duration_literal("ttl", value)?;
    let ttl = parse_duration(&text, "")?;
    if ttl.millis % 1000 != 0 {
        return Err(syn::Error::new(
            ttl.span,
            "`ttl` must be a whole number of seconds (Consul's session TTLs are)",
        ));
    }
    if !(MIN_TTL_SECS * 1000..=MAX_TTL_SECS * 1000).contains(&ttl.millis) {
        return Err(syn::Error::new(
            ttl.span,
            "`ttl` must be from \"10s\" to \"24h\" (Consul's session TTL range)",
        ));
    }
    Ok(ttl)
}

pub(super) fn parse_lock_delay(value: &Expr) -> syn::Result<Millis> {
    let text = duration_literal("lock_delay", value)?;
    let delay = parse_duration(&text, "")?;
    if delay.millis > MAX_LOCK_DELAY_SECS * 1000 {
        return Err(syn::Error::new(
            delay.span,
            "`lock_delay` must be at most \"60s\" (Consul clamps longer ones silently)",
        ));
    }
    Ok(delay)
}

/// `min_hold` or `max_run`: any duration; `LeaseSpec::validate` checks the pair at run time.
pub(super) fn parse_schedule(name: &str, value: &Expr) -> syn::Result<Millis> {
    let text = duration_literal(name, value)?;
    parse_duration(&text, "")
}

/// Reads `"<number><unit>"` repeated (`"1m30s"`), units `ms`, `s`, `m`, `h`.
fn parse_duration(text: &LitStr, also: &str) -> syn::Result<Millis> {
    let malformed = || {
        syn::Error::new(
            text.span(),
            format!(
                "malformed duration {:?}: write a number and a unit (ms, s, m, h), \
                 e.g. \"500ms\", \"30s\", \"2m\", \"1h30m\"{also}",
                text.value()
            ),
        )
    };
    let too_long = || {
        syn::Error::new(
            text.span(),
            "duration too long: it must fit in 2^64 milliseconds",
        )
    };
    let value = text.value();
    let mut rest = value.as_str();
    if rest.is_empty() {
        return Err(malformed());
    }
    let mut total: u64 = 0;
    while !rest.is_empty() {
        let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        if digits == 0 {
            return Err(malformed());
        }
        let number: u64 = rest[..digits].parse().map_err(|_| too_long())?;
        rest = &rest[digits..];
        let unit_len = rest.len()
            - rest
                .trim_start_matches(|c: char| c.is_ascii_alphabetic())
                .len();
        let per_unit: u64 = match &rest[..unit_len] {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            _ => return Err(malformed()),
        };
        rest = &rest[unit_len..];
        total = number
            .checked_mul(per_unit)
            .and_then(|millis| total.checked_add(millis))
            .ok_or_else(too_long)?;
    }
    Ok(Millis {
        millis: total,
        span: text.span(),
    })
}
