//! The Consul backend: leases on Consul sessions and KV.
//!
//! [`Consul`] is a cheap, cloneable handle (an HTTP client and its configuration). Each acquired
//! lease has its own session, renewed every TTL/2 by the lease's holder task, and is watched with
//! consistent blocking queries, so loss is noticed as soon as Consul knows it.
//!
//! Interoperation: a leader lock uses the key and flags of `consul lock KEY` (well, of its
//! `KEY/.lock` when you pass `consul lock` the prefix `KEY`), so the two exclude each other.

mod config;
mod http;
mod leader;
mod session;

use std::fmt;
use std::sync::Arc;

use tracing::Instrument;

pub use config::ConsulBuilder;

use crate::{Backend, BoxFuture, Error, Lease, LeaseSpec, Sequencer, Target};
use http::ConsulHttp;

/// Leases on Consul. Cloning is cheap and clones share one connection pool.
///
/// # Examples
///
/// ```no_run
/// # async fn example() -> Result<(), lease_core::Error> {
/// use lease_core::{Backend, LeaseSpec};
/// use lease_core::consul::Consul;
///
/// let consul = Consul::from_env()?; // CONSUL_HTTP_ADDR, CONSUL_HTTP_TOKEN, ...
/// let lease = consul.acquire(&LeaseSpec::leader("service/api/leader").value("10.0.0.7:8080")).await?;
/// lease.run(async { /* only the leader gets here */ }).await?;
/// lease.release().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Consul {
    http: Arc<ConsulHttp>,
}

impl fmt::Debug for Consul {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Consul")
            .field("address", &self.http.address())
            .finish_non_exhaustive()
    }
}

impl Consul {
    /// A builder with Consul's defaults, ignoring the environment.
    pub fn builder() -> ConsulBuilder {
        ConsulBuilder::new()
    }

    /// A backend configured from the environment as the `consul` CLI is
    /// (see [`ConsulBuilder::from_env`]).
    pub fn from_env() -> Result<Consul, Error> {
        ConsulBuilder::from_env().build()
    }

    pub(crate) fn from_http(http: Arc<ConsulHttp>) -> Consul {
        Consul { http }
    }

    /// How many HTTP requests this client (and its clones) has sent to Consul, for measuring.
    pub fn requests_sent(&self) -> u64 {
        self.http.requests_sent()
    }

    /// Whether `sequencer` still names the current holder of its leader key: one consistent read.
    ///
    /// This is the check a downstream service makes on work handed to it with a sequencer.
    pub async fn check_sequencer(&self, sequencer: &Sequencer) -> Result<(), Error> {
        leader::check_sequencer(&self.http, sequencer).await
    }
}

impl Backend for Consul {
    fn acquire<'a>(&'a self, spec: &'a LeaseSpec) -> BoxFuture<'a, Result<Lease, Error>> {
        let span = tracing::info_span!("lease.acquire", key = spec.key(), backend = "consul");
        Box::pin(
            async move {
                spec.validate()?;
                match spec.target() {
                    Target::Leader { .. } => leader::acquire(&self.http, spec).await,
                    Target::Semaphore { .. } => Err(Error::Config(
                        "Consul semaphores are not available in this build yet".into(),
                    )),
                }
            }
            .instrument(span),
        )
    }

    fn check_sequencer<'a>(&'a self, sequencer: &'a Sequencer) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(leader::check_sequencer(&self.http, sequencer))
    }
}
