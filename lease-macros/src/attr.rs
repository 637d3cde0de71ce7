//! Parsing only: the attribute's arguments and the function it is put on.
//!
//! Arguments are read in two steps. [`RawArgs`] is the syntax (`"positional"`, `key = value`,
//! comma-separated); [`LeaseArgs::from_raw`] gives each argument its meaning, checks it, and
//! collects every error at once, each spanned at the user's token. Durations, literal keys and
//! literal limits are checked here, at compile time; a key, name or limit given as a constant or
//! an expression is checked at run time by `LeaseSpec::validate`, which stays the authority for
//! everything (the generated code calls it before acquiring).

use proc_macro2::Span;
use syn::ext::IdentExt;
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{
    Attribute, Block, Expr, ExprLit, Ident, Lit, LitInt, LitStr, Signature, Token, Visibility,
};

/// Which attribute is being expanded.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Leader,
    Semaphore,
}

impl Kind {
    pub(crate) fn attribute(self) -> &'static str {
        match self {
            Kind::Leader => "#[leader_only]",
            Kind::Semaphore => "#[semaphore]",
        }
    }

    /// The named arguments this attribute accepts, in the order the docs list them.
    fn accepted(self) -> &'static [&'static str] {
        match self {
            Kind::Leader => &[
                "key",
                "wait",
                "ttl",
                "lock_delay",
                "min_hold",
                "max_run",
                "backend",
            ],
            Kind::Semaphore => &[
                "name",
                "limit",
                "wait",
                "ttl",
                "lock_delay",
                "min_hold",
                "max_run",
                "backend",
            ],
        }
    }

    /// A complete example, for errors about a missing or malformed argument.
    pub(crate) fn example(self) -> &'static str {
        match self {
            Kind::Leader => "#[leader_only(key = \"jobs/compact\")]",
            Kind::Semaphore => "#[semaphore(name = \"reports\", limit = 3)]",
        }
    }

    /// The arguments that may be given without a name, in order.
    fn positional(self) -> &'static [&'static str] {
        match self {
            Kind::Leader => &["key"],
            Kind::Semaphore => &["name", "limit"],
        }
    }
}

/// One argument as written.
enum RawArg {
    Positional(Expr),
    Named { name: Ident, value: Expr },
}

impl Parse for RawArg {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        if input.peek(Ident::peek_any) && input.peek2(Token![=]) && !input.peek2(Token![==]) {
            let name = input.call(Ident::parse_any)?;
            input.parse::<Token![=]>()?;
            let value = input.parse()?;
            Ok(RawArg::Named { name, value })
        } else {
            Ok(RawArg::Positional(input.parse()?))
        }
    }
}

/// The comma-separated arguments as written.
pub(crate) struct RawArgs(Punctuated<RawArg, Token![,]>);

impl Parse for RawArgs {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        Punctuated::parse_terminated(input).map(RawArgs)
    }
}

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

/// What the attribute guards with: literals already checked, or expressions (a constant,
/// `format!(…)`) evaluated and checked at run time.
pub(crate) enum TargetArg {
    Leader { key: Expr },
    Semaphore { name: Expr, limit: Expr },
}

/// The checked arguments.
pub(crate) struct LeaseArgs {
    pub(crate) target: TargetArg,
    pub(crate) wait: Option<WaitArg>,
    pub(crate) ttl: Option<Millis>,
    pub(crate) lock_delay: Option<Millis>,
    pub(crate) min_hold: Option<Millis>,
    pub(crate) max_run: Option<Millis>,
    pub(crate) backend: Option<Expr>,
}

/// Every error found, so the user fixes them in one round.
#[derive(Default)]
pub(crate) struct Errors(Option<syn::Error>);

impl Errors {
    pub(crate) fn push(&mut self, error: syn::Error) {
        match &mut self.0 {
            Some(all) => all.combine(error),
            None => self.0 = Some(error),
        }
    }

    pub(crate) fn into_result(self) -> syn::Result<()> {
        self.0.map_or(Ok(()), Err)
    }
}

/// An argument that may be given once, remembering where it was given.
struct Once<T> {
    name: &'static str,
    given: bool,
    value: Option<T>,
}

