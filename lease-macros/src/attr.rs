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
    Attribute, Block, Expr, ExprLit, Ident, Lit, LitInt, LitStr, Path, Signature, Token, Visibility,
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
                "crate",
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
                "crate",
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

/// `crate = "…"`: the path the generated code names lease-core by, with the literal it was read
/// from (for errors about it).
pub(crate) struct CratePath {
    pub(crate) path: Path,
    pub(crate) lit: LitStr,
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
    pub(crate) krate: Option<CratePath>,
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

    /// Whether a required argument is missing: not given at all (one given but rejected has its
    /// own error already), nor written misspelt (`kye = …`), which has its own error with the
    /// right name in it.
    fn missing(&self, misspelt: &[&str]) -> bool {
        !self.given && !misspelt.contains(&self.name)
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
        let mut krate = Once::new("crate");

        // The known arguments that unknown ones look like misspellings of.
        let mut misspelt: Vec<&'static str> = Vec::new();
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
                "crate" => krate.set(at, parse_crate(&value), &mut errors),
                _ => {
                    let close = closest(&name, kind.accepted());
                    misspelt.extend(close);
                    errors.push(syn::Error::new(at, unknown_argument(kind, &name, close)));
                }
            }
        }

        let call_site = Span::call_site();
        let missing = match (
            key.missing(&misspelt),
            kind == Kind::Semaphore && limit.missing(&misspelt),
        ) {
            (true, true) => Some("`name` and `limit`".to_owned()),
            (true, false) => Some(format!("`{}`", key.name)),
            (false, true) => Some("`limit`".to_owned()),
            (false, false) => None,
        };
        if let Some(missing) = missing {
            errors.push(syn::Error::new(
                call_site,
                format!("missing {missing}: write {}", kind.example()),
            ));
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
            krate: krate.value,
        })
    }
}

/// The one error for an argument name the attribute does not take: the known names, and the
/// closest of them when the name looks like a misspelling of it.
fn unknown_argument(kind: Kind, name: &str, close: Option<&str>) -> String {
    let accepted: Vec<String> = kind.accepted().iter().map(|a| format!("`{a}`")).collect();
    let hint = close.map_or_else(String::new, |close| format!("; did you mean `{close}`?"));
    format!(
        "unknown argument `{name}` for {}; expected one of {}{hint}",
        kind.attribute(),
        accepted.join(", ")
    )
}

/// The known name `name` is most likely a misspelling of, as rustc picks one for a misspelt
/// identifier: the same name in another case, the same `_`-separated words in another order
/// (`delay_lock`), or the nearest by edit distance within a third of the name's length
/// (at least 1).
fn closest(name: &str, known: &[&'static str]) -> Option<&'static str> {
    fn words(name: &str) -> Vec<&str> {
        let mut words: Vec<&str> = name.split('_').collect();
        words.sort_unstable();
        words
    }
    let name = name.to_lowercase();
    if let Some(same) = known
        .iter()
        .find(|known| **known == name || words(known) == words(&name))
    {
        return Some(*same);
    }
    let most = name.chars().count().max(3) / 3;
    known
        .iter()
        .map(|known| (edit_distance(&name, known), *known))
        .filter(|(distance, _)| *distance <= most)
        // The first of the nearest, so ties go to the order the docs list the arguments in.
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, known)| known)
}

/// Edits (insert, delete, substitute, or swap two neighbours) to turn `a` into `b`: the
/// optimal string alignment distance, so `kye` is one edit from `key`.
fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    // Three rows of the table: two back (for a swap), the previous one, the current one.
    let mut before: Vec<usize> = vec![0; b.len() + 1];
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    let mut current: Vec<usize> = vec![0; b.len() + 1];
    for i in 1..=a.len() {
        current[0] = i;
        for j in 1..=b.len() {
            let substitution = usize::from(a[i - 1] != b[j - 1]);
            current[j] = (previous[j] + 1)
                .min(current[j - 1] + 1)
                .min(previous[j - 1] + substitution);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                current[j] = current[j].min(before[j - 2] + 1);
            }
        }
        std::mem::swap(&mut before, &mut previous);
        std::mem::swap(&mut previous, &mut current);
    }
    previous[b.len()]
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

