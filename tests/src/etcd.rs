//! A real `etcd` per test, on free loopback ports with its data under a temporary directory,
//! killed (and its data removed) when dropped; and a 3-member cluster for raft faults.
//!
//! The binaries come from `ETCD_BIN` (and `ETCDCTL_BIN`, else `etcdctl` beside it), else `etcd` on
//! `PATH`, else `scripts/ensure-etcd.sh` (which fetches Debian bookworm's etcd 3.4 into
//! `tools/etcd/`). Each member's output goes to a log under `target/etcd-logs/`, whose path is
//! printed when it fails to start. [`Api`] is what an operator does to etcd behind the clients'
//! backs, over the same JSON gateway: revoke a lease, delete keys, list leases and keys, find the
//! key one acquisition holds. It keeps no idle connection, and each member serves `/metrics` on
//! a port of its own ([`Server::metric_total`]), so a test that counts a client's connections to
//! the client port (`crate::sockets`) counts only the client's.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Duration;

use lease_etcd::Etcd;
use serde_json::{Value, json};
use tokio::process::{Child, Command};
use tokio::time::Instant;

use crate::consul::{AgentTls, ensured_tool, free_port, workspace_root};

/// How long a start or an election may take before it is an error.
pub const READY_WITHIN: Duration = Duration::from_secs(30);

/// The etcd binary the tests use, found once per process.
pub fn etcd_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        ensured_tool(
            "ETCD_BIN",
            "scripts/ensure-etcd.sh",
            "etcd is needed for this test",
            "install etcd 3.4+ (etcd and etcdctl) and put it on PATH, or set ETCD_BIN and \
             ETCDCTL_BIN",
        )
    })
    .clone()
}

/// The etcdctl binary: `ETCDCTL_BIN`, else the one beside [`etcd_bin`], else `etcdctl` on `PATH`.
pub fn etcdctl_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("ETCDCTL_BIN") {
        return PathBuf::from(bin);
    }
    let beside = etcd_bin().with_file_name("etcdctl");
    if beside.exists() {
        beside
    } else {
        PathBuf::from("etcdctl")
    }
}

/// One member's ports, directory and process.
#[derive(Debug)]
struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    /// `/metrics` on a port of its own, so that scraping it is no connection to the client port.
    metrics_port: u16,
    data: PathBuf,
    log: PathBuf,
    child: Option<Child>,
    /// Also serve TLS clients on this port, with these certificates, verifying clients.
    tls: Option<(AgentTls, u16)>,
}

/// Where members keep their data: in memory (`/dev/shm`) where the machine has it, as Consul's
/// dev agent (`consul agent -dev`) keeps its Raft log in memory. etcd fsyncs every write; on a
/// shared VM disk that is 5–20 ms a write, which the benchmarks would time instead of the
/// protocol, and which makes the tests slower than the code they test.
fn data_root() -> PathBuf {
    let shm = Path::new("/dev/shm");
    let usable = std::fs::metadata(shm).is_ok_and(|m| m.is_dir() && !m.permissions().readonly());
    if usable {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

impl Member {
    fn new(name: String) -> Member {
        let client_port = free_port();
        let peer_port = free_port();
        let metrics_port = free_port();
        let data = data_root().join(format!("lease-etcd-{}-{client_port}", std::process::id()));
        let logs = workspace_root().join("target/etcd-logs");
        std::fs::create_dir_all(&logs).expect("target/etcd-logs");
        let log = logs.join(format!("{name}-{client_port}.log"));
        Member {
            name,
            client_port,
            peer_port,
            metrics_port,
            data,
            log,
            child: None,
            tls: None,
        }
    }

    fn peer_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.peer_port)
    }

    /// Starts the member in the cluster `initial_cluster` (every member's `name=peer URL`), whose
    /// members all share `token`.
    fn spawn(&mut self, initial_cluster: &str, state: &str, token: &str) -> Result<(), String> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(|e| e.to_string())?;
        let client = format!("http://127.0.0.1:{}", self.client_port);
        let mut listen = client.clone();
        let mut command = Command::new(etcd_bin());
        if let Some((tls, port)) = &self.tls {
            // The plain URL stays for the readiness probe and the operator's calls.
            listen = format!("{client},https://127.0.0.1:{port}");
            command
                .arg("--cert-file")
                .arg(&tls.server_cert)
                .arg("--key-file")
                .arg(&tls.server_key)
                .arg("--trusted-ca-file")
                .arg(&tls.ca)
                .arg("--client-cert-auth");
        }
        let child = command
            .args(["--name", &self.name, "--data-dir"])
            .arg(&self.data)
            .args([
                "--listen-client-urls",
                &listen,
                "--advertise-client-urls",
                &client,
            ])
            .args(["--listen-peer-urls", &self.peer_url()])
            .args([
                "--listen-metrics-urls",
                &format!("http://127.0.0.1:{}", self.metrics_port),
            ])
            .args(["--initial-advertise-peer-urls", &self.peer_url()])
            .args(["--initial-cluster", initial_cluster])
            .args(["--initial-cluster-state", state])
            .args(["--initial-cluster-token", token])
            // Short raft timers: an election after a leader's death takes about a second.
            .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
            .args(["--log-level", "warn", "--logger", "zap"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("cannot run {}: {e}", etcd_bin().display()))?;
        self.child = Some(child);
        Ok(())
    }

    fn exited(&mut self) -> Option<String> {
        match self.child.as_mut().map(Child::try_wait) {
            Some(Ok(Some(status))) => Some(format!(
                "etcd {} exited with {status}; see {}",
                self.name,
                self.log.display()
            )),
            _ => None,
        }
    }

    fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.client_port))
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.start_kill();
        }
        let _ = std::fs::remove_dir_all(&self.data);
    }
}

