//! A TCP proxy that injects network faults between a client and a real service.
//!
//! Faults, each switchable at any time:
//! - **blackhole**: bytes stop flowing in both directions, connections stay open (a partition);
//!   they resume when the blackhole is lifted, nothing lost;
//! - **cut**: every open connection is reset (a crashed link); new ones are accepted;
//! - **HTTP 500**: every open connection is cut and every request on a new one is answered
//!   `500 Internal Server Error` without reaching the service (a Consul server in trouble);
//! - **HTTP 429**: the same with `429 Too Many Requests`;
//! - **refuse**: every open connection is cut and every new one is closed as soon as it is
//!   accepted, which is what a Consul agent does past `limits.http_max_conns_per_client`.
//!
//! It counts what passes: connections open now and at most, and requests (request lines sent
//! upstream, and requests answered or refused by a fault).

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::AbortHandle;

/// What the proxy does with traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Forward everything.
    Forward,
    /// Hold every byte until the mode changes.
    Blackhole,
    /// Answer each HTTP request with 500 and close.
    Http500,
    /// Answer each HTTP request with 429 and close.
    Http429,
    /// Close each connection as soon as it is accepted.
    Refuse,
}

/// What passed through a proxy.
#[derive(Debug, Default)]
pub struct Counters {
    open: AtomicUsize,
    peak: AtomicUsize,
    requests: AtomicU64,
}

impl Counters {
    fn opened(&self) {
        let open = self.open.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak.fetch_max(open, Ordering::SeqCst);
    }

    fn request(&self) {
        self.requests.fetch_add(1, Ordering::SeqCst);
    }
}

