//! Choosing the backend from the flags and the environment, and mapping the command line's KEY
//! to the lease it names there.

use std::sync::Arc;
use std::time::Duration;

use lease_amqp::{Amqp, DEFAULT_HEARTBEAT};
use lease_consul::{Consul, ConsulBuilder};
use lease_core::{Backend, LeaseSpec};
use lease_etcd::{Etcd, EtcdBuilder};
use lease_postgres::Postgres;
use lease_redis::Redis;

use crate::cli::BackendArgs;
use crate::exit::{Failure, in_cli_terms};

/// Points `lease` at etcd (comma-separated client URLs) when no backend flag is given, as
/// `CONSUL_HTTP_ADDR` points it at a Consul agent. A variable of `lease`'s own: the library's
/// `ETCD_ENDPOINTS` (or etcdctl's `ETCDCTL_ENDPOINTS`) may be set on a host for other tools, and
/// must not silently move `lease lock` off the Consul locks its peers still take.
pub(crate) const ETCD_ENDPOINTS_ENV: &str = "LEASE_ETCD_ENDPOINTS";

/// Points `lease` at PostgreSQL (a `postgres://` URL) when no backend flag is given. The library
/// also reads `DATABASE_URL`, which `lease` does not: that one is set on many hosts for their
/// applications, and must not silently move `lease lock` off the Consul locks its peers take.
pub(crate) const POSTGRES_URL_ENV: &str = "LEASE_POSTGRES_URL";

/// Points `lease` at Redis (a `redis://` URL) when no backend flag is given. The library also
/// reads `REDIS_URL`, which `lease` does not, for the reason `DATABASE_URL` is not read.
pub(crate) const REDIS_URL_ENV: &str = "LEASE_REDIS_URL";

/// The backend a command talks to.
#[derive(Debug)]
pub(crate) enum Chosen {
    Consul(Consul),
    Amqp(Amqp),
    Etcd(Etcd),
    Postgres(Postgres),
    Redis(Redis),
}

impl Chosen {
    /// `--amqp`, else `--postgres`, else `--redis`, else `--etcd`, else (no backend flag given)
    /// `LEASE_POSTGRES_URL`, `LEASE_REDIS_URL` or `LEASE_ETCD_ENDPOINTS` (two set is refused),
    /// else Consul.
    /// `grace` is the time `lease lock` needs between loss and its child being gone (zero for the
    /// other commands).
    pub(crate) fn from_args(args: &BackendArgs, grace: Duration) -> Result<Chosen, Failure> {
        if let Some(url) = &args.amqp {
            // The AMQP lease self-fences at 3/4 of the heartbeat and the broker frees its
            // slot about two heartbeats after the last one it got: a heartbeat at least as
            // long as the grace leaves the child gone before then.
            let heartbeat = DEFAULT_HEARTBEAT.max(grace);
            return Amqp::builder(url.clone())
                .heartbeat(heartbeat)
                .connection_name("lease-cli")
                .build()
                .map(Chosen::Amqp)
                .map_err(|e| {
                    Failure::usage(format_args!("--amqp: {}", in_cli_terms(&e.to_string())))
                });
        }
        if let Some(url) = &args.postgres {
            return postgres(url, "--postgres").map(Chosen::Postgres);
        }
        if let Some(url) = &args.redis {
            return redis(url, "--redis").map(Chosen::Redis);
        }
        if args.consul.is_none() && args.etcd.is_none() {
            let set: Vec<&str> = [
                postgres_url_env().map(|_| POSTGRES_URL_ENV),
                redis_url_env().map(|_| REDIS_URL_ENV),
                etcd_endpoints(args).map(|_| ETCD_ENDPOINTS_ENV),
            ]
            .into_iter()
            .flatten()
            .collect();
            if let [first, rest @ ..] = &set[..] {
                if !rest.is_empty() {
                    let all = match rest {
                        [second] => format!("both {first} and {second} are"),
                        _ => format!("{} are all", set.join(" and ")),
                    };
                    return Err(Failure::usage(format_args!(
                        "{all} set: unset all but one, or choose with --postgres, --redis, \
                         --etcd or --consul"
                    )));
                }
            }
            if let Some(url) = postgres_url_env() {
                return postgres(&url, POSTGRES_URL_ENV).map(Chosen::Postgres);
            }
            if let Some(url) = redis_url_env() {
                return redis(&url, REDIS_URL_ENV).map(Chosen::Redis);
            }
        }
        if args.consul.is_none() {
            if let Some(endpoints) = etcd_endpoints(args) {
                // The etcd lease self-fences by the spec's fence lead (the grace), as on Consul.
                return etcd(Some(&endpoints)).map(Chosen::Etcd);
            }
        }
        consul(args).map(Chosen::Consul)
    }

