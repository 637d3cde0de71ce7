//! Exit codes and the one error type every subcommand returns: a message for stderr and the code
//! `lease` exits with. The codes are documented in `lease --help` (see `cli::EXIT_CODES`).

use std::fmt;

use lease_core::Error;

/// `lease lock`: bad usage (an unknown option, a missing `--`, an invalid key or duration).
pub(crate) const USAGE: u8 = 64;
/// `lease lock -try`: the lease stayed held elsewhere for the whole wait (EX_TEMPFAIL).
pub(crate) const BUSY: u8 = 75;
/// `lease lock`: the lease was lost while the command ran, and the command was stopped.
pub(crate) const LOST: u8 = 124;
/// `lease lock`: the backend failed or could not be reached; no command was started.
pub(crate) const BACKEND: u8 = 125;
/// `lease lock`: the command was found but could not be run (as a shell reports it).
pub(crate) const CANNOT_RUN: u8 = 126;
/// `lease lock`: the command was not found (as a shell reports it).
pub(crate) const NOT_FOUND: u8 = 127;

/// `lease status` / `lease check`: nobody holds the key / the sequencer is stale.
pub(crate) const NOT_HELD: u8 = 1;
/// `lease status` / `lease check`: the backend could not answer.
pub(crate) const QUERY_FAILED: u8 = 2;

/// A failure to report on stderr, with the code to exit with.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) code: u8,
    pub(crate) message: String,
}

impl Failure {
    pub(crate) fn new(code: u8, message: impl fmt::Display) -> Failure {
        Failure {
            code,
            message: message.to_string(),
        }
    }

    pub(crate) fn usage(message: impl fmt::Display) -> Failure {
        Failure::new(USAGE, message)
    }

    /// A library error: a spec the library refuses is bad usage, a held lease is busy, anything
    /// else is the backend's failure (its message says what to do).
    pub(crate) fn from_error(error: &Error) -> Failure {
        let code = match error {
            Error::Busy { .. } | Error::SemaphoreInUse { .. } => BUSY,
            Error::InvalidKey { .. }
            | Error::InvalidTtl { .. }
            | Error::InvalidLockDelay { .. }
            | Error::InvalidFenceLead { .. }
            | Error::InvalidLimit { .. }
            | Error::Config(_) => USAGE,
            _ => BACKEND,
        };
        Failure::new(code, error)
    }
}
