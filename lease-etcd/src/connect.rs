//! The connections of the gRPC channel: TCP, and TLS over it for `https://` endpoints, with
//! rustls and the platform's verifier (the `rustls` feature, the default) or the platform's
//! library (`native-tls`), configured from the builder's CA and client certificate.
//!
//! tonic is handed these connections ready-made, so its own TLS stack (and a second copy of the
//! roots) stays out of the build, and both TLS features keep their meaning. ALPN offers `h2`, as
//! etcd's gRPC server requires.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use lease_core::BoxError;
use lease_http::ClientConfig;

/// Connects the channel of one endpoint: `host:port`, with TLS if `tls` is set.
#[derive(Clone, Debug)]
pub(crate) struct Connector {
    pub(crate) host: String,
    pub(crate) port: u16,
    pub(crate) tls: Option<Tls>,
}

impl tower_service::Service<http::Uri> for Connector {
    type Response = TokioIo<Stream>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: http::Uri) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let tcp = TcpStream::connect((this.host.as_str(), this.port)).await?;
            tcp.set_nodelay(true)?;
            let stream = match &this.tls {
                Some(tls) => tls.connect(&this.host, tcp).await?,
                None => Stream::Plain(tcp),
            };
            Ok(TokioIo::new(stream))
        })
    }
}

/// What makes a TLS connection of a TCP one.
#[derive(Clone)]
pub(crate) enum Tls {
    #[cfg(feature = "rustls")]
    Rustls(tokio_rustls::TlsConnector),
    #[cfg(all(feature = "native-tls", not(feature = "rustls")))]
    Native(tokio_native_tls::TlsConnector),
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tls")
    }
}

/// A connection, plain or TLS.
#[derive(Debug)]
pub(crate) enum Stream {
    Plain(TcpStream),
    #[cfg(feature = "rustls")]
    Rustls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
    #[cfg(all(feature = "native-tls", not(feature = "rustls")))]
    Native(Box<tokio_native_tls::TlsStream<TcpStream>>),
}

impl Tls {
    /// The TLS of `config`: `Ok(None)` if this build has no TLS (the builder refuses an `https`
    /// address then).
    pub(crate) fn new(config: &ClientConfig) -> Result<Option<Tls>, BoxError> {
        #[cfg(feature = "rustls")]
        return rustls::connector(config).map(|c| Some(Tls::Rustls(c)));
        #[cfg(all(feature = "native-tls", not(feature = "rustls")))]
        return native::connector(config).map(|c| Some(Tls::Native(c)));
        #[cfg(not(any(feature = "rustls", feature = "native-tls")))]
        {
            let _ = config;
            Ok(None)
        }
    }

    /// The handshake over `tcp`, checking the certificate against `server_name`.
    pub(crate) async fn connect(&self, server_name: &str, tcp: TcpStream) -> io::Result<Stream> {
        // A build without TLS has no `Tls` to call this on.
        #[cfg(not(any(feature = "rustls", feature = "native-tls")))]
        {
            let _ = (server_name, tcp);
            match *self {}
        }
        #[cfg(any(feature = "rustls", feature = "native-tls"))]
        match self {
            #[cfg(feature = "rustls")]
            Tls::Rustls(connector) => {
                let name =
                    tokio_rustls::rustls::pki_types::ServerName::try_from(server_name.to_owned())
                        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
                let stream = connector.connect(name, tcp).await?;
                Ok(Stream::Rustls(Box::new(stream)))
            }
            #[cfg(all(feature = "native-tls", not(feature = "rustls")))]
            Tls::Native(connector) => {
                let stream = connector
                    .connect(server_name, tcp)
                    .await
                    .map_err(io::Error::other)?;
                Ok(Stream::Native(Box::new(stream)))
            }
        }
    }
}

#[cfg(feature = "rustls")]
mod rustls {
    use std::sync::Arc;

    use tokio_rustls::rustls::client::danger::ServerCertVerifier;
    use tokio_rustls::rustls::crypto;
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
    use tokio_rustls::rustls::{self as tls};

