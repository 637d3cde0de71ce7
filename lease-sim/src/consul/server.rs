//! The model's HTTP server: hyper's HTTP/1.1 server, one connection at a time, each request
//! answered by the API ([`answer`]) as Consul's agent answers it.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};

use super::Model;
use super::api::answer;

impl Model {
    /// Serves one connection (HTTP/1.1, keep-alive, no server-side timers) until the client
    /// closes it or it fails.
    pub async fn serve_connection<I>(&self, io: I) -> Result<(), hyper::Error>
    where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        self.start();
        hyper::server::conn::http1::Builder::new()
            .header_read_timeout(None)
            .title_case_headers(true)
            .serve_connection(TokioIo::new(io), self.clone())
            .await
    }
}

impl<B> hyper::service::Service<http::Request<B>> for Model
where
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Response = http::Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn call(&self, request: http::Request<B>) -> Self::Future {
        self.start();
        let model = self.clone();
        Box::pin(async move { Ok(answer(&model, request).await) })
    }
}
