//! [`Amqp`]'s public constructors and its [`Backend`] implementation: the top of the crate,
//! over the builder, the administration and the client.

use lease_core::backend::Reachability;
use lease_core::{Backend, BackendKind, BoxFuture, Error, Lease, LeaseSpec, Sequencer};

use super::admin::Admin;
use super::builder::AmqpBuilder;
use super::client;
use super::handle::Amqp;

impl Amqp {
    /// A builder for the broker at `url` (`amqp://user:password@host:port/vhost`, or `amqps://`
    /// for TLS; the vhost percent-encoded, `%2f` for `/`).
    pub fn builder(url: impl Into<String>) -> AmqpBuilder {
        AmqpBuilder::new(url)
    }

    /// The backend for `url` with the default settings.
    pub fn new(url: impl Into<String>) -> Result<Amqp, Error> {
        Self::builder(url).build()
    }

    /// The backend for the URL in `AMQP_URL`, or [`DEFAULT_AMQP_URL`](crate::DEFAULT_AMQP_URL) when it is not set.
    pub fn from_env() -> Result<Amqp, Error> {
        AmqpBuilder::from_env().build()
    }

    /// The administration of this broker's semaphores (create, destroy, add and remove slots).
    pub fn admin(&self) -> Admin {
        Admin::new(self.clone())
    }
}

impl Backend for Amqp {
    fn acquire<'a>(&'a self, spec: &'a LeaseSpec) -> BoxFuture<'a, Result<Lease, Error>> {
        lease_core::backend::instrument_acquire(
            BackendKind::Amqp,
            spec,
            client::acquire(self, spec),
        )
    }

    /// Verifies a sequencer this handle issued: its lease still holds the slot, and the slot
    /// queue `A[L]` still exists (one confirmed probe).
    ///
    /// RabbitMQ records no acquisition number: another process's holder queue shows that the
    /// slot is held, not by which acquisition. So a sequencer issued by another process, whose
    /// slot is held, is answered with [`Error::Unsupported`]; verify such work in the process
    /// that holds the lease, or use a backend whose sequencers can be checked anywhere (Consul).
    fn check_sequencer<'a>(&'a self, sequencer: &'a Sequencer) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(client::check_sequencer(self, sequencer))
    }

    /// Reachable while one of this handle's connections to the broker is up; with none, what
    /// the last attempt to connect found; unknown before the first. While unreachable, the
    /// handle connects again about every second in the background (and closes that connection
    /// at once), until the broker answers.
    fn reachability(&self) -> Reachability {
        self.inner.probe.watch(
            &self.inner,
            |inner| inner.connections.reachability(),
            |inner| async move {
                inner.connections.probe(&inner.config).await;
            },
        )
    }

    /// Gives every lease back (lease-core's holder tasks), then closes the connections.
    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            self.inner.keepers.shutdown().await;
            let timeout = self.inner.config.operation_timeout;
            self.inner.connections.close_all(timeout).await;
        })
    }
}
