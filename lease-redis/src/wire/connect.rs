//! Opening one connection: where to (a server, or the master the sentinels name), TCP, TLS as
//! the other backends configure it (lease-http's rustls client configuration), and redis-rs's
//! RESP3 multiplexed connection over that stream, its server pushes handed to a channel, its
//! driver spawned here. Every open connection is counted until its stream is dropped.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, ProtocolVersion, PushInfo, RedisConnectionInfo};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use super::error::RedisFailure;

/// Where the server is.
#[derive(Clone, Debug)]
pub(crate) enum Endpoint {
    /// One server.
    Server { host: String, port: u16 },
    /// The master that these sentinels name for `master`.
    Sentinel {
        sentinels: Vec<(String, u16)>,
        master: String,
    },
}

/// A connected server: its connection, the driver to spawn, and how many replicas the server
/// said it has (its `ROLE`).
pub(crate) struct Opened {
    pub(crate) conn: MultiplexedConnection,
    /// The connection's driver task: it ends when the connection does.
    pub(crate) driver: tokio::task::JoinHandle<()>,
    pub(crate) replicas: usize,
    /// `host:port` of the server connected to.
    pub(crate) server: String,
}

/// What every connection of a handle is opened with. Cloned for a runtime that ends (the
/// detached release opens a connection of its own).
#[derive(Clone)]
pub(crate) struct Connector {
    pub(crate) endpoint: Endpoint,
    pub(crate) info: RedisConnectionInfo,
    #[cfg(feature = "rustls")]
    pub(crate) tls: Option<tokio_rustls::TlsConnector>,
    /// The name the server's certificate must carry, when not the host connected to.
    #[cfg_attr(not(feature = "rustls"), allow(dead_code))]
    pub(crate) tls_name: Option<String>,
    pub(crate) connect_timeout: Duration,
    pub(crate) request_timeout: Duration,
    /// Connections open now (their streams not yet dropped).
    pub(crate) open: Arc<AtomicUsize>,
}

