//! A real `consul agent -dev` per test, on free loopback ports, killed when dropped.
//!
//! The binary comes from `CONSUL_BIN`, else `consul` on `PATH`, else `scripts/ensure-consul.sh`
//! (which fetches Debian's consul 1.8.7 into `tools/`). The agent's output goes to a log file
//! under `target/consul-logs/` whose path is printed when a test fails to start it.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Duration;

use lease_consul::Consul;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::overlap::now_ns;

/// The consul binary the tests use, found once per process.
pub fn consul_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        ensured_tool(
            "CONSUL_BIN",
            "scripts/ensure-consul.sh",
            "Consul is needed for this test",
            "install consul 1.8 and put it on PATH, or set CONSUL_BIN",
        )
    })
    .clone()
}

/// The path in `$env_var`, else what `script` (a `scripts/ensure-*.sh`, which fetches the tool
/// when it is missing) prints. Panics with `needed` and `instead` when the script fails.
pub fn ensured_tool(env_var: &str, script: &str, needed: &str, instead: &str) -> PathBuf {
    if let Some(bin) = std::env::var_os(env_var) {
        return PathBuf::from(bin);
    }
    let script = workspace_root().join(script);
    let out = std::process::Command::new("bash")
        .arg(&script)
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    assert!(
        out.status.success(),
        "{needed} and {} could not provide it; {instead}",
        script.display()
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// The workspace's root directory.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ sits in the workspace")
        .to_path_buf()
}

pub(crate) fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("no free loopback port")
}

/// How an agent is started.
#[derive(Clone, Debug, Default)]
pub struct AgentOptions {
    /// Enable ACLs with default deny and this management token.
    pub acl_master_token: Option<String>,
    /// More agent configuration, in HCL (e.g. `limits { http_max_conns_per_client = 20 }`).
    pub extra_hcl: Option<String>,
    /// Also serve HTTPS, on a port of its own, with these certificates and `verify_incoming`:
    /// a client must present a certificate signed by the same CA.
    pub tls: Option<AgentTls>,
}

/// A CA, a server certificate and a client certificate made by `consul tls` (as an operator
/// makes them) in a directory of their own under `target/consul-tls/`. The server certificate
/// names `server.dc1.consul`, `localhost` and `127.0.0.1`; keys are SEC1 (EC) PEM.
#[derive(Clone, Debug)]
pub struct AgentTls {
    /// The CA certificate (PEM).
    pub ca: PathBuf,
    /// The agent's certificate and key.
    pub server_cert: PathBuf,
    /// The agent's key.
    pub server_key: PathBuf,
    /// A client certificate signed by the CA.
    pub client_cert: PathBuf,
    /// Its key.
    pub client_key: PathBuf,
}

impl AgentTls {
    /// Makes the certificates (`consul tls ca create`, `consul tls cert create -server` and
    /// `-client`).
    pub async fn create() -> AgentTls {
        let dir = workspace_root()
            .join("target/consul-tls")
            .join(crate::amqp::unique("tls").replace('/', "-"));
        std::fs::create_dir_all(&dir).expect("cannot create the certificate directory");
        for args in [
            &["tls", "ca", "create"][..],
            &["tls", "cert", "create", "-server", "-dc", "dc1"],
            &["tls", "cert", "create", "-client", "-dc", "dc1"],
        ] {
            let out = Command::new(consul_bin())
                .args(args)
                .current_dir(&dir)
                .stdin(Stdio::null())
                .output()
                .await
                .expect("cannot run consul");
            assert!(
                out.status.success(),
                "consul {args:?} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        AgentTls {
            ca: dir.join("consul-agent-ca.pem"),
            server_cert: dir.join("dc1-server-consul-0.pem"),
            server_key: dir.join("dc1-server-consul-0-key.pem"),
            client_cert: dir.join("dc1-client-consul-0.pem"),
            client_key: dir.join("dc1-client-consul-0-key.pem"),
        }
    }
}

/// A running dev agent.
#[derive(Debug)]
pub struct Agent {
    child: Child,
    http_addr: SocketAddr,
    https_addr: Option<SocketAddr>,
    api: Api,
    log: PathBuf,
}

/// An agent's operator HTTP API (shared by [`Agent`] and [`crate::cluster::Cluster`]).
#[derive(Clone, Debug)]
pub struct Api {
    base: String,
    http: reqwest::Client,
    token: Option<String>,
}

impl std::ops::Deref for Agent {
    type Target = Api;