    pub(crate) fn backend(&self) -> Arc<dyn Backend> {
        match self {
            Chosen::Consul(consul) => Arc::new(consul.clone()),
            Chosen::Amqp(amqp) => Arc::new(amqp.clone()),
            Chosen::Etcd(etcd) => Arc::new(etcd.clone()),
            Chosen::Postgres(postgres) => Arc::new(postgres.clone()),
            Chosen::Redis(redis) => Arc::new(redis.clone()),
        }
    }

    /// The lease KEY names: on Consul, `consul lock`'s layout (the leader key `KEY/.lock`, or the
    /// semaphore under `KEY`); on AMQP, the semaphore `KEY` (one slot for a leader); on etcd, the
    /// election `KEY` (contender keys `KEY/<lease ID>`, the recipe `etcdctl lock KEY` and
    /// `etcdctl elect KEY` use), or the library's FIFO semaphore under `KEY`; on PostgreSQL, the
    /// lease `KEY` in the backend's lease table (a leader, or a semaphore of `limit` slots); on
    /// Redis, the lease `KEY` (its key `lease:{KEY}`), a leader or a semaphore.
    pub(crate) fn spec(&self, key: &str, limit: u32) -> Result<LeaseSpec, Failure> {
        // The key rule is checked on KEY itself, so the message names what the user typed.
        LeaseSpec::leader(key)
            .validate()
            .map_err(|e| Failure::from_error(&e))?;
        Ok(match (self, limit) {
            (Chosen::Consul(_), 1) => LeaseSpec::leader(leader_key(key)),
            (Chosen::Amqp(_) | Chosen::Etcd(_) | Chosen::Postgres(_) | Chosen::Redis(_), 1) => {
                LeaseSpec::leader(key)
            }
            (_, limit) => LeaseSpec::semaphore(key, limit),
        })
    }
}

/// The variables that point a `lease` run by the guarded command at the backend `lease lock`
/// was given by a flag, so `lease check "$LEASE_SEQUENCER"` inside the command reaches it:
/// `CONSUL_HTTP_ADDR` (`--consul`), `LEASE_ETCD_ENDPOINTS` (`--etcd`), `LEASE_POSTGRES_URL`
/// (`--postgres`) and `LEASE_REDIS_URL` (`--redis`). A backend chosen by a variable needs nothing: the command inherits it.
/// RabbitMQ gets nothing: its sequencers cannot be checked from another process. Each value is the flag's as given (a password in a URL included, which
/// the command line already showed); credentials that come only from the environment
/// (`CONSUL_HTTP_TOKEN`, `ETCD_PASSWORD`) are inherited as they were, never added.
pub(crate) fn child_env(args: &BackendArgs, chosen: &Chosen) -> Vec<(&'static str, String)> {
    let given = match chosen {
        Chosen::Consul(_) => args.consul.clone().map(|a| (CONSUL_ADDR_ENV, a)),
        Chosen::Etcd(_) => args.etcd.clone().map(|e| (ETCD_ENDPOINTS_ENV, e)),
        Chosen::Postgres(_) => args.postgres.clone().map(|u| (POSTGRES_URL_ENV, u)),
        Chosen::Redis(_) => args.redis.clone().map(|u| (REDIS_URL_ENV, u)),
        Chosen::Amqp(_) => None,
    };
    given.into_iter().collect()
}