impl std::fmt::Debug for Connector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connector")
            .field("endpoint", &self.endpoint)
            .field("db", &self.info.db())
            .field("open", &self.open.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Connector {
    /// Opens a RESP3 connection to the server (the sentinels' master), its pushes sent to
    /// `pushes` (none: a connection only for requests).
    pub(crate) async fn open(
        &self,
        pushes: Option<mpsc::UnboundedSender<PushInfo>>,
    ) -> Result<Opened, RedisFailure> {
        let (host, port) = match &self.endpoint {
            Endpoint::Server { host, port } => (host.clone(), *port),
            Endpoint::Sentinel { sentinels, master } => {
                self.ask_sentinels(sentinels, master).await?
            }
        };
        let info = self.info.clone().set_protocol(ProtocolVersion::RESP3);
        let mut config = AsyncConnectionConfig::new()
            .set_response_timeout(Some(self.request_timeout))
            .set_connection_timeout(Some(self.connect_timeout));
        if let Some(pushes) = pushes {
            config = config.set_push_sender(pushes);
        }
        let stream = self.stream(&host, port).await?;
        let (mut conn, driver) = tokio::time::timeout(
            self.connect_timeout,
            MultiplexedConnection::new_with_config(&info, stream, config),
        )
        .await
        .map_err(|_| RedisFailure::TimedOut)??;
        // The driver ends once the stream does, or every clone of the connection is dropped.
        let driver = super::runtime::spawn(driver);
        let role: redis::Value = redis::cmd("ROLE").query_async(&mut conn).await?;
        let replicas = match &role {
            redis::Value::Array(parts) => match (parts.first(), parts.get(2)) {
                (Some(redis::Value::BulkString(kind)), Some(redis::Value::Array(replicas)))
                    if kind.as_slice() == b"master" =>
                {
                    replicas.len()
                }
                (Some(redis::Value::BulkString(kind)), _) if kind.as_slice() == b"master" => 0,
                _ => {
                    // A replica (a failover not yet seen by the sentinels, or a URL naming a
                    // replica): leases must be taken on the master.
                    return Err(RedisFailure::Redis(redis::make_extension_error(
                        "READONLY".to_owned(),
                        Some(format!("{host}:{port} is not a master")),
                    )));
                }
            },
            other => {
                return Err(RedisFailure::Malformed(format!("ROLE answered {other:?}")));
            }
        };
        Ok(Opened {
            conn,
            driver,
            replicas,
            server: format!("{host}:{port}"),
        })
    }

    /// The master's address, from the first sentinel that names one.
    async fn ask_sentinels(
        &self,
        sentinels: &[(String, u16)],
        master: &str,
    ) -> Result<(String, u16), RedisFailure> {
        let mut last = RedisFailure::NotConnected;
        for (host, port) in sentinels {
            match self.ask_sentinel(host, *port, master).await {
                Ok(found) => return Ok(found),
                Err(error) => {
                    tracing::debug!(%error, sentinel = %format!("{host}:{port}"), "sentinel did not name the master");
                    last = error;
                }
            }
        }
        Err(last)
    }

    async fn ask_sentinel(
        &self,
        host: &str,
        port: u16,
        master: &str,
    ) -> Result<(String, u16), RedisFailure> {
        let stream = self.stream(host, port).await?;
        let info = RedisConnectionInfo::default();
        let config = AsyncConnectionConfig::new().set_response_timeout(Some(self.request_timeout));
        let (mut conn, driver) = tokio::time::timeout(
            self.connect_timeout,
            MultiplexedConnection::new_with_config(&info, stream, config),
        )
        .await
        .map_err(|_| RedisFailure::TimedOut)??;
        let _driver = super::runtime::spawn(driver);
        let answer = redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(master)
            .query_async::<Option<(String, u16)>>(&mut conn)
            .await;
        match answer? {
            Some(found) => Ok(found),
            None => Err(RedisFailure::Connect(Arc::new(io::Error::new(
                io::ErrorKind::NotFound,
                format!("sentinel {host}:{port} knows no master named {master:?}"),
            )))),
        }
    }

    /// TCP to `host:port`, then TLS if configured; counted while open.
    async fn stream(&self, host: &str, port: u16) -> Result<Counted, RedisFailure> {
        let tcp = tokio::time::timeout(self.connect_timeout, TcpStream::connect((host, port)))
            .await
            .map_err(|_| RedisFailure::TimedOut)?
            .map_err(|e| RedisFailure::Connect(Arc::new(e)))?;
        let _ = tcp.set_nodelay(true);
        let stream = self.secure(host, tcp).await?;
        self.open.fetch_add(1, Ordering::Relaxed);
        Ok(Counted {
            stream,
            open: Arc::clone(&self.open),
        })
    }

    async fn secure(&self, host: &str, tcp: TcpStream) -> Result<Plain, RedisFailure> {
        #[cfg(feature = "rustls")]
        if let Some(tls) = &self.tls {
            let name = self.tls_name.as_deref().unwrap_or(host).to_owned();
            let name =
                tokio_rustls::rustls::pki_types::ServerName::try_from(name).map_err(|e| {
                    RedisFailure::Tls(Arc::new(io::Error::new(io::ErrorKind::InvalidInput, e)))
                })?;
            let stream = tokio::time::timeout(self.connect_timeout, tls.connect(name, tcp))
                .await
                .map_err(|_| RedisFailure::TimedOut)?
                .map_err(|e| match e.kind() {
                    // A cut during the handshake is the network's trouble; the rest is TLS's.
                    io::ErrorKind::ConnectionReset
                    | io::ErrorKind::ConnectionAborted
                    | io::ErrorKind::UnexpectedEof
                    | io::ErrorKind::BrokenPipe => RedisFailure::Connect(Arc::new(e)),
                    _ => RedisFailure::Tls(Arc::new(e)),
                })?;
            return Ok(Plain::Tls(Box::new(stream)));
        }
        let _ = host;
        Ok(Plain::Tcp(tcp))
    }
}

/// A connection's stream, plain or TLS.
enum Plain {
    Tcp(TcpStream),
    #[cfg(feature = "rustls")]
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

/// A stream counted in [`Connector::open`] while it lives.
struct Counted {
    stream: Plain,
    open: Arc<AtomicUsize>,
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.open.fetch_sub(1, Ordering::Relaxed);
    }
}

macro_rules! both {
    ($self:ident, $s:ident => $body:expr) => {
        match &mut $self.get_mut().stream {
            Plain::Tcp($s) => {
                let $s = Pin::new($s);
                $body
            }
            #[cfg(feature = "rustls")]
            Plain::Tls($s) => {
                let $s = Pin::new($s.as_mut());
                $body
            }
        }
    };
}

impl AsyncRead for Counted {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        both!(self, s => s.poll_read(cx, buf))
    }
}

impl AsyncWrite for Counted {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        both!(self, s => s.poll_write(cx, buf))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        both!(self, s => s.poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        both!(self, s => s.poll_shutdown(cx))
    }
}