/// Decrements the open count when a connection's task ends, however it ends.
struct Open(Arc<Counters>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A running proxy; stops (and drops every connection) when dropped.
#[derive(Debug)]
pub struct Proxy {
    addr: SocketAddr,
    mode: watch::Sender<Mode>,
    connections: Arc<Mutex<Vec<AbortHandle>>>,
    faulted: watch::Sender<Vec<String>>,
    counters: Arc<Counters>,
    accept: AbortHandle,
}

impl Proxy {
    /// Listens on a free loopback port and forwards to `upstream`.
    pub async fn start(upstream: SocketAddr) -> io::Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (mode, _) = watch::channel(Mode::Forward);
        let connections = Arc::new(Mutex::new(Vec::new()));
        let (faulted, _) = watch::channel(Vec::new());
        let counters = Arc::new(Counters::default());
        let accept = tokio::spawn(accept_loop(
            listener,
            upstream,
            mode.subscribe(),
            Arc::clone(&connections),
            faulted.clone(),
            Arc::clone(&counters),
        ))
        .abort_handle();
        Ok(Proxy {
            addr,
            mode,
            connections,
            faulted,
            counters,
            accept,
        })
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://<addr>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops (true) or resumes (false) forwarding, keeping connections open.
    pub fn set_blackhole(&self, on: bool) {
        self.mode
            .send_replace(if on { Mode::Blackhole } else { Mode::Forward });
    }

    /// Answers HTTP requests with 500 (true), or forwards again (false). Turning it on cuts every
    /// open connection, so pooled keep-alive connections cannot bypass it.
    pub fn set_http_500(&self, on: bool) {
        self.set_mode(if on { Mode::Http500 } else { Mode::Forward });
    }

    /// Switches to `mode`. Every fault but the blackhole cuts the open connections first, so
    /// pooled keep-alive connections cannot bypass it.
    pub fn set_mode(&self, mode: Mode) {
        self.mode.send_replace(mode);
        if !matches!(mode, Mode::Forward | Mode::Blackhole) {
            self.cut_all();
        }
    }

    /// Connections open through the proxy now.
    pub fn open_connections(&self) -> usize {
        self.counters.open.load(Ordering::SeqCst)
    }

    /// The most connections that were open at once since the last [`reset_peak`](Self::reset_peak).
    pub fn peak_connections(&self) -> usize {
        self.counters.peak.load(Ordering::SeqCst)
    }

    /// Starts counting the peak afresh from the connections open now.
    pub fn reset_peak(&self) {
        let open = self.open_connections();
        self.counters.peak.store(open, Ordering::SeqCst);
    }

    /// Requests seen so far: request lines forwarded, and requests answered or connections
    /// refused by a fault.
    pub fn requests(&self) -> u64 {
        self.counters.requests.load(Ordering::SeqCst)
    }

    /// Waits until a request whose first line contains `needle` has been answered with 500.
    pub async fn answered_500(&self, needle: &str) {
        let mut rx = self.faulted.subscribe();
        let _ = rx
            .wait_for(|lines| lines.iter().any(|l| l.contains(needle)))
            .await;
    }

    /// Resets every open connection.
    pub fn cut_all(&self) {
        for conn in self.connections.lock().unwrap().drain(..) {
            conn.abort();
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut_all();
    }
}

async fn accept_loop(
    listener: TcpListener,
    upstream: SocketAddr,
    mode: watch::Receiver<Mode>,
    connections: Arc<Mutex<Vec<AbortHandle>>>,
    faulted: watch::Sender<Vec<String>>,
    counters: Arc<Counters>,
) {
    while let Ok((client, _)) = listener.accept().await {
        let _ = client.set_nodelay(true);
        let mode = mode.clone();
        let faulted = faulted.clone();
        counters.opened();
        let open = Open(Arc::clone(&counters));
        let task = tokio::spawn(async move {
            let open = open;
            let now = *mode.borrow();
            match now {
                Mode::Refuse => {
                    open.0.request();
                    return;
                }
                Mode::Http500 | Mode::Http429 => {
                    open.0.request();
                    if let Ok(line) = answer(client, now == Mode::Http429).await {
                        faulted.send_modify(|lines| lines.push(line));
                    }
                    return;
                }
                Mode::Forward | Mode::Blackhole => {}
            }
            let Ok(server) = TcpStream::connect(upstream).await else {
                return;
            };
            let _ = server.set_nodelay(true);
            let (client_read, client_write) = client.into_split();
            let (server_read, server_write) = server.into_split();
            let counters = Arc::clone(&open.0);
            tokio::select! {
                _ = pump(client_read, server_write, mode.clone(), Some(&counters)) => {}
                _ = pump(server_read, client_write, mode, None) => {}
            }
        });
        let mut conns = connections.lock().unwrap();
        conns.retain(|c| !c.is_finished());
        conns.push(task.abort_handle());
    }
}

/// Copies bytes from `from` to `to`, holding them while the mode is not `Forward`; counts the
/// request lines it copies into `requests`, if given.
async fn pump(
    mut from: impl AsyncReadExt + Unpin,
    mut to: impl AsyncWriteExt + Unpin,
    mut mode: watch::Receiver<Mode>,
    requests: Option<&Counters>,
) -> io::Result<()> {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            return to.shutdown().await;
        }
        if let Some(counters) = requests {
            let lines = buf[..n].windows(11).filter(|w| w == b" HTTP/1.1\r\n");
            for _ in lines {
                counters.request();
            }
        }
        if mode.wait_for(|m| *m == Mode::Forward).await.is_err() {
            return Ok(());
        }
        to.write_all(&buf[..n]).await?;
    }
}

/// Answers one request with 500 (or 429); returns its request line.
async fn answer(mut client: TcpStream, too_many: bool) -> io::Result<String> {
    // Read the request head so the client sees an answer to its request, not a reset.
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 64 * 1024 {
        let n = client.read(&mut buf).await?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        head.extend_from_slice(&buf[..n]);
    }
    let (status, body) = if too_many {
        ("429 Too Many Requests", "injected fault: too many requests")
    } else {
        (
            "500 Internal Server Error",
            "injected fault: rpc error: No cluster leader",
        )
    };
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    client.write_all(response.as_bytes()).await?;
    client.shutdown().await?;
    let head = String::from_utf8_lossy(&head);
    Ok(head.lines().next().unwrap_or_default().to_owned())
}