    fn deref(&self) -> &Api {
        &self.api
    }
}

impl Agent {
    /// Starts a dev agent and waits (up to 30 s) until it has a cluster leader.
    pub async fn start() -> Agent {
        Self::start_with(AgentOptions::default()).await
    }

    /// Starts a dev agent with options.
    pub async fn start_with(options: AgentOptions) -> Agent {
        let mut last = String::new();
        // Free ports can be taken between choosing and binding; a few attempts make that moot.
        for _ in 0..3 {
            match Self::try_start(&options).await {
                Ok(agent) => return agent,
                Err(e) => last = e,
            }
        }
        panic!("could not start a Consul dev agent: {last}");
    }

    async fn try_start(options: &AgentOptions) -> Result<Agent, String> {
        let http_port = free_port();
        let https_port = options.tls.as_ref().map(|_| free_port());
        let mut hcl = format!(
            "ports {{ http = {http_port} https = {} dns = -1 grpc = -1 serf_lan = {} serf_wan = {} server = {} }}",
            https_port.map_or(-1, i32::from),
            free_port(),
            free_port(),
            free_port()
        );
        if let Some(tls) = &options.tls {
            hcl.push_str(&format!(
                " ca_file = {:?} cert_file = {:?} key_file = {:?} verify_incoming = true",
                tls.ca, tls.server_cert, tls.server_key
            ));
        }
        if let Some(token) = &options.acl_master_token {
            hcl.push_str(&format!(
                " acl {{ enabled = true default_policy = \"deny\" tokens {{ master = \"{token}\" agent = \"{token}\" }} }}"
            ));
        }
        if let Some(extra) = &options.extra_hcl {
            hcl.push(' ');
            hcl.push_str(extra);
        }
        let logs = workspace_root().join("target/consul-logs");
        std::fs::create_dir_all(&logs).map_err(|e| e.to_string())?;
        let log = logs.join(format!("agent-{http_port}.log"));
        let log_file = std::fs::File::create(&log).map_err(|e| e.to_string())?;
        let child = Command::new(consul_bin())
            .args([
                "agent",
                "-dev",
                "-client",
                "127.0.0.1",
                "-bind",
                "127.0.0.1",
            ])
            .args(["-log-level", "warn", "-hcl", &hcl])
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().map_err(|e| e.to_string())?)
            .stderr(log_file)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("cannot run {}: {e}", consul_bin().display()))?;
        let mut agent = Agent {
            child,
            http_addr: SocketAddr::from(([127, 0, 0, 1], http_port)),
            https_addr: https_port.map(|port| SocketAddr::from(([127, 0, 0, 1], port))),
            api: Api::new(
                SocketAddr::from(([127, 0, 0, 1], http_port)),
                options.acl_master_token.clone(),
            ),
            log,
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        // The agent offers no readiness event; poll its leader status until a leader exists.
        loop {
            if let Ok(Some(status)) = agent.child.try_wait() {
                return Err(format!(
                    "the agent exited with {status}; see {}",
                    agent.log.display()
                ));
            }
            // A leader, and the node's serfHealth check registered: sessions are refused with
            // "Missing check 'serfHealth' registration" until the leader has registered it.
            let leader = agent.get("/v1/status/leader").await.ok();
            let has_leader = leader
                .as_ref()
                .is_some_and(|l| l.as_str().is_some_and(|s| !s.is_empty()));
            if has_leader {
                let checks = agent.get("/v1/health/state/any").await.ok();
                let serf_health = checks
                    .as_ref()
                    .and_then(|c| c.as_array())
                    .is_some_and(|c| c.iter().any(|check| check["CheckID"] == "serfHealth"));
                if serf_health {
                    return Ok(agent);
                }
            }
            if tokio::time::Instant::now() > deadline {
                return Err(format!(
                    "no cluster leader after 30 s; see {}",
                    agent.log.display()
                ));
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// The HTTP address, `127.0.0.1:<port>`.
    pub fn addr(&self) -> SocketAddr {
        self.http_addr
    }

    /// The agent's process id, for faults (`kill -STOP`, see [`crate::workers::signal`]).
    pub fn pid(&self) -> u32 {
        self.child.id().expect("the agent is running")
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.http_addr)
    }

    /// The HTTPS address, `127.0.0.1:<port>`, of an agent started with [`AgentOptions::tls`].
    pub fn https_addr(&self) -> SocketAddr {
        self.https_addr
            .expect("the agent was started without AgentOptions::tls")
    }

    /// A backend talking to this agent (with the management token if ACLs are on).
    pub fn backend(&self) -> Consul {
        let mut builder = Consul::builder().address(self.url());
        if let Some(token) = &self.api.token {
            builder = builder.token(token);
        }
        builder.build().expect("valid test configuration")
    }

    /// A `consul` command whose `CONSUL_HTTP_ADDR` (and token) point at this agent.
    pub fn command(&self) -> Command {
        let mut cmd = Command::new(consul_bin());
        cmd.env("CONSUL_HTTP_ADDR", self.http_addr.to_string())
            .env_remove("CONSUL_HTTP_TOKEN")
            .env_remove("CONSUL_HTTP_TOKEN_FILE")
            .stdin(Stdio::null())
            .kill_on_drop(true);
        if let Some(token) = &self.api.token {
            cmd.env("CONSUL_HTTP_TOKEN", token);
        }
        cmd
    }
}

impl Api {
    /// The API of the agent whose HTTP address is `addr`.
    pub fn new(addr: SocketAddr, token: Option<String>) -> Api {
        Api {
            base: format!("http://{addr}"),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .expect("an HTTP client"),
            token,
        }
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let mut req = self.http.request(method, format!("{}{path}", self.base));
        if let Some(token) = &self.token {
            req = req.header("X-Consul-Token", token);
        }
        req
    }

    pub(crate) async fn get(&self, path: &str) -> Result<Value, String> {
        let resp = self
            .request(reqwest::Method::GET, path)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        if resp.status() == reqwest::StatusCode::NOT_FOUND {
            return Ok(Value::Null);
        }
        let bytes = resp.bytes().await.map_err(|e| e.to_string())?;
        serde_json::from_slice(&bytes).map_err(|e| e.to_string())
    }

    async fn put(&self, path: &str, body: Vec<u8>) -> Value {
        let resp = self
            .request(reqwest::Method::PUT, path)
            .body(body)
            .send()
            .await
            .unwrap_or_else(|e| panic!("PUT {path}: {e}"));
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        assert!(status.is_success(), "PUT {path}: {status} {text}");
        serde_json::from_str(&text).unwrap_or(Value::String(text))
    }

    /// Operator action: `PUT /v1/session/destroy/<id>`.
    pub async fn destroy_session(&self, id: &str) {
        self.put(&format!("/v1/session/destroy/{id}"), Vec::new())
            .await;
    }

    /// Operator action: `DELETE /v1/kv/<key>`.
    pub async fn delete_key(&self, key: &str) {
        let resp = self
            .request(reqwest::Method::DELETE, &format!("/v1/kv/{key}"))
            .send()
            .await
            .unwrap_or_else(|e| panic!("DELETE {key}: {e}"));
        assert!(
            resp.status().is_success(),
            "DELETE {key}: {}",
            resp.status()
        );
    }

    /// Operator action: `DELETE /v1/kv/<key>?cas=<index>`, deleting `key` only if its
    /// ModifyIndex is still `index`; returns whether it did.
    pub async fn delete_key_cas(&self, key: &str, index: u64) -> bool {
        let path = format!("/v1/kv/{key}?cas={index}");
        let resp = self
            .request(reqwest::Method::DELETE, &path)
            .send()
            .await
            .unwrap_or_else(|e| panic!("DELETE {path}: {e}"));
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        assert!(status.is_success(), "DELETE {path}: {status} {text}");
        text.trim() == "true"
    }

    /// Operator action: `PUT /v1/kv/<key>?release=<session>`; returns Consul's answer.
    pub async fn release_key(&self, key: &str, session: &str) -> bool {
        self.put(&format!("/v1/kv/{key}?release={session}"), Vec::new())
            .await
            == Value::Bool(true)
    }

    /// Writes a raw value with flags (`PUT /v1/kv/<key>?flags=`).
    pub async fn put_key(&self, key: &str, value: &[u8], flags: u64) {
        self.put(&format!("/v1/kv/{key}?flags={flags}"), value.to_vec())
            .await;
    }

    /// The KV entry of `key` as JSON (with `Value` base64), or `Null`.
    pub async fn key(&self, key: &str) -> Value {
        match self.get(&format!("/v1/kv/{key}?consistent")).await {
            Ok(Value::Array(mut entries)) if !entries.is_empty() => entries.remove(0),
            Ok(_) => Value::Null,
            Err(e) => panic!("GET {key}: {e}"),
        }
    }

    /// The keys under `prefix`.
    pub async fn keys(&self, prefix: &str) -> Vec<String> {
        match self.get(&format!("/v1/kv/{prefix}?keys&consistent")).await {
            Ok(Value::Array(keys)) => keys
                .into_iter()
                .filter_map(|k| k.as_str().map(str::to_owned))
                .collect(),
            Ok(_) => Vec::new(),
            Err(e) => panic!("GET keys {prefix}: {e}"),
        }
    }

    /// IDs of every session on the agent.
    pub async fn sessions(&self) -> Vec<String> {
        match self.get("/v1/session/list?consistent").await {
            Ok(Value::Array(sessions)) => sessions
                .iter()
                .filter_map(|s| s["ID"].as_str().map(str::to_owned))
                .collect(),
            Ok(_) => Vec::new(),
            Err(e) => panic!("listing sessions: {e}"),
        }
    }

    /// Creates an ACL token with `rules` (HCL) and returns its secret.
    pub async fn create_token(&self, rules: &str) -> String {
        let policy_name = format!("p{}", free_port());
        self.put(
            "/v1/acl/policy",
            serde_json::to_vec(&serde_json::json!({"Name": policy_name, "Rules": rules})).unwrap(),
        )
        .await;
        let token = self
            .put(
                "/v1/acl/token",
                serde_json::to_vec(&serde_json::json!({"Policies": [{"Name": policy_name}]}))
                    .unwrap(),
            )
            .await;
        token["SecretID"]
            .as_str()
            .expect("token has a SecretID")
            .to_owned()
    }
}

/// A child for `consul lock` that reports when it is signalled (and when it started).
///
/// It `exec`s, so the signal reaches Python whatever shell runs it: `consul lock` runs its command
/// with `$SHELL -c` (`/bin/sh` when `SHELL` is unset, as under CI) and signals only that shell's
/// pid, and dash, unlike bash, forks for a lone command; without the `exec` the shell dies and
/// Python is never signalled.
pub const SIGNAL_CHILD: &str = r#"exec python3 -u -c 'import signal,sys,time
def h(*_):
    print("signal", time.time_ns(), flush=True); sys.exit(0)
signal.signal(signal.SIGTERM, h); signal.signal(signal.SIGINT, h)
print("ready", flush=True)
while True: time.sleep(1)'"#;

/// How long a guard may take to start its child, or to signal it after its loss, before the
/// trial is a failure: well past any fence interval the benchmarks use, far short of a hang.
pub const GUARD_BOUND: Duration = Duration::from_secs(30);

/// Loss → signal of `consul lock` (the reference the benchmarks compare with): see
/// [`loss_to_signal`]. A trial whose child `consul lock` never signals ends the series and is
/// said, not a failure: it is the reference's behaviour, not ours.
pub async fn consul_lock_loss_to_signal(agent: &Agent, trials: usize) -> Vec<f64> {
    let samples = loss_to_signal(agent, trials, "cl", |prefix| {
        let mut command = agent.command();
        command.args(["lock", prefix, SIGNAL_CHILD]);
        command
    })
    .await;
    if samples.last().is_some_and(Option::is_none) {
        eprintln!(
            "consul lock did not signal its child within {GUARD_BOUND:?} of the loss in trial {} \
             of {trials}; its remaining trials were not run",
            samples.len()
        );
    }
    samples.into_iter().flatten().collect()
}

/// Loss → signal of a process guard of ours (see [`loss_to_signal`]); panics if a child is not
/// signalled within [`GUARD_BOUND`] of its loss.
pub async fn guard_loss_to_signal(
    agent: &Agent,
    trials: usize,
    tag: &str,
    guard: impl FnMut(&str) -> Command,
) -> Vec<f64> {
    let samples = loss_to_signal(agent, trials, tag, guard).await;
    assert!(
        samples.last().is_none_or(Option::is_some),
        "the guard did not signal its child within {GUARD_BOUND:?} of the loss in trial {} of \
         {trials}",
        samples.len()
    );
    samples.into_iter().flatten().collect()
}

/// Loss → signal of a process guard: `trials` times, `guard(prefix)` (a `consul lock`-style
/// command running [`SIGNAL_CHILD`] while it holds `prefix/.lock`) is started, an operator
/// destroys the session holding the key once the child is ready, and the time from the destroy
/// to the child's signal is one sample (ms). A child not signalled within [`GUARD_BOUND`] gives
/// `None` and ends the series, so a guard that never signals costs one bound, not one per trial.
/// `tag` keeps the prefixes of two guards apart. Panics if a guard does not start
/// its child within [`GUARD_BOUND`].
pub async fn loss_to_signal(
    agent: &Agent,
    trials: usize,
    tag: &str,
    mut guard: impl FnMut(&str) -> Command,
) -> Vec<Option<f64>> {
    let mut samples = Vec::new();
    for trial in 0..trials {
        let prefix = format!("bench/loss/{tag}-{trial}");
        let mut child = guard(&prefix)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let ready = tokio::time::timeout(GUARD_BOUND, async {
            while let Ok(Some(line)) = lines.next_line().await {
                if line == "ready" {
                    return true;
                }
            }
            false
        })
        .await;
        assert!(
            ready == Ok(true),
            "trial {trial} on {prefix:?}: the guard's child did not start within {GUARD_BOUND:?} \
             (the guard exited, or is still waiting for the key)"
        );
        let entry = agent.key(&format!("{prefix}/.lock")).await;
        let session = entry["Session"]
            .as_str()
            .expect("the guard holds the key")
            .to_owned();
        let t0 = now_ns();
        agent.destroy_session(&session).await;
        let signalled = tokio::time::timeout(GUARD_BOUND, async {
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(ts) = line.strip_prefix("signal ") {
                    return ts.trim().parse::<u128>().ok();
                }
            }
            None
        })
        .await;
        let _ = child.kill().await;
        let sample = (signalled.ok().flatten()).map(|t1| t1.saturating_sub(t0) as f64 / 1e6);
        samples.push(sample);
        if sample.is_none() {
            break;
        }
    }
    samples
}
