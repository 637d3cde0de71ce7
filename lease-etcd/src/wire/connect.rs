//! The connections of the gRPC channel: dialed (TCP, unless the builder was given a
//! [`Dial`]), and TLS over them for `https://` endpoints
//! (lease-http's [`tls`](lease_http::tls), the same as Consul's, configured from the builder's CA
//! and client certificate; ALPN offers `h2`, as etcd's gRPC server requires): rustls with the
//! platform's verifier (feature `rustls`, the default) or native-tls, tested by
//! `etcd::tls_with_a_ca_and_a_client_certificate`.
//!
//! tonic is handed these connections ready-made, so its own TLS stack (and a second copy of the
//! roots) stays out of the build, and both TLS features keep their meaning.

use std::future::Future;

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper_util::rt::TokioIo;

use lease_core::BoxError;
use lease_http::dial::Dial;
use lease_http::tls::{Stream, Tls};

/// Connects the channel of one endpoint: `host:port` through `dial`, with TLS if `tls` is set.
#[derive(Clone, Debug)]
pub(crate) struct Connector {
    pub(crate) host: String,
    pub(crate) port: u16,
    pub(crate) dial: Arc<dyn Dial>,
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
            let tcp = this.dial.dial(&this.host, this.port).await?;
            let stream = match &this.tls {
                Some(tls) => tls.connect(&this.host, tcp).await?,
                None => Stream::Plain(tcp),
            };
            Ok(TokioIo::new(stream))
        })
    }
}
