//! How to reach RabbitMQ and how the AMQP backend behaves: [`AmqpBuilder`] and [`LossDetection`].
//!
//! The URL carries the credentials; everything that prints the configuration (`Debug`, logs,
//! errors) uses [`AmqpConfig::redacted_url`], which never shows the password.

use std::fmt;
use std::time::Duration;

use lapin::uri::AMQPUri;

use super::config::{AmqpConfig, LossDetection};
use super::handle::Amqp;
use lease_core::Error;

/// The environment variable [`Amqp::from_env`] reads the broker's URL from.
pub const AMQP_URL_ENV: &str = "AMQP_URL";
/// The URL used when none is configured: a local broker's default account and vhost.
pub const DEFAULT_AMQP_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";
/// The default AMQP heartbeat. A dead peer is noticed within about two heartbeats.
pub const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(10);
/// How many connections an [`Amqp`] backend opens at most, unless
/// [`AmqpBuilder::max_connections`] says otherwise.
pub const DEFAULT_MAX_CONNECTIONS: u32 = 8;

/// Builds an [`Amqp`] backend: `Amqp::builder(url)…build()`.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use lease_amqp::Amqp;
///
/// let amqp = Amqp::builder("amqp://app:secret@rabbit.internal:5672/%2f")
///     .heartbeat(Duration::from_secs(5))
///     .build()?;
/// assert!(!format!("{amqp:?}").contains("secret"));
/// # Ok::<(), lease_core::Error>(())
/// ```
#[must_use]
pub struct AmqpBuilder {
    url: String,
    heartbeat: Option<Duration>,
    connect_timeout: Duration,
    operation_timeout: Duration,
    race_retries: u32,
    loss_detection: LossDetection,
    connection_name: Option<String>,
    overshoot: u32,
    max_connections: u32,
    url_from_env: bool,
}

impl fmt::Debug for AmqpBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The URL may carry a password: show only that one was given.
        f.debug_struct("AmqpBuilder")
            .field("heartbeat", &self.heartbeat)
            .field("loss_detection", &self.loss_detection)
            .finish_non_exhaustive()
    }
}

impl AmqpBuilder {
    pub(crate) fn new(url: impl Into<String>) -> Self {
        AmqpBuilder {
            url: url.into(),
            heartbeat: None,
            connect_timeout: Duration::from_secs(10),
            operation_timeout: Duration::from_secs(10),
            race_retries: 16,
            loss_detection: LossDetection::default(),
            connection_name: None,
            overshoot: 0,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            url_from_env: false,
        }
    }

    /// The builder of [`Amqp::from_env`]: hints name `AMQP_URL`.
    pub(crate) fn from_env() -> Self {
        let url = std::env::var(AMQP_URL_ENV).unwrap_or_else(|_| DEFAULT_AMQP_URL.to_owned());
        AmqpBuilder {
            url_from_env: true,
            ..AmqpBuilder::new(url)
        }
    }

    /// The AMQP heartbeat, 1 s to 10 min. Default: the URL's `?heartbeat=` or
    /// [`DEFAULT_HEARTBEAT`] (10 s); the broker may negotiate it lower.
    ///
    /// A holder confirms its channel with the broker every quarter heartbeat and self-fences
    /// (loses the lease with [`LostReason::SelfFenced`](lease_core::LostReason::SelfFenced)) when it
    /// has had no answer for three quarters of one, before the broker could decide the
    /// connection is dead and hand the slot to someone else.
    pub fn heartbeat(mut self, heartbeat: Duration) -> Self {
        self.heartbeat = Some(heartbeat);
        self
    }

    /// How long to wait for the TCP connection and AMQP handshake. Default 10 s.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long to wait for any single broker operation (declare, delete, publish confirm)
    /// before reporting the broker unreachable. Default 10 s.
    pub fn operation_timeout(mut self, timeout: Duration) -> Self {
        self.operation_timeout = timeout;
        self
    }

    /// How many times in a row an acquirer may lose the race for a free slot (RESOURCE_LOCKED)
    /// before acquire fails with [`AmqpError::Contended`](crate::AmqpError::Contended). Default 16.
    pub fn race_retries(mut self, retries: u32) -> Self {
        self.race_retries = retries;
        self
    }

    /// How a holder learns that an administrator removed its slot. Default:
    /// [`LossDetection::ConsumerCancel`].
    pub fn loss_detection(mut self, loss_detection: LossDetection) -> Self {
        self.loss_detection = loss_detection;
        self
    }

    /// The connection name shown by the RabbitMQ management UI and `rabbitmqctl
    /// list_connections client_properties`.
    pub fn connection_name(mut self, name: impl Into<String>) -> Self {
        self.connection_name = Some(name.into());
        self
    }

    /// Overshoot T (as amqp-locks defines it): administration also deletes slot queues up to T above the
    /// semaphore's last slot, to clean up after other tools. Default 0.
    pub fn overshoot(mut self, overshoot: u32) -> Self {
        self.overshoot = overshoot;
        self
    }

    /// How many connections to the broker this backend may open. Default
    /// [`DEFAULT_MAX_CONNECTIONS`] (8).
    ///
    /// Each held lease keeps one channel open, and a connection carries at most the
    /// `channel_max` negotiated with the broker (RabbitMQ's default 2047, set by `channel_max`
    /// in rabbitmq.conf; the URL's `?channel_max=` can only lower it) less a few channels kept
    /// for acquiring and releasing: 2,039 leases per connection at the defaults. Leases beyond that go on
    /// another connection; once `max_connections` connections are full, acquire fails with
    /// [`AmqpError::ChannelsExhausted`](crate::AmqpError::ChannelsExhausted) and the leases already held are untouched.
    pub fn max_connections(mut self, connections: u32) -> Self {
        self.max_connections = connections;
        self
    }

