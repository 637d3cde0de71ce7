//! A TCP proxy that injects network faults between a client and a real service.
//!
//! Faults, each switchable at any time:
//! - **blackhole**: bytes stop flowing in both directions, connections stay open (a partition);
//!   they resume when the blackhole is lifted, nothing lost;
//! - **cut**: every open connection is reset (a crashed link); new ones are accepted;
//! - **HTTP 500**: every open connection is cut and every request on a new one is answered
//!   `500 Internal Server Error` without reaching the service (a Consul server in trouble).

use std::io;
use std::net::SocketAddr;
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
}

/// A running proxy; stops (and drops every connection) when dropped.
#[derive(Debug)]
pub struct Proxy {
    addr: SocketAddr,
    mode: watch::Sender<Mode>,
    connections: Arc<Mutex<Vec<AbortHandle>>>,
    accept: AbortHandle,
}

impl Proxy {
    /// Listens on a free loopback port and forwards to `upstream`.
    pub async fn start(upstream: SocketAddr) -> io::Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (mode, _) = watch::channel(Mode::Forward);
        let connections = Arc::new(Mutex::new(Vec::new()));
        let accept = tokio::spawn(accept_loop(
            listener,
            upstream,
            mode.subscribe(),
            Arc::clone(&connections),
        ))
        .abort_handle();
        Ok(Proxy {
            addr,
            mode,
            connections,
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
        if on {
            self.mode.send_replace(Mode::Http500);
            self.cut_all();
        } else {
            self.mode.send_replace(Mode::Forward);
        }
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
) {
    while let Ok((client, _)) = listener.accept().await {
        let _ = client.set_nodelay(true);
        let mode = mode.clone();
        let task = tokio::spawn(async move {
            if *mode.borrow() == Mode::Http500 {
                let _ = answer_500(client).await;
                return;
            }
            let Ok(server) = TcpStream::connect(upstream).await else {
                return;
            };
            let _ = server.set_nodelay(true);
            let (client_read, client_write) = client.into_split();
            let (server_read, server_write) = server.into_split();
            tokio::select! {
                _ = pump(client_read, server_write, mode.clone()) => {}
                _ = pump(server_read, client_write, mode) => {}
            }
        });
        let mut conns = connections.lock().unwrap();
        conns.retain(|c| !c.is_finished());
        conns.push(task.abort_handle());
    }
}

/// Copies bytes from `from` to `to`, holding them while the mode is not `Forward`.
async fn pump(
    mut from: impl AsyncReadExt + Unpin,
    mut to: impl AsyncWriteExt + Unpin,
    mut mode: watch::Receiver<Mode>,
) -> io::Result<()> {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            return to.shutdown().await;
        }
        if mode.wait_for(|m| *m == Mode::Forward).await.is_err() {
            return Ok(());
        }
        to.write_all(&buf[..n]).await?;
    }
}

async fn answer_500(mut client: TcpStream) -> io::Result<()> {
    // Read the request head so the client sees an answer to its request, not a reset.
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 64 * 1024 {
        let n = client.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
    }
    let body = "injected fault: rpc error: No cluster leader";
    let response = format!(
        "HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    client.write_all(response.as_bytes()).await?;
    client.shutdown().await
}
