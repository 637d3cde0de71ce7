//! Exit codes and the one error type every subcommand returns: a message for stderr and the code
//! `lease` exits with. The codes are documented in `lease --help` (see `cli::EXIT_CODES`).

use std::fmt;

use lease_core::{Error, ErrorKind};

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
    /// else is the backend's failure (its message says what to do). A configuration the backend
    /// refuses once asked (a database that does not exist) is the backend's failure too, as a
    /// role without rights or a wrong port is: 64 is for what `lease` refuses before asking.
    pub(crate) fn from_error(error: &Error) -> Failure {
        let code = match (error, error.kind()) {
            (Error::SemaphoreInUse { .. }, _) | (_, ErrorKind::Busy) => BUSY,
            (Error::Config { .. }, _) => BACKEND,
            (_, ErrorKind::InvalidInput) => USAGE,
            _ => BACKEND,
        };
        Failure::new(code, in_cli_terms(&error.to_string()))
    }
}

/// The library's messages name the builder call a program sets a value with; here the user
/// sets it with a flag.
const FLAGS: &[(&str, &str)] = &[
    ("ConsulBuilder::address", "--consul"),
    ("`Amqp::builder`", "--amqp"),
    ("Amqp::builder", "--amqp"),
    // etcd's credentials come from the environment only (ETCD_USER, ETCD_PASSWORD).
    (", or EtcdBuilder::user", ""),
    (" (or EtcdBuilder::user)", ""),
    // The PostgreSQL URL comes from --postgres (or LEASE_POSTGRES_URL), never from DATABASE_URL.
    (
        "Postgres::from_env reads LEASE_POSTGRES_URL, else DATABASE_URL",
        "--postgres, or LEASE_POSTGRES_URL",
    ),
    // The endpoints come from --etcd (or LEASE_ETCD_ENDPOINTS), never from ETCD_ENDPOINTS,
    // except for `lease check` of an etcd sequencer without either, where --etcd is the fix.
    ("ETCD_ENDPOINTS", "--etcd"),
];

/// `message` with the library's builder calls named as this command's flags.
pub(crate) fn in_cli_terms(message: &str) -> String {
    FLAGS.iter().fold(message.to_owned(), |text, (call, flag)| {
        text.replace(call, flag)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builder_calls_are_named_as_flags() {
        let refused = "cannot reach Consul at http://127.0.0.1:1: error sending request; is it \
                       running? Start an agent, or give ConsulBuilder::address its address";
        assert!(in_cli_terms(refused).ends_with("or give --consul its address"));
        let amqp = "start it with `rabbitmq-server -detached`, or give `Amqp::builder` the \
                    broker's URL";
        assert!(in_cli_terms(amqp).ends_with("or give --amqp the broker's URL"));
        let etcd = "cannot reach etcd at http://127.0.0.1:1/: refused; is it running? Start \
                    etcd, or point ETCD_ENDPOINTS at it";
        assert!(in_cli_terms(etcd).ends_with("or point --etcd at it"));
        let postgres = "start PostgreSQL, or fix the host and port of the URL (Postgres::from_env \
                        reads LEASE_POSTGRES_URL, else DATABASE_URL)";
        assert!(
            in_cli_terms(postgres).ends_with("of the URL (--postgres, or LEASE_POSTGRES_URL)"),
            "{}",
            in_cli_terms(postgres)
        );
        let denied = "use credentials (ETCD_USER and ETCD_PASSWORD, or EtcdBuilder::user) whose \
                      role allows it";
        assert_eq!(
            in_cli_terms(denied),
            "use credentials (ETCD_USER and ETCD_PASSWORD) whose role allows it"
        );
    }
}
