//! TLS for the backend's connections, as the URL's `sslmode` asks: tokio-postgres's
//! `MakeTlsConnect`/`TlsConnect` over tokio-rustls (feature `rustls`, the default), or no TLS
//! at all in a build without it.
//!
//! - `sslmode=disable`: plain TCP.
//! - `sslmode=prefer` (tokio-postgres's default): TLS if the server offers it, else plain; the
//!   certificate is not verified, as libpq's `prefer` does not verify it (an attacker in the
//!   middle can refuse TLS anyway, so verifying would protect nothing more).
//! - `sslmode=require`: TLS or no connection, and the certificate is verified: the platform's
//!   roots and any [`ca_cert`](crate::PostgresBuilder::ca_cert), with the URL's host checked
//!   against the certificate's names. That is libpq's `verify-full`, stricter than libpq's
//!   `require`; the URL's `sslmode=verify-ca` and `verify-full` (which tokio-postgres does not
//!   parse) are read as `require`, and `sslrootcert=PATH` as `ca_cert(PATH)`.
//!
//! A refused or failed handshake (TLS off on the server, an untrusted certificate, a name not on
//! it) is a `Config` error naming TLS and what to do, not retried; a connection cut during a
//! handshake is retried as any cut. A build without `rustls` refuses `sslmode=require` at
//! `build()` and connects in plain under `prefer` (`postgres_tls::tls_follows_the_urls_sslmode`:
//! each mode against the test server, which sessions are encrypted read from `pg_stat_ssl`).
//!
//! The TLS session does not offer channel binding (`SCRAM-SHA-256-PLUS`), nor client
//! certificates yet; SCRAM-SHA-256 and the other password methods work over it as usual.

use lease_core::Error;
use tokio_postgres::config::SslMode;
#[cfg(feature = "rustls")]
pub(crate) use with_rustls::RustlsConnector as Connector;

/// The connector for `mode`, verifying certificates against the platform's roots and the PEM
/// certificates of `ca_pem` when `mode` is `require`.
pub(crate) fn connector(mode: SslMode, ca_pem: Option<&[u8]>) -> Result<Connector, Error> {
    #[cfg(feature = "rustls")]
    {
        with_rustls::RustlsConnector::new(mode == SslMode::Require, ca_pem)
    }
    #[cfg(not(feature = "rustls"))]
    {
        let _ = ca_pem;
        if mode == SslMode::Require {
            return Err(Error::config(
                "the PostgreSQL URL asks for TLS (sslmode=require), and this build of \
                 lease-postgres has none: enable its `rustls` feature (on by default), or use \
                 sslmode=disable or prefer on a network you trust",
            ));
        }
        Ok(Connector)
    }
}

/// No TLS, in a build without `rustls`: tokio-postgres's `NoTls`, as a type that is `Clone` but
/// not `Copy`, so the code that clones the rustls connector reads the same in both builds.
#[cfg(not(feature = "rustls"))]
#[derive(Clone, Debug)]
pub(crate) struct Connector;

#[cfg(not(feature = "rustls"))]
impl<S> tokio_postgres::tls::MakeTlsConnect<S> for Connector {
    type Stream = tokio_postgres::tls::NoTlsStream;
    type TlsConnect = tokio_postgres::NoTls;
    type Error = tokio_postgres::tls::NoTlsError;

    fn make_tls_connect(&mut self, _: &str) -> Result<Self::TlsConnect, Self::Error> {
        Ok(tokio_postgres::NoTls)
    }
}

/// Whether `error` (from connecting) is a failure of TLS that trying again cannot mend: the
/// server refused TLS, or the handshake failed (a certificate not trusted, a name not on it).
/// A connection cut or reset during the handshake is the network's trouble, not this.
pub(crate) fn is_tls_failure(error: &tokio_postgres::Error) -> bool {
    use std::error::Error as _;
    // tokio-postgres has no public kind for it; its message for the kind is fixed.
    if !error
        .to_string()
        .starts_with("error performing TLS handshake")
    {
        return false;
    }
    // rustls's own errors come as `InvalidData`; a bad host name as `InvalidInput` (ours).
    match error
        .source()
        .and_then(|cause| cause.downcast_ref::<std::io::Error>())
    {
        Some(io) => matches!(
            io.kind(),
            std::io::ErrorKind::InvalidData | std::io::ErrorKind::InvalidInput
        ),
        None => true,
    }
}