impl<T> Once<T> {
    fn new(name: &'static str) -> Self {
        Once {
            name,
            given: false,
            value: None,
        }
    }

    /// Stores the value, or reports the repetition at `at`, the second occurrence.
    fn set(&mut self, at: Span, value: syn::Result<T>, errors: &mut Errors) {
        if std::mem::replace(&mut self.given, true) {
            errors.push(syn::Error::new(
                at,
                format!("`{}` specified more than once", self.name),
            ));
            return;
        }
        match value {
            Ok(value) => self.value = Some(value),
            Err(error) => errors.push(error),
        }
    }

    /// Reports a required argument that was not given at all (one given but rejected has its
    /// own error already).
    fn missing(&self, example: &str, errors: &mut Errors) {
        if !self.given {
            errors.push(syn::Error::new(
                Span::call_site(),
                format!("missing `{}`: write {example}", self.name),
            ));
        }
    }
}

impl LeaseArgs {
    /// Gives each raw argument its meaning for `kind`.
    pub(crate) fn from_raw(kind: Kind, raw: RawArgs) -> syn::Result<LeaseArgs> {
        let mut errors = Errors::default();
        let mut key = Once::new(if kind == Kind::Leader { "key" } else { "name" });
        let mut limit = Once::new("limit");
        let mut wait = Once::new("wait");
        let mut ttl = Once::new("ttl");
        let mut lock_delay = Once::new("lock_delay");
        let mut min_hold = Once::new("min_hold");
        let mut max_run = Once::new("max_run");
        let mut backend = Once::new("backend");

        let mut positional_seen = 0;
        let mut named_seen = false;
        for arg in raw.0 {
            let (name, at, value) = match arg {
                RawArg::Named { name, value } => {
                    named_seen = true;
                    (name.to_string(), name.span(), value)
                }
                RawArg::Positional(value) => {
                    let at = value.span();
                    if named_seen {
                        // Still read below, so the user is not also told the key is missing.
                        errors.push(syn::Error::new(
                            at,
                            "positional arguments must come before named ones",
                        ));
                    }
                    let Some(name) = kind.positional().get(positional_seen) else {
                        errors.push(syn::Error::new(at, unexpected_positional(kind)));
                        continue;
                    };
                    positional_seen += 1;
                    (name.to_string(), at, value)
                }
            };
            match name.as_str() {
                "key" if kind == Kind::Leader => key.set(at, parse_key("key", value), &mut errors),
                "name" if kind == Kind::Semaphore => {
                    key.set(at, parse_key("name", value), &mut errors)
                }
                "limit" if kind == Kind::Semaphore => {
                    limit.set(at, parse_limit(value), &mut errors)
                }
                "wait" => wait.set(at, parse_wait(&value), &mut errors),
                "ttl" => ttl.set(at, parse_ttl(&value), &mut errors),
                "lock_delay" => lock_delay.set(at, parse_lock_delay(&value), &mut errors),
                "min_hold" => min_hold.set(at, parse_schedule("min_hold", &value), &mut errors),
                "max_run" => max_run.set(at, parse_schedule("max_run", &value), &mut errors),
                "backend" => backend.set(at, Ok(value), &mut errors),
                _ => errors.push(syn::Error::new(at, unknown_argument(kind, &name))),
            }
        }

        let call_site = Span::call_site();
        if kind == Kind::Semaphore && !key.given && !limit.given {
            errors.push(syn::Error::new(
                call_site,
                format!("missing `name` and `limit`: write {}", kind.example()),
            ));
        } else {
            key.missing(kind.example(), &mut errors);
            if kind == Kind::Semaphore {
                limit.missing(kind.example(), &mut errors);
            }
        }
        errors.into_result()?;
        let target = match (kind, key.value, limit.value) {
            (Kind::Leader, Some(key), _) => TargetArg::Leader { key },
            (Kind::Semaphore, Some(name), Some(limit)) => TargetArg::Semaphore { name, limit },
            // Unreachable in practice: a missing or rejected argument has pushed an error above.
            _ => {
                return Err(syn::Error::new(
                    call_site,
                    format!("{}: the lease target could not be read", kind.attribute()),
                ));
            }
        };
        Ok(LeaseArgs {
            target,
            wait: wait.value,
            ttl: ttl.value,
            lock_delay: lock_delay.value,
            min_hold: min_hold.value,
            max_run: max_run.value,
            backend: backend.value,
        })
    }
}

