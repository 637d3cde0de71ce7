//! The arguments as a whole: [`RawArgs`] (the syntax) and [`LeaseArgs::from_raw`] (the meaning
//! of each, every error collected in [`Errors`]).

use proc_macro2::Span;
use syn::ext::IdentExt;
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{Expr, Ident, Token};

use super::kind::Kind;
use super::suggest::{closest, unexpected_positional, unknown_argument};
use super::value::{
    CratePath, Millis, WaitArg, parse_crate, parse_key, parse_limit, parse_lock_delay,
    parse_schedule, parse_ttl, parse_wait,
};

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
