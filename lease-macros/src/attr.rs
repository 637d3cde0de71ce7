//! Parsing only: the attribute's arguments and the function it is put on.
//!
//! Arguments are read in two steps. [`RawArgs`] is the syntax (`"positional"`, `key = value`,
//! comma-separated); [`LeaseArgs::from_raw`] gives each argument its meaning, checks it, and
//! collects every error at once, each spanned at the user's token. Durations, literal keys and
//! literal limits are checked here, at compile time; a key, name or limit given as a constant or
//! an expression is checked at run time by `LeaseSpec::validate`, which stays the authority for
//! everything (the generated code calls it before acquiring).

mod args;
mod guarded;
mod kind;
mod suggest;
mod value;

#[cfg(test)]
mod tests;

pub(crate) use args::{Errors, LeaseArgs, RawArgs, TargetArg};
pub(crate) use guarded::GuardedFn;
pub(crate) use kind::Kind;
pub(crate) use value::{CratePath, Millis, WaitArg};