    use super::ClientConfig;
    use lease_core::BoxError;

    pub(crate) fn connector(config: &ClientConfig) -> Result<tokio_rustls::TlsConnector, BoxError> {
        let provider = Arc::new(crypto::aws_lc_rs::default_provider());
        let builder = tls::ClientConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()?;
        let extra = match &config.ca_pem {
            Some(pem) => CertificateDer::pem_slice_iter(pem)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| format!("the CA certificate is not PEM: {e}"))?,
            None => Vec::new(),
        };
        let verifier: Arc<dyn ServerCertVerifier> = Arc::new(
            rustls_platform_verifier::Verifier::new_with_extra_roots(extra, provider)?,
        );
        let builder = builder
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let mut tls = match &config.identity_pem {
            Some((cert, key)) => {
                let chain = CertificateDer::pem_slice_iter(cert)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| format!("the client certificate is not PEM: {e}"))?;
                let key = PrivateKeyDer::from_pem_slice(key)
                    .map_err(|e| format!("the client key is not a PEM private key: {e}"))?;
                builder.with_client_auth_cert(chain, key)?
            }
            None => builder.with_no_client_auth(),
        };
        tls.alpn_protocols = vec![b"h2".to_vec()];
        Ok(tokio_rustls::TlsConnector::from(Arc::new(tls)))
    }
}

#[cfg(all(feature = "native-tls", not(feature = "rustls")))]
mod native {
    use tokio_native_tls::native_tls;

    use super::ClientConfig;
    use lease_core::BoxError;

    pub(crate) fn connector(
        config: &ClientConfig,
    ) -> Result<tokio_native_tls::TlsConnector, BoxError> {
        let mut builder = native_tls::TlsConnector::builder();
        if let Some(pem) = &config.ca_pem {
            for block in pem_blocks(pem, "CERTIFICATE") {
                builder.add_root_certificate(native_tls::Certificate::from_pem(block)?);
            }
        }
        if let Some((cert, key)) = &config.identity_pem {
            let identity = native_tls::Identity::from_pkcs8(cert, key).map_err(|e| {
                format!(
                    "the client certificate and key are not usable ({e}): with native-tls the \
                     key must be PKCS #8 PEM (`openssl pkcs8 -topk8 -nocrypt -in key.pem`; \
                     some tools write SEC1), or use lease-etcd's `rustls` feature, \
                     which reads both"
                )
            })?;
            builder.identity(identity);
        }
        builder.request_alpns(&["h2"]);
        Ok(tokio_native_tls::TlsConnector::from(builder.build()?))
    }

    /// Each `-----BEGIN <label>-----` … `-----END <label>-----` block of a PEM bundle.
    fn pem_blocks<'a>(pem: &'a [u8], label: &str) -> impl Iterator<Item = &'a [u8]> {
        let begin = format!("-----BEGIN {label}-----").into_bytes();
        let end = format!("-----END {label}-----").into_bytes();
        let mut rest = pem;
        std::iter::from_fn(move || {
            let start = rest.windows(begin.len()).position(|w| w == begin)?;
            let stop = rest[start..].windows(end.len()).position(|w| w == end)? + start + end.len();
            let block = &rest[start..stop];
            rest = &rest[stop..];
            Some(block)
        })
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            #[cfg(feature = "rustls")]
            Stream::Rustls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
            #[cfg(all(feature = "native-tls", not(feature = "rustls")))]
            Stream::Native(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            #[cfg(feature = "rustls")]
            Stream::Rustls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
            #[cfg(all(feature = "native-tls", not(feature = "rustls")))]
            Stream::Native(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            #[cfg(feature = "rustls")]
            Stream::Rustls(s) => Pin::new(s.as_mut()).poll_flush(cx),
            #[cfg(all(feature = "native-tls", not(feature = "rustls")))]
            Stream::Native(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            #[cfg(feature = "rustls")]
            Stream::Rustls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
            #[cfg(all(feature = "native-tls", not(feature = "rustls")))]
            Stream::Native(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}
