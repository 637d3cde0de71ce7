//! The real RabbitMQ the AMQP tests and benchmark talk to, and the operator actions they perform.
//!
//! The broker is `LEASE_TEST_AMQP_URL`, by default the local `amqp://guest:guest@127.0.0.1:5672/%2f`.
//! [`require_broker`] fails the test with the command that starts one when it is not there.
//! Connections are given unique names so [`close_connection`] can find one with `rabbitmqctl`.

use std::net::SocketAddr;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lease_amqp::{Amqp, AmqpBuilder};

/// The environment variable naming the broker for the tests.
pub const URL_ENV: &str = "LEASE_TEST_AMQP_URL";
/// The broker used when `LEASE_TEST_AMQP_URL` is not set.
pub const DEFAULT_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

/// The broker's URL for the tests.
pub fn url() -> String {
    std::env::var(URL_ENV).unwrap_or_else(|_| DEFAULT_URL.to_owned())
}

/// The broker's `host:port`, resolved.
pub fn broker_addr() -> SocketAddr {
    let url = url();
    let rest = url.split_once("://").map_or(url.as_str(), |(_, r)| r);
    let authority = rest.split('/').next().unwrap_or(rest);
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let host_port = if host_port.contains(':') {
        host_port.to_owned()
    } else {
        format!("{host_port}:5672")
    };
    std::net::ToSocketAddrs::to_socket_addrs(&host_port)
        .ok()
        .and_then(|mut addrs| addrs.next())
        .unwrap_or_else(|| panic!("cannot resolve the RabbitMQ address {host_port:?} of {URL_ENV}"))
}

/// Fails (panics) unless the broker accepts TCP connections, saying how to start one.
pub async fn require_broker() {
    let addr = broker_addr();
    let connect = tokio::net::TcpStream::connect(addr);
    match tokio::time::timeout(Duration::from_secs(5), connect).await {
        Ok(Ok(_)) => {}
        other => panic!(
            "RabbitMQ is not reachable at {addr} ({other:?}). Start it with \
             `rabbitmq-server -detached` (as root), or point {URL_ENV} at a running broker."
        ),
    }
}

/// A name no other test (or run) uses: `prefix` plus the process id, time and a counter.
pub fn unique(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    format!("test/{prefix}/{}-{nanos}-{n}", std::process::id())
}

/// A builder for the test broker whose connection is named `connection_name`.
pub fn builder(connection_name: &str) -> AmqpBuilder {
    Amqp::builder(url()).connection_name(connection_name)
}

/// A backend on the test broker with its own connection, named uniquely; returns the name too.
pub fn backend() -> (Amqp, String) {
    let name = unique("conn");
    let amqp = builder(&name).build().expect("the test URL is valid");
    (amqp, name)
}

fn rabbitmqctl(args: &[&str]) -> String {
    let output = Command::new("rabbitmqctl")
        .args(args)
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run rabbitmqctl ({e}); install RabbitMQ's CLI and run the tests as root")
        });
    assert!(
        output.status.success(),
        "rabbitmqctl {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The broker-side process id of the connection named `connection_name`, if it is open.
pub fn connection_pid(connection_name: &str) -> Option<String> {
    let listing = rabbitmqctl(&["-q", "list_connections", "pid", "client_properties"]);
    let needle = format!("{{\"connection_name\",\"{connection_name}\"}}");
    listing
        .lines()
        .find(|line| line.contains(&needle))
        .and_then(|line| line.split('\t').next())
        .map(str::to_owned)
}

/// The broker-side process ids of every open connection named `connection_name` (a backend's
/// pooled connections share its name).
pub fn connection_pids(connection_name: &str) -> Vec<String> {
    let needle = format!("{{\"connection_name\",\"{connection_name}\"}}");
    rabbitmqctl(&["-q", "list_connections", "pid", "client_properties"])
        .lines()
        .filter(|line| line.contains(&needle))
        .filter_map(|line| line.split('\t').next())
        .map(str::to_owned)
        .collect()
}

/// Closes the connection named `connection_name` from the broker side, as an operator would
/// (`rabbitmqctl close_connection`). Panics if no such connection is open.
pub fn close_connection(connection_name: &str) {
    let pid = connection_pid(connection_name).unwrap_or_else(|| {
        let listing = rabbitmqctl(&["-q", "list_connections", "pid", "client_properties"]);
        panic!("no open connection named {connection_name:?} in:\n{listing}")
    });
    close_connection_pid(&pid);
}

/// Closes the broker connection with process id `pid` (from [`connection_pid`]).
pub fn close_connection_pid(pid: &str) {
    rabbitmqctl(&["close_connection", pid, "closed by the lease tests"]);
}

/// The queues whose names start with `prefix`, with how many messages each holds
/// (`rabbitmqctl list_queues name messages`).
pub fn queues(prefix: &str) -> Vec<(String, u64)> {
    rabbitmqctl(&["-q", "list_queues", "name", "messages"])
        .lines()
        .filter_map(|line| {
            let (name, messages) = line.split_once('\t')?;
            let messages = messages.trim().parse().ok()?;
            name.starts_with(prefix)
                .then(|| (name.to_owned(), messages))
        })
        .collect()
}

/// The open channels of each broker connection named `connection_name`
/// (`rabbitmqctl list_connections channels client_properties`), one entry per connection.
pub fn connection_channels(connection_name: &str) -> Vec<u64> {
    let needle = format!("{{\"connection_name\",\"{connection_name}\"}}");
    rabbitmqctl(&["-q", "list_connections", "channels", "client_properties"])
        .lines()
        .filter(|line| line.contains(&needle))
        .filter_map(|line| line.split('\t').next()?.trim().parse().ok())
        .collect()
}

/// How many consumers the broker has on queues whose names start with `prefix`
/// (`rabbitmqctl list_consumers queue_name`).
pub fn consumers(prefix: &str) -> usize {
    rabbitmqctl(&["-q", "list_consumers", "queue_name"])
        .lines()
        .filter(|line| line.starts_with(prefix))
        .count()
}

/// The URL of the test broker with `?channel_max=` (the client's offer; the lower of it and the
/// broker's is negotiated) set to `channel_max`.
pub fn url_with_channel_max(channel_max: u16) -> String {
    let url = url();
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}channel_max={channel_max}")
}

/// A broker user that may open connections to the default vhost `/` but may configure, write
/// and read no queue or exchange there; deleted when dropped.
#[derive(Debug)]
pub struct UnprivilegedUser {
    /// The user name (unique to this test run).
    pub name: String,
    /// Its password.
    pub password: String,
}

impl UnprivilegedUser {
    /// Creates the user (`rabbitmqctl add_user`, `set_permissions -p / <user> '^$' '^$' '^$'`).
    pub fn create() -> UnprivilegedUser {
        let name = unique("user").replace('/', "-");
        let password = "lease-test-password".to_owned();
        rabbitmqctl(&["add_user", &name, &password]);
        let user = UnprivilegedUser { name, password };
        rabbitmqctl(&["set_permissions", "-p", "/", &user.name, "^$", "^$", "^$"]);
        user
    }

    /// The test broker's URL, logged in as this user.
    pub fn url(&self) -> String {
        format!(
            "amqp://{}:{}@{}/%2f",
            self.name,
            self.password,
            broker_addr()
        )
    }
}

impl Drop for UnprivilegedUser {
    fn drop(&mut self) {
        let _ = Command::new("rabbitmqctl")
            .args(["delete_user", &self.name])
            .output();
    }
}
