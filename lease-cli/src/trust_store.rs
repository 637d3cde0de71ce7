//! Not loading the system's CA bundle when the Consul agent is reached over plain `http`.
//!
//! lease-core's Consul client is a reqwest client with native-tls, and reqwest builds its TLS
//! connector when the client is built, for `http` addresses too: OpenSSL parses the system's CA
//! bundle twice (its default paths, then openssl-probe's), about 80 ms of CPU per process with
//! OpenSSL 3 (`perf stat`: 93 ms for `lease status`, 6 ms without the bundle). That is more than
//! `consul lock`'s whole start (Go reads its roots on first use), and every `lease` a cron table
//! or a `-n` fan-out starts pays it, though a plain-`http` agent never needs a certificate.
//!
//! So, when nothing can use TLS (a Consul address that is `http`, no `CONSUL_CACERT`, no proxy),
//! `lease` points OpenSSL at an empty bundle (`SSL_CERT_FILE=/dev/null`; directories, such as
//! `SSL_CERT_DIR`'s, are read lazily and cost nothing). A process cannot set its own environment
//! safely (`set_var` is `unsafe`, which this workspace forbids), so `lease` executes itself again,
//! once, with it: the same process id, a few milliseconds. The guarded command gets the
//! environment `lease` was started with (the `SSL_CERT_FILE` it had, or none). If lease-core
//! comes to build its TLS connector only for `https`, this goes.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::process::CommandExt;

use crate::cli::BackendArgs;

/// Set by `lease` on itself with [`CERT_FILE`]: `-` if `SSL_CERT_FILE` was unset, else `=` and
/// the value it had.
const MARKER: &str = "LEASE_EMPTY_TRUST_STORE";
/// Where OpenSSL and openssl-probe read the CA bundle from, before their defaults.
const CERT_FILE: &str = "SSL_CERT_FILE";
/// Variables that would make reqwest talk TLS (or to a proxy that may) for an `http` address.
const TLS_HINTS: &[&str] = &[
    "CONSUL_CACERT",
    "http_proxy",
    "HTTP_PROXY",
    "all_proxy",
    "ALL_PROXY",
];

/// Executes `lease` again with an empty CA bundle if `backend` reaches Consul over plain `http`
/// (see the module). Returns if it does not, or if executing failed (then the bundle is loaded,
/// which is only slower).
pub(crate) fn skip_for_plain_http(backend: &BackendArgs) {
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    if !plain_http(backend, env) {
        return;
    }
    let Ok(exe) = std::env::current_exe() else {
        return;
    };
    let mut args = std::env::args_os();
    let arg0 = args.next().unwrap_or_else(|| OsString::from("lease"));
    let mut had = OsString::new();
    match std::env::var_os(CERT_FILE) {
        Some(value) => {
            had.push("=");
            had.push(value);
        }
        None => had.push("-"),
    }
    let _failed = std::process::Command::new(exe)
        .arg0(arg0)
        .args(args)
        .env(CERT_FILE, "/dev/null")
        .env(MARKER, had)
        .exec();
}

/// Gives `command` (the guarded command) the environment `lease` was started with, undoing what
/// [`skip_for_plain_http`] set.
pub(crate) fn restore(command: &mut tokio::process::Command) {
    let Some(had) = std::env::var_os(MARKER) else {
        return;
    };
    command.env_remove(MARKER);
    match had.into_vec().split_first() {
        Some((b'=', value)) => command.env(CERT_FILE, OsString::from_vec(value.to_vec())),
        _ => command.env_remove(CERT_FILE),
    };
}

/// Whether `backend`, with the environment `env` (non-empty values), reaches Consul over plain
/// `http` with nothing that could need a CA bundle, and the bundle was not emptied already.
fn plain_http(backend: &BackendArgs, env: impl Fn(&str) -> Option<String>) -> bool {
    if backend.amqp.is_some() || env(MARKER).is_some() || TLS_HINTS.iter().any(|v| env(v).is_some())
    {
        return false;
    }
    // As lease-core's ConsulBuilder reads them.
    let address = backend
        .consul
        .clone()
        .or_else(|| env("CONSUL_HTTP_ADDR"))
        .unwrap_or_default();
    let address = address.trim().to_ascii_lowercase();
    if address.contains("://") {
        address.starts_with("http://")
    } else {
        !env("CONSUL_HTTP_SSL")
            .is_some_and(|v| matches!(v.as_str(), "1" | "true" | "TRUE" | "True"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(consul: Option<&str>, amqp: Option<&str>) -> BackendArgs {
        BackendArgs {
            consul: consul.map(str::to_owned),
            amqp: amqp.map(str::to_owned),
        }
    }

    fn with<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    #[test]
    fn only_plain_http_consul_skips_the_bundle() {
        assert!(plain_http(&args(None, None), with(&[])));
        assert!(plain_http(&args(Some("10.0.0.1:8500"), None), with(&[])));
        assert!(plain_http(&args(Some("HTTP://h:1"), None), with(&[])));
        assert!(plain_http(
            &args(None, None),
            with(&[
                ("CONSUL_HTTP_ADDR", "http://h:1"),
                ("CONSUL_HTTP_SSL", "true")
            ])
        ));
        assert!(!plain_http(&args(Some("https://h:1"), None), with(&[])));
        assert!(!plain_http(
            &args(None, None),
            with(&[("CONSUL_HTTP_ADDR", "https://h:1")])
        ));
        assert!(!plain_http(
            &args(Some("h:1"), None),
            with(&[("CONSUL_HTTP_SSL", "1")])
        ));
        assert!(!plain_http(&args(None, Some("amqp://h")), with(&[])));
        for hint in TLS_HINTS {
            assert!(
                !plain_http(&args(None, None), with(&[(hint, "x")])),
                "{hint}"
            );
        }
        // Once only.
        assert!(!plain_http(&args(None, None), with(&[(MARKER, "1")])));
    }
}
