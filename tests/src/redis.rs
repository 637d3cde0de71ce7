//! A real `redis-server` per test, on a free loopback port, its files in a temporary directory,
//! killed when dropped; restarted, paused and resumed on demand; and the operator's plain
//! commands (`DEL`, `CLIENT KILL`, `INFO`) on a connection of the test's own.
//!
//! The binary is `REDIS_SERVER_BIN`, else `redis-server` on `PATH` (Debian's `redis-server`
//! package; `scripts/test.sh` installs it when missing). Its log goes under
//! `target/redis-logs/`, whose path is printed when it fails to start. A replica and a sentinel
//! ([`Server::replica_of`], [`Sentinel`]) are the same binary in other modes.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};
use tokio::time::Instant;

use crate::consul::{free_port, workspace_root};

/// How long a start may take before it is an error.
pub const READY_WITHIN: Duration = Duration::from_secs(20);

/// The redis-server binary.
pub fn redis_server_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("REDIS_SERVER_BIN") {
        return PathBuf::from(bin);
    }
    let found = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .map(|dir| dir.join("redis-server"))
        .find(|bin| bin.exists());
    found.unwrap_or_else(|| {
        panic!(
            "redis-server is needed for this test and is not on PATH: install it (apt-get \
             install redis-server; scripts/test.sh does so as root) or set REDIS_SERVER_BIN"
        )
    })
}

/// One `redis-server` (or sentinel) process and its files.
#[derive(Debug)]
pub struct Server {
    port: u16,
    dir: PathBuf,
    log: PathBuf,
    args: Vec<String>,
    child: Option<Child>,
    /// The CA that signed a TLS server's certificate; `None` for a plain server.
    ca: Option<PathBuf>,
}

impl Server {
    /// A fresh server on a free port, without persistence.
    pub async fn start() -> Server {
        Server::with_args(&[]).await
    }

    /// A fresh server with `extra` arguments (`--save 60 1`, `--requirepass x`, …).
    pub async fn with_args(extra: &[&str]) -> Server {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("lease-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a directory for redis-server");
        let logs = workspace_root().join("target/redis-logs");
        std::fs::create_dir_all(&logs).expect("target/redis-logs");
        let log = logs.join(format!("redis-{port}.log"));
        let mut args: Vec<String> = [
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--dir",
            &dir.to_string_lossy(),
            "--logfile",
            &log.to_string_lossy(),
            // Tests kill clients and connect many: no limits of the server's in the way.
            "--maxclients",
            "10000",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        let mut server = Server {
            port,
            dir,
            log,
            args,
            child: None,
            ca: None,
        };
        server.spawn().await;
        server
    }

    /// A fresh server that speaks only TLS on its port, with a certificate for `localhost` and
    /// `127.0.0.1` signed by a CA of its own ([`Server::ca`]), made with `openssl`. Clients need
    /// no certificate of their own.
    pub async fn tls() -> Server {
        let port = free_port();
        let dir =
            std::env::temp_dir().join(format!("lease-redis-tls-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a directory for the certificates");
        let openssl = |args: &[&str]| {
            let status = std::process::Command::new("openssl")
                .args(args)
                .current_dir(&dir)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .unwrap_or_else(|e| panic!("openssl is needed for the TLS test: {e}"));
            assert!(status.success(), "openssl {args:?} failed");
        };
        openssl(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "2",
            "-subj",
            "/CN=lease test CA",
        ]);
        openssl(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=localhost",
        ]);
        std::fs::write(
            dir.join("san.ext"),
            "subjectAltName=DNS:localhost,IP:127.0.0.1\n",
        )
        .expect("the certificate's names");
        openssl(&[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.pem",
            "-days",
            "2",
            "-extfile",
            "san.ext",
        ]);
        let logs = workspace_root().join("target/redis-logs");
        std::fs::create_dir_all(&logs).expect("target/redis-logs");
        let log = logs.join(format!("redis-tls-{port}.log"));
        let path = |name: &str| dir.join(name).to_string_lossy().into_owned();
        let args = vec![
            "--port".to_owned(),
            "0".to_owned(),
            "--tls-port".to_owned(),
            port.to_string(),
            "--tls-cert-file".to_owned(),
            path("server.pem"),
            "--tls-key-file".to_owned(),
            path("server.key"),
            "--tls-ca-cert-file".to_owned(),
            path("ca.pem"),
            "--tls-auth-clients".to_owned(),
            "no".to_owned(),
            "--bind".to_owned(),
            "127.0.0.1".to_owned(),
            "--save".to_owned(),
            String::new(),
            "--dir".to_owned(),
            dir.to_string_lossy().into_owned(),
            "--logfile".to_owned(),
            log.to_string_lossy().into_owned(),
        ];
        let mut server = Server {
            port,
            ca: Some(dir.join("ca.pem")),
            dir,
            log,
            args,
            child: None,
        };
        server.spawn().await;
        server
    }