    /// Validates the configuration. Does not connect: the first acquire does.
    pub fn build(self) -> Result<Amqp, Error> {
        let mut uri: AMQPUri = self.url.parse().map_err(|reason: String| {
            Error::config(format!(
                "the AMQP URL is not valid ({reason}); expected amqp://user:password@host:port/vhost \
                 or amqps://… with the vhost percent-encoded (%2f for /)"
            ))
        })?;
        let heartbeat = match (self.heartbeat, uri.query.heartbeat) {
            (Some(h), _) => h,
            (None, Some(secs)) => Duration::from_secs(u64::from(secs)),
            (None, None) => DEFAULT_HEARTBEAT,
        };
        if heartbeat.is_zero() || heartbeat.subsec_nanos() != 0 || heartbeat.as_secs() > 600 {
            return Err(Error::config(format!(
                "AMQP heartbeat {heartbeat:?}: use whole seconds from 1 s to 600 s; \
                 leases need heartbeats to notice a dead connection"
            )));
        }
        let secs = u16::try_from(heartbeat.as_secs()).unwrap_or(600);
        uri.query.heartbeat = Some(secs);
        if let LossDetection::Verify { period } = self.loss_detection {
            if period.is_zero() {
                return Err(Error::config(
                    "LossDetection::Verify needs a period above zero",
                ));
            }
        }
        if self.max_connections == 0 {
            return Err(Error::config(
                "AmqpBuilder::max_connections must be at least 1",
            ));
        }
        if self.connect_timeout.is_zero() || self.operation_timeout.is_zero() {
            return Err(Error::config(
                "AMQP connect and operation timeouts must be above zero",
            ));
        }
        let port_given = lease_core::address::has_port(&self.url);
        Ok(Amqp::with_config(AmqpConfig {
            port_given,
            uri,
            heartbeat,
            connect_timeout: self.connect_timeout,
            operation_timeout: self.operation_timeout,
            race_retries: self.race_retries,
            loss_detection: self.loss_detection,
            connection_name: self.connection_name,
            overshoot: self.overshoot,
            max_connections: self.max_connections,
            url_from_env: self.url_from_env,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_unreachable_hint_names_where_the_url_came_from() {
        let from_env = AmqpBuilder::from_env().build().unwrap();
        assert!(from_env.config().unreachable_hint().contains("AMQP_URL"));
        let built = AmqpBuilder::new(DEFAULT_AMQP_URL).build().unwrap();
        let hint = built.config().unreachable_hint();
        assert!(
            hint.contains("Amqp::builder") && !hint.contains("AMQP_URL"),
            "{hint}"
        );
    }

    #[test]
    fn debug_and_redacted_url_hide_the_password() {
        let amqp = AmqpBuilder::new("amqp://user:hunter2@example.com:5673/prod")
            .build()
            .expect("valid in this test");
        let text = format!("{amqp:?}");
        assert!(!text.contains("hunter2"), "{text}");
        assert!(text.contains("amqp://user@example.com:5673/prod"), "{text}");
        let builder = AmqpBuilder::new("amqp://user:hunter2@example.com");
        assert!(!format!("{builder:?}").contains("hunter2"));
    }

    #[test]
    fn errors_say_which_port_was_assumed() {
        let amqp = AmqpBuilder::new("amqp://user:hunter2@rabbit.internal/%2f")
            .build()
            .expect("valid in this test");
        let described = amqp.config().described_url();
        assert_eq!(
            described,
            "amqp://user@rabbit.internal:5672/%2f (the URL gives no port, so amqp's default 5672 \
             was assumed)"
        );
        let amqps = AmqpBuilder::new("amqps://rabbit.internal/%2f")
            .build()
            .expect("valid in this test");
        assert!(
            amqps
                .config()
                .described_url()
                .contains("amqps's default 5671 was assumed"),
            "{}",
            amqps.config().described_url()
        );
        let given = AmqpBuilder::new("amqp://user:hunter2@rabbit.internal:5673/%2f")
            .build()
            .expect("valid in this test");
        assert_eq!(
            given.config().described_url(),
            "amqp://user@rabbit.internal:5673/%2f"
        );
    }

    #[test]
    fn max_connections_defaults_and_validation() {
        let amqp = AmqpBuilder::new(DEFAULT_AMQP_URL)
            .build()
            .expect("valid in this test");
        assert_eq!(amqp.config().max_connections, DEFAULT_MAX_CONNECTIONS);
        assert!(matches!(
            AmqpBuilder::new(DEFAULT_AMQP_URL).max_connections(0).build(),
            Err(Error::Config { message, .. }) if message.contains("max_connections")
        ));
    }

    #[test]
    fn heartbeat_defaults_and_validation() {
        let amqp = AmqpBuilder::new(DEFAULT_AMQP_URL)
            .build()
            .expect("valid in this test");
        assert_eq!(amqp.config().heartbeat, DEFAULT_HEARTBEAT);
        let amqp = AmqpBuilder::new("amqp://localhost/%2f?heartbeat=3")
            .build()
            .expect("valid in this test");
        assert_eq!(amqp.config().heartbeat, Duration::from_secs(3));
        assert!(matches!(
            AmqpBuilder::new(DEFAULT_AMQP_URL)
                .heartbeat(Duration::ZERO)
                .build(),
            Err(Error::Config { .. })
        ));
        assert!(matches!(
            AmqpBuilder::new("http://localhost").build(),
            Err(Error::Config { .. })
        ));
    }
}
