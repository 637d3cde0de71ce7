//! A real 3-server Consul cluster (not `-dev`) with one client agent, on free loopback ports: the
//! production topology (workers → local client agent → servers), for faults of the servers
//! themselves, such as `kill -9` of the raft leader.
//!
//! Every node keeps its ports, node name and data directory across [`Cluster::kill9`] and
//! [`Cluster::restart`], so a restarted server rejoins as itself. The nodes are killed when the
//! cluster is dropped (their data with them); their logs stay under
//! `target/consul-logs/cluster-<port>/`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use tokio::process::{Child, Command};
use tokio::time::Instant;

use crate::consul::{Api, consul_bin, free_port, workspace_root};

/// How long a start, a rejoin or an election may take before it is an error.
pub const READY_WITHIN: Duration = Duration::from_secs(60);

/// One node: a server, or the client agent.
#[derive(Debug)]
struct Node {
    name: String,
    args: Vec<String>,
    http_port: u16,
    server_port: u16,
    log: PathBuf,
    child: Option<Child>,
    api: Api,
}

impl Node {
    fn spawn(&mut self) -> Result<(), String> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(|e| e.to_string())?;
        let child = Command::new(consul_bin())
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("cannot run {}: {e}", consul_bin().display()))?;
        self.child = Some(child);
        Ok(())
    }

    fn exited(&mut self) -> Option<String> {
        match self.child.as_mut().map(Child::try_wait) {
            Some(Ok(Some(status))) => Some(format!(
                "{} exited with {status}; see {}",
                self.name,
                self.log.display()
            )),
            _ => None,
        }
    }
}

/// Three servers and a client agent.
#[derive(Debug)]
pub struct Cluster {
    servers: Vec<Node>,
    client: Node,
    dir: PathBuf,
}

impl std::ops::Deref for Cluster {
    type Target = Api;

    /// The operator API goes through the client agent, as the workers do.
    fn deref(&self) -> &Api {
        &self.client.api
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for node in self.servers.iter_mut().chain(Some(&mut self.client)) {
            if let Some(child) = node.child.as_mut() {
                let _ = child.start_kill();
            }
        }
        // The data goes; the logs stay for reading.
        for node in self.servers.iter().chain(Some(&self.client)) {
            let _ = std::fs::remove_dir_all(self.dir.join(&node.name));
        }
    }
}

