//! How a backend opens a connection to its server: TCP ([`Tcp`], the default), or a [`Dial`] of the
//! application's — a Unix socket, an SSH tunnel, a SOCKS proxy, an in-memory stream of a test or
//! a simulation — given to the backend's builder (`ConsulBuilder::dial`, `EtcdBuilder::dial`).
//! TLS, when the address is `https`, runs over whatever the dial returned, so every connection
//! still counts against the backend's connection budget.
//!
//! ```
//! use std::io;
//! use lease_core::BoxFuture;
//! use lease_http::dial::{Connection, Dial};
//!
//! /// Every connection to the server goes through a local tunnel's port instead.
//! #[derive(Debug)]
//! struct Tunnel(u16);
//!
//! impl Dial for Tunnel {
//!     fn dial(&self, _host: &str, _port: u16) -> BoxFuture<'static, io::Result<Connection>> {
//!         let port = self.0;
//!         Box::pin(async move {
//!             let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
//!             Ok(Connection::new(tcp))
//!         })
//!     }
//! }
//! ```

use std::fmt;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use lease_core::BoxFuture;

/// Opens connections to a server; see the [module docs](self).
pub trait Dial: fmt::Debug + Send + Sync + 'static {
    /// A connection to `host:port`, the address the backend was configured with (its host may be
    /// a name to resolve). The backend bounds the call by its connect timeout.
    fn dial(&self, host: &str, port: u16) -> BoxFuture<'static, io::Result<Connection>>;
}

/// What a [`Dial`] returns: a byte stream to the server, read and written by the backend's HTTP
/// or gRPC client.
pub struct Connection(Box<dyn Io>);

/// A connection's stream: anything that reads and writes bytes and may move between threads.
trait Io: AsyncRead + AsyncWrite + Send + Unpin {}

impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}

impl Connection {
    /// A connection over `io`.
    pub fn new<T>(io: T) -> Connection
    where
        T: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    {
        Connection(Box::new(io))
    }
}

impl fmt::Debug for Connection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Connection")
    }
}

impl AsyncRead for Connection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for Connection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.0).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_shutdown(cx)
    }
}

/// TCP to the first of the host's addresses that accepts, with `TCP_NODELAY` (requests are
/// small and each waits for its answer): what a backend dials unless given another [`Dial`].
#[derive(Clone, Copy, Debug, Default)]
pub struct Tcp;

impl Dial for Tcp {
    fn dial(&self, host: &str, port: u16) -> BoxFuture<'static, io::Result<Connection>> {
        let host = host.to_owned();
        Box::pin(async move {
            let mut last = None;
            for address in tokio::net::lookup_host((host.as_str(), port)).await? {
                match TcpStream::connect(address).await {
                    Ok(stream) => {
                        stream.set_nodelay(true)?;
                        return Ok(Connection::new(stream));
                    }
                    Err(error) => last = Some(error),
                }
            }
            Err(last.unwrap_or_else(|| {
                io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("failed to lookup address information: {host} has no address"),
                )
            }))
        })
    }
}