/// A key or name: a string, or any expression of type `&str` or `String`. A string literal is
/// checked against lease-core's key rule at compile time by the expansion (see `expand::spec`),
/// anything else by `LeaseSpec::validate` at run time.
fn parse_key(name: &str, value: Expr) -> syn::Result<Expr> {
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

/// `crate = "…"`: a path without generic arguments (`my_facade::lease`, `::lease_core`,
/// `crate::lease`), in a string as tokio's and serde's `crate` arguments take it. Whether it
/// leads to lease-core is the compiler's to say, at the literal.
fn parse_crate(value: &Expr) -> syn::Result<CratePath> {
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

#[cfg(test)]
mod tests {
    use quote::ToTokens;

    use super::*;

    /// The messages of the errors `args` gives on `kind`, in order.
    fn errors(kind: Kind, args: &str) -> Vec<String> {
        let raw: RawArgs = syn::parse_str(args).expect("the arguments parse as syntax");
        match LeaseArgs::from_raw(kind, raw) {
            Ok(_) => Vec::new(),
            Err(error) => error.into_iter().map(|e| e.to_string()).collect(),
        }
    }

    const LEADER_ARGS: &str = "expected one of `key`, `wait`, `ttl`, `lock_delay`, `min_hold`, \
                               `max_run`, `backend`, `crate`";
    const SEMAPHORE_ARGS: &str = "expected one of `name`, `limit`, `wait`, `ttl`, `lock_delay`, \
                                  `min_hold`, `max_run`, `backend`, `crate`";

    #[test]
    fn a_misspelt_key_is_one_error_that_names_the_key() {
        assert_eq!(
            errors(Kind::Leader, r#"kye = "jobs/x""#),
            [format!(
                "unknown argument `kye` for #[leader_only]; {LEADER_ARGS}; did you mean `key`?"
            )]
        );
    }

    #[test]
    fn misspelt_name_and_limit_are_one_error_each_and_nothing_is_missing() {
        assert_eq!(
            errors(Kind::Semaphore, r#"nmae = "reports", limt = 3"#),
            [
                format!(
                    "unknown argument `nmae` for #[semaphore]; {SEMAPHORE_ARGS}; \
                     did you mean `name`?"
                ),
                format!(
                    "unknown argument `limt` for #[semaphore]; {SEMAPHORE_ARGS}; \
                     did you mean `limit`?"
                ),
            ]
        );
    }

    #[test]
    fn a_misspelt_optional_argument_names_it() {
        assert_eq!(
            errors(Kind::Leader, r#"key = "jobs/x", lock_dealy = "0s""#),
            [format!(
                "unknown argument `lock_dealy` for #[leader_only]; {LEADER_ARGS}; \
                 did you mean `lock_delay`?"
            )]
        );
    }

    #[test]
    fn an_unknown_argument_like_none_gets_no_hint_and_the_key_is_still_missing() {
        assert_eq!(
            errors(Kind::Leader, r#"lease = "jobs/x""#),
            [
                format!("unknown argument `lease` for #[leader_only]; {LEADER_ARGS}"),
                "missing `key`: write #[leader_only(key = \"jobs/compact\")]".to_owned(),
            ]
        );
    }

    #[test]
    fn a_misspelling_only_excuses_the_argument_it_looks_like() {
        assert_eq!(
            errors(Kind::Semaphore, r#"nmae = "reports""#),
            [
                format!(
                    "unknown argument `nmae` for #[semaphore]; {SEMAPHORE_ARGS}; \
                     did you mean `name`?"
                ),
                "missing `limit`: write #[semaphore(name = \"reports\", limit = 3)]".to_owned(),
            ]
        );
    }

    /// The path `crate = …` gives, as written, or the errors.
    fn crate_path(kind: Kind, args: &str) -> Result<Option<String>, Vec<String>> {
        let raw: RawArgs = syn::parse_str(args).expect("the arguments parse as syntax");
        match LeaseArgs::from_raw(kind, raw) {
            Ok(args) => Ok(args
                .krate
                .map(|krate| krate.path.to_token_stream().to_string())),
            Err(error) => Err(error.into_iter().map(|e| e.to_string()).collect()),
        }
    }

    #[test]
    fn crate_takes_a_path_in_a_string() {
        for (args, expected) in [
            (r#"key = "jobs/a""#, None),
            (
                r#"key = "jobs/a", crate = "my_facade::lease""#,
                Some("my_facade :: lease"),
            ),
            (
                r#"crate = "::lease_core", key = "jobs/a""#,
                Some(":: lease_core"),
            ),
            (
                r#""jobs/a", crate = "crate::lease""#,
                Some("crate :: lease"),
            ),
            (
                r#""jobs/a", crate = "self::facade""#,
                Some("self :: facade"),
            ),
            (r#""jobs/a", crate = " renamed ""#, Some("renamed")),
        ] {
            assert_eq!(
                crate_path(Kind::Leader, args),
                Ok(expected.map(str::to_owned)),
                "{args}"
            );
        }
        assert_eq!(
            crate_path(Kind::Semaphore, r#""reports", 3, crate = "facade""#),
            Ok(Some("facade".to_owned()))
        );
    }

    #[test]
    fn crate_that_is_not_a_path_in_a_string_is_one_error() {
        const EXPECTED: &str = "`crate` must be the path to lease-core, or to a module that \
                                re-exports it, in a string: e.g. `crate = \"my_facade::lease\"`";
        for value in [
            r#""not a path!""#,
            r#""""#,
            r#""lease_core::""#,
            r#""lease_core::Wait<u8>""#,
            r#""lease_core::Wait::<u8>""#,
            r#""$crate""#,
            "lease_core",
            "::lease_core",
            "3",
        ] {
            assert_eq!(
                crate_path(Kind::Leader, &format!(r#"key = "jobs/a", crate = {value}"#)),
                Err(vec![EXPECTED.to_owned()]),
                "{value}"
            );
        }
        assert_eq!(
            crate_path(Kind::Leader, r#"key = "jobs/a", crate = "a", crate = "b""#),
            Err(vec!["`crate` specified more than once".to_owned()])
        );
    }

    #[test]
    fn closest_picks_the_argument_a_name_looks_like() {
        let leader = Kind::Leader.accepted();
        let semaphore = Kind::Semaphore.accepted();
        for (name, known, expected) in [
            ("kye", leader, Some("key")),
            ("ky", leader, Some("key")),
            ("Key", leader, Some("key")),
            ("KEY", leader, Some("key")),
            ("wiat", leader, Some("wait")),
            ("tll", leader, Some("ttl")),
            ("lockdelay", leader, Some("lock_delay")),
            ("delay_lock", leader, Some("lock_delay")),
            ("max_rnu", leader, Some("max_run")),
            ("minhold", leader, Some("min_hold")),
            ("backedn", leader, Some("backend")),
            ("limt", semaphore, Some("limit")),
            ("nmae", semaphore, Some("name")),
            ("krate", leader, Some("crate")),
            ("create", semaphore, Some("crate")),
            ("Crate", leader, Some("crate")),
            // Too far from every argument to be a misspelling of one.
            ("timeout", leader, None),
            ("type", leader, None),
            ("lease", leader, None),
            ("k", leader, None),
            // The other attribute's arguments are not suggested.
            ("limit", leader, None),
            ("key", semaphore, None),
        ] {
            assert_eq!(closest(name, known), expected, "{name}");
        }
    }

    #[test]
    fn edit_distance_counts_a_swap_as_one_edit() {
        for (a, b, distance) in [
            ("", "", 0),
            ("key", "key", 0),
            ("", "key", 3),
            ("key", "", 3),
            ("kye", "key", 1),
            ("ky", "key", 1),
            ("kkey", "key", 1),
            ("kez", "key", 1),
            ("eky", "key", 1),
            ("yek", "key", 2),
            ("kitten", "sitting", 3),
            ("ca", "abc", 3),
        ] {
            assert_eq!(edit_distance(a, b), distance, "{a} -> {b}");
            assert_eq!(edit_distance(b, a), distance, "{b} -> {a}");
        }
    }
}