/// What to do about a TLS failure with the server at `address` (`text` says what failed).
pub(crate) fn tls_failure(address: &str, text: &str) -> Error {
    let hint = if text.contains("server does not support TLS") {
        "the server has TLS off: turn `ssl` on in its postgresql.conf, or use sslmode=prefer \
         or disable on a network you trust"
    } else {
        "with sslmode=require the certificate is verified: give the CA that signed it with \
         PostgresBuilder::ca_cert or the URL's sslrootcert=PATH, and use a host name the \
         certificate names; sslmode=prefer encrypts without verifying"
    };
    Error::config(format!(
        "TLS with the PostgreSQL server at {address} failed ({text}): {hint}"
    ))
}

#[cfg(feature = "rustls")]
mod with_rustls {
    use std::future::Future;
    use std::io;
    use std::pin::Pin;
    use std::sync::Arc;
    use std::task::{Context, Poll};

    use lease_core::Error;
    use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
    use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream};
    use tokio_rustls::rustls::pki_types::ServerName;
    use tokio_rustls::rustls::{self as tls};

    /// Makes a TLS session of each connection (tokio-postgres asks only when the mode and the
    /// server call for one). Cloning is cheap.
    #[derive(Clone)]
    pub(crate) struct RustlsConnector {
        config: Arc<tls::ClientConfig>,
    }

    impl std::fmt::Debug for RustlsConnector {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("RustlsConnector")
        }
    }

    impl RustlsConnector {
        /// `verify`: check the certificate (`require`), else accept any (`prefer`).
        pub(crate) fn new(verify: bool, ca_pem: Option<&[u8]>) -> Result<Self, Error> {
            let settings = lease_http::ClientConfig {
                ca_pem: ca_pem.map(<[u8]>::to_vec),
                skip_verify: !verify,
                ..lease_http::ClientConfig::default()
            };
            // "postgresql": what PostgreSQL 17 asks of a direct TLS handshake
            // (`sslnegotiation=direct`); servers that negotiate first ignore it.
            let config = lease_http::tls::rustls_client_config(&settings, "postgresql")
                .map_err(|e| Error::config(format!("PostgreSQL TLS: {e}")))?;
            Ok(RustlsConnector { config })
        }
    }

    impl<S> MakeTlsConnect<S> for RustlsConnector
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        type Stream = RustlsStream<S>;
        type TlsConnect = RustlsConnect;
        type Error = io::Error;

        fn make_tls_connect(&mut self, domain: &str) -> io::Result<RustlsConnect> {
            let name = ServerName::try_from(domain.to_owned()).map_err(|e| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{domain:?} is not a host name TLS can check: {e}"),
                )
            })?;
            Ok(RustlsConnect {
                connector: tokio_rustls::TlsConnector::from(Arc::clone(&self.config)),
                name,
            })
        }
    }

    /// One handshake, with the server name it checks.
    pub(crate) struct RustlsConnect {
        connector: tokio_rustls::TlsConnector,
        name: ServerName<'static>,
    }

    impl<S> TlsConnect<S> for RustlsConnect
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        type Stream = RustlsStream<S>;
        type Error = io::Error;
        type Future = Pin<Box<dyn Future<Output = io::Result<RustlsStream<S>>> + Send>>;

        fn connect(self, stream: S) -> Self::Future {
            Box::pin(async move {
                let stream = self.connector.connect(self.name, stream).await?;
                Ok(RustlsStream(Box::new(stream)))
            })
        }
    }

    /// A connection in a TLS session.
    pub(crate) struct RustlsStream<S>(Box<tokio_rustls::client::TlsStream<S>>);

    impl<S: AsyncRead + AsyncWrite + Unpin> TlsStream for RustlsStream<S> {
        fn channel_binding(&self) -> ChannelBinding {
            ChannelBinding::none()
        }
    }

    impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for RustlsStream<S> {
        fn poll_read(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            Pin::new(self.get_mut().0.as_mut()).poll_read(cx, buf)
        }
    }

    impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for RustlsStream<S> {
        fn poll_write(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            Pin::new(self.get_mut().0.as_mut()).poll_write(cx, buf)
        }

        fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(self.get_mut().0.as_mut()).poll_flush(cx)
        }

        fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(self.get_mut().0.as_mut()).poll_shutdown(cx)
        }
    }
}