    /// The CA that signed a TLS server's certificate.
    pub fn ca(&self) -> Option<&std::path::Path> {
        self.ca.as_deref()
    }

    /// A replica of `master`, on a free port.
    pub async fn replica_of(master: &Server) -> Server {
        let port = master.port.to_string();
        Server::with_args(&["--replicaof", "127.0.0.1", &port]).await
    }

    async fn spawn(&mut self) {
        let child = Command::new(redis_server_bin())
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start redis-server: {e}"));
        self.child = Some(child);
        let deadline = Instant::now() + READY_WITHIN;
        while Instant::now() < deadline {
            if self.ping().await {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!(
            "redis-server on port {} did not answer within {READY_WITHIN:?}; its log: {}",
            self.port,
            self.log.display()
        );
    }

    async fn ping(&self) -> bool {
        if self.ca.is_some() {
            // TLS only: listening is what a test can see without a TLS client of its own.
            return tokio::net::TcpStream::connect(self.addr()).await.is_ok();
        }
        match self.connection().await {
            Some(mut conn) => redis::cmd("PING")
                .query_async::<String>(&mut conn)
                .await
                .is_ok(),
            None => false,
        }
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The server's address.
    pub fn addr(&self) -> std::net::SocketAddr {
        std::net::SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// A connection of the test's own (RESP2), or `None` if the server does not answer.
    pub async fn connection(&self) -> Option<redis::aio::MultiplexedConnection> {
        let client = redis::Client::open(self.url()).ok()?;
        tokio::time::timeout(
            Duration::from_secs(2),
            client.get_multiplexed_async_connection(),
        )
        .await
        .ok()?
        .ok()
    }

    /// Runs one command on a connection of the test's own.
    pub async fn cmd<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> T {
        let mut conn = self
            .connection()
            .await
            .unwrap_or_else(|| panic!("redis-server on port {} does not answer", self.port));
        cmd.query_async(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("{cmd:?} failed: {e}"))
    }

    /// `DEL key`: how many keys went.
    pub async fn del(&self, key: &str) -> u64 {
        self.cmd(redis::cmd("DEL").arg(key)).await
    }

    /// `CLIENT KILL TYPE normal` and `TYPE pubsub`: every client connection but the test's.
    pub async fn kill_clients(&self) -> u64 {
        let normal: u64 = self
            .cmd(
                redis::cmd("CLIENT")
                    .arg("KILL")
                    .arg("TYPE")
                    .arg("normal")
                    .arg("SKIPME")
                    .arg("yes"),
            )
            .await;
        let pubsub: u64 = self
            .cmd(redis::cmd("CLIENT").arg("KILL").arg("TYPE").arg("pubsub"))
            .await;
        normal + pubsub
    }

    /// How many clients are connected (`INFO clients`), the test's own query not counted.
    pub async fn clients(&self) -> u64 {
        let info: String = self.cmd(redis::cmd("INFO").arg("clients")).await;
        let connected = info
            .lines()
            .find_map(|line| line.strip_prefix("connected_clients:"))
            .and_then(|n| n.trim().parse::<u64>().ok())
            .unwrap_or_default();
        connected.saturating_sub(1)
    }

    /// The server's count of commands processed (`INFO stats`), the query itself included.
    pub async fn commands_processed(&self) -> u64 {
        let info: String = self.cmd(redis::cmd("INFO").arg("stats")).await;
        info.lines()
            .find_map(|line| line.strip_prefix("total_commands_processed:"))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_default()
    }

    /// Requests clients sent (`INFO commandstats`): script calls, pings, subscriptions and the
    /// connections' set-up, not the commands a script runs inside, nor `INFO` itself.
    pub async fn client_requests(&self) -> u64 {
        let info: String = self.cmd(redis::cmd("INFO").arg("commandstats")).await;
        const SENT: [&str; 9] = [
            "evalsha",
            "eval",
            "ping",
            "subscribe",
            "unsubscribe",
            "client|tracking",
            "hello",
            "wait",
            "role",
        ];
        info.lines()
            .filter_map(|line| {
                let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(':')?;
                SENT.contains(&name).then_some(rest)
            })
            .filter_map(|rest| {
                rest.split(',')
                    .find_map(|field| field.strip_prefix("calls="))
                    .and_then(|n| n.parse::<u64>().ok())
            })
            .sum()
    }

    /// Kills the server (`SIGKILL`): every key goes (no persistence).
    pub async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill().await;
        }
    }

    /// Kills the server and starts it again on the same port, empty.
    pub async fn restart(&mut self) {
        self.kill().await;
        self.spawn().await;
    }

    /// Stops the server (`SIGSTOP`): connections stay open, nothing answers.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Resumes a paused server (`SIGCONT`).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        let Some(pid) = self.child.as_ref().and_then(Child::id) else {
            return;
        };
        let _ = std::process::Command::new("kill")
            .arg(signal)
            .arg(pid.to_string())
            .status();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.start_kill();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A sentinel watching one master (named `mymaster`, quorum 1), failing it over after
/// `down_after`.
#[derive(Debug)]
pub struct Sentinel {
    server: Server,
}

impl Sentinel {
    /// The master's name the sentinel knows.
    pub const MASTER: &'static str = "mymaster";

    /// A sentinel of `master`, on a free port.
    pub async fn watching(master: &Server, down_after: Duration) -> Sentinel {
        let port = free_port();
        let dir =
            std::env::temp_dir().join(format!("lease-sentinel-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a directory for the sentinel");
        let conf = dir.join("sentinel.conf");
        let millis = down_after.as_millis();
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {dir}\nsentinel monitor {m} 127.0.0.1 {mp} 1\n\
                 sentinel down-after-milliseconds {m} {millis}\nsentinel failover-timeout {m} 10000\n\
                 sentinel parallel-syncs {m} 1\n",
                dir = dir.display(),
                m = Self::MASTER,
                mp = master.port,
            ),
        )
        .expect("the sentinel's configuration");
        let logs = workspace_root().join("target/redis-logs");
        let log = logs.join(format!("sentinel-{port}.log"));
        let mut server = Server {
            port,
            dir,
            log: log.clone(),
            args: vec![
                conf.to_string_lossy().into_owned(),
                "--sentinel".to_owned(),
                "--logfile".to_owned(),
                log.to_string_lossy().into_owned(),
            ],
            child: None,
            ca: None,
        };
        server.spawn().await;
        Sentinel { server }
    }

    /// `redis+sentinel://127.0.0.1:<port>/mymaster`.
    pub fn url(&self) -> String {
        format!(
            "redis+sentinel://127.0.0.1:{}/{}",
            self.server.port,
            Self::MASTER
        )
    }

    /// The master's port, as the sentinel names it now.
    pub async fn master_port(&self) -> u16 {
        let (_, port): (String, u16) = self
            .server
            .cmd(
                redis::cmd("SENTINEL")
                    .arg("get-master-addr-by-name")
                    .arg(Self::MASTER),
            )
            .await;
        port
    }
}