/// The Consul agent's address, as the consul CLI (and `lease`, through `ConsulBuilder::from_env`)
/// reads it.
const CONSUL_ADDR_ENV: &str = "CONSUL_HTTP_ADDR";

/// The Consul agent `--consul` names, else the one `CONSUL_HTTP_ADDR` (and the other
/// `CONSUL_*` variables) configure.
pub(crate) fn consul(args: &BackendArgs) -> Result<Consul, Failure> {
    let mut builder = ConsulBuilder::from_env();
    if let Some(address) = &args.consul {
        builder = builder.address(address.clone());
    }
    builder.build().map_err(|e| {
        Failure::usage(format_args!(
            "Consul configuration (--consul or CONSUL_*): {}",
            in_cli_terms(&e.to_string())
        ))
    })
}

/// The etcd endpoints `--etcd` gives, else `LEASE_ETCD_ENDPOINTS` (set and not blank).
pub(crate) fn etcd_endpoints(args: &BackendArgs) -> Option<String> {
    args.etcd.clone().or_else(|| {
        std::env::var(ETCD_ENDPOINTS_ENV)
            .ok()
            .filter(|v| !v.trim().is_empty())
    })
}

/// An etcd backend at `endpoints` (comma-separated), else at the library's default
/// (`ETCD_ENDPOINTS`, else `http://127.0.0.1:2379`); credentials and TLS from `ETCD_USER`,
/// `ETCD_PASSWORD`, `ETCD_CACERT`, `ETCD_CERT` and `ETCD_KEY`.
pub(crate) fn etcd(endpoints: Option<&str>) -> Result<Etcd, Failure> {
    let mut builder = EtcdBuilder::from_env();
    if let Some(endpoints) = endpoints {
        if endpoints.split(',').all(|e| e.trim().is_empty()) {
            return Err(Failure::usage(
                "--etcd: give etcd's client URL, e.g. --etcd http://127.0.0.1:2379",
            ));
        }
        builder = builder.endpoints(endpoints.split(','));
    }
    builder.build().map_err(|e| {
        Failure::usage(format_args!(
            "etcd configuration (--etcd, {ETCD_ENDPOINTS_ENV} or ETCD_*): {}",
            in_cli_terms(&e.to_string())
        ))
    })
}

/// `LEASE_POSTGRES_URL`, set and not blank.
pub(crate) fn postgres_url_env() -> Option<String> {
    std::env::var(POSTGRES_URL_ENV)
        .ok()
        .filter(|v| !v.trim().is_empty())
}

/// A PostgreSQL backend at `url`, which came from `source` (a flag or a variable, named in the
/// message if the URL is refused). Nothing is connected until the first lease.
pub(crate) fn postgres(url: &str, source: &str) -> Result<Postgres, Failure> {
    if url.trim().is_empty() {
        return Err(Failure::usage(format_args!(
            "{source}: give PostgreSQL's URL, e.g. {source} postgres://user@127.0.0.1:5432/app"
        )));
    }
    Postgres::new(url).map_err(|e| {
        Failure::usage(format_args!(
            "PostgreSQL configuration ({source}): {}",
            in_cli_terms(&e.to_string())
        ))
    })
}

/// `LEASE_REDIS_URL`, set and not blank.
pub(crate) fn redis_url_env() -> Option<String> {
    std::env::var(REDIS_URL_ENV)
        .ok()
        .filter(|v| !v.trim().is_empty())
}

/// A Redis backend at `url`, which came from `source` (a flag or a variable, named in the
/// message if the URL is refused). Nothing is connected until the first lease.
pub(crate) fn redis(url: &str, source: &str) -> Result<Redis, Failure> {
    if url.trim().is_empty() {
        return Err(Failure::usage(format_args!(
            "{source}: give Redis's URL, e.g. {source} redis://127.0.0.1:6379"
        )));
    }
    Redis::new(url).map_err(|e| {
        Failure::usage(format_args!(
            "Redis configuration ({source}): {}",
            in_cli_terms(&e.to_string())
        ))
    })
}

/// The key `consul lock PREFIX` holds.
pub(crate) fn leader_key(prefix: &str) -> String {
    format!("{prefix}/.lock")
}
