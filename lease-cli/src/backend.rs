//! Choosing the backend from the flags and the environment, and mapping the command line's KEY
//! to the lease it names there.

use std::sync::Arc;
use std::time::Duration;

use lease_amqp::{Amqp, DEFAULT_HEARTBEAT};
use lease_consul::{Consul, ConsulBuilder};
use lease_core::{Backend, LeaseSpec};
use lease_etcd::{Etcd, EtcdBuilder};

use crate::cli::BackendArgs;
use crate::exit::{Failure, in_cli_terms};

/// Points `lease` at etcd (comma-separated client URLs) when no backend flag is given, as
/// `CONSUL_HTTP_ADDR` points it at a Consul agent. A variable of `lease`'s own: the library's
/// `ETCD_ENDPOINTS` (or etcdctl's `ETCDCTL_ENDPOINTS`) may be set on a host for other tools, and
/// must not silently move `lease lock` off the Consul locks its peers still take.
pub(crate) const ETCD_ENDPOINTS_ENV: &str = "LEASE_ETCD_ENDPOINTS";

/// The backend a command talks to.
#[derive(Debug)]
pub(crate) enum Chosen {
    Consul(Consul),
    Amqp(Amqp),
    Etcd(Etcd),
}

impl Chosen {
    /// `--amqp`, else `--etcd` (or `LEASE_ETCD_ENDPOINTS` when no backend flag is given), else
    /// Consul. `grace` is the time `lease lock` needs between loss and its child being gone (zero
    /// for the other commands).
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
        }
    }

    /// The lease KEY names: on Consul, `consul lock`'s layout (the leader key `KEY/.lock`, or the
    /// semaphore under `KEY`); on AMQP, the semaphore `KEY` (one slot for a leader); on etcd, the
    /// election `KEY` (contender keys `KEY/<lease ID>`, the recipe `etcdctl lock KEY` and
    /// `etcdctl elect KEY` use), or the library's FIFO semaphore under `KEY`.
    pub(crate) fn spec(&self, key: &str, limit: u32) -> Result<LeaseSpec, Failure> {
        // The key rule is checked on KEY itself, so the message names what the user typed.
        LeaseSpec::leader(key)
            .validate()
            .map_err(|e| Failure::from_error(&e))?;
        Ok(match (self, limit) {
            (Chosen::Consul(_), 1) => LeaseSpec::leader(leader_key(key)),
            (Chosen::Amqp(_) | Chosen::Etcd(_), 1) => LeaseSpec::leader(key),
            (_, limit) => LeaseSpec::semaphore(key, limit),
        })
    }
}

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

/// The key `consul lock PREFIX` holds.
pub(crate) fn leader_key(prefix: &str) -> String {
    format!("{prefix}/.lock")
}