fn node(
    name: String,
    dir: &std::path::Path,
    server: Option<usize>,
    [http_port, server_port, serf_lan_port, serf_wan_port]: [u16; 4],
    join: &[u16],
) -> Result<Node, String> {
    let data = dir.join(&name);
    std::fs::create_dir_all(&data).map_err(|e| e.to_string())?;
    // raft_multiplier 1: the production timing (leader lease 500 ms, election timeout ~1 s).
    let hcl = format!(
        "ports {{ http = {http_port} dns = -1 grpc = -1 serf_lan = {serf_lan_port} \
         serf_wan = {serf_wan_port} server = {server_port} }} \
         performance {{ raft_multiplier = 1 }} disable_update_check = true"
    );
    let mut args: Vec<String> = [
        "agent",
        "-client",
        "127.0.0.1",
        "-bind",
        "127.0.0.1",
        "-log-level",
        "info",
        "-node",
        &name,
        "-data-dir",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.push(data.display().to_string());
    args.extend(["-hcl".to_owned(), hcl]);
    if let Some(expect) = server {
        args.extend(["-server".to_owned(), "-bootstrap-expect".to_owned()]);
        args.push(expect.to_string());
    }
    for port in join {
        if *port != serf_lan_port {
            args.extend(["-retry-join".to_owned(), format!("127.0.0.1:{port}")]);
        }
    }
    let log = dir.join(format!("{name}.log"));
    Ok(Node {
        name,
        args,
        http_port,
        server_port,
        log,
        child: None,
        api: Api::new(SocketAddr::from(([127, 0, 0, 1], http_port)), None),
    })
}

impl Cluster {
    /// Starts `n` servers (`-bootstrap-expect n`, each retry-joining the others) and a client
    /// agent joined to them; waits (up to [`READY_WITHIN`]) for a leader and for every node's
    /// serfHealth check, which sessions need. A few attempts make a port taken meanwhile moot.
    pub async fn start(n: usize) -> Cluster {
        let mut last = String::new();
        for _ in 0..3 {
            match Self::try_start(n).await {
                Ok(cluster) => return cluster,
                Err(e) => last = e,
            }
        }
        panic!("could not start a {n}-server Consul cluster: {last}");
    }

    async fn try_start(n: usize) -> Result<Cluster, String> {
        let tag = free_port();
        let dir = workspace_root().join(format!("target/consul-logs/cluster-{tag}"));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        // Choose every port first so that each server can name the others.
        let ports: Vec<[u16; 4]> = (0..=n)
            .map(|_| [free_port(), free_port(), free_port(), free_port()])
            .collect();
        let lan: Vec<u16> = ports[..n].iter().map(|p| p[2]).collect();
        let mut servers = Vec::new();
        for (i, p) in ports[..n].iter().enumerate() {
            servers.push(node(format!("s{i}-{tag}"), &dir, Some(n), *p, &lan)?);
        }
        let client = node(format!("c-{tag}"), &dir, None, ports[n], &lan)?;
        let mut cluster = Cluster {
            servers,
            client,
            dir,
        };
        for s in &mut cluster.servers {
            s.spawn()?;
        }
        cluster.client.spawn()?;
        let deadline = Instant::now() + READY_WITHIN;
        loop {
            for node in cluster.servers.iter_mut().chain(Some(&mut cluster.client)) {
                if let Some(e) = node.exited() {
                    return Err(e);
                }
            }
            if cluster.ready().await {
                return Ok(cluster);
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "not ready after {READY_WITHIN:?}; see {}",
                    cluster.dir.display()
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// A leader, every node alive in serf with its serfHealth check registered and passing.
    async fn ready(&self) -> bool {
        if self.leader().await.is_none() {
            return false;
        }
        let Ok(Value::Array(checks)) = self.client.api.get("/v1/health/state/any").await else {
            return false;
        };
        self.servers.iter().chain(Some(&self.client)).all(|node| {
            checks.iter().any(|c| {
                c["CheckID"] == "serfHealth"
                    && c["Node"] == node.name.as_str()
                    && c["Status"] == "passing"
            })
        })
    }

    /// The HTTP address of server `i`.
    pub fn server_addr(&self, i: usize) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.servers[i].http_port))
    }

    /// The client agent's `http://127.0.0.1:<port>`, where the workers go.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.client.http_port)
    }

    /// How many servers.
    pub fn len(&self) -> usize {
        self.servers.len()
    }

    /// Whether there is no server.
    pub fn is_empty(&self) -> bool {
        self.servers.is_empty()
    }

    /// Which server is the raft leader, as the client agent sees it; `None` during an election.
    pub async fn leader(&self) -> Option<usize> {
        let leader = self.client.api.get("/v1/status/leader").await.ok()?;
        let addr = leader.as_str()?;
        self.servers
            .iter()
            .position(|s| addr == format!("127.0.0.1:{}", s.server_port))
    }

    /// `kill -9` of server `i`; returns once it is gone.
    pub async fn kill9(&mut self, i: usize) {
        if let Some(mut child) = self.servers[i].child.take() {
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
    }

    /// Waits (up to `limit`) for a leader other than `not`; returns it.
    pub async fn await_leader(&self, not: Option<usize>, limit: Duration) -> Option<usize> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(l) = self.leader().await.filter(|l| Some(*l) != not) {
                return Some(l);
            }
            if Instant::now() > deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Starts server `i` again (same node name, ports and data) and waits (up to
    /// [`READY_WITHIN`]) until it knows the leader and the cluster is ready again.
    pub async fn restart(&mut self, i: usize) -> Result<Duration, String> {
        let t0 = Instant::now();
        self.servers[i].spawn()?;
        let deadline = t0 + READY_WITHIN;
        loop {
            if let Some(e) = self.servers[i].exited() {
                return Err(e);
            }
            let knows = self.servers[i]
                .api
                .get("/v1/status/leader")
                .await
                .ok()
                .is_some_and(|l| l.as_str().is_some_and(|s| !s.is_empty()));
            if knows && self.ready().await {
                return Ok(t0.elapsed());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "{} did not rejoin within {READY_WITHIN:?}; see {}",
                    self.servers[i].name,
                    self.servers[i].log.display()
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
