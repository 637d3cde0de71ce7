//! Choosing the backend from the flags and the environment, and mapping the command line's KEY
//! to the lease it names there.

use std::sync::Arc;
use std::time::Duration;

use lease_core::amqp::{Amqp, DEFAULT_HEARTBEAT};
use lease_core::consul::{Consul, ConsulBuilder};
use lease_core::{Backend, LeaseSpec};

use crate::cli::BackendArgs;
use crate::exit::{Failure, in_cli_terms};

/// The backend a command talks to.
#[derive(Debug)]
pub(crate) enum Chosen {
    Consul(Consul),
    Amqp(Amqp),
}

impl Chosen {
    /// Consul unless `--amqp` was given. `grace` is the time `lease lock` needs between loss and
    /// its child being gone (zero for the other commands).
    pub(crate) fn from_args(args: &BackendArgs, grace: Duration) -> Result<Chosen, Failure> {
        match &args.amqp {
            Some(url) => {
                // The AMQP lease self-fences at 3/4 of the heartbeat and the broker frees its
                // slot about two heartbeats after the last one it got: a heartbeat at least as
                // long as the grace leaves the child gone before then.
                let heartbeat = DEFAULT_HEARTBEAT.max(grace);
                Amqp::builder(url.clone())
                    .heartbeat(heartbeat)
                    .connection_name("lease-cli")
                    .build()
                    .map(Chosen::Amqp)
                    .map_err(|e| {
                        Failure::usage(format_args!("--amqp: {}", in_cli_terms(&e.to_string())))
                    })
            }
            None => {
                let mut builder = ConsulBuilder::from_env();
                if let Some(address) = &args.consul {
                    builder = builder.address(address.clone());
                }
                builder.build().map(Chosen::Consul).map_err(|e| {
                    Failure::usage(format_args!(
                        "Consul configuration (--consul or CONSUL_*): {}",
                        in_cli_terms(&e.to_string())
                    ))
                })
            }
        }
    }

    pub(crate) fn backend(&self) -> Arc<dyn Backend> {
        match self {
            Chosen::Consul(consul) => Arc::new(consul.clone()),
            Chosen::Amqp(amqp) => Arc::new(amqp.clone()),
        }
    }

    /// The lease KEY names: on Consul, `consul lock`'s layout (the leader key `KEY/.lock`, or the
    /// semaphore under `KEY`); on AMQP, the semaphore `KEY` (one slot for a leader).
    pub(crate) fn spec(&self, key: &str, limit: u32) -> Result<LeaseSpec, Failure> {
        // The key rule is checked on KEY itself, so the message names what the user typed.
        LeaseSpec::leader(key)
            .validate()
            .map_err(|e| Failure::from_error(&e))?;
        Ok(match (self, limit) {
            (Chosen::Consul(_), 1) => LeaseSpec::leader(leader_key(key)),
            (Chosen::Amqp(_), 1) => LeaseSpec::leader(key),
            (_, limit) => LeaseSpec::semaphore(key, limit),
        })
    }
}

/// The key `consul lock PREFIX` holds.
pub(crate) fn leader_key(prefix: &str) -> String {
    format!("{prefix}/.lock")
}
