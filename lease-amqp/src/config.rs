//! The validated configuration of an [`Amqp`](crate::Amqp) backend ([`AmqpConfig`]), and how a
//! holder learns of a lost slot ([`LossDetection`]).

use std::fmt;
use std::time::Duration;

use lapin::uri::AMQPUri;

/// How a holder learns that an administrator removed its slot `A[L]`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum LossDetection {
    /// Consume from `A[L]`; RabbitMQ cancels the consumer when the queue is deleted. No polling.
    #[default]
    ConsumerCancel,
    /// Probe `A[L]` every `period` (a confirmed publish each time).
    Verify {
        /// Time between probes.
        period: Duration,
    },
}

/// The validated configuration of an [`Amqp`] backend.
#[derive(Clone)]
pub(crate) struct AmqpConfig {
    pub(crate) uri: AMQPUri,
    pub(crate) heartbeat: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) operation_timeout: Duration,
    pub(crate) race_retries: u32,
    pub(crate) loss_detection: LossDetection,
    pub(crate) connection_name: Option<String>,
    pub(crate) overshoot: u32,
    pub(crate) max_connections: u32,
    /// Whether the URL gives the port (else the scheme's default was assumed).
    pub(crate) port_given: bool,
    /// Whether the URL came from `AMQP_URL` (or its default) through [`Amqp::from_env`], so
    /// hints name the setting the user changes.
    pub(crate) url_from_env: bool,
}

impl AmqpConfig {
    /// What to do when the broker cannot be reached, naming where the URL came from.
    pub(crate) fn unreachable_hint(&self) -> &'static str {
        if self.url_from_env {
            "start it with `rabbitmq-server -detached`, or set AMQP_URL to the broker's amqp:// URL"
        } else {
            "start it with `rabbitmq-server -detached`, or give `Amqp::builder` the broker's \
             amqp:// URL"
        }
    }

    /// The URL without its password, saying which port was assumed if the URL gives none: for
    /// errors about reaching the broker.
    pub(crate) fn described_url(&self) -> String {
        let url = self.redacted_url();
        if self.port_given {
            return url;
        }
        format!(
            "{url} (the URL gives no port, so {}'s default {} was assumed)",
            self.uri.scheme, self.uri.authority.port
        )
    }

    /// The URL without its password, for logs and errors.
    pub(crate) fn redacted_url(&self) -> String {
        let a = &self.uri.authority;
        let user = if a.userinfo.username.is_empty() {
            String::new()
        } else {
            format!("{}@", a.userinfo.username)
        };
        let vhost = if self.uri.vhost == "/" {
            "%2f"
        } else {
            &self.uri.vhost
        };
        format!("{}://{user}{}:{}/{vhost}", self.uri.scheme, a.host, a.port)
    }
}

impl fmt::Debug for AmqpConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AmqpConfig")
            .field("url", &self.redacted_url())
            .field("heartbeat", &self.heartbeat)
            .field("connect_timeout", &self.connect_timeout)
            .field("operation_timeout", &self.operation_timeout)
            .field("race_retries", &self.race_retries)
            .field("loss_detection", &self.loss_detection)
            .field("connection_name", &self.connection_name)
            .field("overshoot", &self.overshoot)
            .field("max_connections", &self.max_connections)
            .finish()
    }
}