fn unknown_argument(kind: Kind, name: &str) -> String {
    let accepted: Vec<String> = kind.accepted().iter().map(|a| format!("`{a}`")).collect();
    format!(
        "unknown argument `{name}` for {}; expected one of {}",
        kind.attribute(),
        accepted.join(", ")
    )
}

fn unexpected_positional(kind: Kind) -> String {
    match kind {
        Kind::Leader => {
            "unexpected argument: #[leader_only] takes one positional argument, the key; \
                         name the others, e.g. `wait = \"30s\"`"
                .to_owned()
        }
        Kind::Semaphore => "unexpected argument: #[semaphore] takes two positional arguments, the \
                            name and the limit; name the others, e.g. `wait = \"30s\"`"
            .to_owned(),
    }
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

/// A key or name: a string literal, checked here against the key rule of
/// `LeaseSpec::validate`, or any other expression (a constant, `format!(…)`), left to run time.
fn parse_key(name: &str, value: Expr) -> syn::Result<Expr> {
    match lit(&value) {
        Some(Lit::Str(s)) => match key_rule_broken(&s.value()) {
            Some(reason) => Err(syn::Error::new(
                s.span(),
                format!("`{name}` {reason}, e.g. \"jobs/compact\""),
            )),
            None => Ok(value),
        },
        Some(_) => Err(syn::Error::new(
            value.span(),
            format!(
                "`{name}` must be a string: a literal (`{name} = \"jobs/compact\"`), a constant \
                 (`{name} = KEYS::COMPACT`) or an expression (`{name} = format!(\"tenant/{{id}}\")`)"
            ),
        )),
        None => Ok(value),
    }
}

/// The key rule of `LeaseSpec::validate` (lease_core's `validate_key`), for literals.
fn key_rule_broken(key: &str) -> Option<&'static str> {
    if key.is_empty() {
        Some("is empty; name the lease")
    } else if key.starts_with('/') {
        Some("must be relative: remove the leading '/'")
    } else if key.ends_with('/') {
        Some("must not end with '/'")
    } else if key.contains("//") {
        Some("contains an empty segment ('//')")
    } else if key.chars().any(char::is_control) {
        Some("contains a control character")
    } else {
        None
    }
}

/// A limit: an integer literal, checked here, or any other expression of type `u32` (a
/// constant), checked at run time.
fn parse_limit(value: Expr) -> syn::Result<Expr> {
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

fn parse_wait(value: &Expr) -> syn::Result<WaitArg> {
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

fn parse_ttl(value: &Expr) -> syn::Result<Millis> {
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

fn parse_lock_delay(value: &Expr) -> syn::Result<Millis> {
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
fn parse_schedule(name: &str, value: &Expr) -> syn::Result<Millis> {
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

/// The function the attribute is put on: anything with a signature and a body (a free function,
/// a method in an impl block, a provided method in a trait).
pub(crate) struct GuardedFn {
    pub(crate) attrs: Vec<Attribute>,
    pub(crate) vis: Visibility,
    pub(crate) sig: Signature,
    pub(crate) block: Block,
}

impl Parse for GuardedFn {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let mut attrs = input.call(Attribute::parse_outer)?;
        let vis = input.parse()?;
        let sig: Signature = input.parse()?;
        if input.peek(Token![;]) {
            return Err(syn::Error::new(
                input.span(),
                "a function without a body cannot be guarded: put the attribute on the \
                 implementation (or give the trait method a default body)",
            ));
        }
        let content;
        let brace_token = syn::braced!(content in input);
        attrs.extend(content.call(Attribute::parse_inner)?);
        let stmts = content.call(Block::parse_within)?;
        Ok(GuardedFn {
            attrs,
            vis,
            sig,
            block: Block { brace_token, stmts },
        })
    }
}
