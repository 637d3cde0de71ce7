//! TLS for the backends' own connections (Consul's counted pool, etcd's gRPC channels): rustls
//! with the platform's verifier (the `rustls` feature, the default) or the platform's library
//! (`native-tls`), configured from a [`ClientConfig`]: extra CA roots, a client certificate, and
//! (Consul's `CONSUL_HTTP_SSL_VERIFY=false`) no verification.
//!
//! A backend dials its connection itself ([`dial`](crate::dial)), then hands it to
//! [`Tls::connect`]; the [`Stream`] it gets back reads and writes the same whether TLS is on or
//! not.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use crate::ClientConfig;
use crate::dial::Connection;
use lease_core::BoxError;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// What makes a TLS connection of a dialed one. A build without TLS has none ([`Tls::new`] says so).
#[derive(Clone)]
pub enum Tls {
    /// rustls, with the platform's verifier.
    #[cfg(feature = "rustls")]
    Rustls(tokio_rustls::TlsConnector),
    /// The platform's library.
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
pub enum Stream {
    /// No TLS: the connection as dialed.
    Plain(Connection),
    /// TLS by rustls.
    #[cfg(feature = "rustls")]
    Rustls(Box<tokio_rustls::client::TlsStream<Connection>>),
    /// TLS by the platform's library.
    #[cfg(all(feature = "native-tls", not(feature = "rustls")))]
    Native(Box<tokio_native_tls::TlsStream<Connection>>),
}

impl Tls {
    /// The TLS of `config`, offering the ALPN protocol `alpn` (`"h2"` for gRPC, `"http/1.1"`):
    /// `Ok(None)` if this build has no TLS (the backend's builder then refuses an `https`
    /// address with [`tls_missing`](crate::tls_missing)).
    pub fn new(config: &ClientConfig, alpn: &'static str) -> Result<Option<Tls>, BoxError> {
        #[cfg(feature = "rustls")]
        return rustls::connector(config, alpn).map(|c| Some(Tls::Rustls(c)));
        #[cfg(all(feature = "native-tls", not(feature = "rustls")))]
        return native::connector(config, alpn).map(|c| Some(Tls::Native(c)));
        #[cfg(not(any(feature = "rustls", feature = "native-tls")))]
        {
            let _ = (config, alpn);
            Ok(None)
        }
    }

    /// The handshake over `tcp` (a dialed connection), checking the certificate against
    /// `server_name`.
    pub async fn connect(&self, server_name: &str, tcp: Connection) -> io::Result<Stream> {
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

/// The rustls client configuration [`Tls::new`] uses (feature `rustls`), for a client that runs
/// the handshake itself (tokio-postgres's `MakeTlsConnect`): the platform's verifier with
/// `config.ca_pem` as extra roots, or any certificate with `config.skip_verify` (the handshake's
/// signatures are still checked), `config.identity_pem` as the client certificate, and `alpn`
/// offered.
#[cfg(feature = "rustls")]
pub fn rustls_client_config(
    config: &ClientConfig,
    alpn: &str,
) -> Result<std::sync::Arc<tokio_rustls::rustls::ClientConfig>, BoxError> {
    rustls::client_config(config, alpn)
}

#[cfg(feature = "rustls")]
mod rustls {
    use std::sync::Arc;

    use tokio_rustls::rustls::client::danger::{
        HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier,
    };
    use tokio_rustls::rustls::crypto::{self, CryptoProvider};
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
    use tokio_rustls::rustls::{self as tls, DigitallySignedStruct, SignatureScheme};

    use super::ClientConfig;
    use lease_core::BoxError;

    pub(super) fn connector(
        config: &ClientConfig,
        alpn: &str,
    ) -> Result<tokio_rustls::TlsConnector, BoxError> {
        client_config(config, alpn).map(tokio_rustls::TlsConnector::from)
    }

    /// See [`rustls_client_config`](super::rustls_client_config).
    pub(super) fn client_config(
        config: &ClientConfig,
        alpn: &str,
    ) -> Result<Arc<tls::ClientConfig>, BoxError> {
        let provider = Arc::new(crypto::aws_lc_rs::default_provider());
        let builder = tls::ClientConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()?;
        let verifier: Arc<dyn ServerCertVerifier> = if config.skip_verify {
            Arc::new(AnyCertificate(Arc::clone(&provider)))
        } else {
            let extra = match &config.ca_pem {
                Some(pem) => CertificateDer::pem_slice_iter(pem)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| format!("the CA certificate is not PEM: {e}"))?,
                None => Vec::new(),
            };
            Arc::new(rustls_platform_verifier::Verifier::new_with_extra_roots(
                extra, provider,
            )?)
        };
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
        tls.alpn_protocols = vec![alpn.as_bytes().to_vec()];
        Ok(Arc::new(tls))
    }

    /// `ssl_verify(false)`: any certificate, for any name; the handshake's signatures are still
    /// checked against the certificate presented.
    #[derive(Debug)]
    struct AnyCertificate(Arc<CryptoProvider>);

    impl ServerCertVerifier for AnyCertificate {
        fn verify_server_cert(
            &self,
            _: &CertificateDer<'_>,
            _: &[CertificateDer<'_>],
            _: &ServerName<'_>,
            _: &[u8],
            _: UnixTime,
        ) -> Result<ServerCertVerified, tls::Error> {
            Ok(ServerCertVerified::assertion())
        }

        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, tls::Error> {
            crypto::verify_tls12_signature(
                message,
                cert,
                dss,
                &self.0.signature_verification_algorithms,
            )
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, tls::Error> {
            crypto::verify_tls13_signature(
                message,
                cert,
                dss,
                &self.0.signature_verification_algorithms,
            )
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.0.signature_verification_algorithms.supported_schemes()
        }
    }
}

#[cfg(all(feature = "native-tls", not(feature = "rustls")))]
mod native {
    use tokio_native_tls::native_tls;

    use super::ClientConfig;
    use lease_core::BoxError;

    pub(super) fn connector(
        config: &ClientConfig,
        alpn: &str,
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
                     `consul tls cert create` writes SEC1), or use the backend crate's `rustls` feature, \
                     which reads both"
                )
            })?;
            builder.identity(identity);
        }
        if config.skip_verify {
            builder
                .danger_accept_invalid_certs(true)
                .danger_accept_invalid_hostnames(true);
        }
        builder.request_alpns(&[alpn]);
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