/// A running single-member etcd.
#[derive(Debug)]
pub struct Server {
    member: Member,
    api: Api,
}

impl std::ops::Deref for Server {
    type Target = Api;

    fn deref(&self) -> &Api {
        &self.api
    }
}

impl Server {
    /// Starts etcd and waits (up to [`READY_WITHIN`]) until it serves linearizable reads.
    pub async fn start() -> Server {
        Server::start_with(None).await
    }

    /// [`Server::start`], also serving TLS clients (`https://`, [`Server::https_url`]) with
    /// `tls`'s server certificate and `--client-cert-auth`: a client must present a certificate
    /// signed by `tls.ca`.
    pub async fn start_tls(tls: &AgentTls) -> Server {
        Server::start_with(Some(tls)).await
    }

    async fn start_with(tls: Option<&AgentTls>) -> Server {
        let mut last = String::new();
        // Free ports can be taken between choosing and binding; a few attempts make that moot.
        for _ in 0..3 {
            let mut member = Member::new("solo".into());
            member.tls = tls.map(|tls| (tls.clone(), free_port()));
            let cluster = format!("solo={}", member.peer_url());
            let token = format!("lease-{}", member.client_port);
            if let Err(e) = member.spawn(&cluster, "new", &token) {
                last = e;
                continue;
            }
            let api = Api::new(member.addr(), None);
            match ready(&api, &mut [&mut member]).await {
                Ok(()) => return Server { member, api },
                Err(e) => last = e,
            }
        }
        panic!("could not start etcd: {last}");
    }

    /// The client address, `127.0.0.1:<port>`.
    pub fn addr(&self) -> SocketAddr {
        self.member.addr()
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr())
    }

    /// The server's process id, for faults (`kill -STOP`, see [`crate::workers::signal`]).
    pub fn pid(&self) -> u32 {
        self.member
            .child
            .as_ref()
            .and_then(Child::id)
            .expect("etcd is running")
    }

    /// `https://127.0.0.1:<port>`, of a server started with [`Server::start_tls`].
    pub fn https_url(&self) -> String {
        let (_, port) = self
            .member
            .tls
            .as_ref()
            .expect("the server was started without start_tls");
        format!("https://127.0.0.1:{port}")
    }

    /// A backend talking to this etcd.
    pub fn backend(&self) -> Etcd {
        Etcd::builder()
            .endpoints([self.url()])
            .build()
            .expect("valid test configuration")
    }

    /// The sum of every series of the Prometheus metric `name` on etcd's `/metrics` (0 if it has
    /// none), served on a port of its own (no connection to the client port), e.g. `grpc_server_msg_received_total`: the gRPC messages etcd received, whether from
    /// gRPC clients or through its JSON gateway (which forwards each call over gRPC).
    pub async fn metric_total(&self, name: &str) -> f64 {
        let text = self
            .api
            .http
            .get(format!(
                "http://127.0.0.1:{}/metrics",
                self.member.metrics_port
            ))
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
            .unwrap_or_else(|e| panic!("GET /metrics: {e}"))
            .text()
            .await
            .unwrap_or_else(|e| panic!("GET /metrics: {e}"));
        text.lines()
            .filter(|line| {
                line.strip_prefix(name)
                    .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
            })
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// Waits (up to `bound`, else panics) until etcd has at least `watchers` watchers: a
    /// client's holds have all begun once there is one per lease (each reads its key once, then
    /// watches it), so a count of messages taken from then on is of holding alone.
    pub async fn await_watchers(&self, watchers: usize, bound: Duration) {
        crate::within(bound, &format!("etcd to have {watchers} watchers"), async {
            while self.metric_total("etcd_debugging_mvcc_watcher_total").await < watchers as f64 {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await;
    }

    /// An `etcdctl` command pointed at this etcd (API 3).
    pub fn etcdctl(&self) -> Command {
        etcdctl(&self.url())
    }

    /// Turns on authentication with a `root` user whose password is `password`; the operator API
    /// of this server authenticates as root from then on.
    pub async fn enable_auth(&mut self, password: &str) {
        for args in [
            vec!["user", "add", &format!("root:{password}")],
            vec!["user", "grant-role", "root", "root"],
            vec!["auth", "enable"],
        ] {
            let out = self.etcdctl().args(&args).output().await.unwrap();
            assert!(
                out.status.success(),
                "etcdctl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        self.api = Api::new(self.addr(), Some(("root".into(), password.into())));
    }
}

/// `etcdctl lock`'s loss → exit, in ms, over `trials` locks on `server`: each trial runs
/// `etcdctl lock --ttl 10 <name>` (no command: it holds until its session ends), revokes its
/// lease as an operator would, and times from just before the revoke until etcdctl exits
/// ("session expired"). etcdctl learns of the revoke from its next keep-alive (every TTL/3). A
/// trial whose etcdctl has not exited 30 s later is left out.
pub async fn etcdctl_lock_loss_to_exit(server: &Server, trials: usize) -> Vec<f64> {
    use tokio::io::{AsyncBufReadExt, BufReader};

    use crate::overlap::now_ns;

    let mut samples = Vec::new();
    for trial in 0..trials {
        let name = format!("bench/loss/etcdctl-{trial}");
        let mut child = server
            .etcdctl()
            .args(["lock", "--ttl", "10", &name])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        // It prints its key `<name>/<lease hex>` once it holds the lock.
        let key = lines
            .next_line()
            .await
            .unwrap()
            .expect("etcdctl lock holds");
        let holder = key.rsplit('/').next().unwrap().to_owned();
        let t0 = now_ns();
        assert!(server.revoke(&holder).await);
        let exited = tokio::time::timeout(Duration::from_secs(30), child.wait()).await;
        let t1 = now_ns();
        if exited.is_ok() {
            samples.push(t1.saturating_sub(t0) as f64 / 1e6);
        } else {
            let _ = child.kill().await;
        }
    }
    samples
}

/// An `etcdctl` command (API 3) for the endpoints `endpoints`.
pub fn etcdctl(endpoints: &str) -> Command {
    let mut cmd = Command::new(etcdctl_bin());
    cmd.env("ETCDCTL_API", "3")
        .env_remove("ETCDCTL_USER")
        .env_remove("ETCDCTL_PASSWORD")
        .arg("--endpoints")
        .arg(endpoints)
        .stdin(Stdio::null())
        .kill_on_drop(true);
    cmd
}

/// Waits until every member has exited (an error) or `api` answers a linearizable read.
async fn ready(api: &Api, members: &mut [&mut Member]) -> Result<(), String> {
    let deadline = Instant::now() + READY_WITHIN;
    loop {
        for member in members.iter_mut() {
            if let Some(exited) = member.exited() {
                return Err(exited);
            }
        }
        // etcd offers no readiness event; a linearizable read answers once there is a leader.
        if api
            .try_post("/v3/kv/range", &json!({"key": b64("ready")}))
            .await
            .is_ok()
        {
            return Ok(());
        }
        if Instant::now() > deadline {
            let logs: Vec<String> = members
                .iter()
                .map(|m| m.log.display().to_string())
                .collect();
            return Err(format!(
                "etcd did not serve reads within {READY_WITHIN:?}; see {logs:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

fn b64(text: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(text)
}

fn unb64(text: &str) -> String {
    use base64::Engine as _;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text)
        .unwrap_or_default();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// What an operator does to etcd, over the JSON gateway: raw calls, as an administrator makes
/// them (never through the library under test).
#[derive(Clone, Debug)]
pub struct Api {
    base: String,
    http: reqwest::Client,
    user: Option<(String, String)>,
}

impl Api {
    /// The API of the member whose client address is `addr`.
    pub fn new(addr: SocketAddr, user: Option<(String, String)>) -> Api {
        Api {
            base: format!("http://{addr}"),
            // No idle connections kept: an operator's call is gone from this process's sockets
            // once answered, so counting a client's connections (`crate::sockets`) counts only
            // the client's.
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .pool_max_idle_per_host(0)
                .build()
                .expect("an HTTP client"),
            user,
        }
    }

    async fn try_post(&self, path: &str, body: &Value) -> Result<Value, String> {
        let mut request = self
            .http
            .post(format!("{}{path}", self.base))
            .body(body.to_string());
        if let Some((name, password)) = &self.user {
            let auth = self
                .http
                .post(format!("{}/v3/auth/authenticate", self.base))
                .body(json!({"name": name, "password": password}).to_string())
                .send()
                .await
                .map_err(|e| e.to_string())?;
            let auth: Value = serde_json::from_str(&auth.text().await.map_err(|e| e.to_string())?)
                .map_err(|e| e.to_string())?;
            request = request.header("Authorization", auth["token"].as_str().unwrap_or(""));
        }
        let response = request.send().await.map_err(|e| e.to_string())?;
        let status = response.status();
        let text = response.text().await.map_err(|e| e.to_string())?;
        if !status.is_success() {
            return Err(format!("{status}: {text}"));
        }
        serde_json::from_str(&text).map_err(|e| e.to_string())
    }

    async fn post(&self, path: &str, body: Value) -> Value {
        self.try_post(path, &body)
            .await
            .unwrap_or_else(|e| panic!("POST {path} {body}: {e}"))
    }

    /// Operator action: `etcdctl lease revoke <hex>` of the lease `holder` (a sequencer's holder:
    /// `<lease hex>` or `<lease hex>_<n>`) names; whether the lease existed.
    pub async fn revoke(&self, holder: &str) -> bool {
        let id = lease_id(holder);
        match self
            .try_post("/v3/lease/revoke", &json!({"ID": id.to_string()}))
            .await
        {
            Ok(_) => true,
            Err(e) if e.contains("not found") => false,
            Err(e) => panic!("revoke {holder}: {e}"),
        }
    }

    /// Operator action: `etcdctl del <key>` and `etcdctl del --prefix <key>/`.
    pub async fn delete_key(&self, key: &str) -> u64 {
        let mut deleted = 0;
        for (start, end) in [
            (key.to_owned(), None),
            (format!("{key}/"), Some(format!("{key}0"))),
        ] {
            let mut body = json!({"key": b64(&start)});
            if let Some(end) = end {
                body["range_end"] = json!(b64(&end));
            }
            let answer = self.post("/v3/kv/deleterange", body).await;
            deleted += answer["deleted"]
                .as_str()
                .and_then(|d| d.parse::<u64>().ok())
                .unwrap_or(0);
        }
        deleted
    }

    /// Operator action: `etcdctl del <key>` of that one key; how many keys went.
    pub async fn post_delete_one(&self, key: &str) -> u64 {
        let answer = self
            .post("/v3/kv/deleterange", json!({"key": b64(key)}))
            .await;
        answer["deleted"]
            .as_str()
            .and_then(|d| d.parse::<u64>().ok())
            .unwrap_or(0)
    }

    /// The whole seconds the lease `holder` names (see [`Api::revoke`]) has left by etcd's own
    /// clock (0: less than one), or -1 if it is gone.
    pub async fn time_to_live(&self, holder: &str) -> i64 {
        let id = lease_id(holder);
        let answer = self
            .post("/v3/lease/timetolive", json!({"ID": id.to_string()}))
            .await;
        // The gateway leaves a zero out: a lease with less than a second left has no `TTL`.
        answer["TTL"]
            .as_str()
            .map_or(0, |t| t.parse().expect("a TTL in seconds"))
    }

    /// The key etcd holds for `sequencer`'s acquisition: of the keys that are the sequencer's key
    /// or under `<key>/`, the one whose create revision is the sequencer's index (a leader's
    /// sequencer names the election, whose contenders' keys are under it; a semaphore slot's may
    /// name its own key). `None` if it is gone. What an operator deletes to take that one lease
    /// away.
    pub async fn own_key(&self, sequencer: &lease_core::Sequencer) -> Option<String> {
        let key = sequencer.key();
        // [key, key + "0"): the key itself, everything under `key/`, and (filtered out below)
        // names that continue with a byte below '0'.
        let answer = self
            .post(
                "/v3/kv/range",
                json!({"key": b64(key), "range_end": b64(&format!("{key}0")), "keys_only": true}),
            )
            .await;
        let index = sequencer.index().to_string();
        answer["kvs"].as_array()?.iter().find_map(|kv| {
            let name = unb64(kv["key"].as_str()?);
            let ours = name == key || name.starts_with(&format!("{key}/"));
            (ours && kv["create_revision"].as_str() == Some(index.as_str())).then_some(name)
        })
    }

    /// The IDs (hex) of every lease etcd has.
    pub async fn leases(&self) -> Vec<String> {
        let answer = self.post("/v3/lease/leases", json!({})).await;
        answer["leases"]
            .as_array()
            .map(|leases| {
                leases
                    .iter()
                    .filter_map(|l| l["ID"].as_str()?.parse::<i64>().ok())
                    .map(|id| format!("{id:x}"))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Every key (with its value) under `prefix` (the empty prefix: every key), oldest first.
    pub async fn keys(&self, prefix: &str) -> Vec<(String, String)> {
        let body = if prefix.is_empty() {
            json!({"key": b64("\0"), "range_end": b64("\0"), "sort_target": "CREATE"})
        } else {
            let mut end = prefix.as_bytes().to_vec();
            if let Some(last) = end.last_mut() {
                *last += 1;
            }
            json!({"key": b64(prefix), "range_end": b64(&String::from_utf8_lossy(&end)), "sort_target": "CREATE"})
        };
        let answer = self.post("/v3/kv/range", body).await;
        answer["kvs"]
            .as_array()
            .map(|kvs| {
                kvs.iter()
                    .map(|kv| {
                        (
                            unb64(kv["key"].as_str().unwrap_or("")),
                            unb64(kv["value"].as_str().unwrap_or("")),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// A 3-member etcd cluster on loopback, for the loss of its raft leader.
#[derive(Debug)]
pub struct Cluster {
    members: Vec<Member>,
    initial: String,
    token: String,
}

impl Cluster {
    /// Starts three members and waits until the cluster serves linearizable reads.
    pub async fn start() -> Cluster {
        let mut members: Vec<Member> = (0..3).map(|i| Member::new(format!("m{i}"))).collect();
        let initial: Vec<String> = members
            .iter()
            .map(|m| format!("{}={}", m.name, m.peer_url()))
            .collect();
        let initial = initial.join(",");
        let token = format!("lease-{}", members[0].client_port);
        for member in &mut members {
            member
                .spawn(&initial, "new", &token)
                .unwrap_or_else(|e| panic!("could not start etcd member: {e}"));
        }
        let mut cluster = Cluster {
            members,
            initial,
            token,
        };
        let api = Api::new(cluster.members[0].addr(), None);
        let mut refs: Vec<&mut Member> = cluster.members.iter_mut().collect();
        ready(&api, &mut refs)
            .await
            .unwrap_or_else(|e| panic!("the etcd cluster did not come up: {e}"));
        cluster
    }

    /// Every member's client URL, comma-separated (as ETCD_ENDPOINTS takes them).
    pub fn endpoints(&self) -> String {
        let urls: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("http://{}", m.addr()))
            .collect();
        urls.join(",")
    }

    /// The client URL of member `i`.
    pub fn url(&self, i: usize) -> String {
        format!("http://{}", self.members[i].addr())
    }

    /// The index of the raft leader, as the members report it (`/v3/maintenance/status`).
    pub async fn leader(&self) -> Option<usize> {
        for (i, member) in self.members.iter().enumerate() {
            if member.child.is_none() {
                continue;
            }
            let api = Api::new(member.addr(), None);
            if let Ok(status) = api.try_post("/v3/maintenance/status", &json!({})).await {
                let leader = status["leader"].as_str().unwrap_or("");
                let this = status["header"]["member_id"].as_str().unwrap_or("");
                if !leader.is_empty() && leader == this {
                    return Some(i);
                }
            }
        }
        None
    }

    /// `kill -9` of member `i`.
    pub async fn kill9(&mut self, i: usize) {
        if let Some(mut child) = self.members[i].child.take() {
            let _ = child.kill().await;
        }
    }

    /// Starts member `i` again, with its data, ports and name.
    pub fn restart(&mut self, i: usize) {
        let (initial, token) = (self.initial.clone(), self.token.clone());
        self.members[i]
            .spawn(&initial, "existing", &token)
            .unwrap_or_else(|e| panic!("could not restart etcd member: {e}"));
    }

    /// The members' logs, for messages.
    pub fn logs(&self) -> Vec<&Path> {
        self.members.iter().map(|m| m.log.as_path()).collect()
    }
}

/// The etcd lease a holder names: the hex before its `_<n>` slot suffix, if any (lease-etcd
/// names the second and later contenders of one name on one etcd lease `<lease hex>_<n>`).
fn lease_id(holder: &str) -> i64 {
    let hex = holder.split_once('_').map_or(holder, |(hex, _)| hex);
    i64::from_str_radix(hex, 16).expect("a hex lease ID")
}
